"""The kube-scheduler stand-in sends the extender the nodes kube-scheduler would under
``percentageOfNodesToScore`` (docs/scale.md, "End to end"): its in-tree filters run from a rotating start
index and stop once ``numFeasibleNodesToFind`` nodes passed; only those go to ``/filter``; the start
index moves on by the nodes processed.

Cheap by construction: the stand-in is driven one ``schedule_one`` at a time, its node view filled
directly (no watch, no 300 Node objects in the apiserver), against a small aiohttp extender that
records the node names of each call and keeps the nodes the test chooses. The apiserver only takes the
stand-in's Events and status patches.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Collection
from typing import Any, cast

import aiohttp
import kmock
import pytest
from aiohttp import web

from hami_testkit.kubeapi import SimApi
from hami_testkit.scheduler_standin import SchedulerStandIn, feasible_nodes_to_find
from tests.builders import make_pod
from tests.testkit.fakeserver import serving


class SamplingExtender:
    """Keeps the nodes in ``fits`` (all, when None); records the node names of every /filter call."""

    def __init__(self) -> None:
        self.fits: Collection[str] | None = None
        self.filtered: list[list[str]] = []
        self.bound: list[str] = []

    async def handle(self, request: web.Request) -> web.Response:
        verb = request.match_info["verb"]
        args = await request.json()
        if verb == "filter":
            names = list(args["NodeNames"])
            self.filtered.append(names)
            kept = [n for n in names if self.fits is None or n in self.fits]
            failed = {n: "node(s) had no room" for n in names if n not in kept}
            return web.json_response({"NodeNames": kept, "FailedNodes": failed, "Error": ""})
        if verb == "prioritize":
            return web.json_response([{"Host": n, "Score": 0} for n in args["NodeNames"]])
        if verb == "preempt":
            return web.json_response({"NodeNameToMetaVictims": {}})
        self.bound.append(args["Node"])
        return web.json_response({"Error": ""})


Start = Callable[..., SchedulerStandIn]


@pytest.fixture
async def extender() -> AsyncIterator[tuple[SamplingExtender, str]]:
    fake = SamplingExtender()
    async with serving("/{verb}", fake.handle) as server:
        yield fake, f"http://127.0.0.1:{server.port}"


@pytest.fixture
async def standin(
    apiserver: kmock.KubernetesEmulator, extender: tuple[SamplingExtender, str]
) -> AsyncIterator[Start]:
    """A factory: a stand-in over ``nodes`` Ready nodes n000, n001, ... (sorted = index order)."""
    async with aiohttp.ClientSession() as session:

        def start(nodes: int, **options: Any) -> SchedulerStandIn:
            scheduler = SchedulerStandIn(
                SimApi(session, str(apiserver.url)), session, extender[1], background_binds=False, **options
            )
            for i in range(nodes):
                scheduler.nodes[name(i)] = node(name(i))
            return scheduler

        yield start


def name(i: int) -> str:
    return f"n{i:03d}"


def node(node_name: str, *, ready: bool = True) -> dict[str, Any]:
    return {
        "metadata": {"name": node_name, "labels": {}, "annotations": {}},
        "spec": {},
        "status": {"conditions": [{"type": "Ready", "status": "True" if ready else "False"}]},
    }


def names(first: int, count: int, total: int) -> list[str]:
    """``count`` node names from index ``first`` on, wrapping around ``total``."""
    return [name((first + i) % total) for i in range(count)]


@pytest.mark.parametrize(
    ("percentage", "nodes", "expected"),
    [
        (0, 0, 0),
        (0, 99, 99),  # under minFeasibleNodesToFind: every node
        (10, 99, 99),
        (0, 100, 100),  # adaptive 50 % of 100 is 50, raised to the minimum of 100
        (0, 200, 100),  # 49 % of 200 = 98 -> 100
        (0, 300, 144),  # 48 % of 300
        (0, 1000, 420),  # 42 %
        (0, 5000, 500),  # 10 %
        (0, 6000, 300),  # 50 - 48 = 2 %, floored at 5 %
        (30, 500, 150),  # kube-scheduler's own example
        (10, 500, 100),
        (100, 1000, 1000),
        (100, 5000, 5000),
    ],
)
def test_feasible_nodes_to_find_is_kube_schedulers_number(percentage: int, nodes: int, expected: int) -> None:
    assert feasible_nodes_to_find(percentage, nodes) == expected


@pytest.mark.parametrize("bad", [-1, 101, True, 50.0, "50"])
def test_a_percentage_outside_0_to_100_is_refused_by_name(bad: Any) -> None:
    with pytest.raises(ValueError, match="percentage_of_nodes_to_score"):
        SchedulerStandIn(
            cast(Any, None), cast(Any, None), "http://127.0.0.1:1", percentage_of_nodes_to_score=bad
        )


async def test_adaptive_sends_a_sample_and_each_attempt_starts_where_the_last_stopped(
    standin: Start, extender: tuple[SamplingExtender, str]
) -> None:
    fake, _ = extender
    scheduler = standin(300, percentage_of_nodes_to_score=0)
    for i in range(3):
        await scheduler.schedule_one(make_pod(f"p{i}"))
    assert [len(call) for call in fake.filtered] == [144, 144, 144]
    assert fake.filtered == [names(0, 144, 300), names(144, 144, 300), names(288, 144, 300)]


async def test_the_start_moves_by_the_nodes_processed_not_only_those_kept(
    standin: Start, extender: tuple[SamplingExtender, str]
) -> None:
    """Nodes the in-tree filters drop are processed too: the next attempt starts after them all."""
    fake, _ = extender
    scheduler = standin(300, percentage_of_nodes_to_score=0)
    for i in range(50):
        scheduler.nodes[name(i)] = node(name(i), ready=False)
    fake.fits = set()  # nothing fits: the message counts the processed nodes only
    first = await scheduler.schedule_one(make_pod("p0"))
    await scheduler.schedule_one(make_pod("p1"))
    assert fake.filtered[0] == names(50, 144, 300)  # 194 processed: 50 not ready, 144 kept
    assert fake.filtered[1][0] == name(194)
    assert first.kind == "unschedulable"
    assert first.message.startswith(
        "0/300 nodes are available: 144 node(s) had no room, 50 node(s) were not ready. preemption: "
    )


async def test_at_100_percent_every_kept_node_is_sent(
    standin: Start, extender: tuple[SamplingExtender, str]
) -> None:
    fake, _ = extender
    scheduler = standin(300)  # the default: what the chart renders
    for i in range(2):
        await scheduler.schedule_one(make_pod(f"p{i}"))
    assert fake.filtered == [names(0, 300, 300)] * 2


@pytest.mark.parametrize("percentage", [0, 1, 50])
async def test_under_100_nodes_every_node_is_sent(
    standin: Start, extender: tuple[SamplingExtender, str], percentage: int
) -> None:
    fake, _ = extender
    scheduler = standin(99, percentage_of_nodes_to_score=percentage)
    for i in range(2):
        await scheduler.schedule_one(make_pod(f"p{i}"))
    assert [sorted(call) for call in fake.filtered] == [names(0, 99, 99)] * 2


async def test_a_pod_fitting_one_node_outside_the_sample_is_found_on_a_later_attempt(
    standin: Start, extender: tuple[SamplingExtender, str]
) -> None:
    """kube-scheduler refuses it "0/300" first (the extender never saw n200), then finds it."""
    fake, _ = extender
    fake.fits = {name(200)}
    scheduler = standin(300, percentage_of_nodes_to_score=0)
    pod = make_pod("pinned")
    first = await scheduler.schedule_one(pod)
    assert first.kind == "unschedulable"
    assert first.message.startswith("0/300 nodes are available: 144 node(s) had no room")
    second = await scheduler.schedule_one(pod)
    assert (second.kind, second.node) == ("bound", name(200))
    assert fake.bound == [name(200)]


async def test_at_100_percent_that_pod_is_placed_at_once(
    standin: Start, extender: tuple[SamplingExtender, str]
) -> None:
    fake, _ = extender
    fake.fits = {name(200)}
    scheduler = standin(300, percentage_of_nodes_to_score=100)
    first = await scheduler.schedule_one(make_pod("pinned"))
    assert (first.kind, first.node) == ("bound", name(200))
    assert len(fake.filtered) == 1


async def test_the_nominated_node_is_tried_alone_first_even_outside_the_sample(
    standin: Start, extender: tuple[SamplingExtender, str]
) -> None:
    """As kube-scheduler's evaluateNominatedNode: before the walk, which it then does not make (the start
    index stays), so the next pod's sample begins where it would have."""
    fake, _ = extender
    scheduler = standin(300, percentage_of_nodes_to_score=0)
    nominee = make_pod("nominee", status={"nominatedNodeName": name(250)})
    placed = await scheduler.schedule_one(nominee)
    assert (placed.kind, placed.node) == ("bound", name(250))
    await scheduler.schedule_one(make_pod("next"))
    assert fake.filtered == [[name(250)], names(0, 144, 300)]
