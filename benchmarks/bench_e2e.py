"""End to end: pods from the openb trace created at a set rate on the embedded cluster of N simulated
nodes, until they are Running; against the same run's baseline, pods with no GPU request.

Set-up per row: the whole system of ``hami demo --generate N --agents fleet``
(``hami_testkit.system.EmbeddedSystem`` with ``fleet=True``: the embedded API server, the admission,
kube-scheduler and workload stand-ins in this process; as child processes the scheduler extender, the
webhook, the kubelet stand-in and one ``python -m nodeagent.fleet`` for every node), N nodes of openb's
card mix (``hami_testkit.clustergen``, seed 0), registration every 30 s (the agent's default; the fleet's
start spread ``HAMI_START_SPREAD``, 10 s here, so that a thousand nodes come up in a row's time).

Pods: GPU pods of openb's ``gpuspec20`` trace (``tests/data/openb``: ``default`` with a fifth of its GPU
pods restricted to models), drawn with a fixed seed: fractional (``gpumem-percentage`` = ``gpucores`` =
gpu_milli / 10), whole-card, multi-card and type-restricted ones (``use-gputype`` naming the simulated
card of each openb model the trace allows); a tenth of those asking
for at most two cards also ``numa-bind``, and one in twenty pinned to the cards of one node of a fitting
model and size (``use-gpuuuid``). Pods asking for a model the generated cluster lacks are skipped, and the
draw stops at half of the cluster's cards. No ``schedulerName``: the webhook sets it. They are created
at ``RATE`` pods/s (each create a task, at most 32 in flight), until each is Running or no pod has
started for ``STALL`` s (the rest are counted as not Running). Baseline, the same run, after the GPU
pods: as many pods with no GPU request (``schedulerName: hami-scheduler``, so the same extender places
them) at the same rate.

Measured per phase (GPU pods, then baseline), with no instrument inside our components:

* **pods/s**: pods Running over the span from the first create to the last Running; creation→Running
  latency p50/p99 (from this benchmark's create call to the API server storing ``phase: Running``);
* **node lock hold** p50/p99: from the API server storing a node's ``hami.io/mutex.lock`` until it
  stores its removal or another value (every request the emulator serves passes a wrapper in this
  process that reads the stored Node after each Node write: no watch, no extra request);
* **API calls per pod** by sender (each component has its own token; the same wrapper counts them);
* **CPU seconds per pod** of each process (user + system, every thread, ``/proc/<pid>/stat``): the
  scheduler, the webhook and the fleet (ours); the kubelet stand-in; and this process (the API server
  emulator, the admission / kube-scheduler / workload stand-ins and this driver); the scheduler's
  ``/metrics``, read for its bind outcomes before and after each phase, is scraped outside that window;
* what bounds throughput: the kube-scheduler stand-in runs one scheduling cycle at a time (``/filter``,
  ``/prioritize``, pick a node, assume) and each pod's ``/bind`` in a task of its own, as kube-scheduler
  runs its binding cycle in a goroutine (at most ``hami_testkit.scheduler_standin.MAX_BINDING`` in
  flight; ``HAMI_BENCH_E2E_BINDS=serial`` waits for each bind before the next pod, as the stand-in did
  before); the share of the span the scheduling cycles were busy and spent inside ``/filter`` and
  ``/prioritize``, the binds in flight on average (their summed wall time over the span), how often the
  cap made the scheduling cycle wait, the queue wait (creation to the stand-in's first attempt), the
  binds refused for a busy lock (``hami_scheduler_binds_total{result="lock_busy"}``) and the CPU share
  of each process show which part is saturated.

Target rows (issue 24): at 1,000 nodes ≥ 100 pods/s sustained to Running with our components ≤ 25 % of
the run's CPU, and the scheduler ≤ 2 ms CPU per scheduled pod. Sizes: ``HAMI_BENCH_E2E_SIZES`` (default
``100,1000``); pods per row ``HAMI_BENCH_E2E_PODS`` (default 300); rate
``HAMI_BENCH_E2E_RATE`` (default 100); the stand-in's binds ``HAMI_BENCH_E2E_BINDS`` (``background``, the
default, or ``serial``); extra ``hami scheduler`` flags ``HAMI_BENCH_E2E_SCHEDULER_ARGS`` (e.g.
``--node-lock-wait=5``); the stand-in's ``percentageOfNodesToScore`` ``HAMI_BENCH_E2E_PERCENTAGE`` (an
integer 0..100; default 100, what the chart renders: the extender is sent every node kube-scheduler's
own filters keep; 0 is kube-scheduler's adaptive default, 420 of 1,000 nodes per attempt; see
docs/scale.md, "End to end").
"""

from __future__ import annotations

import asyncio
import collections
import os
import random
import secrets
import shutil
import tempfile
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import kmock
from prometheus_client.parser import text_string_to_metric_families

from benchmarks.table import Table, percentile
from hami.annotations import NODE_LOCK, POD_NUMA_BIND, POD_USE_GPUTYPE, POD_USE_GPUUUID
from hami.simulate.trace import TracePod, read_pods
from hami_testkit.cluster import ClusterSpec, NodeSpec
from hami_testkit.clustergen import MODELS, OPENB_MIX, generate_cluster
from hami_testkit.kubeapi import SimApi, pods_path
from hami_testkit.reviews import ANONYMOUS
from hami_testkit.system import (
    ACCOUNTS,
    FLEET,
    KUBELET,
    NODE_AGENT,
    SCHEDULER,
    USER,
    WEBHOOK,
    EmbeddedSystem,
    SystemOptions,
)

TRACE = Path(__file__).resolve().parents[1] / "tests" / "data" / "openb" / "openb_pod_list_gpuspec20.csv.gz"
NAMESPACE = "default"
BENCH = "hami-bench"
STALL = 30.0  # seconds without a pod starting that end a phase
LIMIT = 600.0  # seconds a phase may take at most
IN_FLIGHT = 32  # creates at once
WARM_UP = 5  # pods of each kind first, not counted (connections, first reads)
TICKS = os.sysconf("SC_CLK_TCK")
WRITES = (kmock.action.CREATE, kmock.action.UPDATE, kmock.action.DELETE)
#: (row label, the sender's username)
OURS = (
    ("scheduler", ACCOUNTS[SCHEDULER]),
    ("node agents (fleet)", ACCOUNTS[NODE_AGENT]),
    ("webhook", ACCOUNTS[WEBHOOK]),
)
STAND_INS = (
    ("kube-scheduler stand-in", ACCOUNTS[USER]),
    ("kubelet stand-in", ACCOUNTS[KUBELET]),
    ("API server (emulated admission, binding)", ANONYMOUS),
)
#: (row label, child process name in the supervisor)
OUR_PROCESSES = (("scheduler", SCHEDULER), ("node agents (fleet)", FLEET), ("webhook", WEBHOOK))
MAIN = "API server + in-process stand-ins + driver"


# ------------------------------------------------------------------------------------------- pods


def _cards_by_model(cluster: ClusterSpec) -> dict[str, list[NodeSpec]]:
    by_model: dict[str, list[NodeSpec]] = collections.defaultdict(list)
    for node in cluster.nodes:
        by_model[node.labels["hami.io/demo-model"]].append(node)
    return by_model


def draw_pods(cluster: ClusterSpec, count: int, seed: int = 0) -> list[dict[str, Any]]:
    """``count`` GPU pod manifests drawn from openb's default trace for ``cluster`` (module docstring)."""
    rng = random.Random(seed)
    by_model = _cards_by_model(cluster)
    total_cards = sum(len(n.cards) for n in cluster.nodes)
    trace = [p for p in read_pods(TRACE) if p.num_gpu > 0]
    rng.shuffle(trace)
    pods: list[dict[str, Any]] = []
    demand = 0.0
    for entry in trace:
        if len(pods) == count or demand > total_cards / 2:
            break
        models = [m for m in entry.gpu_spec if m in by_model] if entry.gpu_spec else list(by_model)
        if not models or max(len(n.cards) for m in models for n in by_model[m]) < entry.num_gpu:
            continue
        demand += entry.num_gpu * entry.gpu_milli / 1000
        pods.append(_manifest(entry, len(pods), models if entry.gpu_spec else [], by_model, rng))
    return pods


def _manifest(
    entry: TracePod, index: int, models: list[str], by_model: Mapping[str, list[NodeSpec]], rng: random.Random
) -> dict[str, Any]:
    limits = {"nvidia.com/gpu": str(entry.num_gpu)}
    if entry.gpu_milli < 1000:
        limits["nvidia.com/gpumem-percentage"] = str(max(1, -(-entry.gpu_milli // 10)))
        limits["nvidia.com/gpucores"] = str(entry.gpu_milli // 10)
    annotations: dict[str, str] = {}
    if models:
        annotations[POD_USE_GPUTYPE] = ",".join(sorted({MODELS[m].model for m in models}))
    if index % 10 == 3 and entry.num_gpu <= 2:
        annotations[POD_NUMA_BIND] = "true"
    elif index % 20 == 7:
        fitting = [n for m in models or list(by_model) for n in by_model[m] if len(n.cards) >= entry.num_gpu]
        node = rng.choice(fitting)
        annotations[POD_USE_GPUUUID] = ",".join(str(c["uuid"]) for c in node.cards)
    return {
        "metadata": {"name": f"gpu-{index:05d}", "namespace": NAMESPACE, "annotations": annotations},
        "spec": {"containers": [{"name": "main", "image": "cuda:12", "resources": {"limits": limits}}]},
    }


def plain_pod(index: int) -> dict[str, Any]:
    return {
        "metadata": {"name": f"plain-{index:05d}", "namespace": NAMESPACE},
        "spec": {"schedulerName": "hami-scheduler", "containers": [{"name": "main", "image": "busybox"}]},
    }


def kinds(pods: list[dict[str, Any]]) -> collections.Counter[str]:
    """How many pods of each kind (a pod may count under several)."""
    out = collections.Counter[str]()
    for pod in pods:
        limits = pod["spec"]["containers"][0]["resources"]["limits"]
        notes = pod["metadata"]["annotations"]
        cards = int(limits["nvidia.com/gpu"])
        out[
            "fractional" if "nvidia.com/gpucores" in limits else "whole-card" if cards == 1 else "multi-card"
        ] += 1
        out["type-restricted"] += POD_USE_GPUTYPE in notes
        out["numa-bind"] += POD_NUMA_BIND in notes
        out["uuid-pinned"] += POD_USE_GPUUUID in notes
    return out


# ------------------------------------------------------------------------------- instruments


@dataclass(slots=True)
class Tap:
    """What the wrapper around the emulator's request handler records (everything on its loop)."""

    emulator: Any
    calls: collections.Counter[str] = field(default_factory=collections.Counter)  # username -> requests
    running: dict[str, float] = field(default_factory=dict)  # pod name -> monotonic time stored Running
    locks: dict[str, tuple[str, float]] = field(default_factory=dict)  # node -> (value, since)
    holds: list[float] = field(default_factory=list)  # finished hold times, seconds
    errors: list[str] = field(default_factory=list)  # the wrapper's own failures (none expected)

    def install(self) -> None:
        original: Callable[[kmock.Request], Awaitable[Any]] = self.emulator._handle

        async def handle(request: kmock.Request) -> Any:
            response = await original(request)
            try:
                self._record(request)
            except Exception as exc:  # never fails the request: reported at the end of the phase
                self.errors.append(repr(exc))
            return response

        self.emulator._handle = handle

    def _record(self, request: kmock.Request) -> None:
        self.calls[self.emulator.username(request)] += 1
        resource = request.resource
        if resource is not None and request.name and request.action in WRITES:
            if resource.plural == "nodes":
                self._node(request.name)
            elif resource.plural == "pods" and request.name not in self.running:
                self._pod(resource, request.namespace, request.name)

    def _stored(self, resource: Any, namespace: str | None, name: str) -> Mapping[str, Any] | None:
        try:
            obj = self.emulator.objects[resource, namespace, name]
        except KeyError:
            return None
        return None if obj.deleted else dict(obj.raw)

    def _node(self, name: str) -> None:
        node = self._stored(kmock.resource("v1/nodes"), None, name)
        value = str(((node or {}).get("metadata") or {}).get("annotations", {}).get(NODE_LOCK) or "")
        held, since = self.locks.get(name, ("", 0.0))
        if value == held:
            return
        now = time.monotonic()
        if held:
            self.holds.append(now - since)
        self.locks[name] = (value, now)

    def _pod(self, resource: Any, namespace: str | None, name: str) -> None:
        pod = self._stored(resource, namespace, name)
        if pod is not None and (pod.get("status") or {}).get("phase") == "Running":
            self.running[name] = time.monotonic()


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS  # utime, stime


@dataclass(slots=True)
class StandInClock:
    """Wall time the kube-scheduler stand-in spends per verb and per attempt, and its first attempts."""

    verbs: dict[str, float] = field(default_factory=lambda: collections.defaultdict(float))  # verb -> s
    binds: list[float] = field(default_factory=list)  # each /bind call's wall seconds
    nodes: list[str] = field(default_factory=list)  # the node of each pod assumed (its bind sent), in order
    attempts: float = 0.0
    first_try: dict[str, float] = field(default_factory=dict)

    def install(self, standin: Any) -> None:
        post, schedule_one = standin._post, standin.schedule_one

        async def timed_post(verb: str, body: Any) -> Any:
            started = time.monotonic()
            try:
                return await post(verb, body)
            finally:
                self.verbs[verb] += time.monotonic() - started
                if verb == "bind":
                    self.binds.append(time.monotonic() - started)

        async def timed_schedule(pod: Any) -> Any:
            started = time.monotonic()
            self.first_try.setdefault(str(pod["metadata"]["name"]), started)
            try:
                attempt = await schedule_one(pod)
                if attempt.kind in ("binding", "bound"):  # assumed on a node (bound, with serial binds)
                    self.nodes.append(attempt.node)
                return attempt
            finally:
                self.attempts += time.monotonic() - started

        standin._post = timed_post
        standin.preemption._post = timed_post
        standin.schedule_one = timed_schedule


async def scheduler_counters(session: aiohttp.ClientSession, url: str) -> dict[str, float]:
    """Bind outcomes and the verbs' summed server-side seconds/counts from the scheduler's /metrics."""
    async with session.get(url) as response:
        text = await response.text()
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "hami_scheduler_binds_total":
                out[f"bind {sample.labels['result']}"] = sample.value
            elif sample.name in (
                "hami_scheduler_request_seconds_sum",
                "hami_scheduler_request_seconds_count",
            ):
                out[f"{sample.labels.get('verb')} {sample.name.rsplit('_', 1)[1]}"] = (
                    out.get(f"{sample.labels.get('verb')} {sample.name.rsplit('_', 1)[1]}", 0.0)
                    + sample.value
                )
    return out


# ------------------------------------------------------------------------------------ a phase


@dataclass(slots=True)
class Phase:
    pods: int
    running: int
    span: float  # first create -> last Running
    latencies: list[float]
    holds: list[float]
    calls: collections.Counter[str]
    cpu: dict[str, float]  # process label -> CPU seconds over the phase
    wall: float  # the phase's wall time (first create -> quiet)
    standin_busy: float  # seconds inside schedule_one (the scheduling cycles; the binds too when serial)
    verbs: dict[str, float]  # verb -> seconds the stand-in waited
    queue_wait: list[float]
    scheduler: dict[str, float]  # deltas of scheduler_counters
    binds: list[float]  # the stand-in's /bind calls, wall seconds
    nodes: list[str]  # the node of each pod assumed, in order
    bind_waits: int  # times the scheduling cycle waited for a bind at the stand-in's cap


def _processes(system: EmbeddedSystem) -> dict[str, Callable[[], float]]:
    def child(name: str) -> Callable[[], float]:
        pid = system.supervisor.children[name].process.pid
        return lambda: cpu_seconds(pid)

    procs = {label: child(name) for label, name in OUR_PROCESSES}
    procs["kubelet stand-in"] = child(KUBELET)
    procs[MAIN] = time.process_time
    return procs


async def run_phase(
    system: EmbeddedSystem,
    api: SimApi,
    tap: Tap,
    clock: StandInClock,
    pods: list[dict[str, Any]],
    rate: float,
) -> Phase:
    procs = _processes(system)
    # scraped before the CPU is read: a scrape of every card's gauges is not the pods' cost (at 1,000
    # nodes it took the scheduler about 2 s of CPU, as much as a hundred pods)
    metrics0 = await scheduler_counters(system.session, system.metrics_urls[SCHEDULER])
    cpu0 = {label: read() for label, read in procs.items()}
    calls0 = collections.Counter(tap.calls)
    holds0, busy0, verbs0 = len(tap.holds), clock.attempts, dict(clock.verbs)
    binds0, nodes0, waits0 = len(clock.binds), len(clock.nodes), system.scheduler.bind_waits
    created: dict[str, float] = {}
    limiter = asyncio.Semaphore(IN_FLIGHT)
    names = [p["metadata"]["name"] for p in pods]

    async def create(pod: dict[str, Any]) -> None:
        async with limiter:
            created[pod["metadata"]["name"]] = time.monotonic()
            await api.create(pods_path(NAMESPACE), pod)

    started = time.monotonic()
    tasks = []
    for i, pod in enumerate(pods):
        delay = started + i / rate - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(create(pod)))
    await asyncio.gather(*tasks)
    last_count, last_change = -1, time.monotonic()
    while True:
        system.check_standin()
        system.supervisor.check()
        count = sum(n in tap.running for n in names)
        now = time.monotonic()
        if count != last_count:
            last_count, last_change = count, now
        if count == len(names) or now - last_change > STALL or now - started > LIMIT:
            break
        await asyncio.sleep(0.1)
    wall = time.monotonic() - started
    if tap.errors:
        raise RuntimeError(f"the request tap failed: {tap.errors[:3]}")
    cpu = {label: read() - cpu0[label] for label, read in procs.items()}
    metrics1 = await scheduler_counters(system.session, system.metrics_urls[SCHEDULER])
    done = [n for n in names if n in tap.running]
    end = max((tap.running[n] for n in done), default=started)
    return Phase(
        pods=len(names),
        running=len(done),
        span=end - started,
        latencies=[tap.running[n] - created[n] for n in done],
        holds=tap.holds[holds0:],
        calls=collections.Counter({k: v - calls0[k] for k, v in tap.calls.items() if v - calls0[k]}),
        cpu=cpu,
        wall=wall,
        standin_busy=clock.attempts - busy0,
        verbs={v: clock.verbs[v] - verbs0.get(v, 0.0) for v in clock.verbs},
        queue_wait=[clock.first_try[n] - created[n] for n in names if n in clock.first_try],
        scheduler={k: v - metrics0.get(k, 0.0) for k, v in metrics1.items()},
        binds=clock.binds[binds0:],
        nodes=clock.nodes[nodes0:],
        bind_waits=system.scheduler.bind_waits - waits0,
    )


@dataclass(slots=True)
class Row:
    nodes: int
    ready: float  # seconds from start to every node registered
    mix: collections.Counter[str]
    gpu: Phase
    plain: Phase


async def measure(nodes: int, count: int, rate: float) -> Row:
    workdir = Path(tempfile.mkdtemp(prefix="hami-e2e-", dir="/tmp"))  # short: unix socket paths
    cluster = generate_cluster(nodes, OPENB_MIX)
    pods = draw_pods(cluster, count + WARM_UP)
    warm, pods = pods[:WARM_UP], pods[WARM_UP:]
    options = SystemOptions(
        request_log=64,
        register_interval=30.0,
        log_level="WARNING",
        fleet=True,
        ready_limit=900.0,
        background_binds=_binds() == "background",
        percentage_of_nodes_to_score=_percentage(),
        scheduler_args=tuple(os.environ.get("HAMI_BENCH_E2E_SCHEDULER_ARGS", "").split()),
    )
    spread = os.environ.get("HAMI_START_SPREAD")
    os.environ["HAMI_START_SPREAD"] = "10"  # the fleet child reads it (Supervisor copies the environment)
    try:
        started = time.monotonic()
        async with EmbeddedSystem(cluster, workdir, options) as system:
            ready = time.monotonic() - started
            emulator: Any = system.emulator
            tap, clock = Tap(emulator), StandInClock()
            tap.install()
            clock.install(system.scheduler)
            token = secrets.token_hex(16)
            emulator.identities[token] = BENCH
            async with aiohttp.ClientSession() as session:
                api = SimApi(session, system.url, token=token)
                await run_phase(system, api, tap, clock, warm, rate)
                await run_phase(system, api, tap, clock, [plain_pod(i) for i in range(WARM_UP)], rate)
                gpu = await run_phase(system, api, tap, clock, pods, rate)
                plain = await run_phase(
                    system, api, tap, clock, [plain_pod(i) for i in range(WARM_UP, WARM_UP + len(pods))], rate
                )
    finally:
        if spread is None:
            os.environ.pop("HAMI_START_SPREAD", None)
        else:
            os.environ["HAMI_START_SPREAD"] = spread
        shutil.rmtree(workdir, ignore_errors=True)
    return Row(nodes=nodes, ready=ready, mix=kinds(pods), gpu=gpu, plain=plain)


# ------------------------------------------------------------------------------------- tables


def _binds() -> str:
    binds = os.environ.get("HAMI_BENCH_E2E_BINDS", "background")
    if binds not in ("background", "serial"):
        raise ValueError(f"HAMI_BENCH_E2E_BINDS: 'background' or 'serial', not {binds!r}")
    return binds


def _percentage() -> int:
    """``HAMI_BENCH_E2E_PERCENTAGE``: the stand-in's percentageOfNodesToScore (default 100)."""
    text = os.environ.get("HAMI_BENCH_E2E_PERCENTAGE", "100")
    try:
        value = int(text)
    except ValueError:
        value = -1
    if not 0 <= value <= 100:
        raise ValueError(f"HAMI_BENCH_E2E_PERCENTAGE: an integer from 0 (adaptive) to 100, not {text!r}")
    return value


def _p(samples: list[float], q: float) -> str:
    return f"{percentile(samples, q) * 1000:.0f}" if samples else "-"


def _rate(phase: Phase) -> float:
    return phase.running / phase.span if phase.span > 0 else 0.0


def _ours_share(phase: Phase) -> float:
    total = sum(phase.cpu.values())
    return sum(phase.cpu[label] for label, _ in OUR_PROCESSES) / total if total else 0.0


def _ratio(a: float, b: float) -> str:
    return f"{a / b:.2f}" if b else "-"


def tables(rows: list[Row], rate: float) -> list[Table]:
    flow = Table(
        title=f"End to end: openb GPU pods created at {rate:g}/s on N simulated nodes (fleet), until "
        "Running; baseline: as many pods with no GPU request, same run, same rate",
        columns=(
            "nodes",
            "pods",
            "Running",
            "pods/s",
            "latency p50 ms",
            "p99 ms",
            "lock hold p50 ms",
            "p99 ms",
            "API calls/pod",
            "CPU ms/pod (all)",
            "ours % of CPU",
            "baseline pods/s",
            "baseline p50/p99 ms",
            "baseline calls/pod",
            "baseline CPU ms/pod",
        ),
    )
    cpu = Table(
        title="End to end: CPU ms per pod by process, GPU pods vs the baseline (same run), and its share",
        columns=(
            "nodes",
            "process",
            "GPU pod ms",
            "baseline ms",
            "x baseline",
            "% of run CPU",
            "% of one core",
        ),
    )
    calls = Table(
        title="End to end: API calls per pod by sender, GPU pods vs the baseline (same run)",
        columns=("nodes", "sender", "GPU pod", "baseline", "x baseline"),
    )
    bound = Table(
        title=f"End to end: what bounds throughput (GPU pods; the stand-in's binds: {_binds()}, "
        f"percentageOfNodesToScore: {_percentage()})",
        columns=(
            "nodes",
            "wall s",
            "scheduling cycles busy %",
            "in /filter %",
            "/prioritize %",
            "binds in flight, mean",
            "waits at the bind cap",
            "queue wait p50/p99 ms",
            "extender ms/pod (filter/prioritize/bind)",
            "/bind p50/p99 ms (baseline p50)",
            "API requests/s",
            "API server process CPU ms/request",
            "binds lock_busy",
            "same node as previous bind %",
            "lock held % (sum of holds / wall)",
            "busiest process (% of one core)",
        ),
    )
    for row in rows:
        g, b = row.gpu, row.plain
        per = max(g.running, 1)
        base = max(b.running, 1)
        flow.rows.append(
            (
                f"{row.nodes:,}",
                str(g.pods),
                str(g.running),
                f"{_rate(g):.1f}",
                _p(g.latencies, 50),
                _p(g.latencies, 99),
                _p(g.holds, 50),
                _p(g.holds, 99),
                f"{sum(g.calls.values()) / per:.1f}",
                f"{sum(g.cpu.values()) * 1000 / per:.1f}",
                f"{_ours_share(g) * 100:.0f}",
                f"{_rate(b):.1f}",
                f"{_p(b.latencies, 50)}/{_p(b.latencies, 99)}",
                f"{sum(b.calls.values()) / base:.1f}",
                f"{sum(b.cpu.values()) * 1000 / base:.1f}",
            )
        )
        total = sum(g.cpu.values()) or 1.0
        for label, seconds in g.cpu.items():
            cpu.rows.append(
                (
                    f"{row.nodes:,}",
                    label,
                    f"{seconds * 1000 / per:.2f}",
                    f"{b.cpu[label] * 1000 / base:.2f}",
                    _ratio(seconds / per, b.cpu[label] / base),
                    f"{seconds / total * 100:.0f}",
                    f"{seconds / g.wall * 100:.0f}",
                )
            )
        for label, user in (*OURS, *STAND_INS, ("this benchmark (not counted above)", BENCH)):
            calls.rows.append(
                (
                    f"{row.nodes:,}",
                    label,
                    f"{g.calls[user] / per:.2f}",
                    f"{b.calls[user] / base:.2f}",
                    _ratio(g.calls[user] / per, b.calls[user] / base),
                )
            )
        busiest = max(g.cpu, key=lambda k: g.cpu[k])
        busy_locks = g.scheduler.get("bind lock_busy", 0.0)
        same = sum(x == y for x, y in zip(g.nodes, g.nodes[1:], strict=False))
        served = {v: g.scheduler.get(f"{v} count", 0.0) for v in ("filter", "prioritize", "bind")}
        server_ms = "/".join(
            f"{g.scheduler.get(f'{v} sum', 0.0) * 1000 / served[v]:.1f}" if served[v] else "-"
            for v in ("filter", "prioritize", "bind")
        )
        bound.rows.append(
            (
                f"{row.nodes:,}",
                f"{g.wall:.1f}",
                f"{g.standin_busy / g.wall * 100:.0f}",
                f"{g.verbs.get('filter', 0.0) / g.wall * 100:.0f}",
                f"{g.verbs.get('prioritize', 0.0) / g.wall * 100:.0f}",
                f"{g.verbs.get('bind', 0.0) / g.wall:.2f}",
                str(g.bind_waits),
                f"{_p(g.queue_wait, 50)}/{_p(g.queue_wait, 99)}",
                server_ms,
                f"{_p(g.binds, 50)}/{_p(g.binds, 99)} ({_p(b.binds, 50)})",
                f"{sum(g.calls.values()) / g.wall:.0f}",
                f"{g.cpu[MAIN] * 1000 / max(sum(g.calls.values()), 1):.2f}",
                f"{busy_locks:.0f} of {g.scheduler.get('bind success', 0.0):.0f} bound",
                f"{same * 100 / max(len(g.nodes) - 1, 1):.0f}",
                f"{sum(g.holds) / g.wall * 100:.0f}",
                f"{busiest} ({g.cpu[busiest] / g.wall * 100:.0f})",
            )
        )
    targets = Table(title="End to end: targets (issue 24)", columns=("target", "measured", "verdict"))
    at_1000 = [r for r in rows if r.nodes == 1000]
    if at_1000:
        g = at_1000[0].gpu
        pods_s, share = _rate(g), _ours_share(g)
        targets.rows.append(
            (
                ">= 100 pods/s to Running at 1,000 nodes, ours <= 25 % of the run's CPU",
                f"{pods_s:.1f} pods/s, ours {share * 100:.0f} %",
                "met" if pods_s >= 100 and share <= 0.25 else "not met",
            )
        )
        sched = g.cpu["scheduler"] * 1000 / max(g.running, 1)
        targets.rows.append(
            (
                "scheduler <= 2 ms CPU per scheduled pod at 1,000 nodes",
                f"{sched:.2f} ms",
                "met" if sched <= 2.0 else "not met",
            )
        )
    else:
        targets.rows.append(("(no 1,000-node row in HAMI_BENCH_E2E_SIZES)", "-", "-"))
    mix = Table(
        title="End to end: the GPU pods drawn (openb gpuspec20 trace; a pod may count under several kinds)",
        columns=("nodes", *sorted({k for r in rows for k in r.mix}), "ready s"),
    )
    for row in rows:
        mix.rows.append((f"{row.nodes:,}", *(str(row.mix[k]) for k in mix.columns[1:-1]), f"{row.ready:.0f}"))
    return [mix, flow, cpu, calls, bound, targets]


def run() -> list[Table]:
    sizes = [int(s) for s in os.environ.get("HAMI_BENCH_E2E_SIZES", "100,1000").split(",") if s.strip()]
    rate = float(os.environ.get("HAMI_BENCH_E2E_RATE", "100"))
    wanted = os.environ.get("HAMI_BENCH_E2E_PODS")
    rows = [asyncio.run(measure(size, int(wanted) if wanted else 300, rate)) for size in sizes]
    return tables(rows, rate)
