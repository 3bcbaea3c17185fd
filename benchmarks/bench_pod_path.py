"""One pod's whole scheduler path: ``/filter``, ``/prioritize`` with the survivors, ``/bind`` to the best.

Set-up: the embedded API server (``hami_testkit.apiserver``, kmock) in a child process, seeded with N
registered nodes of a typical card mix (per 20 nodes: 12 with 8 x A100-80GB on two NUMA nodes, 5 with
4 x V100-32GB, 3 with 2 x A10-24GB) and one running pod per node holding a random part (fixed seed) of
every card's memory and cores. In this process: the extender as the service runs it (the real aiohttp
app on 127.0.0.1 through ``aiohttp.test_utils.TestServer``, its list+watch sync from that API server,
the official client in worker threads, the Event recorder), as ``tests/scheduler/conftest.py`` starts
it; the client sends real extender JSON, as kube-scheduler does.

Per pod (1 card, 4000 MiB, 30 % cores; ``schedulerName: hami-scheduler``): the pod is created first
(not timed), then timed: ``/filter`` over every node, ``/prioritize`` over the nodes that passed, and
``/bind`` to the best-scored one (bind reads the pod and the node, takes the node lock, decides the
cards, writes the pod's grant and the Binding: every API round trip is in its time). Not timed after
each pod: the background writes (Events) are drained and the node lock is released, as the node agent
does after Allocate, so that the next pod never waits for a lock. The pods stay: each one adds to the
cluster's usage, as a queue of pods does.

Baselines, in the same run, after each pod (not timed with it): ``scan``, a bare scan of the same
nodes' card tuples (free slots, free MiB, free cores per card, as the seeded pods left them) that
keeps the nodes with one card able to hold the pod: what any scheduler written in Python pays at least
to look at the cluster; ``GET``, one API round trip (GET of the chosen node through the extender's own
client): ``x GET`` of ``/bind`` is about how many round trips it waits for. Each ratio is the row's
median over the baseline's median.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import random
import statistics
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp.test_utils import TestServer

from benchmarks.childserver import apiserver_process
from benchmarks.objects import SLOTS, registered_node
from benchmarks.table import Table, ms, percentile
from hami.annotations import POD_DEVICES_ALLOCATED, POD_VGPU_NODE
from hami.kube.client import load_api_client
from hami.kube.events import EventRecorder
from hami.kube.nodelock import release_node_lock
from hami.kube.nodes import get_node
from hami.kube.protocol import KubeApi
from hami.scheduler.app import create_app
from hami.scheduler.config import SchedulerSettings
from hami.scheduler.context import Context
from hami.scheduler.main import build_context
from hami.scheduler.snapshot import local_time
from hami.scheduler.watches import keep_synced
from hami_testkit.apiserver import write_kubeconfig
from hami_testkit.kubeapi import SimApi, nodes_path, pods_path

#: (nodes, pods scheduled one after another)
SIZES = ((100, 120), (500, 80))
NAMESPACE = "default"
WARM_UP = 5  # first pods: connections, first allocations (not counted)
#: (nodes out of 20, cards, MiB, model, cards per NUMA node)
MIX = (
    (12, 8, 81920, "NVIDIA A100-SXM4-80GB", 4),
    (5, 4, 32768, "NVIDIA V100-SXM2-32GB", 4),
    (3, 2, 24576, "NVIDIA A10", 2),
)
MEMORY, CORES = 4000, 30
SERVER = """
import asyncio, sys
from hami_testkit.apiserver import embedded_apiserver

async def main():
    async with embedded_apiserver(request_log=64) as k:
        print(str(k.url).rstrip("/"), flush=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)  # until stdin closes

asyncio.run(main())
"""


def _shape(index: int) -> tuple[int, int, str, int]:
    slot = index % 20
    for share, cards, memory, model, per_numa in MIX:
        if slot < share:
            return cards, memory, model, per_numa
        slot -= share
    raise AssertionError("the mix covers 20 nodes")


Cards = tuple[tuple[int, int, int], ...]  # per card: free slots, free MiB, free cores


def _cluster(
    nodes: int, seed: int = 11
) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[tuple[str, Cards]]]:
    """The Node objects, one running pod per node holding a random part of each card, and every node's
    cards as (free slots, free MiB, free cores) after those pods (the baseline's input)."""
    rng = random.Random(seed)
    now_local = local_time(datetime.datetime.now(datetime.UTC))
    node_objects, holders, tuples = [], [], []
    for index in range(nodes):
        name = f"node-{index:05d}"
        cards, memory, model, per_numa = _shape(index)
        node_objects.append(
            registered_node(
                name, now_local, cards=cards, memory_mib=memory, card_type=model, cards_per_numa=per_numa
            )
        )
        used = [(rng.randint(0, memory * 3 // 4), rng.randint(0, 70)) for _ in range(cards)]
        devices = "".join(f"GPU-{name}-{i},NVIDIA,{mib},{cores}:" for i, (mib, cores) in enumerate(used))
        annotations = {POD_VGPU_NODE: name, POD_DEVICES_ALLOCATED: devices + ";"}
        holders.append(
            {
                "metadata": {"name": f"held-{index:05d}", "namespace": NAMESPACE, "annotations": annotations},
                "spec": {"nodeName": name, "schedulerName": "hami-scheduler", "containers": [_container()]},
                "status": {"phase": "Running"},
            }
        )
        tuples.append((name, tuple((SLOTS - 1, memory - mib, 100 - cores) for mib, cores in used)))
    return node_objects, holders, tuples


def _container(limits: dict[str, str] | None = None) -> dict[str, Any]:
    return {"name": "main", "image": "cuda:12", "resources": {"limits": limits or {}}}


def _candidate(index: int) -> dict[str, Any]:
    limits = {"nvidia.com/gpu": "1", "nvidia.com/gpumem": str(MEMORY), "nvidia.com/gpucores": str(CORES)}
    return {
        "metadata": {"name": f"candidate-{index:04d}", "namespace": NAMESPACE},
        "spec": {"schedulerName": "hami-scheduler", "containers": [_container(limits)]},
    }


@contextlib.asynccontextmanager
async def _extender(kubeconfig: Path) -> AsyncIterator[tuple[Context, str, KubeApi]]:
    """The running extender (verbs app + sync tasks) on the seeded API server; yields its context,
    base URL and API client; waits for its first lists."""
    settings = SchedulerSettings()
    api = load_api_client(str(kubeconfig), request_timeout=settings.api_timeout, component="bench")
    ctx = build_context(settings, api)
    recorder = EventRecorder(api, component=settings.scheduler_name, clock=ctx.clock)
    server = TestServer(create_app(ctx, recorder=recorder), host="127.0.0.1")
    await server.start_server()
    syncing = asyncio.create_task(keep_synced(ctx), name="sync")
    try:
        deadline = time.monotonic() + 120
        while not (ctx.snapshot.ready and ctx.disruptions.synced):
            if syncing.done() or time.monotonic() > deadline:
                raise RuntimeError("the extender's first lists did not arrive")
            await asyncio.sleep(0.05)
        yield ctx, str(server.make_url("")).rstrip("/"), api
    finally:
        syncing.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await syncing
        await recorder.flush()
        await server.close()
        api.close()


def _bare_scan(tuples: list[tuple[str, Cards]]) -> list[str]:
    return [name for name, cards in tuples if any(s > 0 and m >= MEMORY and c >= CORES for s, m, c in cards)]


Samples = dict[str, list[float]]


async def _post(session: aiohttp.ClientSession, url: str, body: Any) -> Any:
    async with session.post(url, json=body) as response:
        assert response.status == 200, await response.text()
        return await response.json()


async def _schedule(nodes: int, pods: int) -> tuple[Samples, int]:
    """Seconds per pod for each verb, the three together and the baseline; how many were bound."""
    samples: Samples = {k: [] for k in ("filter", "prioritize", "bind", "path", "scan", "get")}
    node_objects, holders, tuples = _cluster(nodes)
    names = [n["metadata"]["name"] for n in node_objects]
    with tempfile.TemporaryDirectory() as tmp, apiserver_process(SERVER) as url:
        kubeconfig = write_kubeconfig(Path(tmp) / "kubeconfig", url)
        async with aiohttp.ClientSession() as seeding:
            seeder = SimApi(seeding, url)
            for node in node_objects:
                await seeder.create(nodes_path(), node)
            for holder in holders:
                await seeder.create(pods_path(NAMESPACE), holder)
            async with _extender(kubeconfig) as (ctx, base, api), aiohttp.ClientSession() as session:
                bound = 0
                for index in range(pods + WARM_UP):
                    pod = await seeder.create(pods_path(NAMESPACE), _candidate(index))
                    meta = pod["metadata"]
                    started = time.perf_counter()
                    filtered = await _post(
                        session, f"{base}/filter", {"Pod": pod, "Nodes": None, "NodeNames": names}
                    )
                    survivors = filtered["NodeNames"] or []
                    after_filter = time.perf_counter()
                    scores = await _post(
                        session, f"{base}/prioritize", {"Pod": pod, "Nodes": None, "NodeNames": survivors}
                    )
                    best = max(scores, key=lambda host: host["Score"])["Host"]  # the first of the best
                    after_prioritize = time.perf_counter()
                    binding = {
                        "PodName": meta["name"],
                        "PodNamespace": NAMESPACE,
                        "PodUID": meta["uid"],
                        "Node": best,
                    }
                    answer = await _post(session, f"{base}/bind", binding)
                    done = time.perf_counter()
                    assert answer == {"Error": ""}, answer
                    # not timed: the node agent's part (the lock) and the background Events
                    await ctx.background.drain()
                    assert await release_node_lock(api, best, NAMESPACE, meta["name"])
                    scan_started = time.perf_counter()
                    fitting = _bare_scan(tuples)
                    scanned = time.perf_counter() - scan_started
                    assert len(fitting) >= len(survivors) > 0  # (the bound pods are not in the tuples)
                    get_started = time.perf_counter()
                    await get_node(api, best)
                    got = time.perf_counter() - get_started
                    if index < WARM_UP:
                        continue
                    bound += 1
                    samples["filter"].append(after_filter - started)
                    samples["prioritize"].append(after_prioritize - after_filter)
                    samples["bind"].append(done - after_prioritize)
                    samples["path"].append(done - started)
                    samples["scan"].append(scanned)
                    samples["get"].append(got)
    return samples, bound


def run() -> list[Table]:
    table = Table(
        title="one pod's whole scheduler path over HTTP (1 card, 4000 MiB, 30 %): /filter (every node), "
        "/prioritize (the survivors), /bind (the best; API server: kmock in another process); N nodes of "
        "A100 x8 / V100 x4 / A10 x2 (12:5:3), part used; baselines: a bare scan of the nodes' card "
        "tuples, one API GET of a node",
        columns=(
            "nodes",
            "pods",
            "verb",
            "median ms",
            "p99 ms",
            "max ms",
            "scan ms",
            "x scan",
            "GET ms",
            "x GET",
        ),
    )
    for nodes, pods in SIZES:
        samples, bound = asyncio.run(_schedule(nodes, pods))
        scan, get = statistics.median(samples["scan"]), statistics.median(samples["get"])
        for verb, label in (
            ("path", "all three"),
            ("filter", "/filter"),
            ("prioritize", "/prioritize"),
            ("bind", "/bind"),
        ):
            values = samples[verb]
            median = statistics.median(values)
            table.rows.append(
                (
                    str(nodes),
                    str(bound),
                    label,
                    ms(median),
                    ms(percentile(values, 99)),
                    ms(max(values)),
                    ms(scan),
                    f"{median / scan:.0f}",
                    ms(get),
                    f"{median / get:.1f}",
                )
            )
    return [table]
