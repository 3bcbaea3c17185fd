"""/bind refuses what is not a pending pod of ours, and never writes to it (security: the extender's
verbs; issue "Trust boundaries", finding 1): a pod already bound (running GPU pods included), a pod
naming another scheduler (GPU-less ones included), a pod that is not Pending or is being deleted, a
recreated pod. A retry of a bind that already happened answers success without writing."""

from __future__ import annotations

from typing import Any

import kmock
import pytest

from hami.annotations import NODE_LOCK, POD_BIND_PHASE, POD_DEVICES_ALLOCATED, POD_VGPU_NODE
from tests.builders import make_node, make_pod

from .faults import conflicting_bindings
from .kit import Extender, StartExtender

PODS = kmock.resource("v1/pods")
NODES = kmock.resource("v1/nodes")
EVENTS = kmock.resource("v1/events")
GRANT = "GPU-n2-0,NVIDIA,6000,30:;"


def running_gpu_pod(name: str = "p", node: str = "n2") -> dict[str, Any]:
    """A GPU pod bound to ``node`` by our scheduler and running there (its grant names n2's card)."""
    pod = make_pod(name, memory=6000)
    pod["metadata"]["annotations"] = {
        POD_VGPU_NODE: node,
        POD_DEVICES_ALLOCATED: GRANT,
        "hami.io/vgpu-devices-to-allocate": ";",
        POD_BIND_PHASE: "success",
        "hami.io/bind-time": "1777629600",
    }
    pod["metadata"]["labels"] = {POD_VGPU_NODE: node}
    pod["spec"]["nodeName"] = node
    pod["status"] = {"phase": "Running"}
    return pod


def writes(ext: Extender) -> dict[str, int]:
    """Every write the extender made to pods and nodes, and the Events it recorded."""
    return {
        "pod patches": len(ext.apiserver["patch", PODS]),
        "bindings": len(ext.apiserver["post", PODS, kmock.subresource("binding")]),
        "node patches": len(ext.apiserver["patch", NODES]),
        "events": len(ext.apiserver["post", EVENTS]),
    }


NONE = {"pod patches": 0, "bindings": 0, "node patches": 0, "events": 0}


async def _start(start_extender: StartExtender, *pods: dict[str, Any]) -> Extender:
    ext = await start_extender(nodes=[make_node("n1"), make_node("n2")], pods=list(pods))
    conflicting_bindings(ext.apiserver)
    return ext


async def test_a_running_gpu_pod_is_never_rebound_or_rewritten(start_extender: StartExtender) -> None:
    ext = await _start(start_extender, running_gpu_pod())
    before = await ext.pod("p")
    result = await ext.bind("p", "n1")
    assert result["Error"] == "pod default/p is already bound to node n2: refused"
    await ext.settle()
    assert writes(ext) == NONE
    assert await ext.pod("p") == before  # its grant on n2's card still counts there
    assert ext.ctx.snapshot.record(("default", "p")) is not None
    assert ext.ctx.snapshot.record(("default", "p")).node == "n2"  # type: ignore[union-attr]


@pytest.mark.parametrize("gpus", [0, 1], ids=["gpu-less", "gpu"])
@pytest.mark.parametrize(
    "scheduler", ["default-scheduler", "volcano", None], ids=["default", "volcano", "unset"]
)
async def test_a_pod_of_another_scheduler_is_never_bound(
    start_extender: StartExtender, gpus: int, scheduler: str | None
) -> None:
    pod = make_pod("p", gpus=gpus)
    if scheduler is None:
        del pod["spec"]["schedulerName"]  # the API server's default is default-scheduler
    else:
        pod["spec"]["schedulerName"] = scheduler
    ext = await _start(start_extender, pod)
    result = await ext.bind("p", "n1")
    named = scheduler or "default-scheduler"
    assert result["Error"] == f"pod default/p names scheduler {named!r}, not 'hami-scheduler': refused"
    await ext.settle()
    assert writes(ext) == NONE
    stored = await ext.pod("p")
    assert "nodeName" not in stored["spec"]
    assert stored["metadata"]["annotations"] == {}


@pytest.mark.parametrize("phase", ["Failed", "Succeeded", "Unknown"])
async def test_a_pod_that_is_not_pending_is_never_bound(start_extender: StartExtender, phase: str) -> None:
    pod = make_pod("p")
    pod["status"] = {"phase": phase}
    ext = await _start(start_extender, pod)
    result = await ext.bind("p", "n1")
    assert result["Error"] == f"pod default/p is {phase}, not Pending: refused"
    await ext.settle()
    assert writes(ext) == NONE


async def test_a_pod_being_deleted_is_never_bound(start_extender: StartExtender) -> None:
    pod = make_pod("p")
    pod["metadata"]["deletionTimestamp"] = "2026-05-01T09:59:00Z"
    pod["metadata"]["finalizers"] = ["example.com/keep"]
    ext = await _start(start_extender, pod)
    result = await ext.bind("p", "n1")
    assert result["Error"] == "pod default/p is being deleted: refused"
    await ext.settle()
    assert writes(ext) == NONE


async def test_a_recreated_pod_is_never_written(start_extender: StartExtender) -> None:
    pod = make_pod("p")
    pod["metadata"]["uid"] = "uid-of-the-new-pod"
    ext = await _start(start_extender, pod)
    result = await ext.bind("p", "n1")  # kube-scheduler's request names the old uid-p
    assert result["Error"] == "pod default/p was recreated (uid uid-of-the-new-pod, not uid-p): refused"
    await ext.settle()
    assert writes(ext) == NONE


async def test_a_retried_bind_of_a_pod_already_bound_here_succeeds_without_writing(
    start_extender: StartExtender,
) -> None:
    # kube-scheduler lost our answer and asks again: the pod is bound to n2 with our grant for n2
    pod = running_gpu_pod()
    pod["status"] = {"phase": "Pending"}
    pod["metadata"]["annotations"][POD_BIND_PHASE] = "allocating"
    ext = await _start(start_extender, pod)
    assert await ext.bind("p", "n2") == {"Error": ""}
    await ext.settle()
    assert writes(ext) == NONE


async def test_a_gpu_less_pod_bound_here_by_someone_else_is_not_claimed(
    start_extender: StartExtender,
) -> None:
    pod = make_pod("p", gpus=0)
    pod["spec"]["nodeName"] = "n1"
    ext = await _start(start_extender, pod)
    result = await ext.bind("p", "n1")
    assert result["Error"] == "pod default/p is already bound to node n1: refused"
    assert writes(ext) == NONE


async def test_refusals_are_counted(start_extender: StartExtender) -> None:
    other = make_pod("other", gpus=0)
    other["spec"]["schedulerName"] = "default-scheduler"
    ext = await _start(start_extender, running_gpu_pod(), other)
    await ext.bind("p", "n1")
    await ext.bind("other", "n1")
    assert ext.ctx.metrics.binds.labels("refused")._value.get() == 2
    assert ext.ctx.metrics.binds.labels("success")._value.get() == 0
    node = await ext.node("n1")
    assert NODE_LOCK not in (node["metadata"].get("annotations") or {})
