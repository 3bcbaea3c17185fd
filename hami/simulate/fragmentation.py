"""``fragmentation``: our placement rule — the paper's fragmentation gradient descent, measured against the
node's host memory as well as its CPU and against what each card type's restricted demand needs, with
CPU-only pods kept off the nodes whose GPUs are still free.

Owns :class:`Fragmentation`. Every pod goes where the node's expected GPU fragmentation grows least,
scored as FGD does (``int(100 σ((F(n) - F(n'))/1000))`` against the target workload; a share tries every
card that fits; whole cards are the lowest-index free ones), with three changes:

- **Host memory.** FGD's measure counts a node's free GPU as lost to a class when the class's CPU no
  longer fits there, but not when its memory no longer does — and on openb GPU pods are turned away for
  the host memory left beside free cards at least as often as for the CPU (measured in
  docs/policies.md, "fragmentation", change 1). Here a class also needs :data:`MEMORY_SHARE` of its
  typical pod's memory (the median of its pods in the trace) free on the node, so a placement that
  strands cards behind spent memory scores as the fragmentation it causes.
- **Card-type reserves.** FGD counts a card that a model-restricted class may not use as lost to that
  class already, so an unrestricted pod is drawn to the models that fewer classes accept — whatever
  their supply — and the pods restricted to a scarce model find its cards taken (measured in
  docs/policies.md, "fragmentation", change 2). Here the measure knows the cluster's cards per type
  (:func:`hami.core.fragmentation.reserves`): a free card counts only for the
  share its type's restricted demand does not hold, so taking a card of a model that restricted pods
  wait for costs what it is worth to them. Only where some type's restricted demand per card reaches half
  the average (else FGD's own balance serves the few restricted pods), and a reserve moves a score by the
  whole points it is worth (:func:`hami.core.fragplacement.reserved_gradient`).
- **CPU-only pods.** FGD's integer score ties across hundreds of nodes for a pod that asks for no card
  (its CPU does not yet decide whether a class fits), and the seed's order sends that CPU to nodes with
  idle GPUs as often as to nodes whose GPUs are all in use. Among the best-scored nodes a CPU-only pod
  takes the one with the least free GPU milli, then the seed's order; GPU pods keep FGD's order (packing
  them instead measured worse).

The policy keeps its own measure (:class:`~hami.simulate.frag.FragMeasure` with memory and the
cluster's supply) beside the paper's one that the replay reports. Measured against FGD on the same
seeds: see docs/policies.md. Pure numpy, no I/O.
"""

from __future__ import annotations

import numpy as np

from hami.simulate.frag import FragMeasure
from hami.simulate.policies import FGD, Choice, Context, best_node
from hami.simulate.trace import TracePod

#: The share of a class's typical host memory a node must have free for the class to use its cards (1/2:
#: 3/4 lost to FGD on multi-card traces where host memory is scarce; docs/policies.md, "Held-out traces").
MEMORY_SHARE = 0.5


class Fragmentation(FGD):
    name = "fragmentation"

    def __init__(self, ctx: Context) -> None:
        measure = FragMeasure(ctx.measure.classes, ctx.cluster, memory=MEMORY_SHARE, reserve=True)
        super().__init__(Context(cluster=ctx.cluster, measure=measure, rank=ctx.rank, rng=ctx.rng))

    def placed(self, i: int, pod: TracePod, cards: tuple[int, ...]) -> None:
        self.ctx.measure.refresh(i)

    def choose(self, pod: TracePod, rows: np.ndarray, fit: np.ndarray | None) -> Choice:
        if fit is not None:
            return super().choose(pod, rows, fit)
        scores = self.ctx.measure.scores(pod, rows)
        top = rows[scores == scores.max()]
        gpu = self.ctx.cluster.gpu_free[top]
        return best_node(top[gpu == gpu.min()], np.zeros(int((gpu == gpu.min()).sum())), self.ctx.rank), None
