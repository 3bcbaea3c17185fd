"""The fleet's cost: many simulated nodes' agents in one process (``python -m nodeagent.fleet``) against
the same run's baseline, one ``hami-node-agent`` process for one node.

Set-up per row: the embedded API server (the test kit's, in a child process), N nodes of the openb mix
(:mod:`hami_testkit.clustergen`, seed 0) created on it with their files, the kubelet stand-in for all of
them (a child process), then the agents: the fleet (one child) or, for the baseline, one agent for one
node. Each row waits until every node is registered and its device plugin serves (allocatable > 0:
``ready s``), then measures the agents' process over ``ROUNDS`` registration rounds of
``--register-interval`` ``HAMI_BENCH_FLEET_INTERVAL`` s (default 30, the agent's default): CPU seconds
(user + system, every thread, from ``/proc/<pid>/stat``) per round, and resident memory (``VmRSS``) at
the end. One round's CPU is everything the agents do in that time: the registration of every node (a GET
of its Node; no patch when unchanged), the card health polls every 5 s, each device plugin's watch of
its sockets every second and the exporter's pod pass. Columns per node divide by N; ``x baseline`` is the
fleet's per-node figure over the single agent's (what N agent processes would cost). Sizes:
``HAMI_BENCH_FLEET_SIZES`` (default ``100,1000``).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import yaml

from benchmarks.table import Table
from hami import objects
from hami.annotations import NODE_REGISTER
from hami_testkit.apiserver import write_kubeconfig
from hami_testkit.cluster import ClusterSpec, node_object, write_node_files
from hami_testkit.clustergen import OPENB_MIX, generate_cluster
from hami_testkit.kubeapi import SimApi, nodes_path

ROUNDS = 2
SERVER = """
import asyncio, sys
from hami_testkit.apiserver import embedded_apiserver

async def main():
    async with embedded_apiserver(request_log=64) as k:
        print(str(k.url).rstrip("/"), flush=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)  # until stdin closes

asyncio.run(main())
"""
TICKS = os.sysconf("SC_CLK_TCK")


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS  # utime, stime


def _rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


@contextlib.contextmanager
def _child(argv: list[str], log: Path, **kw: object) -> Iterator[subprocess.Popen[str]]:
    with log.open("w") as out:
        process = subprocess.Popen(
            argv, stdout=out, stderr=subprocess.STDOUT, text=True, start_new_session=True
        )
    try:
        yield process
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


@contextlib.contextmanager
def _apiserver() -> Iterator[str]:
    process = subprocess.Popen(
        [sys.executable, "-c", SERVER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert process.stdout is not None
        yield process.stdout.readline().strip()
    finally:
        if process.stdin is not None:
            process.stdin.close()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


async def _all_ready(api: SimApi, names: set[str]) -> bool:
    ready = 0
    for node in await api.list_objects(nodes_path()):
        if objects.name(node) in names and objects.annotations(node).get(NODE_REGISTER):
            ready += int(objects.allocatable(node).get("nvidia.com/gpu") or 0) > 0
    return ready == len(names)


async def _measure(cluster: ClusterSpec, fleet: bool, interval: float) -> tuple[float, float, float]:
    """(ready seconds, CPU seconds per round, RSS MiB) of the agents of ``cluster``."""
    with tempfile.TemporaryDirectory(prefix="hf-", dir="/tmp") as tmp, _apiserver() as url:
        work = Path(tmp)
        kubeconfig = write_kubeconfig(work / "kubeconfig", url)
        files = {node.name: write_node_files(node, work / "n") for node in cluster.nodes}
        async with aiohttp.ClientSession() as session:
            api = SimApi(session, url)
            for node in cluster.nodes:
                await api.create(nodes_path(), node_object(node))
            standin = [sys.executable, "-m", "hami_testkit.kubelet_standin", "--kubeconfig", str(kubeconfig)]
            for name, node_files in files.items():
                standin += ["--node", f"{name}={node_files.kubelet_dir}"]
            common = [
                "--kubeconfig",
                str(kubeconfig),
                "--register-interval",
                str(interval),
                "--log-level",
                "WARNING",
            ]
            common += ["--metrics-listen", "127.0.0.1:0"]
            if fleet:
                entries = [
                    {
                        "name": n,
                        "sim_devices": str(f.devices),
                        "kubelet_dir": str(f.kubelet_dir),
                        "config": str(f.config),
                    }
                    for n, f in files.items()
                ]
                (work / "fleet.yaml").write_text(yaml.safe_dump({"nodes": entries}))
                agents = [
                    sys.executable,
                    "-m",
                    "nodeagent.fleet",
                    "--fleet",
                    str(work / "fleet.yaml"),
                    *common,
                ]
            else:
                ((name, f),) = files.items()
                agents = [sys.executable, "-m", "nodeagent", "--node-name", name, "--backend", "sim"]
                agents += ["--sim-devices", str(f.devices), "--kubelet-dir", str(f.kubelet_dir), *common]
            with _child([*standin, "--log-level", "WARNING"], work / "kubelet.log"):
                while not all((f.kubelet_dir / "kubelet.sock").exists() for f in files.values()):  # noqa: ASYNC110 - files
                    await asyncio.sleep(0.2)
                started = time.monotonic()
                with _child(agents, work / "agents.log") as process:
                    names = set(files)
                    while not await _all_ready(api, names):
                        if process.poll() is not None:
                            raise RuntimeError((work / "agents.log").read_text()[-3000:])
                        await asyncio.sleep(0.5)
                    ready = time.monotonic() - started
                    await asyncio.sleep(interval)  # the start spread is over: every node in its cadence
                    cpu = _cpu_seconds(process.pid)
                    await asyncio.sleep(ROUNDS * interval)
                    per_round = (_cpu_seconds(process.pid) - cpu) / ROUNDS
                    return ready, per_round, _rss_mib(process.pid)


def run() -> list[Table]:
    sizes = [int(s) for s in os.environ.get("HAMI_BENCH_FLEET_SIZES", "100,1000").split(",") if s.strip()]
    interval = float(os.environ.get("HAMI_BENCH_FLEET_INTERVAL", "30"))
    table = Table(
        title=f"Node agents: a process per node vs one fleet ({ROUNDS} rounds of {interval:g} s, openb mix)",
        columns=(
            "nodes",
            "agents",
            "ready s",
            "RSS MiB",
            "RSS KiB/node",
            "CPU s/round",
            "CPU ms/node/round",
            "RSS x baseline",
            "CPU x baseline",
        ),
    )
    _, base_cpu, base_rss = asyncio.run(_measure(generate_cluster(1, OPENB_MIX), False, interval))
    table.rows.append(
        (
            "1",
            "hami-node-agent (baseline)",
            "-",
            f"{base_rss:.1f}",
            f"{base_rss * 1024:.0f}",
            f"{base_cpu:.3f}",
            f"{base_cpu * 1000:.1f}",
            "1.00",
            "1.00",
        )
    )
    for size in sizes:
        ready, cpu, rss = asyncio.run(_measure(generate_cluster(size, OPENB_MIX), True, interval))
        table.rows.append(
            (
                str(size),
                "fleet (one process)",
                f"{ready:.1f}",
                f"{rss:.1f}",
                f"{rss * 1024 / size:.0f}",
                f"{cpu:.3f}",
                f"{cpu * 1000 / size:.2f}",
                f"{rss / size / base_rss:.3f}",
                f"{cpu / size / base_cpu:.3f}" if base_cpu > 0 else "-",
            )
        )
    return [table]
