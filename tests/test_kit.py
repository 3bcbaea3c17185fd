"""The test kit itself: the raw-object builders read back through the codec and the API server, and the
bounded wait's bound, progress, liveness and failure message."""

from __future__ import annotations

import time
from collections.abc import Iterator

import kmock
import pytest

from hami.annotations import NODE_HANDSHAKE, NODE_REGISTER, decode_node_devices, decode_node_lock
from tests.builders import (
    HANDSHAKE,
    NOW,
    ago,
    card,
    create,
    device,
    lock,
    make_node,
    make_pod,
    webhook_config,
)
from tests.eventually import MAX_SCALE, SCALE_ENV, eventually, time_scale


# ------------------------------------------------------------------------------------------- builders
def test_a_node_with_cards_is_registered_through_the_codec() -> None:
    node = make_node("n1", cards=3, memory=5000, count=4)
    annotations = node["metadata"]["annotations"]
    cards = decode_node_devices(annotations[NODE_REGISTER])
    assert [(c.uuid, c.index, c.memory_mib, c.count) for c in cards] == [
        (f"GPU-n1-{i}", i, 5000, 4) for i in range(3)
    ]
    assert annotations[NODE_HANDSHAKE] == HANDSHAKE
    assert node["status"]["allocatable"] == {"nvidia.com/gpu": "12"}


def test_given_devices_replace_the_counted_cards_and_no_cards_means_no_agent() -> None:
    given = make_node("a", device("G0", health=False), card("a", 1))
    assert [c.uuid for c in decode_node_devices(given["metadata"]["annotations"][NODE_REGISTER])] == [
        "G0",
        "GPU-a-1",
    ]
    bare = make_node("cpu", cards=0, labels={"gpu": "on"})
    assert bare["metadata"] == {"name": "cpu", "annotations": {}, "labels": {"gpu": "on"}}
    assert bare["status"]["allocatable"] == {"nvidia.com/gpu": "0"}


def test_a_lock_value_decodes_to_its_holder_and_time() -> None:
    value = decode_node_lock(lock(30, "team", "p"))
    assert (value.time, value.namespace, value.name) == (ago(30), "team", "p")
    assert ago(0) == NOW


def test_a_pod_asks_what_it_is_told() -> None:
    pod = make_pod("p", gpus=2, memory=None, namespace="team", node="n1", phase="Running")
    assert pod["spec"] == {
        "containers": [
            {
                "name": "main",
                "image": "cuda",
                "resources": {"limits": {"nvidia.com/gpu": "2", "nvidia.com/gpucores": "30"}},
            }
        ],
        "schedulerName": "hami-scheduler",
        "nodeName": "n1",
    }
    assert pod["metadata"]["uid"] == "uid-p" and pod["status"] == {"phase": "Running"}
    assert "resources" not in make_pod("cpu", gpus=0)["spec"]["containers"][0]
    assert "schedulerName" not in make_pod("bare", scheduler=None)["spec"]


async def test_created_objects_are_stored_where_the_api_serves_them(
    apiserver: kmock.KubernetesEmulator,
) -> None:
    await create(apiserver, make_node("n1"), make_pod("p", namespace="team"), webhook_config())
    node = await (await apiserver.get("/api/v1/nodes/n1")).json()
    pod = await (await apiserver.get("/api/v1/namespaces/team/pods/p")).json()
    mwc = await (
        await apiserver.get(
            "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations/hami-webhook"
        )
    ).json()
    assert node["metadata"]["annotations"][NODE_HANDSHAKE] == HANDSHAKE
    assert pod["spec"]["schedulerName"] == "hami-scheduler"
    assert mwc["webhooks"][0]["clientConfig"]["caBundle"] == "Y2E="


# ------------------------------------------------------------------------------------------ eventually
@pytest.fixture
def idle(monkeypatch: pytest.MonkeyPatch) -> None:
    """A machine that reads as idle, so bounds are not stretched."""
    monkeypatch.delenv(SCALE_ENV, raising=False)
    monkeypatch.setattr("os.getloadavg", lambda: (0.0, 0.0, 0.0))


async def test_returns_the_first_truthy_answer() -> None:
    answers: Iterator[int | bool | list[int] | None] = iter([None, False, 0, [], 7])

    async def probe() -> int | bool | list[int] | None:
        return next(answers)

    assert await eventually(probe, "an answer") == 7
    assert await eventually(lambda: "done", "a plain condition") == "done"


async def test_fails_after_the_bound_naming_what_and_the_last_result(idle: None) -> None:
    started = time.monotonic()
    with pytest.raises(AssertionError) as failure:
        await eventually(lambda: False, "the moon to turn blue", within=0.1)
    assert time.monotonic() - started >= 0.1
    assert "timed out waiting for the moon to turn blue" in str(failure.value)
    assert "last result False" in str(failure.value)


async def test_the_bound_starts_again_at_each_step_of_progress(idle: None) -> None:
    polls: list[float] = []

    def condition() -> bool:
        polls.append(time.monotonic())
        return len(polls) >= 40

    started = time.monotonic()
    assert await eventually(condition, "40 polls", within=0.2, progress=lambda: len(polls), interval=0.02)
    assert time.monotonic() - started > 0.2  # longer than the bound: each poll was progress

    steps: list[int] = []

    def stalls_after_three() -> bool:
        steps.append(min(len(steps) + 1, 3))
        return False

    with pytest.raises(AssertionError, match=r"progress 3\b"):  # it moved to 3, then the bound ran out
        await eventually(
            stalls_after_three, "nothing", within=0.1, progress=lambda: steps[-1] if steps else 0
        )


async def test_a_dead_dependency_fails_at_once() -> None:
    def alive() -> None:
        raise RuntimeError("the child exited with code 1")

    started = time.monotonic()
    with pytest.raises(RuntimeError, match="exited"):
        await eventually(lambda: False, "nothing", within=60, alive=alive)
    assert time.monotonic() - started < 30


def test_the_scale_follows_the_load_and_the_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(SCALE_ENV, raising=False)
    monkeypatch.setattr("os.cpu_count", lambda: 2)
    monkeypatch.setattr("os.getloadavg", lambda: (0.5, 0.0, 0.0))
    assert time_scale() == 1.0  # never shorter than on an idle machine
    monkeypatch.setattr("os.getloadavg", lambda: (6.0, 0.0, 0.0))
    assert time_scale() == 3.0
    monkeypatch.setattr("os.getloadavg", lambda: (1000.0, 0.0, 0.0))
    assert time_scale() == MAX_SCALE
    monkeypatch.setenv(SCALE_ENV, "2")
    assert time_scale() == 2 * MAX_SCALE
