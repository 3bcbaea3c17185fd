"""End to end with the node agents as one fleet process (``SystemOptions(fleet=True)``: ``python -m
nodeagent.fleet`` for the four demo nodes, the MIG node included): every example pod becomes what its
example declares, exactly as with one agent process per node, no node lock is left, and the fleet's one
``/metrics`` carries every node's families."""

from __future__ import annotations

from pathlib import Path

import pytest

from hami.annotations import NODE_LOCK
from hami_testkit.cluster import load_cluster
from hami_testkit.demo_session import default_examples_dir, final_state, submit_all, wait_decided
from hami_testkit.kubeapi import nodes_path
from hami_testkit.manifests import read_examples
from hami_testkit.report import card_index, describe, render, verdict
from hami_testkit.system import FLEET, EmbeddedSystem, SystemOptions

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]

CLUSTER = load_cluster()


async def test_every_example_becomes_what_it_declares_with_the_agents_in_one_fleet(workdir: Path) -> None:
    examples = read_examples(default_examples_dir())
    async with EmbeddedSystem(CLUSTER, workdir, SystemOptions(fleet=True)) as system:
        assert [c for c in system.supervisor.children if c.startswith("agent")] == [FLEET]
        names, refused = await submit_all(system, [e.pod for e in examples])
        undecided = await wait_decided(system, names, refused, limit=120)
        pods = await final_state(system, names, refused)
        reports = [describe(n, pods[n], refused.get(n), system.scheduler, card_index(CLUSTER)) for n in names]
        nodes = await system.api.list_objects(nodes_path())
        async with system.session.get(system.metrics_urls[FLEET]) as response:
            metrics = await response.text()
    table = render(reports)
    assert undecided == [], table
    pod_examples = [e for e in examples if e.kind == "Pod"]
    expected = {n: e.outcome for n, e in zip(names, pod_examples, strict=True) if e.outcome}
    assert len(expected) == len(pod_examples) and verdict(reports, expected) == [], table
    assert all(not (n["metadata"].get("annotations") or {}).get(NODE_LOCK) for n in nodes), table
    for node in CLUSTER.nodes:
        assert f'hami_node_pod_cache_synced{{node="{node.name}",zone="vGPU"}} 1.0' in metrics, node.name
