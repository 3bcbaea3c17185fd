"""Scheduler extender: HTTP ``/filter`` latency over loopback and the cost of one pod event.

Each node has 8 cards (10 slots, 32768 MiB, 100 cores; cards 0..3 on NUMA node 0, 4..7 on 1), every
card half used (one tracked pod holds 16384 MiB and 50 cores on each). The pod asks for 1 card with
8000 MiB and 30 cores, so it fits every node and the answer names them all (the largest answer). The
extender is the real aiohttp app (without watches: the snapshot is filled directly) on 127.0.0.1,
called with real extender JSON, each request a new version of the pod (a new ``resourceVersion``: the
extender evaluates it anew, as for a pod it has not seen; a repeated version would be answered from
its scheduling cycle). Targets (issue 3): p99 <= 2 ms at 500 nodes, <= 20 ms at 5,000.

The first table measures three kinds of pod: plain, with ``nvidia.com/use-gputype: A100`` (a third
of production GPU pods carry a type constraint) and with ``nvidia.com/numa-bind``; all three are
judged from the per-node summaries (:mod:`hami.core.precheck`). Its baselines are measured in the same
run, right after each kind's requests: ``core``, the core's verdicts alone on the same node states
(``allocate(...).fitting``); ``full Fit``, every node decided by the full Fit (``fit_node``: card
scores, card order, the walk), what deciding without the summaries costs. ``x plain`` is the median
against the plain pod's at the same size.

The fragmentation table: the same pod annotated ``hami.io/node-scheduler-policy`` and
``hami.io/gpu-scheduler-policy: fragmentation``, ``/filter`` and ``/prioritize`` over HTTP at 500 nodes,
against the same verb for the plain pod (binpack / spread) as the baseline. Here every node is used
alike, so after the first call every node's score is remembered; ``bench_allocate`` measures nodes
used at random and a target change.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import time
from typing import Any

import aiohttp
from aiohttp.test_utils import TestServer

from benchmarks.objects import new_version, offline_context, registered_node
from benchmarks.table import Table, ms, percentile, summary
from hami.annotations import (
    POD_DEVICES_ALLOCATED,
    POD_VGPU_NODE,
    read_pod_request,
)
from hami.core.allocate import allocate, fit_node
from hami.core.model import Allocation
from hami.scheduler.app import create_app
from hami.scheduler.candidates import snapshot_states
from hami.scheduler.snapshot import local_time

CARDS = 8
#: (label, pod annotations): the kinds of pod of the first table.
KINDS: tuple[tuple[str, dict[str, str]], ...] = (
    ("plain", {}),
    ("use-gputype A100", {"nvidia.com/use-gputype": "A100"}),
    ("numa-bind", {"nvidia.com/numa-bind": "true"}),
)
#: (nodes, requests per kind of pod)
SIZES = ((100, 400), (500, 400), (5000, 60))


def _node(name: str, now_local: Any) -> dict[str, Any]:
    return registered_node(
        name, now_local, cards=CARDS, memory_mib=32768, card_type="NVIDIA-A100-SXM4-40GB", cards_per_numa=4
    )


def _pod(name: str, node: str, memory: int = 16384, cores: int = 50) -> dict[str, Any]:
    devices = "".join(f"GPU-{node}-{i},NVIDIA,{memory},{cores}:" for i in range(CARDS)) + ";"
    return {
        "metadata": {
            "name": name,
            "namespace": "bench",
            "annotations": {POD_VGPU_NODE: node, POD_DEVICES_ALLOCATED: devices},
        },
        "spec": {"containers": [{"name": "c"}]},
        "status": {"phase": "Running"},
    }


REQUEST_POD = {
    "metadata": {"name": "candidate", "namespace": "bench", "uid": "u-1"},
    "spec": {
        "containers": [
            {
                "name": "main",
                "resources": {
                    "limits": {
                        "nvidia.com/gpu": "1",
                        "nvidia.com/gpumem": "8000",
                        "nvidia.com/gpucores": "30",
                    }
                },
            }
        ]
    },
}


def _context(nodes: int) -> Any:
    ctx = offline_context()
    now_local = local_time(ctx.clock())
    ctx.snapshot.replace_nodes([_node(f"node-{i:05d}", now_local) for i in range(nodes)])
    ctx.snapshot.replace_pods([_pod(f"used-{i:05d}", f"node-{i:05d}") for i in range(nodes)])
    ctx.snapshot.replace_quotas([])  # no namespace quota: the plain-pod fast path
    return ctx


FRAGMENTATION_POD: dict[str, Any] = {
    **REQUEST_POD,
    "metadata": {
        "name": "candidate",
        "namespace": "bench",
        "uid": "u-1",
        "annotations": {
            "hami.io/node-scheduler-policy": "fragmentation",
            "hami.io/gpu-scheduler-policy": "fragmentation",
        },
    },
}


async def _filter_latency(
    nodes: int, requests: int, path: str = "/filter", pod: dict[str, Any] = REQUEST_POD
) -> tuple[list[float], int, int]:
    ctx = _context(nodes)
    names = [f"node-{i:05d}" for i in range(nodes)]
    server = TestServer(create_app(ctx), host="127.0.0.1")
    await server.start_server()
    samples: list[float] = []
    fitting = size = 0
    try:
        async with aiohttp.ClientSession() as session:
            url = str(server.make_url(path))
            headers = {"Content-Type": "application/json"}
            for i in range(requests + 5):
                body = json.dumps({"Pod": new_version(pod), "Nodes": None, "NodeNames": names})
                started = time.perf_counter()
                async with session.post(url, data=body, headers=headers) as response:
                    raw = await response.read()
                elapsed = time.perf_counter() - started
                if i >= 5:  # warm-up: first connections, first allocations
                    samples.append(elapsed)
            answer = json.loads(raw)
            if path == "/filter":
                assert answer["Error"] == "", answer["Error"]
                fitting = len(answer["NodeNames"])
            else:
                fitting = sum(1 for host in answer if host["Score"] > 0)
            size = len(raw)
    finally:
        await server.close()
    return samples, fitting, size


def _with_annotations(steering: dict[str, str]) -> dict[str, Any]:
    metadata = {"name": "candidate", "namespace": "bench", "uid": "u-1", "annotations": steering}
    return {**REQUEST_POD, "metadata": metadata}


async def _kind_latency(
    ctx: Any, nodes: int, pod: dict[str, Any], requests: int
) -> tuple[list[float], list[float], list[float], int, int]:
    """Seconds per /filter request, per core decision and per full-Fit decision of every node (a tenth
    as many); how many nodes fit; the answer's size in bytes."""
    names = [f"node-{i:05d}" for i in range(nodes)]
    request = read_pod_request(pod, ctx.settings.device_config)
    states, _ = snapshot_states(ctx.snapshot, names, request, ctx.clock())
    policy = ctx.settings.policy
    server = TestServer(create_app(ctx), host="127.0.0.1")
    await server.start_server()
    samples: list[float] = []
    core: list[float] = []
    full: list[float] = []
    decided: tuple[str, ...] = ()
    raw = b""
    try:
        async with aiohttp.ClientSession() as session:
            url = str(server.make_url("/filter"))
            headers = {"Content-Type": "application/json"}
            for i in range(requests + 5):
                body = json.dumps({"Pod": new_version(pod), "Nodes": None, "NodeNames": names})
                started = time.perf_counter()
                async with session.post(url, data=body, headers=headers) as response:
                    raw = await response.read()
                elapsed = time.perf_counter() - started
                if i >= 5:  # warm-up: first connections, first allocations
                    samples.append(elapsed)
    finally:
        await server.close()
    # The baselines right after the requests, on the same states (interleaved, the full Fit's garbage
    # would land in the requests' p99).
    for i in range(requests):
        started = time.perf_counter()
        decided = allocate(request, states, policy).fitting
        core.append(time.perf_counter() - started)
        if i % 10 == 0:
            started = time.perf_counter()
            by_fit = [s.name for s in states if isinstance(fit_node(request, s, policy), Allocation)]
            full.append(time.perf_counter() - started)
            assert by_fit == list(decided)  # the summaries decide as the full Fit does
    answer = json.loads(raw)
    assert answer["Error"] == "", answer["Error"]
    assert answer["NodeNames"] == list(decided)
    return samples, core, full, len(decided), len(raw)


def filter_table(sizes: tuple[tuple[int, int], ...] = SIZES) -> Table:
    """Every kind of pod at every size, with the same-run baselines (see the module docstring)."""
    table = Table(
        title="scheduler /filter over HTTP (8 cards/node, half used; pod fits every node); baselines: "
        "the core's verdicts alone, every node by the full Fit",
        columns=(
            "nodes",
            "pod",
            "requests",
            "median ms",
            "p99 ms",
            "max ms",
            "core ms",
            "x core",
            "full Fit ms",
            "x full Fit",
            "x plain",
            "fitting",
            "answer bytes",
        ),
    )
    for nodes, requests in sizes:
        ctx = _context(nodes)
        plain = 0.0
        for label, steering in KINDS:
            samples, core, full, fitting, size = asyncio.run(
                _kind_latency(ctx, nodes, _with_annotations(steering), requests)
            )
            median, core_median, full_median = (statistics.median(x) for x in (samples, core, full))
            plain = plain or median
            table.rows.append(
                (
                    str(nodes),
                    label,
                    str(requests),
                    *summary(samples),
                    ms(core_median),
                    f"{median / core_median:.1f}",
                    ms(full_median),
                    f"{median / full_median:.3f}",
                    f"{median / plain:.2f}",
                    str(fitting),
                    str(size),
                )
            )
    return table


def _event_cost(nodes: int, events: int) -> list[float]:
    """Seconds per pod MODIFIED event (the pod's usage moves between two allocations on its node)."""
    ctx = _context(nodes)
    first, second = _pod("used-00000", "node-00000"), _pod("used-00000", "node-00000", 8192, 25)
    samples = []
    for i in range(events):
        pod = first if i % 2 else second
        started = time.perf_counter()
        ctx.snapshot.pod_event("MODIFIED", pod)
        samples.append(time.perf_counter() - started)
    return samples


def _cold_start(nodes: int, pods_per_node: int) -> tuple[float, float]:
    """Seconds to rebuild the snapshot from full lists (a scheduler restart), without the API's own time.

    Returns (nodes list applied, pods list applied). Each pod holds one card (4000 MiB, 10 cores).
    """
    ctx = offline_context()
    now_local = local_time(ctx.clock())
    node_list = [_node(f"node-{i:05d}", now_local) for i in range(nodes)]
    pod_list = []
    for i in range(nodes):
        for k in range(pods_per_node):
            pod = _pod(f"p-{i:05d}-{k}", f"node-{i:05d}")
            pod["metadata"]["annotations"][POD_DEVICES_ALLOCATED] = (
                f"GPU-node-{i:05d}-{k % CARDS},NVIDIA,4000,10:;"
            )
            pod_list.append(pod)
    started = time.perf_counter()
    ctx.snapshot.replace_nodes(node_list)
    after_nodes = time.perf_counter()
    ctx.snapshot.replace_pods(pod_list)
    return after_nodes - started, time.perf_counter() - after_nodes


def run() -> list[Table]:
    table = filter_table()
    events = Table(
        title="snapshot: applying one pod event (8 grants) with 5,000 nodes tracked",
        columns=("events", "median µs", "p99 µs", "mean µs"),
    )
    samples = _event_cost(5000, 2000)
    events.rows.append(
        (
            str(len(samples)),
            f"{statistics.median(samples) * 1e6:.1f}",
            f"{sorted(samples)[int(len(samples) * 0.99) - 1] * 1e6:.1f}",
            f"{statistics.fmean(samples) * 1e6:.1f}",
        )
    )
    cold = Table(
        title="scheduler restart: snapshot rebuilt from full lists (API time excluded)",
        columns=("nodes", "pods", "nodes applied s", "pods applied s", "total s"),
    )
    for nodes, per_node in ((500, 10), (5000, 10)):
        node_seconds, pod_seconds = _cold_start(nodes, per_node)
        cold.rows.append(
            (
                str(nodes),
                str(nodes * per_node),
                f"{node_seconds:.2f}",
                f"{pod_seconds:.2f}",
                f"{node_seconds + pod_seconds:.2f}",
            )
        )
    fragmentation = Table(
        title="fragmentation policy over HTTP, 500 nodes (8 cards/node, half used); baseline: the plain pod",
        columns=("verb", "median ms", "p99 ms", "max ms", "baseline p99 ms", "x baseline (p99)"),
    )
    for path in ("/filter", "/prioritize"):
        ours, _, _ = asyncio.run(_filter_latency(500, 400, path, FRAGMENTATION_POD))
        base, _, _ = asyncio.run(_filter_latency(500, 400, path, REQUEST_POD))
        median, p99, worst = summary(ours)
        base_p99 = percentile(base, 99)
        ratio = f"{percentile(ours, 99) / base_p99:.2f}"
        fragmentation.rows.append((path, median, p99, worst, f"{base_p99 * 1000:.3f}", ratio))
    return [table, events, cold, fragmentation]
