"""The replay's view of GPU fragmentation: the core's measure (:mod:`hami.core.fragmentation`, the one
the scheduler's ``fragmentation`` policy uses) kept per node, and the core's placement scores remembered
per node until that node changes.

Owns :class:`FragMeasure` and :func:`target_class` (a trace class as the core's
:class:`~hami.core.fragmentation.TargetClass`: ``gpu_milli`` of each card as the cluster's request for it,
``gpu_spec`` as allowed card types, the class's CPU and, for a memory-aware measure, a share of its
typical host memory). ``frag[i]`` is ``F`` of node ``i`` against the target workload at its free CPU (and
memory), refreshed after every booking there; ``total`` is their sum.
:meth:`FragMeasure.scores` answers the FGD score (0..99) of the pod's best placement on each candidate
node with :func:`hami.core.fragplacement.place`, remembered per (node, node version, request shape): a
node is evaluated again only after something was booked on it (what that saves: docs/simulate.md,
"Speed"). Imports ``hami.core`` and numpy only, no I/O.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

import numpy as np

from hami.core.fragmentation import Target, TargetClass
from hami.core.fragplacement import place, steering
from hami.simulate.cluster import Cluster, container_request
from hami.simulate.trace import TracePod
from hami.simulate.workload import RequestClass

F64 = np.float64
I64 = np.int64
_NO_SCORE = -2  # not evaluated since the node last changed

#: What a pod's placement score depends on: CPU, host memory (when measured), share, cards, allowed models.
Shape = tuple[int, int, int, int, tuple[str, ...]]


def target_class(cls: RequestClass, card_mib: int | None, *, memory: float = 0.0) -> TargetClass:
    """A trace class of the target workload in the core's terms (the request the cluster books);
    ``memory`` > 0: the class needs that share of its typical host memory free on the node too."""
    if cls.num_gpu == 0:
        return TargetClass(nums=0, cpu_milli=cls.cpu_milli, weight=cls.probability)
    probe = TracePod(name="class", cpu_milli=cls.cpu_milli, memory_mib=0, num_gpu=1, gpu_milli=cls.gpu_milli)
    request = container_request(probe, card_mib)
    return TargetClass(
        nums=cls.num_gpu,
        memory_mib=request.memory_mib,
        percentage=request.percentage,
        cores=request.cores,
        cpu_milli=cls.cpu_milli,
        host_memory_mib=int(cls.memory_mib * memory),
        types=tuple(s.lower() for s in cls.gpu_spec),
        weight=cls.probability,
    )


class FragMeasure:
    """``F(n)`` for every node (``frag``, total ``total``) and the placement scores of a pod (``scores``)."""

    def __init__(
        self, classes: Sequence[RequestClass], cluster: Cluster, *, memory: float = 0.0, reserve: bool = False
    ) -> None:
        self.cluster = cluster
        self.memory = memory > 0
        self.classes = tuple(classes)
        supply = Counter(s.device.type for node in cluster.states for s in node.devices) if reserve else None
        self.target = Target(
            (target_class(c, cluster.exact_card_mib, memory=memory) for c in classes), supply=supply
        )
        n = len(cluster.states)
        self.frag = np.zeros(n, dtype=F64)
        self.total = 0.0  # Σ frag, kept up to date by refresh
        self.version = np.zeros(n, dtype=I64)
        self._shapes: dict[Shape, int] = {}
        self._score = np.full((n, 8), _NO_SCORE, dtype=I64)
        self._at = np.full((n, 8), -1, dtype=I64)  # the node version each score was taken at
        self._cards: dict[tuple[int, int], tuple[int, ...]] = {}
        self.refresh(np.arange(n))

    def refresh(self, rows: np.ndarray | int) -> None:
        """Recompute ``F`` of ``rows`` from the cluster (after a booking there); their scores expire."""
        for i in np.atleast_1d(rows).tolist():
            view = self.target.node(self.cluster.states[i], self._host(i))
            self.total += view.frag - float(self.frag[i])
            self.frag[i] = view.frag
            self.version[i] += 1

    def _host(self, i: int) -> tuple[int, int]:
        return int(self.cluster.cpu_free[i]), int(self.cluster.mem_free[i]) if self.memory else 0

    def _column(self, pod: TracePod) -> int:
        memory = pod.memory_mib if self.memory else 0
        shape = (pod.cpu_milli, memory, pod.gpu_milli, pod.num_gpu, pod.gpu_spec)
        at = self._shapes.get(shape)
        if at is None:
            at = self._shapes[shape] = len(self._shapes)
            if at >= self._score.shape[1]:
                grow = self._score.shape[1]
                self._score = np.pad(self._score, ((0, 0), (0, grow)), constant_values=_NO_SCORE)
                self._at = np.pad(self._at, ((0, 0), (0, grow)), constant_values=-1)
        return at

    def scores(self, pod: TracePod, rows: np.ndarray) -> np.ndarray:
        """The score (0..99) of the pod's best placement on each node of ``rows`` (-1: no cards there)."""
        k = self._column(pod)
        stale = rows[self._at[rows, k] != self.version[rows]]
        if stale.size:
            request = self.cluster.request(pod)
            steer = steering(request)
            cluster = self.cluster
            for i in stale.tolist():
                found = place(
                    self.target,
                    cluster.states[i],
                    request,
                    host_request=(pod.cpu_milli, pod.memory_mib if self.memory else 0),
                    host_free=self._host(i),
                    steer=steer,
                )
                self._score[i, k] = -1 if found is None else found.score
                if found is not None and found.cards:
                    self._cards[(i, k)] = found.cards[0]
            self._at[stale, k] = self.version[stale]
        result: np.ndarray = self._score[rows, k]
        return result

    def cards(self, i: int, pod: TracePod) -> tuple[int, ...]:
        """The cards the rule chose for ``pod`` on node ``i`` (after :meth:`scores` covered ``i``)."""
        return self._cards[(i, self._column(pod))]
