"""One replay run (one policy, one trace, one seed) and what it measures.

Owns :func:`replay` and :class:`RunResult`. The run: the seed's arrival order (:mod:`workload`), a
random rank per node (ties), a fresh :class:`~hami.simulate.cluster.Cluster`; every pod in turn is
judged against all nodes (the cluster's mask), a policy picks among the feasible ones, the core books
it; a pod no node can take is dropped (never retried) but its GPU request still counts as arrived.

After every pod: ``A`` = arrived GPU milli, ``U`` = allocated GPU milli, ``x = round(100 A / capacity)``;
the curve at x is the mean over the pods with that x of ``100 - 100 U / capacity`` (unallocated GPU
%), likewise the fragmentation ``100 ΣF / capacity`` and ``100 ΣF / idle``. An x no pod landed on takes
the mean of its neighbours' pods (x-1..x+1), as the paper's analysis does; where those are empty too (a
small cluster, a live one: one pod moves x by several points) it takes the value of the last x below it
that pods landed on, the cluster as it stood when that much demand had arrived. On a live cluster ``U``
starts at what its pods already hold (cards that cannot take a pod count as held).
``progress(done, total)`` is called every ``PROGRESS_EVERY`` pods. Pure apart from that callback.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from hami.simulate.cluster import DEFAULT_SPLIT_COUNT, Cluster
from hami.simulate.frag import FragMeasure
from hami.simulate.policies import Context
from hami.simulate.registry import make_policy
from hami.simulate.trace import KINDS, TraceNode, TracePod
from hami.simulate.workload import RequestClass, arrivals

PROGRESS_EVERY = 500
Progress = Callable[[int, int], None]


@dataclass(slots=True, kw_only=True)
class RunResult:
    """One run: per-x means (unallocated %, frag/total %, frag rate %), drops by pod kind, pods placed."""

    seed: int
    pods: int
    placed: int
    unallocated: dict[int, float]
    frag_total: dict[int, float]
    frag_rate: dict[int, float]
    dropped: dict[str, int] = field(default_factory=dict)
    slot_bound: int = 0  # drops that a free slot alone would have placed


class _Curve:
    """Sums per x of the per-pod values, and their means with the neighbour fallback."""

    def __init__(self) -> None:
        self.sums: dict[int, list[float]] = {}
        self.counts: Counter[int] = Counter()

    def add(self, x: int, values: tuple[float, ...]) -> None:
        acc = self.sums.setdefault(x, [0.0] * len(values))
        for k, v in enumerate(values):
            acc[k] += v
        self.counts[x] += 1

    def means(self, k: int, upto: int) -> dict[int, float]:
        out: dict[int, float] = {}
        held: float | None = None  # the mean at the last x below that pods landed on
        for x in range(upto + 1):
            near = [x] if self.counts[x] else [y for y in (x - 1, x, x + 1) if self.counts[y]]
            n = sum(self.counts[y] for y in near)
            if n:
                out[x] = sum(self.sums[y][k] for y in near) / n
            elif held is not None:
                out[x] = held
            if self.counts[x]:
                held = self.sums[x][k] / self.counts[x]
        return out


def replay(
    nodes: Sequence[TraceNode] | Cluster,
    pods: Sequence[TracePod],
    policy: str,
    seed: int,
    *,
    inflate: float = 1.3,
    classes: Sequence[RequestClass],
    split_count: int = DEFAULT_SPLIT_COUNT,
    progress: Progress | None = None,
    limit: int | None = None,
) -> RunResult:
    """Replay ``pods`` on ``nodes`` under ``policy`` with ``seed``; ``limit`` stops after that many pods."""
    rng = np.random.default_rng(seed)
    cluster = nodes if isinstance(nodes, Cluster) else Cluster.from_trace(nodes, split_count)
    capacity = cluster.capacity_milli
    if capacity <= 0:
        raise ValueError("the node list has no GPU card: nothing to measure")
    order = arrivals(pods, capacity, inflate, rng)
    if limit is not None:
        order = order[:limit]
    rank = rng.permutation(len(cluster.states))
    measure = FragMeasure(classes, cluster)
    chooser = make_policy(policy, Context(cluster=cluster, measure=measure, rank=rank, rng=rng))
    curve = _Curve()
    dropped: Counter[str] = Counter()
    arrived = placed = slot_bound = 0
    allocated = capacity - int(cluster.gpu_free.sum())  # a live cluster's cards already in use
    per_x = capacity / 100
    upto = 0
    for done, index in enumerate(order, 1):
        pod = pods[index]
        arrived += pod.gpu_request
        ok, fit = cluster.feasible(pod)
        rows = np.flatnonzero(ok)
        if rows.size:
            i, cards = chooser.choose(pod, rows, fit)
            granted = cluster.place(i, pod, cards, chooser.gpu_policy)
            chooser.placed(i, pod, granted)
            measure.refresh(i)
            allocated += pod.gpu_request
            placed += 1
        else:
            dropped[pod.kind] += 1
            slot_bound += int(pod.num_gpu > 0 and cluster.feasible_without_slots(pod))
        x = round(arrived / per_x)
        upto = max(upto, x)
        idle = capacity - allocated
        frag = measure.total
        curve.add(
            x,
            (
                100.0 - 100.0 * allocated / capacity,
                100.0 * frag / capacity,
                100.0 * frag / idle if idle else 0.0,
            ),
        )
        if progress is not None and (done % PROGRESS_EVERY == 0 or done == len(order)):
            progress(done, len(order))
    return RunResult(
        seed=seed,
        pods=len(order),
        placed=placed,
        unallocated=curve.means(0, upto),
        frag_total=curve.means(1, upto),
        frag_rate=curve.means(2, upto),
        dropped={kind: dropped[kind] for kind in KINDS},
        slot_bound=slot_bound,
    )
