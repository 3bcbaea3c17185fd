"""The rejections ``/filter`` keeps from one pod to the next (``Context.rejections``) go with their node:
a node deleted from the cluster leaves nothing behind (names churn under autoscalers; each kept entry
holds the node's whole state)."""

from __future__ import annotations

import kmock

from tests.builders import make_node, make_pod
from tests.eventually import eventually

from .kit import StartExtender


async def test_a_deleted_nodes_kept_rejections_go_with_it(
    start_extender: StartExtender, apiserver: kmock.KubernetesEmulator
) -> None:
    ext = await start_extender(nodes=[make_node("n1", memory=1000), make_node("n2", memory=1000)])
    answer = await ext.filter(make_pod("big", memory=5000), ["n1", "n2"])
    assert not answer["NodeNames"] and set(answer["FailedAndUnresolvableNodes"]) == {"n1", "n2"}
    assert len(ext.ctx.rejections) == 2  # one pod shape on each node
    await apiserver.delete("/api/v1/nodes/n1")
    await eventually(lambda: len(ext.ctx.rejections) == 1 or None, "n1's kept rejection to go")
    again = await ext.filter(make_pod("big2", memory=5000), ["n2"])
    assert set(again["FailedAndUnresolvableNodes"]) == {"n2"} and len(ext.ctx.rejections) == 1
