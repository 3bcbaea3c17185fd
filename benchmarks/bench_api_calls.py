"""API calls per scheduled pod, by component and verb, on the embedded cluster.

Set-up: the whole system of ``hami demo`` (``hami_testkit.system.EmbeddedSystem``: the embedded API
server in this process, and as child processes the scheduler, the webhook, one node agent and the
kubelet stand-in; the kube-scheduler stand-in in this process) on one node with 4 simulated A100-80GB
cards. Each component has its own bearer token, so the API server knows who sent each request; it
keeps every request (``request_log=None``). The node agent's registration interval is an hour, so the
only periodic call it makes (a GET of its Node each interval) falls outside the counted spans; the
``idle`` column checks that nothing else runs in the background.

Measured: ``PODS`` GPU pods (1 card, 1000 MiB, no ``schedulerName``: the webhook sets it), created one
after another by this benchmark (its own token, not counted), each waited for until ``Running`` (the
kube-scheduler stand-in calls /filter, /prioritize and /bind, the kubelet stand-in calls the agent's
Allocate and sets the phase); after the last one, until the API server has seen no request for a
second. Every request in that span is counted by its sender and verb (get, list, watch, create, patch,
update, delete) and resource, and divided by ``PODS``. Baseline, the same run: ``PODS`` pods without
a GPU request (``schedulerName: hami-scheduler``, so the same extender places them). Two pods of each
kind go first, not counted (connections, first reads). ``idle``: the requests in a span as long as
the GPU pods' with no pod created (expected 0).

Rows: our components (scheduler, node agent, webhook) and their total, then the stand-ins that play
Kubernetes' parts (not ours: kube-scheduler, kubelet, and the API server's own emulated admission and
binding writes) for reference, and any other sender (none expected).
"""

from __future__ import annotations

import asyncio
import collections
import secrets
import shutil
import tempfile
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import aiohttp
import kmock

from benchmarks.table import Table
from hami_testkit.cluster import parse_cluster
from hami_testkit.kubeapi import SimApi, pods_path
from hami_testkit.reviews import ANONYMOUS
from hami_testkit.system import (
    ACCOUNTS,
    KUBELET,
    NODE_AGENT,
    SCHEDULER,
    USER,
    WEBHOOK,
    EmbeddedSystem,
    SystemOptions,
)

PODS = 10
WARM_UP = 2
NAMESPACE = "default"
QUIET = 1.0  # seconds without a request that end a span
LIMIT = 60.0  # seconds any one wait may take
CLUSTER = """
nodes:
  - name: gpu-0
    labels: {gpu: "on"}
    cards:
""" + "".join(
    f"      - {{uuid: GPU-00000000-0000-0000-0000-00000000000{i}, model: NVIDIA A100-SXM4-80GB, "
    f"memory_mib: 81920, numa: 0, healthy: true}}\n"
    for i in range(4)
)
BENCH = "hami-bench"
#: (row label, the sender's username): our components, then the stand-ins playing Kubernetes' parts
OURS = (
    ("scheduler", ACCOUNTS[SCHEDULER]),
    ("node agent", ACCOUNTS[NODE_AGENT]),
    ("webhook", ACCOUNTS[WEBHOOK]),
)
STAND_INS = (
    ("kube-scheduler stand-in", ACCOUNTS[USER]),
    ("kubelet stand-in", ACCOUNTS[KUBELET]),
    ("API server (emulated admission, binding)", ANONYMOUS),
)

Counts = collections.Counter[tuple[str, str, str]]  # (username, verb, resource) -> requests


def _gpu_pod(index: int) -> dict[str, Any]:
    limits = {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "1000"}
    return {
        "metadata": {"name": f"gpu-{index:03d}", "namespace": NAMESPACE},
        "spec": {"containers": [{"name": "main", "image": "cuda:12", "resources": {"limits": limits}}]},
    }


def _plain_pod(index: int) -> dict[str, Any]:
    return {
        "metadata": {"name": f"plain-{index:03d}", "namespace": NAMESPACE},
        "spec": {"schedulerName": "hami-scheduler", "containers": [{"name": "main", "image": "busybox"}]},
    }


def _verb(request: kmock.Request) -> str:
    method = request.method.upper()
    if method == "GET":
        if request.name:
            return "get"
        return "watch" if str(request.params.get("watch", "")).lower() in ("true", "1") else "list"
    return {"POST": "create", "PATCH": "patch", "PUT": "update", "DELETE": "delete"}.get(
        method, method.lower()
    )


def _resource(request: kmock.Request) -> str:
    plural = request.resource.plural if request.resource is not None else request.url.path
    plural = plural or "?"
    return f"{plural}/{request.subresource}" if request.subresource else plural


def _count(emulator: Any, requests: Iterable[kmock.Request]) -> Counts:
    return Counts((emulator.username(r), _verb(r), _resource(r)) for r in requests)


async def _quiet(emulator: Any) -> None:
    """Until the API server has had no request for :data:`QUIET` seconds (bounded)."""
    deadline = time.monotonic() + LIMIT
    last, since = emulator.served, time.monotonic()
    while time.monotonic() - since < QUIET:
        if time.monotonic() > deadline:
            raise RuntimeError("the API server did not fall quiet")
        await asyncio.sleep(0.1)
        if emulator.served != last:
            last, since = emulator.served, time.monotonic()


async def _running(api: SimApi, name: str, system: EmbeddedSystem) -> None:
    deadline = time.monotonic() + LIMIT
    while True:
        system.check_standin()
        pod = await api.get(pods_path(NAMESPACE, name))
        phase = ((pod or {}).get("status") or {}).get("phase")
        if phase == "Running":
            return
        if phase == "Failed" or time.monotonic() > deadline:
            raise RuntimeError(f"pod {name} did not start: {phase}")
        await asyncio.sleep(0.02)


async def _span(system: EmbeddedSystem, api: SimApi, pods: list[dict[str, Any]]) -> tuple[Counts, float]:
    """Create each pod and wait for it to run, one after another; the requests of the whole span (this
    benchmark's own excluded) and its seconds."""
    emulator: Any = system.emulator
    start, started = len(list(emulator)), time.monotonic()
    for pod in pods:
        await api.create(pods_path(NAMESPACE), pod)
        await _running(api, pod["metadata"]["name"], system)
    await _quiet(emulator)
    seconds = time.monotonic() - started
    counts = _count(emulator, list(emulator)[start:])
    return Counts({k: v for k, v in counts.items() if k[0] != BENCH}), seconds


async def _measure() -> tuple[Counts, Counts, Counts]:
    workdir = Path(tempfile.mkdtemp(prefix="hami-bench-", dir="/tmp"))  # short: unix socket paths
    options = SystemOptions(request_log=None, register_interval=3600.0, log_level="WARNING")
    try:
        async with EmbeddedSystem(parse_cluster(CLUSTER), workdir, options) as system:
            emulator: Any = system.emulator
            token = secrets.token_hex(16)
            emulator.identities[token] = BENCH
            async with aiohttp.ClientSession() as session:
                api = SimApi(session, system.url, token=token)
                await _quiet(emulator)
                await _span(system, api, [_gpu_pod(i) for i in range(WARM_UP)])
                await _span(system, api, [_plain_pod(i) for i in range(WARM_UP)])
                gpu, seconds = await _span(system, api, [_gpu_pod(i) for i in range(WARM_UP, WARM_UP + PODS)])
                plain, _ = await _span(system, api, [_plain_pod(i) for i in range(WARM_UP, WARM_UP + PODS)])
                start = len(list(emulator))
                await asyncio.sleep(seconds)
                idle = _count(emulator, list(emulator)[start:])
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    return gpu, plain, idle


def _per_pod(counts: Counts, users: set[str]) -> float:
    return sum(n for (who, _, _), n in counts.items() if who in users) / PODS


def _by_verb(counts: Counts, users: set[str]) -> str:
    mine = collections.Counter[tuple[str, str]]()
    for (who, verb, resource), n in counts.items():
        if who in users:
            mine[verb, resource] += n
    return ", ".join(f"{verb} {resource} {n / PODS:g}" for (verb, resource), n in sorted(mine.items())) or "-"


def _ratio(ours: float, base: float) -> str:
    return f"{ours / base:.1f}" if base else "-"


def run() -> list[Table]:
    gpu, plain, idle = asyncio.run(_measure())
    table = Table(
        title=f"API calls per scheduled pod (embedded cluster, {PODS} pods one after another, each until "
        "Running); baseline: a pod without a GPU request placed by the same extender",
        columns=(
            "component",
            "GPU pod calls/pod",
            "GPU pod by verb (calls/pod)",
            "no-GPU pod",
            "no-GPU by verb",
            "x no-GPU",
            "idle",
        ),
    )

    def row(label: str, users: set[str], by_verb: bool = True) -> tuple[str, ...]:
        calls, base = _per_pod(gpu, users), _per_pod(plain, users)
        idle_calls = sum(n for (who, _, _), n in idle.items() if who in users)
        by_gpu, by_plain = (_by_verb(gpu, users), _by_verb(plain, users)) if by_verb else ("", "")
        return (label, f"{calls:g}", by_gpu, f"{base:g}", by_plain, _ratio(calls, base), str(idle_calls))

    table.rows.extend(row(label, {user}) for label, user in OURS)
    table.rows.append(row("ours: total", {user for _, user in OURS}, by_verb=False))
    table.rows.extend(row(label, {user}) for label, user in STAND_INS)
    others = {who for who, _, _ in gpu + plain} - {user for _, user in OURS + STAND_INS}
    if others:  # a sender this table does not know: shown, so that no call goes unseen
        table.rows.append(row(f"others: {', '.join(sorted(others))}", others))
    return [table]
