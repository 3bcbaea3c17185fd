"""The placement rules ``hami simulate`` knows: the paper's six and HAMi's two (our ``fragmentation``
builds on ``fgd`` in :mod:`hami.simulate.fragmentation`; :mod:`hami.simulate.registry` names them all).

Owns the rules (:class:`Policy` and its subclasses) and what a rule sees (:class:`Context`); imports
neither the registry nor ``fragmentation``. A policy sees one pod, the nodes that can take it (the
cluster's mask) and the per-card fit, and answers the node and, for the paper's policies, the cards
(pinned through the core); HAMi's policies leave the cards to the core's own card order. Node scores
are the paper's integers 0..100 (the float truncated); among the best nodes the lowest per-seed random
rank wins (the paper's simulator prefixes node names with a random permutation and takes the smallest
name). Rules, as the paper's simulator computes them (c = free milli-CPU, g = free GPU milli of the node):

- ``random``: a uniformly random feasible node; a share goes on a uniformly random card that fits.
- ``dotprod``: ``100 (1 - ([c, g] . [c_req, g_req]) / 2)`` with CPU over 128000 and GPU over 8000.
- ``clustering``: pods tagged ``share`` / ``<k>-gpu``; ``B = 25 (8000 - g) / 8000``; a node holding only
  the pod's tag 75+B, the tag among others 50+B, no GPU pod 25+B, only other tags B; CPU-only 0.
- ``packing``: empty node ``max(33 - F, F)``; free cards needed ``max(50 - u, 33)``; else the used cards
  ``max(100 - Σ(l·100/1000)/10, 50)``; CPU-only 0.
- ``bestfit``: ``100 (1 - [0.5 (c - c_req)/128000 + 0.5 (g - g_req)/8000])``.
- ``fgd``: ``100 σ((F(n) - F(n'))/1000)``, trying every card for a share (first best card); the measure
  and the rule are the core's (:mod:`hami.core.fragmentation`, :mod:`hami.core.fragplacement`), the
  scheduler's ``fragmentation`` policy.
- ``hami-binpack`` / ``hami-spread``: HAMi's node score of the usage (highest / lowest), cards by the
  core's binpack / spread order; a CPU-only pod gets kube-scheduler's LeastAllocated score.
- ``fragmentation``: see :mod:`hami.simulate.fragmentation`.

Card rule of ``dotprod``, ``clustering``, ``packing`` and ``bestfit`` (best fit): a share takes the card
with the least free milli that fits (lowest index on ties), whole cards the lowest-index free cards.
Pure numpy, no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from hami.core.score import BINPACK
from hami.simulate.cluster import Cluster
from hami.simulate.frag import FragMeasure
from hami.simulate.trace import MILLI, TracePod

MAX_CPU = 128000.0
MAX_GPU = 8000.0
TAGS = 66  # 0 = share, k = k whole cards (k <= 64), 65 unused


@dataclass(slots=True)
class Context:
    """What a policy may consult: the cluster, the fragmentation measure, the seed's rank and RNG."""

    cluster: Cluster
    measure: FragMeasure
    rank: np.ndarray
    rng: np.random.Generator


Choice = tuple[int, tuple[int, ...] | None]


def best_node(rows: np.ndarray, scores: np.ndarray, rank: np.ndarray) -> int:
    """The row with the highest score; ties: the lowest rank."""
    top = rows[scores == scores.max()]
    return int(top[np.argmin(rank[top])])


def best_fit_cards(pod: TracePod, fit_row: np.ndarray, milli_row: np.ndarray) -> tuple[int, ...]:
    """The paper's best fit: a share on the tightest card (lowest index on ties), else lowest free cards."""
    fitting = np.flatnonzero(fit_row)
    if pod.kind == "share":
        return (int(fitting[np.argmin(milli_row[fitting])]),)
    return tuple(int(j) for j in fitting[: pod.num_gpu])


class Policy:
    """A placement rule: ``choose`` a node (and maybe cards); ``placed`` hears about every booking."""

    name = ""
    gpu_policy = BINPACK  # the core's card order when cards are not pinned

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx

    def choose(self, pod: TracePod, rows: np.ndarray, fit: np.ndarray | None) -> Choice:
        raise NotImplementedError

    def placed(self, i: int, pod: TracePod, cards: tuple[int, ...]) -> None:
        """Called after the core booked ``pod`` on node ``i``."""

    def cards(self, i: int, pod: TracePod, fit: np.ndarray | None) -> tuple[int, ...] | None:
        if fit is None:
            return None
        return best_fit_cards(pod, fit[i], self.ctx.cluster.milli[i])

    def scored(self, pod: TracePod, rows: np.ndarray, fit: np.ndarray | None, scores: np.ndarray) -> Choice:
        i = best_node(rows, scores, self.ctx.rank)
        return i, self.cards(i, pod, fit)


class RandomPolicy(Policy):
    name = "random"

    def choose(self, pod: TracePod, rows: np.ndarray, fit: np.ndarray | None) -> Choice:
        i = int(rows[self.ctx.rng.integers(rows.size)])
        if fit is None:
            return i, None
        fitting = np.flatnonzero(fit[i])
        if pod.kind == "share":
            return i, (int(fitting[self.ctx.rng.integers(fitting.size)]),)
        return i, tuple(int(j) for j in fitting[: pod.num_gpu])


class DotProd(Policy):
    name = "dotprod"

    def choose(self, pod: TracePod, rows: np.ndarray, fit: np.ndarray | None) -> Choice:
        c = self.ctx.cluster
        node = (c.cpu_free[rows] / MAX_CPU) * (pod.cpu_milli / MAX_CPU)
        node = node + (c.gpu_free[rows] / MAX_GPU) * (pod.gpu_request / MAX_GPU)
        scores = np.floor(100.0 * (1.0 - node / 2.0)).astype(np.int64)
        return self.scored(pod, rows, fit, scores)


class BestFit(Policy):
    name = "bestfit"

    def choose(self, pod: TracePod, rows: np.ndarray, fit: np.ndarray | None) -> Choice:
        c = self.ctx.cluster
        s = (c.cpu_free[rows] - pod.cpu_milli) / MAX_CPU * 0.5
        s = s + (c.gpu_free[rows] - pod.gpu_request) / MAX_GPU * 0.5
        scores = np.trunc((1.0 - s) * 100.0).astype(np.int64)
        return self.scored(pod, rows, fit, scores)


class Packing(Policy):
    name = "packing"

    def choose(self, pod: TracePod, rows: np.ndarray, fit: np.ndarray | None) -> Choice:
        if fit is None:
            return self.scored(pod, rows, fit, np.zeros(rows.size, dtype=np.int64))
        total = self.ctx.cluster.ncards[rows]
        free = self.ctx.cluster.full_cards[rows]
        empty = np.maximum(33 - free, free)
        if pod.kind == "share":
            tight = np.where(fit[rows], self.ctx.cluster.milli[rows], MILLI + 1).min(axis=1)
            used = np.maximum(100 - (tight * 100 // MILLI) // 10, 50)
            scores = np.where(tight == MILLI, 49, used)
        else:
            scores = np.full(rows.size, max(50 - pod.num_gpu, 33), dtype=np.int64)
        scores = np.where(free == total, empty, scores)
        return self.scored(pod, rows, fit, scores)


class Clustering(Policy):
    name = "clustering"

    def __init__(self, ctx: Context) -> None:
        super().__init__(ctx)
        self.tags = np.zeros((len(ctx.cluster.states), TAGS), dtype=np.int64)

    @staticmethod
    def tag(pod: TracePod) -> int:
        return 0 if pod.kind == "share" else pod.num_gpu

    def choose(self, pod: TracePod, rows: np.ndarray, fit: np.ndarray | None) -> Choice:
        if fit is None:
            return self.scored(pod, rows, fit, np.zeros(rows.size, dtype=np.int64))
        g = self.ctx.cluster.gpu_free[rows]
        base = 25 * (8000 - g) // 8000
        tags = self.tags[rows]
        kinds = (tags > 0).sum(axis=1)
        mine = tags[:, self.tag(pod)] > 0
        scores = np.where(mine, np.where(kinds == 1, 75, 50), np.where(kinds == 0, 25, 0)) + base
        return self.scored(pod, rows, fit, scores)

    def placed(self, i: int, pod: TracePod, cards: tuple[int, ...]) -> None:
        if pod.num_gpu:
            self.tags[i, self.tag(pod)] += 1


class FGD(Policy):
    """The node whose fragmentation grows least, the cards the core's rule picks there
    (:func:`hami.core.fragplacement.place`: a share tries every card, the first best one)."""

    name = "fgd"

    def choose(self, pod: TracePod, rows: np.ndarray, fit: np.ndarray | None) -> Choice:
        m = self.ctx.measure
        i = best_node(rows, m.scores(pod, rows), self.ctx.rank)
        return i, (m.cards(i, pod) if fit is not None else None)


class Hami(Policy):
    """HAMi's node policy on the core's node score; the core picks the cards."""

    def __init__(self, ctx: Context, node_policy: str) -> None:
        super().__init__(ctx)
        self.name = f"hami-{node_policy}"
        self.gpu_policy = node_policy
        self.sign = 1.0 if node_policy == BINPACK else -1.0

    def choose(self, pod: TracePod, rows: np.ndarray, fit: np.ndarray | None) -> Choice:
        c = self.ctx.cluster
        if fit is None:  # kube-scheduler's LeastAllocated (CPU and memory, equal weights)
            cpu_cap = np.array([c.capacity[i].cpu_milli for i in rows], dtype=np.int64)
            mem_cap = np.array([c.capacity[i].memory_mib for i in rows], dtype=np.int64)
            cpu = (c.cpu_free[rows] - pod.cpu_milli) * 100 // np.maximum(cpu_cap, 1)
            mem = (c.mem_free[rows] - pod.memory_mib) * 100 // np.maximum(mem_cap, 1)
            return best_node(rows, (cpu + mem) // 2, self.ctx.rank), None
        scores = c.node_score[rows] * self.sign
        return best_node(rows, scores, self.ctx.rank), None
