"""``/preempt`` over HTTP: kube-scheduler's preemption made device-aware, per call, at 100 and 500 nodes.

The extender is the real aiohttp app (the snapshot filled directly from Node and Pod objects, no
watches) on 127.0.0.1, called with kube-scheduler's JSON in the ``nodeCacheCapable: true`` form: every
node a candidate with an empty victim list (kube-scheduler's plugins need none: it ignores the GPU
resources). Nodes have 8 cards (80 GiB, 100 cores, 10 slots) and no free room for the pod, which asks
one card of 56 GiB at priority 100; every pod on the cards is bound there, with a uid and a priority.

- ``2 per card``: every card holds two pods of 40 GiB (priority 0..6): each node needs both pods of
  one card gone (the answer names 2 victims per node).
- ``1..9 per card``: each card shared by 1..9 pods (fixed seed) holding together all of its memory in
  random parts, priorities 0..9 (some at the preemptor's: never victims).

Baseline, measured alternately in the same run: ``/filter`` for the same pod and nodes (what
kube-scheduler asked just before preempting; every node fails), so ``x filter`` is what the
preemption costs on top of a scheduling attempt. kube-scheduler sends at most
``max(100, 10 % of the nodes)`` candidates by default: 500 is a 5,000-node cluster. ``CPU ms`` is the
process CPU time per ``/preempt`` (median; client and server share the process), which a busy
machine does not inflate the way it inflates the wall-clock columns.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import statistics
import time
from typing import Any

import aiohttp
from aiohttp.test_utils import TestServer

from benchmarks.objects import offline_context, registered_node
from benchmarks.table import Table, ms, summary
from hami.annotations import (
    POD_DEVICES_ALLOCATED,
    POD_VGPU_NODE,
)
from hami.scheduler.app import create_app
from hami.scheduler.context import Context
from hami.scheduler.snapshot import local_time

CARDS = 8
MEMORY = 81920
SIZES = ((100, 30), (500, 12))  # (nodes, requests)
PREEMPTOR = {
    "metadata": {"name": "urgent", "namespace": "bench", "uid": "u-urgent"},
    "spec": {
        "priority": 100,
        "containers": [
            {"name": "main", "resources": {"limits": {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "57344"}}}
        ],
    },
}


def _node(name: str, now_local: Any) -> dict[str, Any]:
    return registered_node(name, now_local, cards=CARDS, memory_mib=MEMORY, card_type="NVIDIA A100-SXM4-80GB")


def _pod(node: str, card: int, k: int, memory: int, priority: int, started: int) -> dict[str, Any]:
    name = f"{node}-{card}-{k}"
    return {
        "metadata": {
            "name": name,
            "namespace": "bench",
            "uid": f"uid-{name}",
            "annotations": {
                POD_VGPU_NODE: node,
                POD_DEVICES_ALLOCATED: f"GPU-{node}-{card},NVIDIA,{memory},0:;",
            },
        },
        "spec": {"nodeName": node, "priority": priority, "containers": [{"name": "c"}]},
        "status": {"phase": "Running", "startTime": f"2026-05-01T{started // 60:02d}:{started % 60:02d}:00Z"},
    }


def _two_per_card(node: str, rng: random.Random) -> list[dict[str, Any]]:
    return [
        _pod(node, card, k, MEMORY // 2, rng.randint(0, 6), rng.randint(0, 1439))
        for card in range(CARDS)
        for k in range(2)
    ]


def _shared(node: str, rng: random.Random) -> list[dict[str, Any]]:
    pods = []
    for card in range(CARDS):
        sharing = rng.randint(1, 9)
        cuts = sorted(rng.sample(range(1, MEMORY), sharing - 1))
        parts = [b - a for a, b in zip([0, *cuts], [*cuts, MEMORY], strict=True)]
        pods += [
            _pod(node, card, k, part, rng.randint(0, 9) if rng.random() < 0.9 else 100, rng.randint(0, 1439))
            for k, part in enumerate(parts)
        ]
    return pods


CLUSTERS = (("2 per card", _two_per_card), ("1..9 per card", _shared))


def _context(nodes: int, holders: Any) -> tuple[Context, list[str]]:
    rng = random.Random(11)
    ctx = offline_context()
    now_local = local_time(ctx.clock())
    names = [f"node-{i:05d}" for i in range(nodes)]
    ctx.snapshot.replace_nodes([_node(name, now_local) for name in names])
    ctx.snapshot.replace_pods([pod for name in names for pod in holders(name, rng)])
    ctx.snapshot.replace_quotas([])
    return ctx, names


async def _latency(
    ctx: Context, names: list[str], requests: int
) -> tuple[list[float], list[float], list[float], dict[str, Any]]:
    preempt = json.dumps(
        {"Pod": PREEMPTOR, "NodeNameToMetaVictims": {n: {"Pods": [], "NumPDBViolations": 0} for n in names}}
    )
    filtering = json.dumps({"Pod": PREEMPTOR, "Nodes": None, "NodeNames": names})
    server = TestServer(create_app(ctx), host="127.0.0.1")
    await server.start_server()
    preempted: list[float] = []
    filtered: list[float] = []
    cpu: list[float] = []  # process CPU seconds per /preempt (client and server share the process)
    answer: dict[str, Any] = {}
    try:
        async with aiohttp.ClientSession() as session:
            headers = {"Content-Type": "application/json"}
            for i in range(requests + 2):  # alternately, so a change of load hits both
                for path, body, samples in (
                    ("/preempt", preempt, preempted),
                    ("/filter", filtering, filtered),
                ):
                    started, cpu_started = time.perf_counter(), time.process_time()
                    async with session.post(server.make_url(path), data=body, headers=headers) as response:
                        raw = await response.read()
                    elapsed, cpu_spent = time.perf_counter() - started, time.process_time() - cpu_started
                    assert response.status == 200, raw[:200]
                    if i >= 2:  # warm-up
                        samples.append(elapsed)
                    if path == "/preempt":
                        answer = json.loads(raw)
                        if i >= 2:
                            cpu.append(cpu_spent)
                    else:
                        assert json.loads(raw)["NodeNames"] == [], (
                            "the pod must fit nowhere before preempting"
                        )
    finally:
        await server.close()
    return preempted, filtered, cpu, answer


def run() -> list[Table]:
    # the baseline's FilteringFailed Events have no API server to go to here
    logging.getLogger("hami.kube.events").setLevel(logging.CRITICAL)
    table = Table(
        title="/preempt per call over HTTP (pod: 1 card of 56 GiB, priority 100; every node a candidate, "
        "8 full cards); baseline: /filter for the same pod and nodes",
        columns=(
            "nodes",
            "cluster",
            "kept",
            "victims",
            "median ms",
            "p99 ms",
            "max ms",
            "CPU ms",
            "/filter ms",
            "x filter",
            "us/node (median)",
        ),
    )
    for label, holders in CLUSTERS:
        for nodes, requests in SIZES:
            ctx, names = _context(nodes, holders)
            preempted, filtered, cpu, answer = asyncio.run(_latency(ctx, names, requests))
            kept = answer["NodeNameToMetaVictims"]
            victims = sum(len(v["Pods"]) for v in kept.values())
            base = statistics.median(filtered)
            median = statistics.median(preempted)
            table.rows.append(
                (
                    str(nodes),
                    label,
                    str(len(kept)),
                    str(victims),
                    *summary(preempted),
                    ms(statistics.median(cpu)),
                    ms(base),
                    f"{median / base:.1f}",
                    f"{median * 1e6 / nodes:.0f}",
                )
            )
    return [table]
