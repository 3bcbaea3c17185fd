"""The kube-scheduler stand-in's queue rules, as tables: which event moves a parked pod with which
rejectors, with queueing hints on and off (docs/scheduler.md, "Waking pending pods")."""

from __future__ import annotations

from typing import Any, cast

import pytest

from hami_testkit.scheduler_standin import (
    _QUEUE_ORDER,
    EXTENDER,
    Attempt,
    SchedulerStandIn,
    node_update_actions,
    pod_updated,
    requeues,
)
from tests.builders import make_pod

NODE_EVENTS = ["Add", "UpdateNodeAllocatable", "UpdateNodeLabel", "UpdateNodeTaint", "UpdateNodeCondition",
               "UpdateNodeAnnotation"]  # fmt: skip


@pytest.mark.parametrize("hints", [True, False])
@pytest.mark.parametrize("action", NODE_EVENTS)
def test_an_extender_rejection_is_moved_by_every_node_event(hints: bool, action: str) -> None:
    assert requeues({EXTENDER}, "Node", [action], queueing_hints=hints)


@pytest.mark.parametrize("hints", [True, False])
def test_an_extender_rejection_is_moved_by_an_assigned_pod_deleted(hints: bool) -> None:
    assert requeues({EXTENDER, "NodeAffinity"}, "AssignedPod", ["Delete"], queueing_hints=hints)
    assert not requeues({"NodeAffinity"}, "AssignedPod", ["Delete"], queueing_hints=hints)


def test_the_pods_own_update_moves_it_when_a_rejector_registers_pod_updates_or_hints_are_off() -> None:
    assert requeues({EXTENDER}, "UnschedulablePod", ["Update"], queueing_hints=True)
    assert not requeues({"NodeAffinity"}, "UnschedulablePod", ["Update"], queueing_hints=True)
    assert requeues({"NodeAffinity"}, "UnschedulablePod", ["Update"], queueing_hints=False)


def test_in_tree_rejectors_register_only_their_node_events() -> None:
    # NodeAffinity: Add|UpdateNodeLabel with hints; without, also UpdateNodeTaint
    assert not requeues({"NodeAffinity"}, "Node", ["UpdateNodeAnnotation"], queueing_hints=True)
    assert not requeues({"NodeAffinity"}, "Node", ["UpdateNodeTaint"], queueing_hints=True)
    assert requeues({"NodeAffinity"}, "Node", ["UpdateNodeTaint"], queueing_hints=False)
    assert requeues({"NodeAffinity"}, "Node", ["UpdateNodeLabel"], queueing_hints=True)
    assert not requeues({"NodeUnschedulable"}, "Node", ["UpdateNodeAnnotation"], queueing_hints=False)


def _node(**changes: Any) -> dict[str, Any]:
    node: dict[str, Any] = {
        "metadata": {"name": "n", "labels": {"a": "1"}, "annotations": {"x": "1"}},
        "spec": {},
        "status": {
            "allocatable": {"nvidia.com/gpu": "10"},
            "conditions": [{"type": "Ready", "status": "True"}],
        },
    }
    for key, value in changes.items():
        part, field = key.split("__")
        node[part][field] = value
    return node


def test_a_node_update_is_classified_as_kube_scheduler_does() -> None:
    old = _node()
    assert node_update_actions(old, _node()) == []
    assert node_update_actions(old, _node(metadata__annotations={"x": "2"})) == ["UpdateNodeAnnotation"]
    assert node_update_actions(old, _node(metadata__labels={"a": "2"})) == ["UpdateNodeLabel"]
    assert node_update_actions(old, _node(status__allocatable={"nvidia.com/gpu": "20"})) == [
        "UpdateNodeAllocatable"
    ]
    cordoned = _node(spec__unschedulable=True)
    assert node_update_actions(old, cordoned) == []  # only becoming schedulable is an event
    assert node_update_actions(cordoned, old) == ["UpdateNodeTaint"]


def test_a_pod_is_updated_when_it_changes_outside_its_status() -> None:
    pod: dict[str, Any] = {"metadata": {"name": "p", "resourceVersion": "1", "annotations": {}}, "spec": {},
                           "status": {}}  # fmt: skip
    assert not pod_updated(pod, {**pod, "status": {"conditions": [{"type": "PodScheduled"}]}})
    assert not pod_updated(pod, {**pod, "metadata": {**pod["metadata"], "resourceVersion": "2"}})
    assert pod_updated(pod, {**pod, "metadata": {**pod["metadata"], "annotations": {"k": "v"}}})


def _arrive(standin: SchedulerStandIn, pod: dict[str, Any]) -> None:
    """What the stand-in's pod watch does with a new pod (its queue order: first sight)."""
    standin.pods[(pod["metadata"]["namespace"], pod["metadata"]["name"])] = pod
    standin._arrived.setdefault(pod["metadata"]["uid"], next(_QUEUE_ORDER))


def _rejected(standin: SchedulerStandIn, pod: dict[str, Any]) -> None:
    """An attempt that found no node, with no rejector to wait for: queued again at once."""
    attempt = Attempt(kind="unschedulable", message="0/1 nodes are available", generation=0, retry_at=1e9)
    attempt.requeued = "ScheduleAttemptFailure"
    standin.attempts[pod["metadata"]["uid"]] = attempt


def test_equal_priorities_go_by_the_time_each_pod_entered_the_queue() -> None:
    """kube-scheduler's PrioritySort: priority, then the queue timestamp, which a failed attempt renews.
    A rejected pod goes behind the pods that arrived before its rejection (by creation order instead, a
    burst's rejected pods were tried again ahead of the thousands never tried: bench_faults' quota burst
    left 4,761 of 5,000 pods unattempted)."""
    standin = SchedulerStandIn(cast(Any, None), cast(Any, None), "http://127.0.0.1:1")
    first, second, third = make_pod("first"), make_pod("second"), make_pod("third")
    for pod in (first, second, third):
        _arrive(standin, pod)
    assert standin._next(0.0)[0] is first
    _rejected(standin, first)
    assert standin._next(0.0)[0] is second  # first went to the back
    _rejected(standin, second)
    assert standin._next(0.0)[0] is third
    _rejected(standin, third)
    assert standin._next(0.0)[0] is first  # every one tried once: the earliest rejection first
    urgent = make_pod("urgent")
    urgent["spec"]["priority"] = 1000
    _arrive(standin, urgent)
    assert standin._next(0.0)[0] is urgent  # priority before order
