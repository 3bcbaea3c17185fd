"""``fragmentation``: our placement rule — the paper's fragmentation gradient descent, with CPU-only pods
kept off the nodes whose GPUs are still free.

Owns :class:`Fragmentation`. Every pod goes where the node's expected GPU fragmentation grows least,
scored exactly as FGD does (``int(100 σ((F(n) - F(n'))/1000))`` against the target workload; a share tries
every card that fits; whole cards are the lowest-index free ones). FGD breaks the many ties of that
integer score by the seed's node order alone; for a pod that asks for no card this sends CPU to nodes
with idle GPUs as often as to nodes whose GPUs are all in use, and the CPU it takes is what later GPU
pods on that node would have needed (at x = 100 on the default trace, 1.3 % of the capacity sits on
cards some class could use but for the CPU left on their node). So among the best-scored nodes a
CPU-only pod takes the one with the least free GPU milli, then the seed's order; GPU pods keep FGD's
order (packing them instead measured worse).

Measured against FGD on the same seeds: see docs/policies.md. Pure numpy, no I/O.
"""

from __future__ import annotations

import numpy as np

from hami.simulate.policies import FGD, Choice, best_node
from hami.simulate.trace import TracePod


class Fragmentation(FGD):
    name = "fragmentation"

    def choose(self, pod: TracePod, rows: np.ndarray, fit: np.ndarray | None) -> Choice:
        if fit is not None:
            return super().choose(pod, rows, fit)
        scores = self.ctx.measure.scores(pod, rows)
        top = rows[scores == scores.max()]
        gpu = self.ctx.cluster.gpu_free[top]
        return best_node(top[gpu == gpu.min()], np.zeros(int((gpu == gpu.min()).sum())), self.ctx.rank), None
