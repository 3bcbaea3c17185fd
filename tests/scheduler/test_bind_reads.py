"""How often a GPU bind reads its node: once (HAMi's step 2, that the node exists; the lock's first try
decides on that read), and again only when the lock's compare-and-set lost a race."""

from __future__ import annotations

import kmock

from hami.annotations import NODE_LOCK
from hami_testkit.restapi import Response  # kmock.Response (exported, not in its __all__)
from tests.builders import make_node, make_pod

from .kit import Extender, StartExtender

NODES = kmock.resource("v1/nodes")
LOCK = "2026-05-01T10:00:00Z,default,p"  # the lock of pod p at the kit's fixed clock


def _node_reads(ext: Extender) -> int:
    return len([r for r in ext.apiserver["get", NODES] if r.name == "n1"])


async def _lock(ext: Extender) -> str | None:
    value: str | None = ((await ext.node("n1"))["metadata"].get("annotations") or {}).get(NODE_LOCK)
    return value


async def test_a_gpu_bind_reads_its_node_once(start_extender: StartExtender) -> None:
    ext = await start_extender(nodes=[make_node("n1")], pods=[make_pod("p")])
    reads = _node_reads(ext)
    assert await ext.bind("p", "n1") == {"Error": ""}
    assert _node_reads(ext) - reads == 1
    assert await _lock(ext) == LOCK
    assert (await ext.pod("p"))["spec"]["nodeName"] == "n1"


async def test_a_lock_race_lost_on_that_read_reads_the_node_again(start_extender: StartExtender) -> None:
    ext = await start_extender(nodes=[make_node("n1")], pods=[make_pod("p")])
    reads = _node_reads(ext)

    async def changed_meanwhile(_: kmock.Request) -> Response:
        await ext.apiserver.patch("/api/v1/nodes/n1", json={"metadata": {"annotations": {"other": "x"}}})
        return Response(status=422)  # a failed test op, as a real API server answers

    (ext.apiserver**10)["patch", NODES][:1] << changed_meanwhile
    assert await ext.bind("p", "n1") == {"Error": ""}
    assert _node_reads(ext) - reads == 2  # the read that the node exists, then the retry's own
    assert await _lock(ext) == LOCK
    assert (await ext.node("n1"))["metadata"]["annotations"]["other"] == "x"
