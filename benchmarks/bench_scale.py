"""The scheduler extender at 5,000 nodes and 50,000 pods: resident memory, start and restart to ready, and
``/filter``'s p99 against the same run's bare scan of precomputed card tuples.

Set-up: the embedded API server (the test kit's, kmock) in a child process, preloaded (its objects written
straight into its store, no request) with ``NODES`` registered Nodes of 8 cards each (80 GB, two NUMA
nodes of 4, 10 slots a card) and ``PODS`` Running pods bound to them, ``PODS / NODES`` a node, each
holding one card's random part of memory and cores (a fixed seed; grants through the codec's format).
No agent runs: the nodes' handshakes (``Requesting_<time>``) are stamped ten minutes ahead, so that
without an agent answering they stay within the scheduler's 60 s window over the run. Then ``hami
scheduler`` (the CLI, the process a chart install runs) is started on it: **start to ready** is from the
process's spawn to ``GET /readyz`` answering 200 (the route says the live view has synced its first
lists: every Node and Pod read, every grant booked); its CPU seconds (``/proc/<pid>/stat``) and ``VmRSS``
right after. It is killed (SIGKILL, as a crash) and started again: **restart to ready**, CPU and RSS
again. Baseline, in between: one LIST of every Node and every Pod by the benchmark itself (aiohttp and
``json``), what any client pays to read the cluster from this API server.

Then ``/filter`` over loopback for one pod (1 card, 4000 MiB, 30 % cores) naming every node, as
kube-scheduler sends it with ``nodeCacheCapable``, each call a new version of the pod (a new
``resourceVersion``: evaluated anew, not answered from the scheduling cycle kept for a repeated one):
``ROUNDS`` calls after ``WARM_UP``, median and p99 of the wall time. Baseline, the same run, ``SCANS``
times: a bare scan in this process of the same nodes' card tuples (free slots, free MiB, free cores per
card, as the preloaded pods left them) keeping the nodes with one card able to hold the pod, what
``benchmarks/bench_pod_path.py`` calls the scan: the least any scheduler written in Python pays to look
at the cluster. Target rows (issue 24): RSS ≤ 1 GiB and restart to ready ≤ 10 s; filter p99 ≤ 10x the
scan's p99. ``HAMI_BENCH_SCALE_NODES`` / ``HAMI_BENCH_SCALE_PODS``
change the sizes (default 5000 / 50000).
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp

from benchmarks.objects import new_version
from benchmarks.table import Table, percentile
from hami.annotations import (
    NODE_HANDSHAKE,
    NODE_REGISTER,
    POD_DEVICES_ALLOCATED,
    POD_VGPU_NODE,
    HandshakeKind,
    encode_handshake,
    encode_node_devices,
)
from hami.core.model import Device
from hami_testkit.apiserver import write_kubeconfig
from hami_testkit.processes import PortReservations

CARDS, MEMORY_MIB, SLOTS, PER_NUMA = 8, 81920, 10, 4
MODEL = "NVIDIA A100-SXM4-80GB"
NAMESPACE = "default"
WARM_UP, ROUNDS = 5, 100
#: the scheduler's listen ports, held for the life of the bench (a child binds them)
PORTS = PortReservations()
SCANS = 1000  # the baseline is cheap: more samples steady its p99 on a shared machine
POD_MIB, POD_CORES = 4000, 30
READY_LIMIT = 600.0
TICKS = os.sysconf("SC_CLK_TCK")
#: The child: an embedded API server preloaded from a JSON file (argv[1]) of nodes and pods; prints its
#: URL, serves until stdin closes.
SERVER = """
import asyncio, json, sys
import kmock
from hami_testkit.apiserver import embedded_apiserver
from hami_testkit.restapi import now_utc, stamp_create

async def main():
    with open(sys.argv[1]) as f:
        objects = json.load(f)
    async with embedded_apiserver(request_log=64) as k:
        now = now_utc()
        for plural, namespaced in (("nodes", False), ("pods", True)):
            resource = kmock.resource(f"v1/{plural}")
            for obj in objects[plural]:
                k.revision += 1
                namespace = obj["metadata"].get("namespace") if namespaced else None
                stamp_create(obj, namespace, k.revision, now)
                k.objects[resource, namespace, obj["metadata"]["name"]] = obj
        del objects
        print(str(k.url).rstrip("/"), flush=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)  # until stdin closes

asyncio.run(main())
"""

Cards = tuple[tuple[int, int, int], ...]  # per card: free slots, free MiB, free cores


def cluster(
    nodes: int, pods: int, seed: int = 5
) -> tuple[dict[str, list[dict[str, Any]]], list[tuple[str, Cards]]]:
    """The Node and Pod objects to preload, and every node's card tuples after those pods."""
    rng = random.Random(seed)
    stamp = datetime.datetime.now().astimezone().replace(tzinfo=None) + datetime.timedelta(minutes=10)
    node_objects: list[dict[str, Any]] = []
    pod_objects: list[dict[str, Any]] = []
    tuples: list[tuple[str, Cards]] = []
    per_node = max(1, pods // nodes)
    for index in range(nodes):
        name = f"node-{index:05d}"
        devices = [
            Device(
                uuid=f"GPU-{name}-{i}",
                index=i,
                count=SLOTS,
                memory_mib=MEMORY_MIB,
                cores=100,
                type=MODEL,
                numa=i // PER_NUMA,
                mode="hami-core",
                health=True,
            )
            for i in range(CARDS)
        ]
        node_objects.append(
            {
                "apiVersion": "v1",
                "kind": "Node",
                "metadata": {
                    "name": name,
                    "annotations": {
                        NODE_REGISTER: encode_node_devices(devices),
                        NODE_HANDSHAKE: encode_handshake(HandshakeKind.REQUESTING, stamp),
                    },
                },
                "status": {"allocatable": {"nvidia.com/gpu": str(CARDS * SLOTS)}},
            }
        )
        free = [[SLOTS, MEMORY_MIB, 100] for _ in range(CARDS)]
        for j in range(per_node if len(pod_objects) < pods else 0):
            card = rng.randrange(CARDS)
            mib = rng.randint(256, free[card][1] // 4)
            cores = rng.randint(0, free[card][2] // 4)
            free[card][0] -= 1
            free[card][1] -= mib
            free[card][2] -= cores
            annotations = {
                POD_VGPU_NODE: name,
                POD_DEVICES_ALLOCATED: f"GPU-{name}-{card},NVIDIA,{mib},{cores}:;",
            }
            limits = {"nvidia.com/gpu": "1", "nvidia.com/gpumem": str(mib), "nvidia.com/gpucores": str(cores)}
            pod_objects.append(
                {
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "metadata": {
                        "name": f"held-{index:05d}-{j}",
                        "namespace": NAMESPACE,
                        "annotations": annotations,
                    },
                    "spec": {
                        "nodeName": name,
                        "schedulerName": "hami-scheduler",
                        "containers": [{"name": "main", "image": "cuda:12", "resources": {"limits": limits}}],
                    },
                    "status": {"phase": "Running"},
                }
            )
        tuples.append((name, tuple((s, m, c) for s, m, c in free)))
    return {"nodes": node_objects, "pods": pod_objects}, tuples


def bare_scan(tuples: list[tuple[str, Cards]]) -> list[str]:
    return [
        name for name, cards in tuples if any(s > 0 and m >= POD_MIB and c >= POD_CORES for s, m, c in cards)
    ]


def candidate() -> dict[str, Any]:
    limits = {"nvidia.com/gpu": "1", "nvidia.com/gpumem": str(POD_MIB), "nvidia.com/gpucores": str(POD_CORES)}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "candidate", "namespace": NAMESPACE, "uid": "candidate-uid"},
        "spec": {
            "schedulerName": "hami-scheduler",
            "containers": [{"name": "main", "image": "cuda:12", "resources": {"limits": limits}}],
        },
    }


@contextlib.contextmanager
def apiserver(objects_file: Path) -> Iterator[tuple[str, int]]:
    process = subprocess.Popen(
        [sys.executable, "-c", SERVER, str(objects_file)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stdout is not None
        url = process.stdout.readline().strip()
        if not url.startswith("http"):
            raise RuntimeError("the preloaded API server did not start")
        yield url, process.pid
    finally:
        if process.stdin is not None:
            process.stdin.close()
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(5)


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS  # utime, stime


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


async def start_scheduler(
    session: aiohttp.ClientSession, kubeconfig: Path, log: Path
) -> tuple[subprocess.Popen[bytes], float, str]:
    """Spawn ``hami scheduler``; (process, seconds from spawn to /readyz 200, verbs URL)."""
    port, probes = PORTS.take(), PORTS.take()
    argv = [
        sys.executable, "-m", "hami.cli", "scheduler",
        "--kubeconfig", str(kubeconfig),
        "--listen", f"127.0.0.1:{port}",
        "--metrics-listen", f"127.0.0.1:{probes}",
        "--log-level", "WARNING",
    ]  # fmt: skip
    started = time.monotonic()
    process = _spawn(argv, log)
    while True:
        if process.poll() is not None:
            raise RuntimeError(f"the scheduler exited: {_tail(log)}")
        if time.monotonic() - started > READY_LIMIT:
            stop(process)
            raise RuntimeError(f"the scheduler was not ready within {READY_LIMIT:g} s: {_tail(log)}")
        with contextlib.suppress(aiohttp.ClientError, TimeoutError):
            url = f"http://127.0.0.1:{probes}/readyz"
            async with session.get(url, timeout=aiohttp.ClientTimeout(total=5)) as response:
                if response.status == 200:
                    return process, time.monotonic() - started, f"http://127.0.0.1:{port}"
        await asyncio.sleep(0.05)


def _spawn(argv: list[str], log: Path) -> subprocess.Popen[bytes]:
    with log.open("ab") as out:
        return subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)


def _tail(log: Path) -> str:
    return log.read_text(errors="replace")[-2000:]


def stop(process: subprocess.Popen[bytes], sig: int = signal.SIGTERM) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, sig)
    try:
        process.wait(30)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()


async def measure(nodes: int, pods: int) -> dict[str, Any]:
    objects, tuples = cluster(nodes, pods)
    names = [n["metadata"]["name"] for n in objects["nodes"]]
    with tempfile.TemporaryDirectory(prefix="hami-scale-", dir="/tmp") as tmp:
        work = Path(tmp)
        (work / "objects.json").write_text(json.dumps(objects))
        del objects
        with apiserver(work / "objects.json") as (url, server_pid):
            kubeconfig = write_kubeconfig(work / "kubeconfig", url)
            out: dict[str, Any] = {"apiserver RSS MiB": rss_mib(server_pid)}
            async with aiohttp.ClientSession() as session:
                process, ready, _ = await start_scheduler(session, kubeconfig, work / "scheduler.log")
                out["start s"], out["start RSS MiB"] = ready, rss_mib(process.pid)
                out["start CPU s"] = cpu_seconds(process.pid)
                stop(process, signal.SIGKILL)
                started = time.monotonic()
                for plural in ("nodes", "pods"):
                    async with session.get(f"{url}/api/v1/{plural}") as response:
                        listed = len((await response.json())["items"])
                    out[f"listed {plural}"] = listed
                out["list s"] = time.monotonic() - started
                process, ready, verbs = await start_scheduler(session, kubeconfig, work / "scheduler.log")
                try:
                    out["restart s"], out["restart RSS MiB"] = ready, rss_mib(process.pid)
                    out["restart CPU s"] = cpu_seconds(process.pid)
                    walls: list[float] = []
                    passed = 0
                    headers = {"Content-Type": "application/json"}
                    for i in range(WARM_UP + ROUNDS):
                        body = json.dumps(
                            {"Pod": new_version(candidate()), "Nodes": None, "NodeNames": names}
                        )
                        started = time.perf_counter()
                        async with session.post(f"{verbs}/filter", data=body, headers=headers) as response:
                            reply = await response.json(content_type=None)
                        if i >= WARM_UP:
                            walls.append(time.perf_counter() - started)
                        passed = len(reply.get("NodeNames") or [])
                    scans: list[float] = []
                    for i in range(WARM_UP + SCANS):
                        started = time.perf_counter()
                        fitting = bare_scan(tuples)
                        if i >= WARM_UP:
                            scans.append(time.perf_counter() - started)
                    out["filter RSS MiB"] = rss_mib(process.pid)
                    out["filter"], out["scan"], out["passed"], out["fitting"] = (
                        walls,
                        scans,
                        passed,
                        len(fitting),
                    )
                finally:
                    stop(process)
    return out


def run() -> list[Table]:
    nodes = int(os.environ.get("HAMI_BENCH_SCALE_NODES", "5000"))
    pods = int(os.environ.get("HAMI_BENCH_SCALE_PODS", "50000"))
    m = asyncio.run(measure(nodes, pods))
    memory = Table(
        title=f"The scheduler on {nodes:,} registered nodes and {pods:,} bound pods (API server preloaded, "
        "no agent): start and restart (after SIGKILL) to /readyz, resident memory",
        columns=("what", "seconds", "scheduler CPU s", "scheduler RSS MiB", "API server RSS MiB"),
    )
    memory.rows.append(
        (
            "start to ready",
            f"{m['start s']:.1f}",
            f"{m['start CPU s']:.1f}",
            f"{m['start RSS MiB']:.0f}",
            f"{m['apiserver RSS MiB']:.0f}",
        )
    )
    memory.rows.append(
        (
            "restart to ready (after SIGKILL)",
            f"{m['restart s']:.1f}",
            f"{m['restart CPU s']:.1f}",
            f"{m['restart RSS MiB']:.0f}",
            "-",
        )
    )
    memory.rows.append(
        (f"after {WARM_UP + ROUNDS} /filter calls", "-", "-", f"{m['filter RSS MiB']:.0f}", "-")
    )
    memory.rows.append(
        (
            f"baseline: one LIST of every node and pod ({m['listed nodes']:,} + {m['listed pods']:,}; "
            "aiohttp + json in the benchmark)",
            f"{m['list s']:.1f}",
            "-",
            "-",
            "-",
        )
    )
    walls, scans = m["filter"], m["scan"]
    filt = Table(
        title=f"/filter naming all {nodes:,} nodes ({ROUNDS} calls, ms) against the same run's bare scan of "
        "the nodes' precomputed card tuples",
        columns=("what", "median", "p99", "nodes passed", "x scan (p99)"),
    )
    filt.rows.append(
        (
            "/filter over loopback",
            f"{statistics.median(walls) * 1000:.2f}",
            f"{percentile(walls, 99) * 1000:.2f}",
            str(m["passed"]),
            f"{percentile(walls, 99) / percentile(scans, 99):.1f}",
        )
    )
    filt.rows.append(
        (
            "bare scan of card tuples (baseline)",
            f"{statistics.median(scans) * 1000:.2f}",
            f"{percentile(scans, 99) * 1000:.2f}",
            str(m["fitting"]),
            "1.0",
        )
    )
    targets = Table(
        title=f"Scale targets (issue 24) at {nodes:,} nodes / {pods:,} pods",
        columns=("target", "measured", "verdict"),
    )
    rss = max(m["restart RSS MiB"], m["filter RSS MiB"], m["start RSS MiB"])
    targets.rows.append(
        ("scheduler resident memory <= 1 GiB", f"{rss:.0f} MiB", "met" if rss <= 1024 else "not met")
    )
    targets.rows.append(
        ("restart to ready <= 10 s", f"{m['restart s']:.1f} s", "met" if m["restart s"] <= 10 else "not met")
    )
    ratio = percentile(walls, 99) / percentile(scans, 99)
    targets.rows.append(
        (
            "filter p99 <= 10x the bare scan's p99",
            f"{percentile(walls, 99) * 1000:.1f} ms vs {percentile(scans, 99) * 1000:.2f} ms: {ratio:.1f}x",
            "met" if ratio <= 10 else "not met",
        )
    )
    return [memory, filt, targets]
