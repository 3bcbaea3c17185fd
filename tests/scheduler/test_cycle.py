"""One scheduling cycle per pod version (hami.scheduler.cycle): the request read once and shared by the
verbs, never reused for another version or content, and an evaluation never reused once what it read
changed (the snapshot, the clock, the nominated pods' cards).

The verb-level tests call the handlers on a context without an API server (the snapshot filled from
objects); the edited-pod test runs the extender over HTTP against the embedded API server.
"""

from __future__ import annotations

import datetime
from collections.abc import Sequence
from typing import Any

import pytest

from hami.annotations import NODE_HANDSHAKE, POD_USE_GPUTYPE
from hami.scheduler.config import SchedulerSettings
from hami.scheduler.context import Context
from hami.scheduler.cycle import Cycles
from hami.scheduler.filter import handle_filter
from hami.scheduler.main import build_context
from hami.scheduler.nodecache import local_time
from hami.scheduler.prioritize import handle_prioritize
from hami.scheduler.wire import ExtenderArgs
from hami.settings import DeviceConfig
from tests.builders import MODEL, NO_API, NOW, make_node, make_pod, placed
from tests.eventually import eventually

from .kit import StartExtender

CONFIG = DeviceConfig()


def _version(pod: dict[str, Any], uid: str = "u-1", version: str = "1") -> dict[str, Any]:
    pod["metadata"]["uid"] = uid
    pod["metadata"]["resourceVersion"] = version
    return pod


def _args(pod: dict[str, Any], names: list[str]) -> ExtenderArgs:
    return ExtenderArgs(Pod=pod, Nodes=None, NodeNames=names)


class Clock:
    def __init__(self) -> None:
        self.now = NOW

    def __call__(self) -> datetime.datetime:
        return self.now


def _offline(
    nodes: list[dict[str, Any]], pods: Sequence[dict[str, Any]] = (), clock: Clock | None = None
) -> Context:
    ctx = build_context(SchedulerSettings(), NO_API, clock=clock or (lambda: NOW))
    ctx.snapshot.replace_nodes(nodes)
    ctx.snapshot.replace_pods(list(pods))
    ctx.snapshot.replace_quotas([])
    return ctx


# ------------------------------------------------------------------------------------- the cache


def test_the_same_pod_version_is_read_once() -> None:
    cycles = Cycles()
    pod = _version(make_pod("p", gpus=1, memory=1000))
    first = cycles.of(pod, CONFIG)
    assert first.request is not None and first.request.has_devices
    assert cycles.of(_version(make_pod("p", gpus=1, memory=1000)), CONFIG) is first  # an equal body
    assert (cycles.made, cycles.reused) == (1, 1)


def test_a_new_resource_version_is_a_new_cycle() -> None:
    cycles = Cycles()
    first = cycles.of(_version(make_pod("p"), version="1"), CONFIG)
    second = cycles.of(_version(make_pod("p"), version="2"), CONFIG)
    assert second is not first
    assert len(cycles) == 1  # one cycle per pod: the newer version replaced the older
    assert cycles.of(_version(make_pod("p"), version="2"), CONFIG) is second


def test_another_body_under_the_same_version_is_read_anew() -> None:
    # a caller sending different content under a known uid + resourceVersion never gets the old request
    cycles = Cycles()
    first = cycles.of(_version(make_pod("p", memory=1000)), CONFIG)
    forged = cycles.of(_version(make_pod("p", memory=9000)), CONFIG)
    assert forged is not first
    assert forged.request is not None and first.request is not None
    assert forged.request.containers != first.request.containers
    typed = cycles.of(_version(make_pod("p", memory=9000, annotations={POD_USE_GPUTYPE: "A100"})), CONFIG)
    assert typed is not forged and typed.request is not None and typed.request.use_types == ("A100",)


def test_an_unreadable_request_is_kept_as_its_error() -> None:
    cycles = Cycles()
    pod = _version(make_pod("p", annotations={"hami.io/device-scoring-weights": "nonsense"}))
    cycle = cycles.of(pod, CONFIG)
    assert cycle.request is None and cycle.error is not None
    assert "device-scoring-weights" in str(cycle.error)


def test_the_cache_is_bounded_and_forgets_bound_or_deleted_pods() -> None:
    cycles = Cycles(capacity=2)
    a, b, c = (_version(make_pod(n), uid=f"u-{n}") for n in "abc")
    first = cycles.of(a, CONFIG)
    cycles.of(b, CONFIG)
    cycles.of(a, CONFIG)  # a used last: b is the least recently used
    cycles.of(c, CONFIG)
    assert len(cycles) == 2
    assert cycles.of(a, CONFIG) is first
    made = cycles.made
    cycles.of(b, CONFIG)
    assert cycles.made == made + 1  # b had been evicted
    assert len(cycles) == 2  # a and b: c went
    cycles.pod_event("DELETED", a)  # the watch: a was deleted
    assert len(cycles) == 1
    cycles.forget(("default", "b"))  # bind: b was bound
    assert len(cycles) == 0
    cycles.of(a, CONFIG)
    assert cycles.made == made + 2


def test_only_the_cycles_evaluated_last_keep_their_evaluation() -> None:
    # an evaluation holds a state per candidate node: a few of them are kept, not one per pod
    ctx = _offline([make_node("n1"), make_node("n2")])
    cycles = Cycles(evaluated=1)
    a = cycles.of(_version(make_pod("a"), uid="u-a"), CONFIG)
    b = cycles.of(_version(make_pod("b"), uid="u-b"), CONFIG)
    first = a.evaluate(ctx.snapshot, ["n1", "n2"], NOW, 0)
    assert a.evaluate(ctx.snapshot, ["n1", "n2"], NOW, 0) is first  # nothing changed: kept
    b.evaluate(ctx.snapshot, ["n1", "n2"], NOW, 0)
    again = a.evaluate(ctx.snapshot, ["n1", "n2"], NOW, 0)
    assert again is not first  # b's evaluation pushed a's out
    assert [s.name for s in again.candidates.states] == ["n1", "n2"]


# ------------------------------------------------------------------------------------ the verbs


def _busy(name: str, node: str, card: int, memory: int) -> dict[str, Any]:
    pod = make_pod(name, node=node, phase="Running")
    pod["metadata"]["annotations"] = placed(node, f"GPU-{node}-{card}", memory, 10)
    return pod


def test_filter_and_prioritize_share_one_cycle() -> None:
    nodes = [make_node("n1"), make_node("n2"), make_node("n3", cards=1)]
    busy = [_busy("b1", "n1", 0, 1000), _busy("b2", "n2", 0, 9000), _busy("b3", "n2", 1, 9000)]
    ctx = _offline(nodes, busy)
    pod = _version(make_pod("p", gpus=2, memory=1000))
    assert handle_filter(ctx, _args(pod, ["n1", "n2", "n3"])).result["NodeNames"] == ["n1", "n2"]
    # kube-scheduler sends prioritize the nodes that passed filter: it ranks the states filter read
    survivors = ["n2", "n1"]
    scores = handle_prioritize(ctx, _args(_version(make_pod("p", gpus=2, memory=1000)), survivors))
    assert (ctx.cycles.made, ctx.cycles.reused, ctx.cycles.evaluations) == (1, 1, 1)
    # and they rank as a context that never filtered this pod ranks them
    alone = _offline(nodes, busy)
    assert scores == handle_prioritize(alone, _args(_version(make_pod("p", gpus=2, memory=1000)), survivors))
    assert scores[0]["Score"] > scores[1]["Score"]  # binpack: the fuller n2 first


def test_an_evaluation_is_not_reused_once_the_snapshot_changed() -> None:
    ctx = _offline([make_node("n1", cards=1, memory=10000)])
    pod = _version(make_pod("p", memory=6000))
    assert handle_filter(ctx, _args(pod, ["n1"])).result["NodeNames"] == ["n1"]
    # another pod now holds 5000 MiB of the only card: the same pod version no longer fits
    other = make_pod("other", node="n1", phase="Running")
    other["metadata"]["annotations"] = placed("n1", "GPU-n1-0", 5000, 0)
    ctx.snapshot.pod_event("ADDED", other)
    again = handle_filter(ctx, _args(_version(make_pod("p", memory=6000)), ["n1"])).result
    assert again["NodeNames"] == []
    assert "n1" in {**again["FailedNodes"], **again.get("FailedAndUnresolvableNodes", {})}
    assert ctx.cycles.made == 1  # the same cycle: only its evaluation was made again


def test_an_evaluation_is_not_reused_once_a_node_turned_stale() -> None:
    clock = Clock()
    # the handshake asked 50 s ago and the device plugin not registered: stale 10 s from now
    stamp = local_time(NOW - datetime.timedelta(seconds=50)).strftime("%Y-%m-%d %H:%M:%S")
    node = make_node("n1", annotations={NODE_HANDSHAKE: f"Requesting_{stamp}"}, allocatable=0)
    ctx = _offline([node], clock=clock)
    pod = _version(make_pod("p"))
    assert handle_filter(ctx, _args(pod, ["n1"])).result["NodeNames"] == ["n1"]
    clock.now = NOW + datetime.timedelta(seconds=11)
    again = handle_filter(ctx, _args(pod, ["n1"])).result
    assert again["NodeNames"] == []
    assert "allocatable is 0" in again["FailedAndUnresolvableNodes"]["n1"]


def _nominated(priority: int) -> dict[str, Any]:
    """A pending pod of ours nominated to n1 holding 6000 MiB of both its cards."""
    pod = make_pod("urgent", gpus=2, memory=6000, cores=None)
    pod["spec"]["priority"] = priority
    pod["status"]["nominatedNodeName"] = "n1"
    return pod


@pytest.mark.parametrize("filter_first", [True, False], ids=["after-filter", "alone"])
def test_prioritize_scores_as_before_whether_or_not_filter_ran(filter_first: bool) -> None:
    # filter counts the nominated pod's cards as used (it outranks p); prioritize never did, and its
    # score must not change because filter evaluated the same pod version just before
    ctx = _offline([make_node("n1"), make_node("n2")], [_nominated(100)])
    names = ["n1", "n2"]
    if filter_first:
        assert handle_filter(ctx, _args(_version(make_pod("p", memory=5000)), names)).result["NodeNames"] == [
            "n2"
        ]
    scores = handle_prioritize(ctx, _args(_version(make_pod("p", memory=5000)), names))
    assert scores == [{"Host": "n1", "Score": 0}, {"Host": "n2", "Score": 0}]


async def test_a_pod_edited_between_filter_and_bind_is_decided_as_edited(
    start_extender: StartExtender,
) -> None:
    ext = await start_extender(
        nodes=[make_node("n1")], pods=[make_pod("p", annotations={POD_USE_GPUTYPE: MODEL})]
    )
    stored = await ext.pod("p")
    assert (await ext.filter(stored, ["n1"]))["NodeNames"] == ["n1"]
    # edited after filter: it now asks for a type n1 does not have (a new resourceVersion)
    edit = {"metadata": {"annotations": {POD_USE_GPUTYPE: "A100"}}}
    response = await ext.apiserver.patch("/api/v1/namespaces/default/pods/p", json=edit)
    assert response.status == 200
    result = await ext.bind("p", "n1")
    assert "does not fit node n1" in result["Error"], result
    assert "nodeName" not in (await ext.pod("p"))["spec"]


async def test_a_bound_pod_leaves_the_cache(start_extender: StartExtender) -> None:
    ext = await start_extender(nodes=[make_node("n1")], pods=[make_pod("p")])
    stored = await ext.pod("p")
    assert (await ext.filter(stored, ["n1"]))["NodeNames"] == ["n1"]
    assert len(ext.ctx.cycles) == 1
    assert (await ext.bind("p", "n1")) == {"Error": ""}
    assert len(ext.ctx.cycles) == 0
    assert ext.ctx.cycles.reused >= 1  # bind read the version filter had read
    await eventually(lambda: ext.ctx.snapshot.record(("default", "p")) is not None, "the bound pod seen")
