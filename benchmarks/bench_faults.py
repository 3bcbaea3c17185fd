"""Scale faults (issue 24): a relist of every pod while binds are in flight, 10 % of the node agents
restarting at once, a burst of GPU pods at one namespace with a quota. What must hold: no over-commit, no
lost pod, bounded scheduler memory (docs/scale.md, "Scale faults").

One table, a row per run, each judged by :func:`hami_testkit.audit.audit` over what the API server stores
at the end: over-committed cards (memory, cores or grants above a registered card's), over-committed
quotas, and the pods the run created that are neither Running, bound, nor Pending with a reason (lost).
The scheduler's resident memory (``VmRSS`` of ``hami scheduler``) is sampled every 0.2 s: before the run,
its peak, and after.

**a. Relist while binding.** The API server of ``benchmarks/bench_scale.py`` (a child process preloaded
with ``NODES`` nodes of 8 cards and ``PODS`` bound pods) behind a :class:`hami_testkit.watchproxy.WatchProxy`
in this process; ``hami scheduler`` started on the proxy. Namespaces ``stream-0`` and ``stream-1`` each
have a ResourceQuota for half of a stream. A stream of ``STREAM`` GPU pods (1 card, 4,000 MiB, 30 %
cores) per namespace is scheduled by ``WORKERS`` concurrent loops playing kube-scheduler (create the pod,
``/filter`` over a window of ``WINDOW`` nodes, ``/bind`` to the first that passed, up to three tries, else
the pod gets kube-scheduler's ``PodScheduled=False`` condition with the reason) and the agent (after a
bind: the node lock removed, the pod set Running). Baseline: the first stream, no fault. Then the second
stream, during which the scheduler's pod watch is broken ``RELISTS`` times (the open stream ended, its
resume answered ``410 Gone``): the scheduler lists every pod again while binds go on.

**b. 10 % of the agents restarting at once.** The embedded system of ``hami demo --generate N --agents
fleet`` with the fleet split over ten processes (``SystemOptions.fleets``); ``RESTART_PODS`` GPU pods drawn
from openb (``benchmarks/bench_e2e.py``'s draw) are created at ``RATE`` pods/s; a third of the way in, one
fleet process (a tenth of the nodes) is killed (SIGKILL) and started again. Waits until every pod is
Running, or none has changed for ``STALL`` s. Also reported: node locks left at the end. Baseline: the
same number of pods, before, with no restart.

**c. Quota burst.** The same system (one fleet process) with ``BURST_NODES`` nodes; namespace ``burst``
has a ResourceQuota of ``BURST_QUOTA`` pods' GPU memory; ``BURST`` GPU pods (1 card, 4,000 MiB, 10 %
cores) are created as fast as ``IN_FLIGHT`` concurrent creates go (admission, the webhook). Waits until
every pod is Running or Pending with a reason and nothing changed for ``STALL`` s.

Sizes: ``HAMI_BENCH_FAULTS_NODES`` / ``_PODS`` / ``_STREAM`` (a), ``_FLEET_NODES`` / ``_RESTART_PODS`` (b),
``_BURST_NODES`` / ``_BURST`` (c); ``HAMI_BENCH_FAULTS_ONLY=a,b,c`` runs some.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import secrets
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp

from benchmarks.bench_e2e import draw_pods
from benchmarks.bench_scale import apiserver, cluster, rss_mib, start_scheduler, stop
from benchmarks.table import Table
from hami.annotations import NODE_LOCK
from hami_testkit.apiserver import write_kubeconfig
from hami_testkit.audit import Audit, audit
from hami_testkit.clustergen import OPENB_MIX, generate_cluster
from hami_testkit.kubeapi import ApiError, SimApi
from hami_testkit.system import SCHEDULER, EmbeddedSystem, SystemOptions
from hami_testkit.watchproxy import WatchProxy

POD_MIB, POD_CORES = 4000, 30
WORKERS = 8
WINDOW = 40
TRIES = 3
RELISTS = 2
FLEETS = 10
RATE = 20.0
STALL = 90.0  # longer than the kube-scheduler stand-in's flush of parked pods (60 s in the embedded system)
LIMIT = 1200.0
IN_FLIGHT = 32
BURST_QUOTA = 50
BENCH = "hami-bench"


def _env(name: str, default: int) -> int:
    return int(os.environ.get(f"HAMI_BENCH_FAULTS_{name}", str(default)))


@dataclass(slots=True)
class Row:
    scenario: str
    scale: str
    created: int
    verdict: Audit
    rss: tuple[float, float, float]
    seconds: float
    note: str = ""


class RssSampler:
    """``VmRSS`` of one process every 0.2 s: first, peak, last (MiB)."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.first = self.peak = self.last = rss_mib(pid)
        self._task: asyncio.Task[None] | None = None

    async def _run(self) -> None:
        while True:
            with contextlib.suppress(OSError):
                self.last = rss_mib(self.pid)
                self.peak = max(self.peak, self.last)
            await asyncio.sleep(0.2)

    def __enter__(self) -> RssSampler:
        self._task = asyncio.get_running_loop().create_task(self._run())
        return self

    def __exit__(self, *exc_info: object) -> None:
        if self._task is not None:
            self._task.cancel()
        with contextlib.suppress(OSError):
            self.last = rss_mib(self.pid)
            self.peak = max(self.peak, self.last)

    @property
    def triple(self) -> tuple[float, float, float]:
        return self.first, self.peak, self.last


async def _until(condition: Callable[[], bool]) -> None:
    while not condition():  # noqa: ASYNC110  (a counter of another task; polled)
        await asyncio.sleep(0.2)


def _answered(proxy: WatchProxy, count: int) -> Callable[[], bool]:
    return lambda: proxy.gone >= count


def gpu_pod(name: str, namespace: str, memory: int, cores: int) -> dict[str, Any]:
    limits = {"nvidia.com/gpu": "1", "nvidia.com/gpumem": str(memory), "nvidia.com/gpucores": str(cores)}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "schedulerName": "hami-scheduler",
            "containers": [{"name": "main", "image": "cuda:12", "resources": {"limits": limits}}],
        },
    }


def quota(namespace: str, pods: int, memory: int) -> dict[str, Any]:
    return {
        "metadata": {"name": "gpu", "namespace": namespace},
        "spec": {"hard": {"limits.nvidia.com/gpumem": str(pods * memory)}},
    }


async def stored(api: SimApi, namespaces: list[str]) -> tuple[list[Any], list[Any], list[Any]]:
    nodes = await api.list_objects("/api/v1/nodes")
    pods = await api.list_objects("/api/v1/pods")
    quotas = [
        q for ns in namespaces for q in await api.list_objects(f"/api/v1/namespaces/{ns}/resourcequotas")
    ]
    return nodes, pods, quotas


# ------------------------------------------------------------------------- a. relist while binding


class Stream:
    """kube-scheduler and the agent for a stream of pods on the preloaded cluster (module docstring)."""

    def __init__(self, session: aiohttp.ClientSession, api: SimApi, verbs: str, names: list[str]) -> None:
        self.session, self.api, self.verbs, self.names = session, api, verbs, names
        self.bound = 0
        self.done = 0

    async def _post(self, verb: str, body: dict[str, Any]) -> dict[str, Any]:
        async with self.session.post(f"{self.verbs}/{verb}", json=body) as response:
            answer: dict[str, Any] = await response.json(content_type=None)
            return answer

    async def one(self, index: int, namespace: str) -> None:
        pod = await self.api.create(
            f"/api/v1/namespaces/{namespace}/pods", gpu_pod(f"s-{index:05d}", namespace, POD_MIB, POD_CORES)
        )
        meta = pod["metadata"]
        why = ""
        for attempt in range(TRIES):
            start = (index * 7 + attempt * WINDOW) % len(self.names)
            window = (self.names + self.names)[start : start + WINDOW]
            passed = (await self._post("filter", {"Pod": pod, "NodeNames": window})).get("NodeNames") or []
            if not passed:
                why = "no node passed the extender's filter"
                continue
            node = passed[0]
            body = {"PodName": meta["name"], "PodNamespace": namespace, "PodUID": meta["uid"], "Node": node}
            why = str((await self._post("bind", body)).get("Error") or "")
            if not why:
                self.bound += 1
                # the agent: Allocate done, the lock released, the container started
                await self.api.merge_patch(
                    f"/api/v1/nodes/{node}", {"metadata": {"annotations": {NODE_LOCK: None}}}
                )
                await self.api.merge_patch(
                    f"/api/v1/namespaces/{namespace}/pods/{meta['name']}/status",
                    {"status": {"phase": "Running"}},
                )
                return
        condition = {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": why}
        await self.api.merge_patch(
            f"/api/v1/namespaces/{namespace}/pods/{meta['name']}/status",
            {"status": {"conditions": [condition]}},
        )

    async def run(self, namespace: str, count: int, on_progress: Any = None) -> None:
        queue = list(range(count))

        async def worker() -> None:
            while queue:
                index = queue.pop(0)
                await self.one(index, namespace)
                self.done += 1
                if on_progress is not None:
                    await on_progress(self.done)

        await asyncio.gather(*(worker() for _ in range(WORKERS)))


async def relist_rows(nodes: int, pods: int, stream: int) -> list[Row]:
    objects, _ = cluster(nodes, pods)
    names = [n["metadata"]["name"] for n in objects["nodes"]]
    rows: list[Row] = []
    with tempfile.TemporaryDirectory(prefix="hami-faults-", dir="/tmp") as tmp:
        work = Path(tmp)
        (work / "objects.json").write_text(json.dumps(objects))
        del objects
        with apiserver(work / "objects.json") as (url, _):
            async with aiohttp.ClientSession() as session, WatchProxy(url) as proxy:
                api = SimApi(session, url)
                spaces = ["stream-0", "stream-1"]
                for ns in spaces:
                    await api.create("/api/v1/namespaces", {"metadata": {"name": ns}})
                    await api.create(
                        f"/api/v1/namespaces/{ns}/resourcequotas", quota(ns, stream // 2, POD_MIB)
                    )
                kubeconfig = write_kubeconfig(work / "kubeconfig", proxy.url)
                process, ready, verbs = await start_scheduler(session, kubeconfig, work / "scheduler.log")
                try:
                    scale = f"{nodes:,} nodes, {pods:,} pods preloaded; {stream} pods streamed"
                    for ns, relists in zip(spaces, (0, RELISTS), strict=True):
                        driver = Stream(session, api, verbs, names)
                        gone0 = proxy.gone
                        marks = {stream * (i + 1) // (relists + 1) for i in range(relists)}

                        async def progress(done: int, marks: set[int] = marks) -> None:
                            if done in marks:
                                marks.discard(done)
                                proxy.break_watches("pods", gone=True)

                        started = time.monotonic()
                        with RssSampler(process.pid) as rss:
                            await driver.run(ns, stream, progress)
                            # every break was answered (410, so a relist) while the stream was binding
                            await _until(_answered(proxy, gone0 + relists))
                        seconds = time.monotonic() - started
                        node_list, pod_list, quotas = await stored(api, spaces)
                        verdict = audit(
                            node_list, pod_list, quotas, [(ns, f"s-{i:05d}") for i in range(stream)]
                        )
                        del pod_list
                        label = (
                            f"a. {relists} relists of every pod while binding"
                            if relists
                            else "a. baseline: the same stream, no relist"
                        )
                        note = f"start to ready {ready:.0f} s; 410s answered: {proxy.gone - gone0}"
                        rows.append(Row(label, scale, stream, verdict, rss.triple, seconds, note))
                finally:
                    stop(process)
    return rows


# --------------------------------------------------------------------- b. and c. on the embedded system


@contextlib.contextmanager
def _spread(seconds: str) -> Iterator[None]:
    """The fleet children's start spread (``HAMI_START_SPREAD``, read from the environment they copy)."""
    before = os.environ.get("HAMI_START_SPREAD")
    os.environ["HAMI_START_SPREAD"] = seconds
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("HAMI_START_SPREAD", None)
        else:
            os.environ["HAMI_START_SPREAD"] = before


async def _create_all(
    api: SimApi, pods: list[dict[str, Any]], rate: float | None, on_created: Any = None
) -> None:
    limiter = asyncio.Semaphore(IN_FLIGHT)
    count = 0

    async def create(pod: dict[str, Any]) -> None:
        nonlocal count
        async with limiter:
            namespace = pod["metadata"]["namespace"]
            with contextlib.suppress(ApiError):  # a refusal is the webhook's: counted as lost by the audit
                await api.create(f"/api/v1/namespaces/{namespace}/pods", pod)
            count += 1
            if on_created is not None:
                await on_created(count)

    started = time.monotonic()
    tasks = []
    for i, pod in enumerate(pods):
        if rate is not None and (delay := started + i / rate - time.monotonic()) > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(create(pod)))
    await asyncio.gather(*tasks)


async def _settle(system: EmbeddedSystem, api: SimApi, namespace: str, count: int) -> None:
    """Until every pod of ``namespace`` is Running or Pending with a reason and nothing changed for
    ``STALL`` s (or all Running), at most ``LIMIT`` s."""
    started = last_change = time.monotonic()
    last: tuple[int, int] = (-1, -1)
    while True:
        system.check_standin()
        pods = await api.list_objects(f"/api/v1/namespaces/{namespace}/pods")
        running = sum((p.get("status") or {}).get("phase") == "Running" for p in pods)
        reasoned = sum(
            any(
                c.get("type") == "PodScheduled" and c.get("status") == "False"
                for c in (p.get("status") or {}).get("conditions") or ()
            )
            for p in pods
        )
        now = time.monotonic()
        if (running, reasoned) != last:
            last, last_change = (running, reasoned), now
        if running == count or now - last_change > STALL or now - started > LIMIT:
            return
        await asyncio.sleep(1.0)


def _why_pending(verdict: Audit) -> str:
    """The most common reason a pod is still Pending, if any is."""
    if not verdict.pending_reasons:
        return ""
    reason, count = max(verdict.pending_reasons.items(), key=lambda item: item[1])
    return f"; Pending: {count} x {reason[:160]!r}"


def _locks(nodes: list[Any]) -> int:
    return sum(bool(((n.get("metadata") or {}).get("annotations") or {}).get(NODE_LOCK)) for n in nodes)


async def restart_rows(nodes: int, count: int) -> list[Row]:
    workdir = Path(tempfile.mkdtemp(prefix="hami-faults-", dir="/tmp"))
    spec = generate_cluster(nodes, OPENB_MIX)
    options = SystemOptions(
        request_log=64,
        register_interval=30.0,
        log_level="WARNING",
        fleet=True,
        fleets=FLEETS,
        ready_limit=900.0,
    )
    rows: list[Row] = []
    try:
        with _spread("10"):
            async with EmbeddedSystem(spec, workdir, options) as system, aiohttp.ClientSession() as session:
                emulator: Any = system.emulator
                token = secrets.token_hex(16)
                emulator.identities[token] = BENCH
                api = SimApi(session, system.url, token=token)
                pid = system.supervisor.children[SCHEDULER].process.pid
                fleets = list(system.fleet_nodes())
                drawn = draw_pods(spec, 2 * count)
                for phase, restart in (("base", False), ("restart", True)):
                    await api.create("/api/v1/namespaces", {"metadata": {"name": phase}})
                    batch = drawn[:count] if not restart else drawn[count : 2 * count]
                    for pod in batch:
                        pod["metadata"]["namespace"] = phase
                    restarted: list[str] = []

                    async def on_created(
                        done: int,
                        restart: bool = restart,
                        restarted: list[str] = restarted,
                        third: int = len(batch) // 3,
                    ) -> None:
                        if restart and done == third and not restarted:
                            restarted.append(fleets[0])
                            await system.restart_fleet(fleets[0])

                    started = time.monotonic()
                    with RssSampler(pid) as rss:
                        await _create_all(api, batch, RATE, on_created)
                        await _settle(system, api, phase, len(batch))
                    seconds = time.monotonic() - started
                    node_list, pod_list, _ = await stored(api, [])
                    expected = [(phase, p["metadata"]["name"]) for p in batch]
                    verdict = audit(node_list, pod_list, (), expected)
                    share = len(system.fleet_nodes()[fleets[0]])
                    label = (
                        f"b. {share} of {nodes} agents ({share * 100 // nodes} %) killed, restarted at once"
                        if restart
                        else "b. baseline: the same pods, no restart"
                    )
                    scale = (
                        f"{nodes} fleet nodes, {len(fleets)} processes; {len(batch)} openb pods, {RATE:g}/s"
                    )
                    note = f"node locks left: {_locks(node_list)}" + _why_pending(verdict)
                    rows.append(Row(label, scale, len(batch), verdict, rss.triple, seconds, note))
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    return rows


async def burst_rows(nodes: int, count: int) -> list[Row]:
    workdir = Path(tempfile.mkdtemp(prefix="hami-faults-", dir="/tmp"))
    spec = generate_cluster(nodes, OPENB_MIX)
    options = SystemOptions(
        request_log=64, register_interval=30.0, log_level="WARNING", fleet=True, ready_limit=900.0
    )
    try:
        with _spread("10"):
            async with EmbeddedSystem(spec, workdir, options) as system, aiohttp.ClientSession() as session:
                emulator: Any = system.emulator
                token = secrets.token_hex(16)
                emulator.identities[token] = BENCH
                api = SimApi(session, system.url, token=token)
                pid = system.supervisor.children[SCHEDULER].process.pid
                await api.create("/api/v1/namespaces", {"metadata": {"name": "burst"}})
                await api.create(
                    "/api/v1/namespaces/burst/resourcequotas", quota("burst", BURST_QUOTA, POD_MIB)
                )
                pods = [gpu_pod(f"b-{i:05d}", "burst", POD_MIB, 10) for i in range(count)]
                for pod in pods:
                    del pod["spec"]["schedulerName"]  # the webhook sets it, as for any user's pod
                started = time.monotonic()
                with RssSampler(pid) as rss:
                    await _create_all(api, pods, None)
                    created = time.monotonic() - started
                    await _settle(system, api, "burst", count)
                seconds = time.monotonic() - started
                node_list, pod_list, quotas = await stored(api, ["burst"])
                verdict = audit(node_list, pod_list, quotas, [("burst", p["metadata"]["name"]) for p in pods])
                used = verdict.quota_use.get("burst", (0, None, 0, None))
                note = (
                    f"created in {created:.0f} s ({count / created:.0f}/s); quota {used[0]:,} of "
                    f"{used[1] or 0:,} MiB used; node locks left: {_locks(node_list)}"
                )
                scale = f"{nodes} fleet nodes; {count:,} pods, quota of {BURST_QUOTA} pods' memory"
                return [
                    Row("c. quota burst at one namespace", scale, count, verdict, rss.triple, seconds, note)
                ]
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


# --------------------------------------------------------------------------------------- the table


def table(rows: list[Row]) -> Table:
    out = Table(
        title="Scale faults (issue 24): over-commit, lost pods and the scheduler's memory after each fault, "
        "judged over what the API server stores (hami_testkit.audit)",
        columns=(
            "scenario",
            "scale",
            "pods bound / Running",
            "Pending with a reason",
            "lost pods",
            "over-committed cards",
            "over-committed quotas",
            "scheduler RSS MiB before / peak / after",
            "seconds",
            "notes",
        ),
    )
    for row in rows:
        v = row.verdict
        out.rows.append(
            (
                row.scenario,
                row.scale,
                f"{v.running + v.bound_waiting} / {v.running}",
                str(v.pending_with_reason),
                str(len(v.lost)) + (f" ({v.lost[0]})" if v.lost else ""),
                str(len(v.cards)) + (f" ({v.cards[0]})" if v.cards else ""),
                str(len(v.quotas)) + (f" ({v.quotas[0]})" if v.quotas else ""),
                " / ".join(f"{x:.0f}" for x in row.rss),
                f"{row.seconds:.0f}",
                row.note,
            )
        )
    return out


async def measure() -> list[Row]:
    only = set(os.environ.get("HAMI_BENCH_FAULTS_ONLY", "a,b,c").split(","))
    rows: list[Row] = []
    if "a" in only:
        rows += await relist_rows(_env("NODES", 1000), _env("PODS", 10000), _env("STREAM", 120))
    if "b" in only:
        rows += await restart_rows(_env("FLEET_NODES", 200), _env("RESTART_PODS", 150))
    if "c" in only:
        rows += await burst_rows(_env("BURST_NODES", 100), _env("BURST", 5000))
    return rows


def run() -> list[Table]:
    return [table(asyncio.run(measure()))]
