"""Allocation integrity of /bind under races, lost answers, late writes and stale binds (issue
"Allocation integrity", cases 1-5): no card is ever booked twice, whatever the API answers."""

from __future__ import annotations

import asyncio
import contextlib
import datetime
from collections.abc import AsyncIterator, Callable
from typing import Any

import kmock
import pytest

from hami.annotations import (
    NODE_LOCK,
    POD_BIND_PHASE,
    POD_DEVICES_ALLOCATED,
    POD_GROUP_LABEL,
    POD_VGPU_NODE,
    decode_node_lock,
    decode_pod_devices,
)
from hami.core.model import NodeState
from hami.kube.nodelock import release_node_lock
from hami.scheduler.snapshot import local_time
from hami_testkit.restapi import Response  # kmock.Response (exported, not in its __all__)
from tests.builders import NOW, make_node, make_pod
from tests.eventually import eventually

from .faults import (  # noqa: F401  (proxy_fixture: the `proxy` fixture)
    FaultProxy,
    conflicting_bindings,
    lost_binding,
    pod_write,
    proxy_fixture,
)
from .kit import Extender, StartExtender

PODS = kmock.resource("v1/pods")
NODES = kmock.resource("v1/nodes")
HELD = "2026-05-01T09:59:00Z,default,holder"  # a fresh lock (1 min old)
STAMP = str(int(NOW.timestamp()))


def frozen() -> float:
    """A monotonic clock that never moves: bind deadlines and lock waits never run out by themselves."""
    return 0.0


class Ticker:
    """A monotonic clock the test moves."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def group_pod(name: str, **kwargs: Any) -> dict[str, Any]:
    pod = make_pod(name, **kwargs)
    pod["metadata"]["labels"] = {POD_GROUP_LABEL: "training"}
    return pod


def holder(node: str = "n1", *, bound: str | None = "n1", **status: str) -> dict[str, Any]:
    """The pod named by ``HELD``: bound to ``bound`` and running there unless told otherwise."""
    pod = make_pod("holder")
    if bound is not None:
        pod["spec"]["nodeName"] = bound
    pod["status"] = status or {"phase": "Running"}
    return pod


def locked(name: str, **kwargs: Any) -> dict[str, Any]:
    return make_node(name, annotations={NODE_LOCK: HELD}, **kwargs)


async def lock_of(ext: Extender, node: str = "n1") -> str | None:
    value: str | None = ((await ext.node(node))["metadata"].get("annotations") or {}).get(NODE_LOCK)
    return value


def holder_checks(ext: Extender) -> int:
    """How often a bind found the lock busy and read the holder pod."""
    return len([r for r in ext.apiserver[kmock.action.FETCH, PODS] if r.name == "holder"])


@contextlib.asynccontextmanager
async def node_agent(*replicas: Extender, node: str = "n1") -> AsyncIterator[None]:
    """Stand-in node agent: once the lock holder is bound here and every replica's view counts it
    (kubelet's Allocate comes after the bind), it releases the lock. A holder whose bind fails
    releases the lock itself."""
    ext = replicas[0]

    async def run() -> None:
        while True:
            await eventually(lambda: bool(ext.ctx.snapshot.lock_of(node)), "a node lock", within=120)
            value = ext.ctx.snapshot.lock_of(node) or ""
            owner = decode_node_lock(value)
            assert owner.namespace is not None and owner.name is not None
            key = (owner.namespace, owner.name)

            def settled(key: tuple[str, str] = key, value: str = value) -> bool:
                if ext.ctx.snapshot.lock_of(node) != value:
                    return True  # released by its own bind
                stored = ext.apiserver.objects["v1/pods", key[0], key[1]].raw  # read in place
                return (stored.get("spec") or {}).get("nodeName") == node and all(
                    r.ctx.snapshot.record(key) is not None for r in replicas
                )

            await eventually(settled, f"{key} bound and seen, or its lock released", within=30)
            gone = {"metadata": {"annotations": {NODE_LOCK: None}}}  # released straight on the API server
            await ext.apiserver.patch(f"/api/v1/nodes/{node}", json=gone)
            await eventually(lambda v=value: ext.ctx.snapshot.lock_of(node) != v, "the release seen")  # type: ignore[misc]

    task = asyncio.create_task(run())
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def card_memory(ext: Extender, names: list[str]) -> dict[str, int]:
    """MiB granted per card over the given pods, decoded from their stored annotations."""
    memory: dict[str, int] = {}
    for name in names:
        annotations = (await ext.pod(name))["metadata"]["annotations"]
        for grants in decode_pod_devices(annotations[POD_DEVICES_ALLOCATED]):
            for grant in grants:
                memory[grant.uuid] = memory.get(grant.uuid, 0) + grant.memory_mib
    return memory


def used(ext: Extender, node: str = "n1") -> list[tuple[int, int, int]]:
    state = ext.ctx.snapshot.candidate(node, local_time(ext.ctx.clock()))
    assert isinstance(state, NodeState), state
    return [(d.used, d.used_mem, d.used_cores) for d in state.devices]


# ----------------------------------------------------------------------- case 1: stale binds


async def test_a_stale_bind_does_not_rewrite_a_pod_bound_elsewhere_meanwhile(
    start_extender: StartExtender,
) -> None:
    # replica A waits for n1's lock for a PodGroup member; kube-scheduler gives up on it and binds the
    # pod to n2 through replica B; then n1's lock frees and A's stale bind goes on
    a = await start_extender(
        nodes=[locked("n1"), make_node("n2")], pods=[holder(), group_pod("g")], ticker=frozen
    )
    b = await start_extender(ticker=frozen)
    conflicting_bindings(a.apiserver)
    stale = asyncio.create_task(a.bind("g", "n1"))
    await eventually(lambda: holder_checks(a) >= 1, "the stale bind to meet the busy lock")
    assert await b.bind("g", "n2") == {"Error": ""}
    bound = await a.pod("g")
    assert bound["spec"]["nodeName"] == "n2" and bound["metadata"]["annotations"][POD_VGPU_NODE] == "n2"
    assert await release_node_lock(a.ctx.api, "n1", "default", "holder")
    result = await eventually(
        lambda: stale.result() if stale.done() else None, "the stale bind's answer", within=30
    )
    assert result == {"Error": "pod default/g is already bound to node n2: refused"}
    assert await a.pod("g") == bound  # not one write
    assert await lock_of(a) is None  # the lock it took for nothing is given back
    await eventually(lambda: a.ctx.snapshot.record(("default", "g")) is not None, "the pod seen on n2")
    assert a.ctx.snapshot.record(("default", "g")).node == "n2"  # type: ignore[union-attr]


async def test_waiting_for_a_lock_never_holds_the_node_queue(start_extender: StartExtender) -> None:
    # the holder's own earlier bind took the lock and lost its answer; while a group member waits for
    # that lock, kube-scheduler's retry of the holder (re-entrant) must not queue behind the waiter
    ext = await start_extender(
        nodes=[locked("n1")],
        pods=[make_pod("holder"), group_pod("g")],
        ticker=frozen,
        node_lock_retry_timeout=10.0,
    )
    waiter = asyncio.create_task(ext.bind("g", "n1"))
    await eventually(lambda: holder_checks(ext) >= 1, "the member to meet the busy lock")
    assert await ext.bind("holder", "n1") == {"Error": ""}
    assert not waiter.done()  # still waiting: the holder's retry did not wait behind it
    assert (await ext.pod("holder"))["spec"]["nodeName"] == "n1"
    assert await release_node_lock(ext.ctx.api, "n1", "default", "holder")  # the agent, after Allocate
    result = await eventually(
        lambda: waiter.result() if waiter.done() else None, "the waiter's answer", within=30
    )
    assert result == {"Error": ""}
    assert await lock_of(ext) == "2026-05-01T10:00:00Z,default,g"


async def test_a_bind_whose_deadline_passed_while_waiting_writes_nothing(
    start_extender: StartExtender,
) -> None:
    ticker = Ticker()
    ext = await start_extender(
        nodes=[locked("n1")], pods=[holder(), group_pod("g")], ticker=ticker, bind_timeout=20.0
    )  # a PodGroup member would wait 28 s: the 20 s deadline comes first
    waiter = asyncio.create_task(ext.bind("g", "n1"))
    await eventually(lambda: holder_checks(ext) >= 1, "the member to meet the busy lock")
    ticker.now = 21.0  # kube-scheduler's extender timeout is over: it no longer waits for us
    assert await release_node_lock(ext.ctx.api, "n1", "default", "holder")
    result = await eventually(
        lambda: waiter.result() if waiter.done() else None, "the waiter's answer", within=30
    )
    assert result["Error"].startswith(
        "kube-scheduler's bind timeout (20 s) passed before taking the node lock"
    )
    node_writes = [r for r in ext.apiserver["patch", NODES]]
    assert len(node_writes) == 1  # the release above; none of the bind's
    assert len(ext.apiserver["patch", PODS]) == 0
    assert await lock_of(ext) is None
    assert ext.ctx.metrics.binds.labels("deadline")._value.get() == 1


async def test_a_bind_that_passes_its_deadline_midway_gives_back_and_stops(
    start_extender: StartExtender,
) -> None:
    ticker = Ticker()
    ext = await start_extender(
        nodes=[make_node("n1", cards=1)], pods=[make_pod("p", memory=6000)], ticker=ticker
    )

    async def slow(request: kmock.Request) -> Any:
        ticker.now = 31.0  # the allocation patch is applied, but its answer comes after the deadline
        return await (await ext.apiserver.get("/api/v1/namespaces/default/pods/p")).json()

    (ext.apiserver**10)["patch", PODS][:1] << slow
    result = await ext.bind("p", "n1")
    assert result["Error"].startswith(
        "kube-scheduler's bind timeout (30 s) passed before creating the Binding"
    )
    assert len(ext.apiserver["post", PODS, kmock.subresource("binding")]) == 0
    pod = await ext.pod("p")
    assert "nodeName" not in pod["spec"]
    assert pod["metadata"]["annotations"][POD_BIND_PHASE] == "failed"  # undone: tested on our values
    assert await lock_of(ext) is None
    await eventually(lambda: ext.ctx.snapshot.record(("default", "p")) is None, "the grant to stop counting")


# ------------------------------------------------------------- case 2: ambiguous Binding outcome


@pytest.mark.parametrize("lost", ["500", "timeout"])
async def test_a_binding_whose_answer_is_lost_is_a_success(start_extender: StartExtender, lost: str) -> None:
    ext = await start_extender(
        nodes=[make_node("n1", cards=1)], pods=[make_pod("p", memory=6000), make_pod("q", memory=1000)],
        api_timeout=2.0 if lost == "timeout" else 5.0,  # long enough for a busy machine's other reads
    )  # fmt: skip
    release = asyncio.Event() if lost == "timeout" else None
    applied = lost_binding(ext.apiserver, release=release)
    try:
        assert await ext.bind("p", "n1") == {"Error": ""}
    finally:
        if release is not None:
            release.set()
    assert applied == ["p"]
    pod = await ext.pod("p")
    assert pod["spec"]["nodeName"] == "n1"
    assert pod["metadata"]["annotations"][POD_BIND_PHASE] == "allocating"  # never marked failed
    assert await lock_of(ext) == "2026-05-01T10:00:00Z,default,p"  # kept for the node agent
    assert used(ext) == [(1, 6000, 30)]
    # the next pod neither gets the lock nor the card
    assert (await ext.bind("q", "n1"))[
        "Error"
    ] == "node n1 has been locked within 5m0s by default/p: node lock contention"
    await ext.settle()
    failed = [
        r for r in ext.apiserver["post", kmock.resource("v1/events")] if r.data["reason"] == "BindingFailed"
    ]
    assert [e.data["involvedObject"]["name"] for e in failed] == ["q"]


async def test_a_pod_that_cannot_be_read_after_a_failed_binding_keeps_lock_and_phase(
    start_extender: StartExtender,
) -> None:
    ext = await start_extender(nodes=[make_node("n1", cards=1)], pods=[make_pod("p", memory=6000)])

    failing: list[bool] = []  # while non-empty, the next read of the pod fails

    async def refused(request: kmock.Request) -> Response:
        failing.append(True)
        return Response(status=503)

    async def unreadable(request: kmock.Request) -> Response:
        failing.clear()
        return Response(status=500)

    (ext.apiserver**10)["post", PODS, kmock.subresource("binding")][:1] << refused
    (ext.apiserver**20)[kmock.action.FETCH, PODS][lambda _: bool(failing)] << unreadable
    result = await ext.bind("p", "n1")
    assert result["Error"].startswith("503 ")
    # whether the Binding happened is unknown: nothing is released or marked failed
    assert await lock_of(ext) == "2026-05-01T10:00:00Z,default,p"
    assert (await ext.pod("p"))["metadata"]["annotations"][POD_BIND_PHASE] == "allocating"


async def test_a_binding_refused_for_a_pod_bound_elsewhere_undoes_only_its_own_writes(
    start_extender: StartExtender,
) -> None:
    ext = await start_extender(
        nodes=[make_node("n1", cards=1), make_node("n2", cards=1)], pods=[make_pod("p", memory=6000)]
    )

    async def beaten(request: kmock.Request) -> Response:
        # someone else's Binding to n2 wins just before ours: kube-apiserver answers ours 409
        await ext.apiserver.patch("/api/v1/namespaces/default/pods/p", json={"spec": {"nodeName": "n2"}})
        return Response(status=409)

    (ext.apiserver**10)["post", PODS, kmock.subresource("binding")][:1] << beaten
    result = await ext.bind("p", "n1")
    assert result["Error"].startswith("409 ")
    annotations = (await ext.pod("p"))["metadata"]["annotations"]
    assert annotations[POD_BIND_PHASE] == "failed"  # our grant on n1 is marked dead
    assert await lock_of(ext) is None
    await eventually(
        lambda: ext.ctx.snapshot.record(("default", "p")) is None, "the n1 grant to stop counting"
    )
    assert used(ext) == [(0, 0, 0)]  # n1's card is free: the pod runs on n2, not here


# ------------------------------------------------------------------ case 3: late writes, leftovers


async def test_a_late_allocation_patch_cannot_resurrect_an_undone_bind(
    proxy: FaultProxy, start_extender: StartExtender
) -> None:
    # every try of the allocation patch is held on the way (the client sees 500) and lands later
    late = proxy.defer(pod_write("p", "vgpu-devices-allocated"), times=3)
    ext = await start_extender(
        nodes=[make_node("n1", cards=1)], pods=[make_pod("p", memory=6000)], api_url=proxy.url
    )
    result = await ext.bind("p", "n1")
    assert result["Error"].startswith("500 ")
    undone = await ext.pod("p")
    statuses = await proxy.deliver(late)  # the held patches land after the undo
    assert len(statuses) >= 1
    stored = await ext.pod("p")
    assert stored["metadata"]["annotations"].get(POD_BIND_PHASE) == "failed"  # not resurrected
    assert POD_VGPU_NODE not in stored["metadata"]["annotations"]
    await eventually(lambda: ext.ctx.snapshot.record(("default", "p")) is None, "nothing to count")
    assert (await ext.filter(make_pod("next", memory=10000), ["n1"]))["NodeNames"] == ["n1"]
    # each late patch tested the pod as its bind had read it, and the undo changed that: none applied
    assert all(s >= 400 for s in statuses)
    assert stored == undone
    assert undone["metadata"]["annotations"] == {POD_BIND_PHASE: "failed", "hami.io/bind-time": STAMP}
    assert await lock_of(ext) is None


async def test_an_allocation_patch_landing_before_the_undo_is_undone(start_extender: StartExtender) -> None:
    ext = await start_extender(nodes=[make_node("n1", cards=1)], pods=[make_pod("p", memory=6000)])
    (ext.apiserver**10)["patch", PODS][:1] << 500  # applied, answer lost
    (ext.apiserver**10)["post", PODS, kmock.subresource("binding")][:1] << 500  # refused, not applied
    result = await ext.bind("p", "n1")
    assert result["Error"].startswith("500 ")
    annotations = (await ext.pod("p"))["metadata"]["annotations"]
    assert annotations[POD_BIND_PHASE] == "failed" and annotations[POD_VGPU_NODE] == "n1"
    assert await lock_of(ext) is None
    await eventually(lambda: ext.ctx.snapshot.record(("default", "p")) is None, "nothing to count")
    assert used(ext) == [(0, 0, 0)]


def leftover(name: str, node: str, seconds_ago: int, memory: int = 6000) -> dict[str, Any]:
    """An unbound pod whose bind wrote its grant and then vanished (a crash, a write landing late)."""
    pod = make_pod(name, memory=memory)
    pod["metadata"]["annotations"] = {
        POD_VGPU_NODE: node,
        POD_DEVICES_ALLOCATED: f"GPU-{node}-0,NVIDIA,{memory},30:;",
        "hami.io/vgpu-devices-to-allocate": f"GPU-{node}-0,NVIDIA,{memory},30:;",
        POD_BIND_PHASE: "allocating",
        "hami.io/bind-time": str(int(NOW.timestamp()) - seconds_ago),
    }
    return pod


async def test_an_unbound_allocation_stops_counting_after_the_horizon(start_extender: StartExtender) -> None:
    now = [NOW]
    clock: Callable[[], datetime.datetime] = lambda: now[0]  # noqa: E731
    ext = await start_extender(
        nodes=[make_node("n1", cards=1), make_node("n2", cards=1)],
        pods=[leftover("old", "n1", seconds_ago=60), leftover("young", "n2", seconds_ago=59)],
        clock=clock,
    )
    probe = make_pod("next", memory=6000)
    # the horizon is 2 x the 30 s bind timeout: "old" began 60 s ago and no bind can still be running
    assert (await ext.filter(probe, ["n1", "n2"]))["NodeNames"] == ["n1"]
    now[0] = NOW + datetime.timedelta(seconds=1)
    assert (await ext.filter(probe, ["n1", "n2"]))["NodeNames"] == ["n1", "n2"]
    assert ext.ctx.snapshot.tracked_count() == 0
    restarted = await start_extender(clock=clock)  # a restart rebuilds the same view from the lists
    assert used(restarted, "n1") == used(ext, "n1") == [(0, 0, 0)]
    assert used(restarted, "n2") == used(ext, "n2") == [(0, 0, 0)]


# ------------------------------------------------------------------- case 4: init-only pods, replicas


def init_only(name: str) -> dict[str, Any]:
    pod = make_pod(name, gpus=0)
    limits = {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "1000", "nvidia.com/gpucores": "10"}
    pod["spec"]["initContainers"] = [{"name": "warmup", "image": "cuda", "resources": {"limits": limits}}]
    return pod


async def test_two_replicas_never_overbook_init_only_pods(start_extender: StartExtender) -> None:
    names = [f"w{i}" for i in range(6)]
    a = await start_extender(
        nodes=[make_node("n1", cards=1, count=3)], pods=[init_only(n) for n in names],
        ticker=frozen, node_lock_wait=28.0,
    )  # fmt: skip
    b = await start_extender(ticker=frozen, node_lock_wait=28.0)
    async with node_agent(a, b):
        results = await asyncio.gather(*((a if i % 2 else b).bind(n, "n1") for i, n in enumerate(names)))
    errors = [r["Error"] for r in results]
    bound = [n for n, e in zip(names, errors, strict=True) if e == ""]
    assert len(bound) == 3, errors  # 3 slots on the card
    assert all("CardTimeSlicingExhausted" in e or "does not fit" in e for e in errors if e), errors
    assert used(a) == used(b) == [(3, 3000, 30)]


# --------------------------------------------------------------- case 5: locks of lost holders


@pytest.mark.parametrize(
    ("lost", "reason"),
    [
        (holder(bound="n2"), "holder_elsewhere"),  # rescheduled to n2 after a crash
        (holder(bound=None, phase="Pending"), None),  # still pending: may come here, keeps the lock
        (holder(phase="Failed", reason="UnexpectedAdmissionError"), "holder_rejected"),
        (holder(phase="Succeeded"), "holder_finished"),
    ],
    ids=["elsewhere", "pending", "admission-failed", "finished"],
)
async def test_a_lock_whose_holder_can_never_be_allocated_here_is_taken_over_at_once(
    start_extender: StartExtender, lost: dict[str, Any], reason: str | None
) -> None:
    ext = await start_extender(nodes=[locked("n1"), make_node("n2")], pods=[lost, make_pod("p")])
    result = await ext.bind("p", "n1")
    if reason is None:
        assert (
            result["Error"] == "node n1 has been locked within 5m0s by default/holder: node lock contention"
        )
        assert await lock_of(ext) == HELD
    else:
        assert result == {"Error": ""}
        assert await lock_of(ext) == "2026-05-01T10:00:00Z,default,p"
    takeovers = {r: ext.ctx.metrics.lock_takeovers.labels(r)._value.get() for r in ("holder_elsewhere",
                 "holder_rejected", "holder_finished", "holder_deleted", "expired")}  # fmt: skip
    assert takeovers == {r: (1 if r == reason else 0) for r in takeovers}


# --------------------------------------------------------------------------- keep holding


# about 10 API calls per bind, one bind at a time per node: minutes on a loaded machine (the guard only)
@pytest.mark.timeout(1200)
async def test_sixty_concurrent_binds_get_exactly_the_capacity_and_a_restart_agrees(
    start_extender: StartExtender,
) -> None:
    # 2 cards x 10000 MiB, pods of 1000 MiB: room for exactly 20
    names = [f"p{i:02d}" for i in range(60)]
    ext = await start_extender(
        nodes=[make_node("n1", memory=10000, count=20)],
        pods=[make_pod(n, memory=1000, cores=5) for n in names],
        ticker=frozen, node_lock_wait=28.0,
    )  # fmt: skip
    async with node_agent(ext):
        results = await asyncio.gather(*(ext.bind(n, "n1") for n in names))
    errors = [r["Error"] for r in results]
    bound = [n for n, e in zip(names, errors, strict=True) if e == ""]
    assert len(bound) == 20, "\n".join(e for e in errors if e)
    assert all("does not fit node n1" in e for e in errors if e), "\n".join(e for e in errors if e)
    assert await card_memory(ext, bound) == {"GPU-n1-0": 10000, "GPU-n1-1": 10000}
    await eventually(
        lambda: all(ext.ctx.snapshot.record(("default", n)) is not None for n in bound), "all seen"
    )
    assert used(ext) == [(10, 10000, 50), (10, 10000, 50)]
    restarted = await start_extender()
    assert used(restarted) == used(ext)


# ------------------------------------------------------------------- a crash in the middle of a bind


@pytest.mark.parametrize(
    ("retry_to", "bound"), [("n1", True), ("n2", False)], ids=["same-node", "other-node"]
)
async def test_a_bind_left_half_done_by_a_crash_is_redone_on_its_node(
    start_extender: StartExtender, retry_to: str, bound: bool
) -> None:
    # the crashed scheduler took n1's lock and wrote the grant, but never created the Binding
    crashed = leftover("p", "n1", seconds_ago=5, memory=1000)
    lock = "2026-05-01T09:59:55Z,default,p"
    ext = await start_extender(
        nodes=[make_node("n1", cards=1, annotations={NODE_LOCK: lock}), make_node("n2", cards=1)],
        pods=[crashed],
    )
    result = await ext.bind("p", retry_to)
    if bound:  # redone under n1's lock, which it re-takes with its new time
        assert result == {"Error": ""}
        pod = await ext.pod("p")
        assert pod["spec"]["nodeName"] == "n1" and pod["metadata"]["annotations"][POD_VGPU_NODE] == "n1"
        assert await lock_of(ext) == "2026-05-01T10:00:00Z,default,p"
    else:  # its Binding to n1 could still land until the allocating horizon: nothing written
        assert result["Error"].startswith("pod default/p has a bind to node n1 in progress")
        pod = await ext.pod("p")
        assert "nodeName" not in pod["spec"]
        assert pod["metadata"]["annotations"] == crashed["metadata"]["annotations"]
        assert len(ext.apiserver["patch", PODS]) == 0
        assert await lock_of(ext) == lock
