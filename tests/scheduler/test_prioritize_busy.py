"""/prioritize steers a pod away from a node whose lock is held (docs/scheduler.md, "What each step
does", Prioritize; docs/compatibility.md, "Scheduler extender", item 30): a candidate whose node lock
another pod holds now for a grant there, as the node watch shows it, or that a bind of this process to
it is in progress for, scores 0, and every other candidate at least 1; with no busy candidate, or only
busy ones, the scores are HAMi's. A lock whose holder counts nowhere on the node (the next bind takes
it over) is not busy. Over HTTP against the embedded API server, and BindCoordination's count of the
binds in progress per node directly."""

from __future__ import annotations

import asyncio
from typing import Any

import kmock
import pytest

from hami.annotations import NODE_LOCK, POD_DEVICES_ALLOCATED, POD_VGPU_NODE
from hami.kube.nodelock import release_node_lock
from hami.scheduler.coordination import BindCoordination
from hami_testkit.restapi import Response  # kmock.Response (exported, not in its __all__)
from tests.builders import lock, make_node, make_pod
from tests.eventually import eventually

from .kit import Extender, StartExtender

PODS = kmock.resource("v1/pods")
NODES = kmock.resource("v1/nodes")

#: binpack's scores with no busy node: n-full holds one pod (1/10 slots, 50/100 cores, 5000/10000
#: MiB: 10 x (0.1 + 0.5 + 0.5) = 11 -> 4), n-empty none
BINPACK = [{"Host": "n-full", "Score": 4}, {"Host": "n-empty", "Score": 0}]
#: the same with n-full busy: it scores 0, the other candidate at least 1
STEERED = [{"Host": "n-full", "Score": 0}, {"Host": "n-empty", "Score": 1}]
NAMES = ["n-full", "n-empty"]


def _used() -> dict[str, Any]:
    used = make_pod("used", gpus=1, memory=5000, cores=50)
    used["metadata"]["annotations"] = {
        POD_VGPU_NODE: "n-full",
        POD_DEVICES_ALLOCATED: "GPU-n-full-0,NVIDIA,5000,50:;",
    }
    return used


async def _start(
    start_extender: StartExtender,
    full: dict[str, str] | None = None,
    empty: dict[str, str] | None = None,
    pods: tuple[dict[str, Any], ...] = (),
) -> Extender:
    """n-full (one pod on its one card) and n-empty, with the given annotations (a lock)."""
    nodes = [make_node("n-full", cards=1, annotations=full), make_node("n-empty", cards=1, annotations=empty)]
    return await start_extender(nodes=nodes, pods=[_used(), *pods])


def _demoted(ext: Extender) -> float:
    value = ext.ctx.metrics.registry.get_sample_value("hami_scheduler_prioritize_demoted_nodes_total")
    assert value is not None
    return value


@pytest.mark.parametrize(
    "value",
    [
        lock(1, "default", "other"),  # another pod's, just taken: its grant is not shown yet
        lock(299, "default", "used"),  # held for the grant of a pod counted there; --node-lock-timeout 5 min
        lock(100, None, None),  # a live legacy lock names nobody: no holder to check
        "not a lock",  # unreadable: never expires (docs/compatibility.md, scheduler item 23)
    ],
    ids=["just-taken", "held-for-a-grant-there", "legacy", "unreadable"],
)
async def test_a_node_whose_lock_another_pod_holds_ranks_below_the_others(
    start_extender: StartExtender, value: str
) -> None:
    ext = await _start(start_extender, full={NODE_LOCK: value})
    assert await ext.prioritize(make_pod("p"), NAMES) == STEERED
    assert _demoted(ext) == 1.0


@pytest.mark.parametrize(
    "value",
    [
        lock(301, "default", "used"),  # expired: the next bind takes it over
        lock(301, None, None),
        lock(10, "default", "gone"),  # its holder counts nowhere: the next bind takes it over
        lock(1, "default", "p"),  # the scheduled pod's own
        "",  # an empty value holds nothing
    ],
    ids=["expired", "expired-legacy", "holder-gone", "own", "empty"],
)
async def test_an_expired_lock_or_the_pods_own_keeps_the_binpack_order(
    start_extender: StartExtender, value: str
) -> None:
    ext = await _start(start_extender, full={NODE_LOCK: value})
    assert await ext.prioritize(make_pod("p"), NAMES) == BINPACK
    assert _demoted(ext) == 0.0


async def test_a_lock_whose_holder_the_kubelet_refused_is_not_busy(start_extender: StartExtender) -> None:
    """The holder of n-full's lock failed admission there (the node agent was down, nobody released
    it): it counts nowhere, and the next bind takes the lock over at once."""
    status = {"reason": "UnexpectedAdmissionError"}
    refused = make_pod("refused", node="n-full", phase="Failed", status=status)
    refused["metadata"]["annotations"] = {
        POD_VGPU_NODE: "n-full",
        POD_DEVICES_ALLOCATED: "GPU-n-full-0,NVIDIA,1000,30:;",
    }
    ext = await _start(start_extender, full={NODE_LOCK: lock(10, "default", "refused")}, pods=(refused,))
    assert await ext.prioritize(make_pod("p"), NAMES) == BINPACK
    assert _demoted(ext) == 0.0


async def test_a_lock_whose_holder_counts_on_another_node_is_not_busy(start_extender: StartExtender) -> None:
    """n-empty's lock names the pod counted on n-full: the next bind takes it over at once."""
    ext = await _start(start_extender, empty={NODE_LOCK: lock(10, "default", "used")})
    spread = make_pod("q", annotations={"hami.io/node-scheduler-policy": "spread"})
    assert await ext.prioritize(spread, NAMES) == [
        {"Host": "n-full", "Score": 6},
        {"Host": "n-empty", "Score": 10},
    ]
    assert _demoted(ext) == 0.0


async def test_only_busy_candidates_keep_their_scores(start_extender: StartExtender) -> None:
    held = {NODE_LOCK: lock(1, "default", "other")}
    ext = await _start(start_extender, full=held, empty={NODE_LOCK: lock(0, "default", "another")})
    assert await ext.prioritize(make_pod("p"), NAMES) == BINPACK
    assert await ext.prioritize(make_pod("p"), ["n-full"]) == [{"Host": "n-full", "Score": 4}]
    assert _demoted(ext) == 0.0


async def test_the_other_candidates_keep_their_order_and_unknown_nodes_score_0(
    start_extender: StartExtender,
) -> None:
    spread = make_pod("q", annotations={"hami.io/node-scheduler-policy": "spread"})
    ext = await _start(start_extender, empty={NODE_LOCK: lock(1, "default", "other")})
    # spread: n-full 6, n-empty 10; n-empty busy -> 0, n-full keeps 6 (>= 1 already)
    assert await ext.prioritize(spread, [*NAMES, "ghost"]) == [
        {"Host": "n-full", "Score": 6},
        {"Host": "n-empty", "Score": 0},
        {"Host": "ghost", "Score": 0},
    ]
    # a no-GPU pod scores 0 everywhere, busy or not
    assert await ext.prioritize(make_pod("cpu", gpus=0), NAMES) == [
        {"Host": "n-full", "Score": 0},
        {"Host": "n-empty", "Score": 0},
    ]


async def test_a_lock_that_changes_is_followed(start_extender: StartExtender) -> None:
    ext = await _start(start_extender)
    assert await ext.prioritize(make_pod("p"), NAMES) == BINPACK
    value = lock(1, "default", "other")
    await ext.apiserver.patch("/api/v1/nodes/n-full", json={"metadata": {"annotations": {NODE_LOCK: value}}})
    await eventually(lambda: ext.ctx.snapshot.lock_of("n-full") == value, "the watch to show the lock")
    assert await ext.prioritize(make_pod("p"), NAMES) == STEERED
    await ext.apiserver.patch("/api/v1/nodes/n-full", json={"metadata": {"annotations": {NODE_LOCK: None}}})
    await eventually(lambda: ext.ctx.snapshot.lock_of("n-full") is None, "the watch to show it gone")
    assert await ext.prioritize(make_pod("p"), NAMES) == BINPACK


def _holding(name: str, release: asyncio.Event, reached: asyncio.Event, answer: Response | None) -> Any:
    """A reaction holding the first request for ``name`` until ``release``, then passing it on to the
    API server (``answer`` None) or answering ``answer``."""
    held: list[str] = []

    async def hold(request: kmock.Request) -> Response | None:
        if request.name != name or held:
            return None  # not matched here: the API server answers
        held.append(name)
        reached.set()
        await release.wait()
        return answer

    return hold


async def test_a_bind_in_progress_demotes_its_node_until_it_answers(start_extender: StartExtender) -> None:
    """The bind's first read (the pod) is held: its lock is not written yet, the watch shows nothing,
    and the node is busy all the same; the pod's own bind does not make the node busy for it. Once
    bound, the lock the bind left for the agent keeps it busy; once the agent released it, nothing."""
    ext = await _start(start_extender, pods=(make_pod("b"),))
    release, reached = asyncio.Event(), asyncio.Event()
    (ext.apiserver**10)[kmock.action.FETCH, PODS] << _holding("b", release, reached, None)
    assert (await ext.filter(make_pod("b"), NAMES))["NodeNames"] == NAMES  # kube-scheduler's cycle
    binding = asyncio.create_task(ext.bind("b", "n-full"))
    try:
        await eventually(lambda: reached.is_set() or binding.done(), "the bind to read its pod")
        assert not binding.done()
        assert ext.ctx.snapshot.lock_of("n-full") is None  # nothing written yet
        assert await ext.prioritize(make_pod("p"), NAMES) == STEERED
        assert await ext.prioritize(make_pod("b"), NAMES) == BINPACK  # its own bind
    finally:
        release.set()
    assert await binding == {"Error": ""}
    await eventually(lambda: ext.ctx.snapshot.lock_of("n-full"), "the watch to show the bind's lock")
    assert await ext.prioritize(make_pod("p"), NAMES) == STEERED  # the lock held for the agent
    assert await release_node_lock(ext.ctx.api, "n-full", "default", "b")  # the agent's release
    await eventually(lambda: ext.ctx.snapshot.lock_of("n-full") is None, "the watch to show it released")
    # n-full now holds two pods: 10 x (0.2 + 0.8 + 0.6) = 16 -> 5
    assert await ext.prioritize(make_pod("p"), NAMES) == [
        {"Host": "n-full", "Score": 5},
        {"Host": "n-empty", "Score": 0},
    ]


async def test_a_failed_bind_leaves_its_node_free(start_extender: StartExtender) -> None:
    """A bind whose pod nobody filtered (no cycle kept: the restart of the scheduler between filter and
    bind) counts from its first read of the pod; held at its node read, then answered 404, it fails
    without a lock, and the node is not busy once it answered."""
    ext = await _start(start_extender, pods=(make_pod("b"),))
    release, reached = asyncio.Event(), asyncio.Event()
    missing = Response(status=404, payload={"kind": "Status", "code": 404, "reason": "NotFound"})
    (ext.apiserver**10)[kmock.action.FETCH, NODES] << _holding("n-full", release, reached, missing)
    binding = asyncio.create_task(ext.bind("b", "n-full"))
    try:
        await eventually(lambda: reached.is_set() or binding.done(), "the bind to read its node")
        assert not binding.done()
        assert await ext.prioritize(make_pod("p"), NAMES) == STEERED
    finally:
        release.set()
    assert (await binding)["Error"] == "node n-full not found"
    assert ext.ctx.snapshot.lock_of("n-full") is None
    assert await ext.prioritize(make_pod("p"), NAMES) == BINPACK


def test_bind_coordination_counts_the_gpu_binds_in_progress_per_node() -> None:
    binds = BindCoordination()
    a, b, c = ("default", "a"), ("default", "b"), ("default", "c")
    assert binds.claim(a) and binds.claim(b) and binds.claim(c)
    assert binds.busy_for("n1", c) is False  # claimed, not known to lock a node yet
    binds.locking(a, "n1")
    binds.locking(a, "n1")  # once per bind
    binds.locking(b, "n1")
    binds.locking(c, "n2")
    assert binds.busy_for("n1", c) and binds.busy_for("n2", a)
    assert binds.busy_for("n2", c) is False  # its own bind
    assert binds.locking_nodes() == {"n1", "n2"}
    binds.done(a)
    assert binds.busy_for("n1", c)  # b still binds there
    binds.done(b)
    assert binds.busy_for("n1", c) is False
    assert binds.locking_nodes() == {"n2"}
    binds.done(c)
    assert binds.locking_nodes() == set()
    binds.locking(a, "n1")  # not claimed (done, or never): not counted
    assert binds.locking_nodes() == set()
