"""What one scheduling call costs: ``/filter`` then ``/prioritize`` for one pod over N nodes, as run live.

Measured: ``handle_filter`` + ``handle_prioritize`` on the parsed extender args (the pod's request read
by the codec, every candidate's state from the live view without the pod's own booking, the namespace
quota, the core's verdicts, every failing node's rejection and its text, the metrics, the core's
ranking of the candidates) — everything the two verbs compute except HTTP and JSON, which
``bench_filter`` measures. Each call is a new version of the pod (``benchmarks.objects.new_version``),
so the two verbs share one scheduling cycle (:mod:`hami.scheduler.cycle`) as kube-scheduler's
filter and prioritize of one pod do, and no call is answered from an earlier one's. The live view
is the real snapshot, filled from Node and Pod objects.
Baseline: the core's verdicts alone on the same node states (``allocate(...).fitting``); the ratio
column is what the scheduler's call costs on top of the placement decision.

Cluster: N nodes x 8 cards (80 GiB, 100 cores, 10 slots), each card shared by 0..9 running pods holding
a random part of its memory and cores (fixed seed; about half of every capacity used). Pod: one
container, 1 card, 4000 MiB, 30 % cores. Target: 500 nodes <= 1 ms median for the core on one core.
Further rows: the same pod with ``nvidia.com/use-gputype`` and with ``nvidia.com/numa-bind`` (both
judged from the node summaries too: one type decision per card type, one count per NUMA node), and with
``nvidia.com/use-gputype: V100``, which no node has: every node is rejected, so the call builds every
node's reasons (``8/8 CardTypeMismatch``) and whether it could ever resolve.

Second table, the ``fragmentation`` policy (node and card), each against the same call for the same pod
under the defaults (binpack nodes, spread cards) as the baseline: ``/filter`` (it only filters: the
policy must cost nothing there), ``/prioritize`` with one node's usage changed between calls (a bind or
a pod event: the per-node figures of the others are kept), ``/prioritize`` right after a new target
(every node measured again: once per refresh when the learned workload moved), and bind's card choice
(``fit_node`` on one node).
"""

from __future__ import annotations

import random
import statistics
import time
from typing import Any

from benchmarks.objects import new_version, offline_context, registered_node
from benchmarks.table import Table, ms, summary
from hami.annotations import (
    POD_DEVICES_ALLOCATED,
    POD_VGPU_NODE,
    read_pod_request,
)
from hami.core.allocate import allocate, fit_node
from hami.core.fragmentation import Target
from hami.core.model import NodeState
from hami.scheduler.candidates import snapshot_states
from hami.scheduler.context import Context
from hami.scheduler.filter import handle_filter
from hami.scheduler.prioritize import handle_prioritize
from hami.scheduler.snapshot import local_time
from hami.scheduler.wire import ExtenderArgs

SIZES = ((100, 300), (500, 200), (5000, 30))  # (nodes, repetitions)
CARDS = 8
MEMORY = 81920


def _node(name: str, now_local: Any) -> dict[str, Any]:
    return registered_node(
        name, now_local, cards=CARDS, memory_mib=MEMORY, card_type="NVIDIA A100-SXM4-80GB", cards_per_numa=4
    )


def _holders(node: str, rng: random.Random) -> list[dict[str, Any]]:
    """Running pods of one container and one card each: 1..9 on a card, sharing a random part of its
    memory and cores (uniform, so about half of every capacity is used); a card without pods is idle."""
    pods = []
    for i in range(CARDS):
        sharing = rng.randint(0, 9)
        memory_used, cores_used = rng.randint(0, MEMORY), rng.randint(0, 100)
        for k in range(sharing):
            memory, cores = memory_used // sharing, cores_used // sharing
            pods.append(
                {
                    "metadata": {
                        "name": f"{node}-{i}-{k}",
                        "namespace": "bench",
                        "annotations": {
                            POD_VGPU_NODE: node,
                            POD_DEVICES_ALLOCATED: f"GPU-{node}-{i},NVIDIA,{memory},{cores}:;",
                        },
                    },
                    "spec": {"containers": [{"name": "c"}]},
                    "status": {"phase": "Running"},
                }
            )
    return pods


def cluster(nodes: int, seed: int = 7) -> Context:
    rng = random.Random(seed)
    ctx = offline_context()
    now_local = local_time(ctx.clock())
    names = [f"node-{n:05d}" for n in range(nodes)]
    ctx.snapshot.replace_nodes([_node(name, now_local) for name in names])
    ctx.snapshot.replace_pods([pod for name in names for pod in _holders(name, rng)])
    ctx.snapshot.replace_quotas([])
    return ctx


def pod(annotations: dict[str, str]) -> dict[str, Any]:
    limits = {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "4000", "nvidia.com/gpucores": "30"}
    return {
        "metadata": {"name": "candidate", "namespace": "bench", "uid": "u-1", "annotations": annotations},
        "spec": {"containers": [{"name": "main", "resources": {"limits": limits}}]},
    }


def measure(ctx: Context, args: ExtenderArgs, repetitions: int) -> tuple[list[float], list[float], int]:
    """Seconds per call of the two verbs and of the baseline (the core's verdicts alone, on the same
    states the verbs see), taken alternately so that a change of load hits both; how many nodes fit."""
    assert args["Pod"] is not None
    request = read_pod_request(args["Pod"], ctx.settings.device_config)
    states: list[NodeState]
    states, _ = snapshot_states(ctx.snapshot, args["NodeNames"] or [], request, ctx.clock())
    verbs: list[float] = []
    core: list[float] = []
    fitting: tuple[str, ...] = ()
    for _ in range(repetitions):
        assert args["Pod"] is not None
        once = ExtenderArgs(Pod=new_version(args["Pod"]), Nodes=args["Nodes"], NodeNames=args["NodeNames"])
        start = time.perf_counter()
        filtered = handle_filter(ctx, once)
        scores = handle_prioritize(ctx, once)
        verbs.append(time.perf_counter() - start)
        start = time.perf_counter()
        fitting = allocate(request, states, ctx.settings.policy).fitting
        core.append(time.perf_counter() - start)
        assert list(fitting) == filtered.result["NodeNames"]  # the same decision, measured twice
        assert len(scores) == len(args["NodeNames"] or [])
    return verbs, core, len(fitting)


def run() -> list[Table]:
    table = Table(
        title="/filter + /prioritize per call (pod: 1 card, 4000 MiB, 30 %) over N nodes x 8 cards, "
        "half used; baseline: the core's verdicts alone",
        columns=(
            "nodes",
            "pod",
            "fitting",
            "median ms",
            "p99 ms",
            "max ms",
            "baseline ms",
            "x baseline",
            "us/node (median)",
        ),
    )
    for nodes_count, repetitions in SIZES:
        ctx = cluster(nodes_count)
        names = [f"node-{n:05d}" for n in range(nodes_count)]
        for label, steering, reps in (
            ("plain", {}, repetitions),
            ("use-gputype A100", {"nvidia.com/use-gputype": "A100"}, repetitions),
            ("numa-bind", {"nvidia.com/numa-bind": "true"}, repetitions),
            ("use-gputype V100 (none fits)", {"nvidia.com/use-gputype": "V100"}, max(3, repetitions // 10)),
        ):
            args = ExtenderArgs(Pod=pod(steering), Nodes=None, NodeNames=names)
            samples, core, fitting = measure(ctx, args, reps)
            base = statistics.median(core)
            median, p99, worst = summary(samples)
            per_node = f"{statistics.median(samples) * 1e6 / nodes_count:.2f}"
            ratio = f"{statistics.median(samples) / base:.1f}"
            table.rows.append(
                (str(nodes_count), label, str(fitting), median, p99, worst, ms(base), ratio, per_node)
            )
    return [table, fragmentation_table()]


def _timed(call: Any, repetitions: int, between: Any = None) -> list[float]:
    samples = []
    for i in range(repetitions):
        if between is not None:
            between(i)
        start = time.perf_counter()
        call()
        samples.append(time.perf_counter() - start)
    return samples


def fragmentation_rows(nodes_count: int, repetitions: int) -> list[tuple[str, ...]]:
    """The fragmentation table's rows for one cluster size (see the module docstring)."""
    ctx = cluster(nodes_count)
    names = [f"node-{n:05d}" for n in range(nodes_count)]
    ours = pod(
        {"hami.io/node-scheduler-policy": "fragmentation", "hami.io/gpu-scheduler-policy": "fragmentation"}
    )
    ours_args = ExtenderArgs(Pod=ours, Nodes=None, NodeNames=names)
    base_args = ExtenderArgs(Pod=pod({}), Nodes=None, NodeNames=names)
    workload = ctx.snapshot.workload
    rng = random.Random(3)

    def touch(i: int) -> None:  # a pod's grant moves to a random node: its old and new node change
        node = names[rng.randrange(nodes_count)]
        annotations = {POD_VGPU_NODE: node, POD_DEVICES_ALLOCATED: f"GPU-{node}-0,NVIDIA,{1000 + i % 2},5:;"}
        moving = {
            "metadata": {"name": f"moving-{i % 7}", "namespace": "bench", "annotations": annotations},
            "spec": {"containers": [{"name": "c"}]},
            "status": {"phase": "Running"},
        }
        ctx.snapshot.pod_event("MODIFIED", moving)

    def fresh_target(_: int) -> None:  # as when the learned workload moved
        workload._target = Target(workload.target().classes)

    rows: list[tuple[str, ...]] = []

    def fresh(a: ExtenderArgs) -> ExtenderArgs:  # a new pod version: evaluated anew, not from its cycle
        assert a["Pod"] is not None
        return ExtenderArgs(Pod=new_version(a["Pod"]), Nodes=a["Nodes"], NodeNames=a["NodeNames"])

    checks = (
        ("/filter", lambda a: lambda: handle_filter(ctx, fresh(a)), None),
        ("/prioritize, one node changed", lambda a: lambda: handle_prioritize(ctx, fresh(a)), touch),
        ("/prioritize, new target", lambda a: lambda: handle_prioritize(ctx, fresh(a)), fresh_target),
    )
    for label, make, between in checks:
        reps = repetitions if label != "/prioritize, new target" else max(3, repetitions // 10)
        handle_prioritize(ctx, ours_args)  # warm: every node measured once under the current target
        mine = _timed(make(ours_args), reps, between)
        base = _timed(make(base_args), reps, between if between is touch else None)
        median, p99, worst = summary(mine)
        ratio = statistics.median(mine) / statistics.median(base)
        rows.append(
            (str(nodes_count), label, median, p99, worst, ms(statistics.median(base)), f"{ratio:.1f}")
        )
    if nodes_count == SIZES[0][0]:
        request = read_pod_request(ours, ctx.settings.device_config)
        plain = read_pod_request(pod({}), ctx.settings.device_config)
        states, _ = snapshot_states(ctx.snapshot, names, request, ctx.clock())
        policy = workload.policy(ctx.settings.policy, request)
        mine = _timed(lambda: [fit_node(request, s, policy) for s in states], 20)
        base = _timed(lambda: [fit_node(plain, s, ctx.settings.policy) for s in states], 20)
        per = len(states)
        rows.append(
            (
                "1",
                "bind's card choice (fit_node)",
                ms(statistics.median(mine) / per),
                ms(sorted(mine)[-1] / per),
                ms(max(mine) / per),
                ms(statistics.median(base) / per),
                f"{statistics.median(mine) / statistics.median(base):.1f}",
            )
        )
    return rows


def fragmentation_table() -> Table:
    table = Table(
        title="fragmentation policy per call (pod: 1 card, 4000 MiB, 30 %; N nodes x 8 cards, half used); "
        "baseline: the same pod under binpack / spread",
        columns=("nodes", "call", "median ms", "p99 ms", "max ms", "baseline median ms", "x baseline"),
    )
    for nodes_count, repetitions in SIZES:
        table.rows.extend(fragmentation_rows(nodes_count, repetitions))
    return table
