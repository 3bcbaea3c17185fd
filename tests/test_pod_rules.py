"""The pod rules every reader shares, each declared once (issue 23, finding 5): priority, start time,
finished phases, the init-first container order (``hami.objects``) and a container's card count
(``hami.core.requests.card_count``); and the former call sites, now reading through them, agree."""

from __future__ import annotations

import math
from typing import Any

import pytest

from hami import objects
from hami.annotations import parse_pod_containers
from hami.annotations.holding import Why, holding
from hami.core.requests import card_count, parse_container
from hami.scheduler.podrecords import pod_meta
from hami.settings import DeviceConfig
from hami_testkit.preemption_rules import victim
from nodeagent.allocate_rules import container_names
from nodeagent.handout import asked_count


def _pod(
    name: str = "p", *, priority: Any = None, start: Any = None, created: str = "", phase: str = ""
) -> Any:
    pod: dict[str, Any] = {"metadata": {"name": name, "namespace": "ns", "uid": f"u-{name}"}, "spec": {}}
    if created:
        pod["metadata"]["creationTimestamp"] = created
    if priority is not None:
        pod["spec"]["priority"] = priority
    status: dict[str, Any] = {}
    if start is not None:
        status["startTime"] = start
    if phase:
        status["phase"] = phase
    pod["status"] = status
    return pod


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (None, 0),
        (7, 7),
        (-5, -5),
        (2**31 - 1, 2**31 - 1),
        (-(2**31), -(2**31)),
        (2**31, 0),  # beyond int32: kube-apiserver never stores it; read as absent
        (-(2**31) - 1, 0),
        (True, 0),
        ("7", 0),
        (7.0, 0),
    ],
)
def test_priority_is_an_int32_else_zero(value: Any, expected: int) -> None:
    assert objects.priority(_pod(priority=value)) == expected


@pytest.mark.parametrize("value", [None, 3, 2**31, -(2**31) - 1, True, "1"])
def test_the_extender_and_the_preemption_standin_read_one_priority(value: Any) -> None:
    pod = _pod(priority=value)
    assert pod_meta(pod).priority == victim(pod, now=0.0).priority == objects.priority(pod)


@pytest.mark.parametrize(
    ("start", "expected"),
    [
        ("2026-01-01T00:00:10Z", 1767225610.0),
        ("2026-01-01T00:00:10", 1767225610.0),  # no zone: UTC, as the API server writes it
        (None, 42.0),
        ("soon", 42.0),
        (17, 42.0),
        ("2026-01-01T00:00:10Z" + " " * 64, 42.0),  # overlong: not parsed
    ],
)
def test_start_time_is_status_start_time_else_now(start: Any, expected: float) -> None:
    assert objects.start_time(_pod(start=start), now=42.0) == expected


def test_a_pod_not_started_ranks_youngest_for_the_extender_as_for_kube_scheduler() -> None:
    """kube-scheduler's MoreImportantPod: higher priority first, then the earlier GetPodStartTime
    (``status.startTime``, else now). A bound pod not started yet is the youngest even when it was
    created long ago (the extender used to read its creationTimestamp and rank it oldest)."""
    pods = [
        _pod("fresh-start", start="2026-01-01T00:10:00Z", created="2026-01-01T00:09:00Z"),
        _pod("not-started", created="2020-01-01T00:00:00Z"),
        _pod("old-start", start="2026-01-01T00:00:00Z", created="2025-12-31T00:00:00Z"),
        _pod("important", priority=10, created="2020-01-01T00:00:00Z"),
    ]
    now = 1_900_000_000.0  # later than every start above, as kube-scheduler's clock is
    standin = sorted(pods, key=lambda p: (-victim(p, now).priority, victim(p, now).started))
    extender = sorted(pods, key=lambda p: (-pod_meta(p).priority, pod_meta(p).started))
    expected = ["important", "old-start", "fresh-start", "not-started"]
    assert [objects.name(p) for p in standin] == expected
    assert [objects.name(p) for p in extender] == expected
    assert math.isinf(pod_meta(pods[1]).started)


@pytest.mark.parametrize(
    ("phase", "done"),
    [
        ("Succeeded", True),
        ("Failed", True),
        ("Running", False),
        ("Pending", False),
        ("Unknown", False),
        ("", False),
    ],
)
def test_finished_phases(phase: str, done: bool) -> None:
    pod = _pod(phase=phase)
    assert objects.finished(pod) is done
    assert {"Succeeded", "Failed"} == objects.FINISHED_PHASES
    # the grant rule reads it too: a finished pod holds nothing, whatever its annotations
    pod["metadata"]["annotations"] = {"hami.io/vgpu-node": "n1", "hami.io/vgpu-devices-allocated": "x"}
    assert (holding(pod).why is Why.FINISHED) is done


def test_containers_are_ordered_init_first_and_every_reader_agrees() -> None:
    pod: Any = {
        "spec": {
            "containers": [
                {"name": "a", "resources": {"limits": {"nvidia.com/gpu": "1"}}},
                "junk",
                {"name": "b"},
            ],
            "initContainers": [{"name": "i1"}, 3, {"name": "i2"}],
        }
    }
    names = [c.get("name") for c in objects.containers_init_first(pod)]
    assert names == ["i1", "i2", "a", "b"]
    assert list(container_names(pod)) == names  # the node agent's walk
    assert [c.name for c in parse_pod_containers(pod, DeviceConfig())] == names  # the codec's request


@pytest.mark.parametrize(
    ("limits", "requests", "expected"),
    [
        ({}, {}, 0),
        ({"nvidia.com/gpu": "2"}, {}, 2),
        ({}, {"nvidia.com/gpu": "3"}, 3),
        ({"nvidia.com/gpu": "2"}, {"nvidia.com/gpu": "5"}, 2),  # limits first, as HAMi reads it
        ({"nvidia.com/gpu": "0"}, {}, 0),
        ({"nvidia.com/gpu": "1e1"}, {}, 10),  # a whole quantity: the scheduler books 10 cards for it
        ({"nvidia.com/gpu": "0.5"}, {}, None),
        ({"nvidia.com/gpu": "two"}, {}, None),
        ({"nvidia.com/gpu": "-1"}, {}, None),
    ],
)
def test_one_card_count_reader(
    limits: dict[str, str], requests: dict[str, str], expected: int | None
) -> None:
    assert card_count("nvidia.com/gpu", limits, requests) == expected
    container = {"name": "c", "resources": {"limits": limits, "requests": requests}}
    assert asked_count(container, "nvidia.com/gpu") == expected  # the node agent's hand-out check
    parsed = parse_container("c", limits, requests, DeviceConfig()).request
    if expected:  # the scheduler's request asks for the same number of cards
        assert parsed is not None and parsed.nums == expected
    else:
        assert parsed is None


def test_the_hand_out_reads_plain_numbers_and_odd_shapes_as_text() -> None:
    assert asked_count({"resources": {"limits": {"nvidia.com/gpu": 2}}}, "nvidia.com/gpu") == 2
    assert asked_count({"resources": "junk"}, "nvidia.com/gpu") == 0
    assert asked_count({"resources": {"limits": []}}, "nvidia.com/gpu") == 0
