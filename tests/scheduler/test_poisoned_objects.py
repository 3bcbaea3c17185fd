"""One hostile object never stops the scheduler: a list holding a poisoned Node, Pod or ResourceQuota
still makes the snapshot ready, /filter still judges the other nodes, the bad node is excluded with a
Warning Event, and the watch goes on (issue 11, finding 4; duplicate card ids: finding 5)."""

from __future__ import annotations

import time
from typing import Any

import kmock

from hami.annotations import (
    NODE_REGISTER,
    POD_DEVICES_ALLOCATED,
    POD_MIG_ALLOCATIONS,
    POD_VGPU_NODE,
    POD_VGPU_TIME,
    encode_node_devices,
)
from hami.core.model import NamespaceQuota
from tests.builders import card, make_node, make_pod
from tests.eventually import eventually, time_scale

from .kit import StartExtender

EVENTS = kmock.resource("v1/events")
MEM = "limits.nvidia.com/gpumem"
CORES = "limits.nvidia.com/gpucores"
HUGE = "9" * 5000  # beyond Python's int-from-str limit (4,300 digits)
DEEP = "[" * 50_000 + "]" * 50_000  # beyond the json module's recursion limit


def _events(ext: Any, reason: str) -> dict[str, str]:
    """involved object name -> message of the Events with ``reason`` the extender created."""
    return {
        r.data["involvedObject"]["name"]: r.data["message"]
        for r in ext.apiserver["post", EVENTS]
        if r.data["reason"] == reason
    }


def _quota(name: str, namespace: str, hard: dict[str, str]) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ResourceQuota",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"hard": hard},
    }


def _tracked(name: str, node: str, allocated: str, **more: str) -> dict[str, Any]:
    annotations = {POD_VGPU_NODE: node, POD_VGPU_TIME: "1700000000", POD_DEVICES_ALLOCATED: allocated, **more}
    pod = make_pod(name, annotations=annotations)
    pod["spec"]["nodeName"] = node
    pod["status"] = {"phase": "Running"}
    return pod


async def test_poisoned_objects_in_the_lists_leave_the_scheduler_ready_and_filtering(
    start_extender: StartExtender,
) -> None:
    legacy = f"GPU-x-0,{HUGE},1000,100,NVIDIA,0,true:"
    twice = card("twice", 0)
    duplicated = encode_node_devices([twice, card("twice", 1), twice])  # one card registered twice
    started = time.perf_counter()
    ext = await start_extender(
        nodes=[
            make_node("good"),
            make_node("huge-number", register=legacy),
            make_node("deep-json", register=DEEP),
            make_node("twice", register=duplicated),
        ],
        pods=[
            _tracked("uses-good", "good", "GPU-good-0,NVIDIA,1000,30:;"),
            _tracked("huge", "good", f"GPU-good-1,NVIDIA,{HUGE},30:;"),
            _tracked("deep-mig", "good", "GPU-good-1,NVIDIA,1000,30:;", **{POD_MIG_ALLOCATIONS: DEEP}),
        ],
        quotas=[
            _quota("huge", "team", {MEM: "1" * 5000, CORES: "20"}),
            _quota("exponent", "lab", {MEM: "1e10000000"}),  # valid syntax; computed exactly: 32 s
            _quota("fine", "capped", {MEM: "500"}),
        ],
    )
    # the fixture waited for readiness: every list completed, in well under the exact 1e10000000 (both
    # slow down alike on a loaded machine)
    assert time.perf_counter() - started < 10 * time_scale()

    result = await ext.filter(make_pod("p", memory=1000), ["good", "huge-number", "deep-json", "twice"])
    assert result["Error"] == ""
    assert result["NodeNames"] == ["good"]
    failed = result["FailedAndUnresolvableNodes"]
    assert set(failed) == {"huge-number", "deep-json", "twice"}
    assert "count" in failed["huge-number"]
    assert "nested deeper than" in failed["deep-json"]
    assert f"duplicate card id '{twice.uuid}'" in failed["twice"]

    # the readable pod counts; the unreadable ones are not counted (and logged), the MIG one fails closed
    tracked = ext.ctx.snapshot.tracked()
    assert ("default", "uses-good") in tracked
    assert ("default", "huge") not in tracked
    # quotas: the unreadable values are ignored, the readable ones still apply
    assert ext.ctx.snapshot.quotas.quota("team") == NamespaceQuota(cores_limit=20)
    assert ext.ctx.snapshot.quotas.quota("lab") is None
    capped = await ext.filter(make_pod("q", memory=1000, namespace="capped"), ["good"])
    assert capped["NodeNames"] == [] and "quota" in str(capped).lower()

    # each bad node has a Warning Event naming the problem
    await ext.settle()
    events = _events(ext, "InvalidNodeRegistration")
    assert set(events) == {"huge-number", "deep-json", "twice"}
    assert twice.uuid in events["twice"]

    # the watches go on: a new node after all that is seen and used
    await ext.apiserver.post("/api/v1/nodes", json=make_node("late"))
    await eventually(lambda: ext.ctx.snapshot.problem("late", ext.ctx.clock()) is None, "the late node")
    again = await ext.filter(make_pod("r", memory=1000), ["late", "deep-json"])
    assert again["NodeNames"] == ["late"]


async def test_objects_of_hostile_shapes_are_read_not_skipped(
    start_extender: StartExtender,
) -> None:
    """Not only unreadable annotations: objects of shapes kube-apiserver never stores (the embedded API
    server validates nothing) are read through hami.objects, a field of the wrong JSON type as absent.
    A Node so shaped is excluded with its reason (``NodeMalformed``) and an InvalidNodeRegistration
    Warning Event; a pod whose ``initContainers`` is not a list has none; the rest of each list is
    applied and nothing is skipped (before: the watch skipped both with an AttributeError/TypeError)."""
    odd_node = make_node("odd")
    odd_node["status"] = {"allocatable": "not a map"}
    int_register = make_node("int-register")
    int_register["metadata"]["annotations"][NODE_REGISTER] = 5
    odd_pod = _tracked("odd-pod", "other", "GPU-other-1,NVIDIA,1000,30:;")
    odd_pod["spec"]["initContainers"] = 5  # no container list has a length of its own
    ext = await start_extender(
        nodes=[make_node("good"), odd_node, int_register, make_node("other")],
        pods=[odd_pod, _tracked("counted", "other", "GPU-other-0,NVIDIA,1000,30:;")],
    )
    result = await ext.filter(make_pod("p", memory=1000), ["good", "odd", "int-register", "other"])
    assert result["NodeNames"] == ["good", "other"]
    failed = result["FailedAndUnresolvableNodes"]
    assert failed == {
        "odd": "node unregistered: status.allocatable is not an object",
        "int-register": f"node unregistered: annotation {NODE_REGISTER} is not a string",
    }
    assert set(ext.ctx.snapshot.tracked()) == {("default", "counted"), ("default", "odd-pod")}
    await ext.settle()
    assert _events(ext, "SkippedByGPUScheduler") == {}
    events = _events(ext, "InvalidNodeRegistration")
    assert events == {
        "odd": "node excluded from GPU scheduling: status.allocatable is not an object",
        "int-register": f"node excluded from GPU scheduling: annotation {NODE_REGISTER} is not a string",
    }
    # repaired, the node is used again
    register = make_node("int-register")["metadata"]["annotations"][NODE_REGISTER]
    repair = {"metadata": {"annotations": {NODE_REGISTER: register}}}
    response = await ext.apiserver.patch("/api/v1/nodes/int-register", json=repair)
    assert response.status == 200
    await eventually(lambda: ext.ctx.snapshot.problem("int-register", ext.ctx.clock()) is None, "the repair")
