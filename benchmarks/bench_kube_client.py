"""Kubernetes API client cost: the sync client in worker threads (what ``hami.kube`` runs) vs async clients.

The question (issue 14, "typed Kubernetes edge"): would an async client (lightkube or kr8s) let us drop
the worker threads of ``hami.kube.client.call_json`` (and ``hami_testkit.kubeapi``)? Set-up: the embedded API
server (kmock) in a child process, seeded with ``PODS`` pods of a realistic size (our annotations); this
process is only the client, so its CPU time (``time.process_time``, every thread) is the client's cost.
Operations: GET one pod, merge-PATCH one pod's annotations, LIST every pod; each closed loop with 1 and
16 requests in flight. Clients, each returning what its callers would use:

* baseline: ``hami.kube.pods.get_pod`` / ``patch_pod`` / ``list_pods``: the official ``kubernetes``
  client through ``asyncio.to_thread`` (the default executor: ``min(32, CPUs + 4)`` threads), raw dicts;
* lightkube ``AsyncClient`` (httpx2): its typed models (lazily decoded), as its callers use them;
* kr8s (httpx): ``Api.call_api`` and the raw JSON (kr8s' ``Pod.get`` lists by field selector and retries
  a missing pod for seconds: not what a bind may do);
* aiohttp: ``hami_testkit.kubeapi.SimApi``, the small raw-JSON client the stand-ins already use.

Columns: median and p99 latency, throughput, client CPU per request, and throughput and CPU as a
multiple of the baseline's. The server's own cost (kmock, in Python) bounds every client's throughput;
the CPU column is what a client saves. Requests per row: ``HAMI_BENCH_KUBE_REQUESTS`` (default 400; LIST
a tenth). Needs the optional ``lightkube`` and ``kr8s`` packages; their rows are left out when missing.
"""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp

from benchmarks.childserver import apiserver_process
from benchmarks.table import Table, ms, percentile
from hami.annotations import POD_BIND_PHASE, POD_BIND_TIME, POD_DEVICES_ALLOCATED, POD_VGPU_NODE
from hami.kube import pods as kube_pods
from hami.kube.client import load_api_client
from hami_testkit.apiserver import write_kubeconfig
from hami_testkit.kubeapi import SimApi, pods_path

PODS = 200
NAMESPACE = "default"
LEVELS = (1, 16)
OPERATIONS = ("get", "patch", "list")
ROUNDS = 4
SERVER = """
import asyncio, sys
from hami_testkit.apiserver import embedded_apiserver

async def main():
    async with embedded_apiserver(request_log=64) as k:
        print(str(k.url).rstrip("/"), flush=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)  # until stdin closes

asyncio.run(main())
"""

Call = Callable[[int], Awaitable[Any]]


def _pod(index: int) -> dict[str, Any]:
    grant = f"GPU-{index:04d}-aaaa-bbbb-cccc-dddddddddddd,NVIDIA,4000,30:;"
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": f"p{index}",
            "namespace": NAMESPACE,
            "labels": {"app": "train", POD_VGPU_NODE: "node-1"},
            "annotations": {
                POD_VGPU_NODE: "node-1",
                POD_DEVICES_ALLOCATED: grant,
                POD_BIND_PHASE: "success",
                POD_BIND_TIME: "1714557600",
            },
        },
        "spec": {
            "schedulerName": "hami-scheduler",
            "nodeName": "node-1",
            "containers": [
                {
                    "name": "main",
                    "image": "cuda:12",
                    "resources": {"limits": {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "4000"}},
                    "env": [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "none"}],
                }
            ],
        },
    }


async def _closed_loop(call: Call, count: int, in_flight: int) -> tuple[list[float], float, float]:
    """``count`` calls, ``in_flight`` at a time: latencies, wall seconds and client CPU seconds."""
    latencies: list[float] = []
    next_index = 0

    async def worker() -> None:
        nonlocal next_index
        while next_index < count:
            index = next_index
            next_index += 1
            start = time.perf_counter()
            await call(index)
            latencies.append(time.perf_counter() - start)

    cpu, wall = time.process_time(), time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(in_flight)))
    return latencies, time.perf_counter() - wall, time.process_time() - cpu


def _patch(index: int) -> dict[str, Any]:
    return {"metadata": {"annotations": {POD_BIND_TIME: str(1714557600 + index)}}}


async def _baseline(kubeconfig: Path) -> tuple[dict[str, Call], Callable[[], Awaitable[None]]]:
    api = load_api_client(str(kubeconfig), component="bench")

    async def patch(i: int) -> Any:
        return await kube_pods.patch_pod(
            api, NAMESPACE, f"p{i % PODS}", annotations=_patch(i)["metadata"]["annotations"]
        )

    async def close() -> None:
        api.close()

    calls: dict[str, Call] = {
        "get": lambda i: kube_pods.get_pod(api, NAMESPACE, f"p{i % PODS}"),
        "patch": patch,
        "list": lambda i: kube_pods.list_pods(api),
    }
    return calls, close


async def _lightkube(kubeconfig: Path) -> tuple[dict[str, Call], Callable[[], Awaitable[None]]] | None:
    try:
        from lightkube import AsyncClient  # type: ignore[import-not-found, unused-ignore]
        from lightkube.config.kubeconfig import KubeConfig  # type: ignore[import-not-found, unused-ignore]
        from lightkube.resources.core_v1 import Pod  # type: ignore[import-not-found, unused-ignore]
        from lightkube.types import PatchType  # type: ignore[import-not-found, unused-ignore]
    except ImportError:
        return None
    client = AsyncClient(KubeConfig.from_file(str(kubeconfig)), trust_env=False)

    async def listing(i: int) -> Any:
        return [pod async for pod in client.list(Pod, namespace="*")]

    calls: dict[str, Call] = {
        "get": lambda i: client.get(Pod, f"p{i % PODS}", namespace=NAMESPACE),
        "patch": lambda i: client.patch(
            Pod, f"p{i % PODS}", _patch(i), namespace=NAMESPACE, patch_type=PatchType.MERGE
        ),
        "list": listing,
    }
    return calls, client.close


async def _kr8s(kubeconfig: Path) -> tuple[dict[str, Call], Callable[[], Awaitable[None]]] | None:
    try:
        import kr8s.asyncio  # type: ignore[import-not-found, unused-ignore]
    except ImportError:
        return None
    api = await kr8s.asyncio.api(kubeconfig=str(kubeconfig))

    async def call(method: str, url: str, namespace: str | None, **kwargs: Any) -> Any:
        async with api.call_api(method, url=url, namespace=namespace, **kwargs) as response:
            return response.json()

    async def close() -> None:
        session = api._session  # kr8s caches one Api per loop and has no close of its own
        if session is not None:
            await session.aclose()

    calls: dict[str, Call] = {
        "get": lambda i: call("GET", f"pods/p{i % PODS}", NAMESPACE),
        "patch": lambda i: call(
            "PATCH",
            f"pods/p{i % PODS}",
            NAMESPACE,
            content=json.dumps(_patch(i)),
            headers={"Content-Type": "application/merge-patch+json"},
        ),
        "list": lambda i: call("GET", "pods", None),
    }
    return calls, close


async def _aiohttp(url: str) -> tuple[dict[str, Call], Callable[[], Awaitable[None]]]:
    session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=64))
    api = SimApi(session, url)
    calls: dict[str, Call] = {
        "get": lambda i: api.get(pods_path(NAMESPACE, f"p{i % PODS}")),
        "patch": lambda i: api.merge_patch(pods_path(NAMESPACE, f"p{i % PODS}"), _patch(i)),
        "list": lambda i: api.list_objects(pods_path()),
    }
    return calls, session.close


async def _seed(url: str) -> None:
    async with aiohttp.ClientSession() as session:
        api = SimApi(session, url)
        for index in range(PODS):
            await api.create(pods_path(NAMESPACE), _pod(index))


Row = tuple[str, int, str, list[float], float, float]


async def _measure(requests: int) -> list[Row]:
    rows: list[Row] = []
    with tempfile.TemporaryDirectory() as tmp, apiserver_process(SERVER) as url:
        kubeconfig = write_kubeconfig(Path(tmp) / "kubeconfig", url)
        await _seed(url)
        clients: list[tuple[str, tuple[dict[str, Call], Callable[[], Awaitable[None]]] | None]] = [
            ("sync kubernetes client, threads", await _baseline(kubeconfig)),
            ("lightkube AsyncClient (models)", await _lightkube(kubeconfig)),
            ("kr8s call_api (raw JSON)", await _kr8s(kubeconfig)),
            ("aiohttp (hami_testkit.kubeapi)", await _aiohttp(url)),
        ]
        ready = [(label, client[0]) for label, client in clients if client is not None]
        for _, calls in ready:  # warm-up: connections, first-call imports and caches
            for operation in OPERATIONS:
                await calls[operation](0)
        for operation in OPERATIONS:
            count = requests if operation != "list" else max(requests // 10, ROUNDS)
            for in_flight in LEVELS:
                # the clients take turns in rounds (order rotated), so a slow spell of the shared machine
                # or the server's growing state falls on all of them alike
                totals: dict[str, tuple[list[float], float, float]] = {
                    label: ([], 0.0, 0.0) for label, _ in ready
                }
                for turn in range(ROUNDS):
                    for label, calls in ready[turn % len(ready) :] + ready[: turn % len(ready)]:
                        latencies, wall, cpu = await _closed_loop(
                            calls[operation], count // ROUNDS, in_flight
                        )
                        kept, walls, cpus = totals[label]
                        totals[label] = (kept + latencies, walls + wall, cpus + cpu)
                rows.extend((operation, in_flight, label, *totals[label]) for label, _ in ready)
        for _, client in clients:
            if client is not None:
                await client[1]()
    return rows


def run() -> list[Table]:
    requests = int(os.environ.get("HAMI_BENCH_KUBE_REQUESTS", "400"))
    rows = asyncio.run(_measure(requests))
    table = Table(
        title=(
            f"Kubernetes client: {PODS} pods in kmock (another process), closed loop; "
            "baseline: the sync client in threads (hami.kube)"
        ),
        columns=(
            "op",
            "in flight",
            "client",
            "median ms",
            "p99 ms",
            "req/s",
            "CPU µs/req",
            "x baseline req/s",
            "x baseline CPU",
        ),
    )
    baseline: dict[tuple[str, int], tuple[float, float]] = {}
    for operation, in_flight, label, latencies, wall, cpu in rows:
        rate, cpu_each = len(latencies) / wall, cpu / len(latencies)
        base = baseline.setdefault((operation, in_flight), (rate, cpu_each))
        table.rows.append(
            (
                operation,
                str(in_flight),
                label,
                ms(statistics.median(latencies)),
                ms(percentile(latencies, 99)),
                f"{rate:.0f}",
                f"{cpu_each * 1e6:.0f}",
                f"{rate / base[0]:.2f}",
                f"{cpu_each / base[1]:.2f}",
            )
        )
    return [table]
