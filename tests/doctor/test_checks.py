"""The pure rules of ``hami doctor``: tables of objects in, findings out (no API server)."""

from __future__ import annotations

import datetime
from collections.abc import Callable
from typing import Any

import pytest

from hami.annotations import (
    NODE_HANDSHAKE,
    NODE_LOCK,
    AnnotationError,
    HandshakeKind,
    decode_bind_phase,
    decode_node_lock,
    encode_handshake,
)
from hami.core.model import DeviceState, NodeState
from hami.doctor.checks import check_locks, check_nodes, check_webhooks
from hami.doctor.findings import DoctorSettings, Finding, Severity, exit_code, finding
from hami.doctor.pods import check_pods, check_usage
from hami.scheduler.snapshot import local_time
from hami.settings import DeviceConfig, ResourceNames
from tests.builders import NOW, ago, device, handshake, lock, make_node, make_pod, placed, webhook_config

SETTINGS = DoctorSettings()
OK, WARN, FAIL = Severity.OK, Severity.WARN, Severity.FAIL


def brief(findings: list[Finding]) -> list[tuple[Severity, str, str]]:
    return [(f.severity, f.subject, f.message) for f in findings]


BAD_LOCK = "2026-05-01T09:59:00Z,default"


def codec_error(decode: Callable[[str], object], text: str) -> str:
    """The codec's own error text for ``text`` (its wording belongs to the codec, not to these tests)."""
    with pytest.raises(AnnotationError) as caught:
        decode(text)
    return str(caught.value)


# ------------------------------------------------------------------------------------------ webhook

WEBHOOK_SUBJECT = "mutatingwebhookconfiguration hami-webhook webhook vgpu.hami.io"
SERVICE = "service kube-system/hami-webhook/webhook"


@pytest.mark.parametrize(
    ("config", "expected"),
    [
        # no failurePolicy: admissionregistration/v1 defaults to Fail
        (webhook_config(failure_policy=None), [(OK, f"routes pods to {SERVICE}, failurePolicy Fail")]),
        # the demo's Kopf-managed entry: a URL ending in /webhook
        (
            webhook_config(
                webhook_name="webhook.auto.kopf.dev", client_config={"url": "https://127.0.0.1:9/webhook"}
            ),
            [(OK, "routes pods to https://127.0.0.1:9/webhook, failurePolicy Fail")],
        ),
        # found by its name even on another path
        (
            webhook_config(client_config={"url": "https://h/mutate?x=1"}),
            [(OK, "routes pods to https://h/mutate?x=1, failurePolicy Fail")],
        ),
        (
            webhook_config(resources=("deployments",)),
            [
                (FAIL, "its rules do not send pod CREATE requests: GPU pods are never routed"),
                (OK, f"routes pods to {SERVICE}, failurePolicy Fail"),
            ],
        ),
        (webhook_config(resources=("*",)), [(OK, f"routes pods to {SERVICE}, failurePolicy Fail")]),
        (
            webhook_config(ca_bundle="", failure_policy="Ignore"),
            [
                (FAIL, f"caBundle is empty: the API server cannot verify {SERVICE}"),
                (
                    WARN,
                    "failurePolicy Ignore: while the webhook is unreachable GPU pods are admitted unchanged "
                    "and never reach hami-scheduler",
                ),
            ],
        ),
    ],
)
def test_webhook_entries(config: dict[str, Any], expected: list[tuple[Severity, str]]) -> None:
    found = check_webhooks([config], SETTINGS)
    assert [(f.severity, f.message) for f in found] == expected
    assert {f.subject for f in found} == {
        f"mutatingwebhookconfiguration hami-webhook webhook {config['webhooks'][0]['name']}"
    }


def test_unrelated_webhooks_do_not_count() -> None:
    other = webhook_config(
        "istio", webhook_name="sidecar.istio.io", client_config={"url": "https://x/inject"}
    )
    for configs in ([], [other], [{"metadata": {"name": "empty"}}]):
        [only] = check_webhooks(configs, DoctorSettings(scheduler_name="gpu-sched"))
        assert only.severity is FAIL and only.subject == "cluster"
        assert only.message.endswith("GPU pods are not routed to gpu-sched")


# -------------------------------------------------------------------------------------------- nodes

LOCAL_NOW = local_time(NOW)


@pytest.mark.parametrize(
    ("item", "expected"),
    [
        (make_node("cpu", cards=0), []),  # neither registered nor labelled: not a GPU node
        (make_node("a", device("G0"), device("G1")), [(OK, "node a", "2 cards registered, all healthy")]),
        (make_node("a", device("G0", health=False)), [(WARN, "node a", "1 of 1 cards unhealthy: G0")]),
        (make_node("a", register="[]", cards=0), [(WARN, "node a", "the node agent registers no card")]),
        # handshake within the window, or allocatable back: not excluded
        (
            make_node("a", device("G0"), allocatable=0, annotations={NODE_HANDSHAKE: handshake(60)}),
            [(OK, "node a", "1 card registered, all healthy")],
        ),
        (
            make_node("a", device("G0"), annotations={NODE_HANDSHAKE: handshake(3600)}),
            [(OK, "node a", "1 card registered, all healthy")],
        ),
        # an old Reported/Deleted stamp is not a pending request
        (
            make_node(
                "a",
                device("G0"),
                allocatable=0,
                annotations={NODE_HANDSHAKE: encode_handshake(HandshakeKind.DELETED, local_time(ago(600)))},
            ),
            [(OK, "node a", "1 card registered, all healthy")],
        ),
        (
            make_node(
                "a", labels={"gpu": "on"}, allocatable=0, annotations={NODE_HANDSHAKE: handshake(61)}, cards=0
            ),
            [
                (
                    FAIL,
                    "node a",
                    "labelled gpu=on but has no hami.io/node-nvidia-register: the node agent is not running "
                    "there or cannot write the Node",
                ),
                (
                    FAIL,
                    "node a",
                    f"handshake {handshake(61)!r} unanswered for 61 s and nvidia.com/gpu allocatable is 0: "
                    "the scheduler excludes the node",
                ),
            ],
        ),
    ],
)
def test_nodes(item: dict[str, Any], expected: list[tuple[Severity, str, str]]) -> None:
    found = [f for f in check_nodes([item], SETTINGS, local_now=LOCAL_NOW) if f.subject != "cluster"]
    assert brief(found) == expected


def test_node_registration_errors_quote_the_codec_and_no_gpu_node_warns() -> None:
    [bad] = check_nodes([make_node("a", register='[{"id": 5}]', cards=0)], SETTINGS, local_now=LOCAL_NOW)
    assert bad.severity is FAIL
    assert bad.message.startswith(
        "registration unreadable, the scheduler excludes the node: hami.io/node-nvidia-register "
        '"[{\\"id\\": 5}]"'
    )
    [none] = check_nodes([make_node("cpu", cards=0)], SETTINGS, local_now=LOCAL_NOW)
    assert brief([none]) == [
        (WARN, "cluster", "no node is labelled gpu=on or carries hami.io/node-nvidia-register")
    ]
    # the count resource (and so the allocatable looked at) comes from the device config
    config = DeviceConfig(resources=ResourceNames(count="example.com/vgpu"))
    stale = make_node("a", device("G0"), annotations={NODE_HANDSHAKE: handshake(90)})  # nvidia.com/gpu: 10
    found = check_nodes([stale], DoctorSettings(config=config), local_now=LOCAL_NOW)
    assert found[-1].message.endswith(
        "unanswered for 90 s and example.com/vgpu allocatable is 0: the scheduler excludes the node"
    )


# -------------------------------------------------------------------------------------------- locks


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (lock(300), None),  # exactly the timeout: not yet expired
        (lock(5, None, None), None),  # a fresh legacy lock is simply busy
        (
            lock(301),
            (
                WARN,
                "held by default/holder for 301 s, longer than the 300 s lock timeout: the next bind on "
                "the node takes it over",
            ),
        ),
        (
            lock(900, None, None),
            (
                WARN,
                "held by a legacy holder (no pod named) for 900 s, longer than the 300 s lock timeout: "
                "the next bind on the node takes it over",
            ),
        ),
        (
            lock(5, "default", "ghost"),
            (WARN, "held by default/ghost, which no longer exists (dangling): the next bind takes it over"),
        ),
        (
            BAD_LOCK,
            (
                FAIL,
                "unreadable node lock, every bind on the node fails: "
                + codec_error(decode_node_lock, BAD_LOCK),
            ),
        ),
    ],
)
def test_locks(value: str, expected: tuple[Severity, str] | None) -> None:
    found = check_locks(
        [make_node("n", annotations={NODE_LOCK: value}, cards=0)], {"default/holder"}, SETTINGS, now=NOW
    )
    if expected is None:
        assert brief(found) == [(OK, "cluster", "no node lock is unreadable, expired or dangling (1 held)")]
    else:
        assert brief(found) == [(expected[0], "node n", expected[1])]


def test_lock_timeout_is_a_setting() -> None:
    short = DoctorSettings(lock_timeout=datetime.timedelta(seconds=30))
    [found] = check_locks(
        [make_node("n", annotations={NODE_LOCK: lock(31)}, cards=0)], {"default/holder"}, short, now=NOW
    )
    assert found.message.startswith("held by default/holder for 31 s, longer than the 30 s lock timeout")


# --------------------------------------------------------------------------------------------- pods


@pytest.mark.parametrize(
    ("item", "expected"),
    [
        (make_pod("cpu", gpus=0, scheduler=None), []),  # asks for nothing of ours
        (make_pod("ok", annotations=placed("n", "G0", 1000, 10)), []),
        (make_pod("done", scheduler=None, phase="Succeeded"), []),  # finished pods are history
        (make_pod("young", annotations=placed("n", "G0", 1000, 10, phase="allocating", bound_ago=300)), []),
        (
            make_pod("old", annotations=placed("n", "G0", 1000, 10, phase="allocating", bound_ago=301)),
            [
                (
                    FAIL,
                    "bind-phase allocating for 301 s on n, longer than the 300 s lock timeout: the node "
                    "agent never finished the hand-off",
                )
            ],
        ),
        (
            make_pod("f", annotations=placed("n", "G0", 1000, 10, phase="failed")),
            [(WARN, "bind-phase failed on n")],
        ),
        (
            make_pod(
                "s",
                memory=None,
                cores=None,
                scheduler="default-scheduler",
                labels={"hami.io/webhook": "ignore"},
            ),
            [
                (
                    FAIL,
                    "asks for nvidia.com/gpu but its schedulerName is 'default-scheduler', not "
                    "'hami-scheduler' (labelled hami.io/webhook=ignore): the webhook did not route it",
                )
            ],
        ),
        (
            make_pod("p", annotations={"hami.io/bind-phase": "done"}),
            [
                (
                    FAIL,
                    f"unreadable bind state: {codec_error(decode_bind_phase, 'done')}",
                )
            ],
        ),
    ],
)
def test_pods(item: dict[str, Any], expected: list[tuple[Severity, str]]) -> None:
    found = check_pods([item], SETTINGS, now=NOW)
    if not expected:
        assert [f.severity for f in found] == [OK]
    else:
        assert [(f.severity, f.message) for f in found] == expected


def test_gpu_resources_in_requests_and_init_containers_count() -> None:
    item = make_pod("init", gpus=0, scheduler="other")
    item["spec"]["initContainers"] = [{"name": "i", "resources": {"requests": {"nvidia.com/gpumem": "100"}}}]
    [found] = check_pods([item], SETTINGS, now=NOW)
    assert found.message.startswith("asks for nvidia.com/gpumem but its schedulerName is 'other'")
    # our own scheduler name, as configured, is fine
    assert check_pods([item], DoctorSettings(scheduler_name="other"), now=NOW)[0].severity is OK


# -------------------------------------------------------------------------------------------- usage


def state(*cards: DeviceState) -> NodeState:
    return NodeState(name="n", devices=cards)


@pytest.mark.parametrize(
    ("used", "expected"),
    [
        ({"used": 10, "used_mem": 10000, "used_cores": 100}, None),  # full to the brim is fine
        ({"used": 11, "used_mem": 100, "used_cores": 0}, "slots 11/10"),
        ({"used": 2, "used_mem": 10001, "used_cores": 101}, "memory 10001/10000 MiB, cores 101/100%"),
    ],
)
def test_usage(used: dict[str, Any], expected: str | None) -> None:
    found = check_usage([state(DeviceState(device=device("G0"), **used))], {("n", "G0"): ["ns/b", "ns/a"]})
    if expected is None:
        assert brief(found) == [
            (OK, "cluster", "no card is granted beyond its memory, cores or slots (1 card)")
        ]
    else:
        assert brief(found) == [
            (FAIL, "node n card G0", f"granted beyond the card: {expected} (pods ns/a, ns/b)")
        ]


def test_exit_code_and_line() -> None:
    warn = finding(WARN, "lock", "node n", "held", "wait")
    assert exit_code([finding(OK, "pod", "cluster", "fine"), warn]) == 0
    assert exit_code([warn, finding(FAIL, "pod", "pod a/b", "bad")]) == 1
    assert warn.line() == "WARN  lock     node n: held -> wait"
    assert finding(OK, "usage", "cluster", "fine").line() == "OK    usage    cluster: fine"
