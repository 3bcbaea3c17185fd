"""/bind over HTTP against the embedded API server: the writes, the node lock, races and API failures."""

from __future__ import annotations

import asyncio
from functools import partial
from typing import Any

import kmock
import pytest

from hami.annotations import NODE_LOCK, POD_BIND_PHASE, decode_node_lock, decode_pod_devices
from hami.core.model import NodeState
from hami.kube.nodelock import release_node_lock
from hami.scheduler.snapshot import local_time
from hami_testkit.restapi import Response  # kmock.Response (exported, not in its __all__)
from tests.builders import NOW, make_node, make_pod
from tests.eventually import eventually

from .faults import FaultProxy, pod_write, proxy_fixture  # noqa: F401  (the `proxy` fixture)
from .kit import Extender, StartExtender

PODS = kmock.resource("v1/pods")
EVENTS = kmock.resource("v1/events")
STAMP = str(int(NOW.timestamp()))  # vgpu-time and bind-time: Unix seconds of the (fixed) clock
LOCK = "2026-05-01T10:00:00Z,default,p"


def _events(ext: Extender, reason: str) -> list[dict[str, Any]]:
    return [r.data for r in ext.apiserver["post", EVENTS] if r.data["reason"] == reason]


async def _lock(ext: Extender, node: str = "n1") -> str | None:
    value: str | None = ((await ext.node(node))["metadata"].get("annotations") or {}).get(NODE_LOCK)
    return value


async def test_bind_writes_exactly_the_protocol_and_keeps_the_lock(start_extender: StartExtender) -> None:
    seeded = make_pod("p", memory=1000, cores=30)
    seeded["metadata"].pop("labels", None)  # no label map: the patch tests the whole metadata as read
    ext = await start_extender(nodes=[make_node("n1")], pods=[seeded])
    assert await ext.bind("p", "n1") == {"Error": ""}
    pod = await ext.pod("p")
    # both cards idle with equal scores; Fit walks the ordered cards from the last one (as HAMi
    # does), so it takes card 1
    devices = "GPU-n1-1,NVIDIA,1000,30:;"
    assert pod["metadata"]["annotations"] == {
        "hami.io/vgpu-node": "n1",
        "hami.io/vgpu-time": STAMP,
        "hami.io/vgpu-devices-to-allocate": devices,
        "hami.io/vgpu-devices-allocated": devices,
        "hami.io/bind-phase": "allocating",
        "hami.io/bind-time": STAMP,
        "hami.io/vgpu-enforcement": "GPU-n1-1:none",  # ours: the node reports no enforcement
    }
    assert pod["metadata"]["labels"] == {"hami.io/vgpu-node": "n1"}
    assert pod["spec"]["nodeName"] == "n1"
    assert await _lock(ext) == LOCK  # kept: the node agent releases it after Allocate
    assert ext.ctx.snapshot.record(("default", "p")) is not None
    await ext.settle()
    (event,) = _events(ext, "BindingSucceed")
    assert event["message"] == "Successfully binding node [n1] to default/p"
    assert event["involvedObject"]["uid"] == "uid-p"
    # exactly one pod patch of ours (annotations and label together: a JSON patch that first tests
    # the pod is as read) and one binding (the embedded server's binding reaction sets spec.nodeName
    # with a merge patch of its own)
    (ours,) = [r.data for r in ext.apiserver["patch", PODS] if isinstance(r.data, list)]
    assert ours[0] == {"op": "test", "path": "/metadata", "value": seeded["metadata"]}
    written = {op["path"]: op["value"] for op in ours if op["op"] == "add"}
    assert written == {
        **{
            "/metadata/annotations/" + k.replace("/", "~1"): v
            for k, v in pod["metadata"]["annotations"].items()
        },
        "/metadata/labels": {"hami.io/vgpu-node": "n1"},
    }
    assert [op["op"] for op in ours].count("test") == 1
    assert len(ext.apiserver["post", PODS, kmock.subresource("binding")]) == 1


async def test_a_lock_held_by_a_live_pod_blocks(start_extender: StartExtender) -> None:
    ext = await start_extender(nodes=[make_node("n1")], pods=[make_pod("p"), make_pod("q")])
    assert await ext.bind("p", "n1") == {"Error": ""}
    result = await ext.bind("q", "n1")
    assert result["Error"] == "node n1 has been locked within 5m0s by default/p: node lock contention"
    assert await _lock(ext) == LOCK  # not ours: left alone
    assert (await ext.pod("q"))["metadata"]["annotations"] == {
        POD_BIND_PHASE: "failed",
        "hami.io/bind-time": STAMP,
    }
    assert ext.ctx.snapshot.record(("default", "q")) is None
    await ext.settle()
    (event,) = _events(ext, "BindingFailed")
    assert event["type"] == "Warning"
    assert event["message"] == (  # the error, then what to do about it
        "node n1 has been locked within 5m0s by default/p: node lock contention. kube-scheduler retries "
        "the pod; the lock goes "
        "once that pod's GPUs are allocated by the node agent, or after --node-lock-timeout if the agent "
        "never does (check hami-node-agent there)"
    )


@pytest.mark.parametrize(
    "lock",
    ["2026-05-01T09:54:59Z,default,holder", "2026-05-01T09:59:59Z,default,gone", "2026-05-01T09:50:00Z"],
    ids=["expired", "holder-gone", "expired-legacy"],
)
async def test_an_expired_or_ownerless_lock_is_taken_over(start_extender: StartExtender, lock: str) -> None:
    ext = await start_extender(
        nodes=[make_node("n1", annotations={NODE_LOCK: lock})], pods=[make_pod("p"), make_pod("holder")]
    )
    assert await ext.bind("p", "n1") == {"Error": ""}
    assert await _lock(ext) == LOCK


async def test_a_pod_that_cannot_fit_fails_without_touching_the_lock(start_extender: StartExtender) -> None:
    ext = await start_extender(nodes=[make_node("n1", memory=500)], pods=[make_pod("p", memory=1000)])
    result = await ext.bind("p", "n1")
    assert result["Error"] == "pod default/p does not fit node n1: 2/2 CardInsufficientMemory"
    assert await _lock(ext) is None
    assert len(ext.apiserver["patch", kmock.resource("v1/nodes")]) == 0


async def test_missing_pods_and_gpu_less_pods(start_extender: StartExtender) -> None:
    ext = await start_extender(nodes=[make_node("n1")], pods=[make_pod("plain", gpus=0)])
    assert await ext.bind("ghost", "n1") == {"Error": "pod default/ghost not found"}
    assert await ext.bind("plain", "n1") == {"Error": ""}
    assert (await ext.pod("plain"))["spec"]["nodeName"] == "n1"
    assert await _lock(ext) is None  # no devices, no lock


@pytest.mark.parametrize("gpus", [1, 0], ids=["gpu-pod", "gpu-less-pod"])
async def test_a_node_that_does_not_exist_fails_with_not_found(
    start_extender: StartExtender, gpus: int
) -> None:
    # HAMi reads the node before anything else: not found -> the lister's `not found` error and a
    # BindingFailed Event; no lock, no annotation, no Binding (a Binding to a missing node is accepted
    # by kube-apiserver and leaves the pod on a node that never runs it)
    ext = await start_extender(nodes=[make_node("n1")], pods=[make_pod("p", gpus=gpus)])
    result = await ext.bind("p", "gone")
    assert result == {"Error": "node gone not found"}
    pod = await ext.pod("p")
    assert "nodeName" not in pod["spec"]
    assert "hami.io/vgpu-node" not in pod["metadata"]["annotations"]
    assert len(ext.apiserver["post", PODS, kmock.subresource("binding")]) == 0
    assert len(ext.apiserver["patch", kmock.resource("v1/nodes")]) == 0
    assert ext.ctx.snapshot.record(("default", "p")) is None
    await ext.settle()
    (event,) = _events(ext, "BindingFailed")
    assert event["type"] == "Warning"
    assert event["involvedObject"]["name"] == "p"
    assert event["message"].startswith("node gone not found. ")


async def test_twenty_concurrent_binds_on_room_for_ten(start_extender: StartExtender) -> None:
    """Twenty binds at once on room for ten: exactly ten are granted, the others refused because the
    node is full, never over-allocated. Every bind waits for the node lock as long as it takes (the
    bind deadline and the lock wait run on a frozen ticker), so a loaded machine slows the test but
    cannot turn a bind that would fit into a lock or deadline failure; the budget is progress: the
    test fails when no bind is decided for a while (scaled by the load), not after a fixed time."""
    # 2 cards x 5000 MiB, pods of 1000 MiB: 5 per card, room for exactly 10
    names = [f"p{i:02d}" for i in range(20)]
    ext = await start_extender(
        nodes=[make_node("n1", memory=5000)],
        pods=[make_pod(n, memory=1000, cores=10) for n in names],
        node_lock_wait=20.0,
        ticker=lambda: 0.0,
    )

    async def agent() -> None:
        """Stand-in node agent: releases each lock as soon as the watch shows it (Allocate done)."""
        while True:
            await eventually(lambda: bool(ext.ctx.snapshot.lock_of("n1")), "a node lock", within=30)
            held = ext.ctx.snapshot.lock_of("n1")
            holder = decode_node_lock(held or "")
            assert holder.namespace is not None and holder.name is not None
            await release_node_lock(ext.ctx.api, "n1", holder.namespace, holder.name)
            await eventually(partial(moved_from, held), "the release to be seen")

    def moved_from(held: str | None) -> bool:
        """Seen released, or already taken by the next bind (a poll can miss the moment between)."""
        return ext.ctx.snapshot.lock_of("n1") != held

    def agent_alive() -> None:
        if releaser.done():
            releaser.result()  # its failure, if it failed
            raise AssertionError("the stand-in agent stopped")

    releaser = asyncio.create_task(agent())
    binds = [asyncio.create_task(ext.bind(n, "n1")) for n in names]

    def decided() -> int:
        return sum(b.done() for b in binds)

    try:
        await eventually(
            lambda: decided() == len(binds), "every bind decided", progress=decided, alive=agent_alive
        )
    finally:
        releaser.cancel()
        for bind in binds:
            bind.cancel()
    results = [b.result() for b in binds]
    errors = [r["Error"] for r in results]
    bound = [n for n, e in zip(names, errors, strict=True) if e == ""]
    assert len(bound) == 10, errors
    assert all("does not fit node n1" in e for e in errors if e), "\n".join(errors)
    memory: dict[str, int] = {}
    for name in bound:
        annotations = (await ext.pod(name))["metadata"]["annotations"]
        for grants in decode_pod_devices(annotations["hami.io/vgpu-devices-allocated"]):
            for grant in grants:
                memory[grant.uuid] = memory.get(grant.uuid, 0) + grant.memory_mib
    assert memory == {"GPU-n1-0": 5000, "GPU-n1-1": 5000}  # full, never over
    usage = ext.ctx.snapshot.candidate("n1", local_time(NOW))
    assert isinstance(usage, NodeState), usage
    assert [d.used_mem for d in usage.devices] == [5000, 5000]


@pytest.mark.parametrize("status", [500, 409], ids=["binding-500", "binding-409"])
async def test_a_binding_refused_fails_cleanly(start_extender: StartExtender, status: int) -> None:
    ext = await start_extender(nodes=[make_node("n1", cards=1)], pods=[make_pod("p", memory=1000)])
    (ext.apiserver**10)["post", PODS, kmock.subresource("binding")][:1] << status  # not applied
    result = await ext.bind("p", "n1")
    assert result["Error"].startswith(f"{status} "), result
    await _assert_clean_failure(ext)


@pytest.mark.parametrize("status", [409, 422, 500, 503])
async def test_an_allocation_patch_that_never_applies_fails_cleanly(
    proxy: FaultProxy, start_extender: StartExtender, status: int
) -> None:
    # each try of the allocation patch is answered `status` and never reaches the API server; a try
    # whose outcome is unknown is re-read and tried again, at most 3 times
    refused = proxy.defer(pod_write("p", "vgpu-devices-allocated"), times=3, status=status)
    ext = await start_extender(
        nodes=[make_node("n1", cards=1)], pods=[make_pod("p", memory=1000)], api_url=proxy.url
    )
    result = await ext.bind("p", "n1")
    assert result["Error"].startswith(f"{status} "), result
    assert len(refused.held) == 3
    assert len(ext.apiserver["post", PODS, kmock.subresource("binding")]) == 0
    await _assert_clean_failure(ext)


async def test_an_allocation_patch_whose_answer_is_lost_binds(start_extender: StartExtender) -> None:
    ext = await start_extender(nodes=[make_node("n1", cards=1)], pods=[make_pod("p", memory=1000)])
    (ext.apiserver**10)["patch", PODS][:1] << 500  # kmock applies a PATCH before answering
    assert await ext.bind("p", "n1") == {"Error": ""}
    pod = await ext.pod("p")
    assert pod["spec"]["nodeName"] == "n1"
    assert pod["metadata"]["annotations"][POD_BIND_PHASE] == "allocating"
    assert await _lock(ext) == LOCK


async def test_a_hanging_api_request_fails_within_the_timeout(start_extender: StartExtender) -> None:
    release = asyncio.Event()

    async def hang(_: kmock.Request) -> Response:
        await release.wait()
        return Response(status=500)

    # 2 s: only the held Binding may pass it, never a read before it on a busy machine
    ext = await start_extender(nodes=[make_node("n1", cards=1)], pods=[make_pod("p")], api_timeout=2.0)
    (ext.apiserver**10)["post", PODS, kmock.subresource("binding")][:1] << hang
    try:
        result = await ext.bind("p", "n1")
        assert result["Error"].startswith("Timeout"), result
        await _assert_clean_failure(ext)
    finally:
        release.set()


async def _assert_clean_failure(ext: Extender) -> None:
    assert await _lock(ext) is None  # released
    assert (await ext.pod("p"))["metadata"]["annotations"][POD_BIND_PHASE] == "failed"
    await eventually(lambda: ext.ctx.snapshot.record(("default", "p")) is None, "the booking to be undone")
    await ext.settle()
    assert len(_events(ext, "BindingFailed")) == 1
    # the card is free again: another pod fits where the failed one would have gone
    assert (await ext.filter(make_pod("next", memory=10000), ["n1"]))["NodeNames"] == ["n1"]


async def test_a_pod_watch_that_ends_is_resumed(
    apiserver: kmock.KubernetesEmulator, start_extender: StartExtender
) -> None:
    apiserver[kmock.action.WATCH, PODS][:1] << b""  # the first pod watch ends at once
    ext = await start_extender(nodes=[make_node("n1", cards=1)])
    busy = make_pod("busy")
    busy["metadata"]["annotations"] = {
        "hami.io/vgpu-node": "n1",
        "hami.io/vgpu-devices-allocated": "GPU-n1-0,NVIDIA,9500,30:;",
    }
    await apiserver.post("/api/v1/namespaces/default/pods", json=busy)
    await eventually(
        lambda: ext.ctx.snapshot.record(("default", "busy")) is not None, "the pod created later"
    )
    assert len(apiserver[kmock.action.WATCH, PODS]) >= 2  # the first (cut) and its replacement
    result = await ext.filter(make_pod("p", memory=1000), ["n1"])
    assert result["FailedNodes"] == {"n1": "1/1 CardInsufficientMemory"}


async def test_a_bounded_wait_for_a_busy_lock_gives_up(start_extender: StartExtender) -> None:
    held = "2026-05-01T09:59:00Z,default,holder"
    ext = await start_extender(
        nodes=[make_node("n1", annotations={NODE_LOCK: held})],
        pods=[make_pod("p"), make_pod("holder")],
        node_lock_wait=0.2,
    )
    result = await ext.bind("p", "n1")
    assert result["Error"] == "node n1 has been locked within 5m0s by default/holder: node lock contention"
    assert await _lock(ext) == held
