"""GPU fragmentation of a node against a target workload (the paper's measure), kept incrementally.

Owns :class:`FragMeasure`. For a node with free card shares ``l_i`` (milli), free CPU ``c`` and
``G = Σ l_i``, a target class m (CPU ``c_m``, per-card share ``t_m``, ``k_m`` cards, allowed models)
sees as fragment: everything (``G``) when it has no card request, may not use the node's model, or does
not fit (fewer than ``k_m`` cards with ``l_i >= t_m``, or ``c < c_m``); otherwise only the cards too
small for it (``Σ l_i`` over ``l_i < t_m``). ``F(n) = Σ_m p_m frag_m(n)`` is computed as
``G - Σ_m p_m fits_m R_m`` with ``R_m = Σ l_i`` over ``l_i >= t_m``.

Per node the measure keeps ``R`` and the count of cards ``>= t`` for every distinct threshold ``t``,
refreshed only when that node changes; a hypothetical placement (one card's share reduced, some whole
cards taken, CPU taken) is evaluated from those per-threshold figures in O(thresholds + classes),
vectorised over all candidate (node, card) pairs of a pod. Pure numpy, no I/O.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from hami.simulate.cluster import Cluster
from hami.simulate.trace import MILLI
from hami.simulate.workload import RequestClass

F64 = np.float64


def node_model(cluster: Cluster, i: int) -> str:
    """The model a node's cards are (the paper's nodes have one model): the type after ``NVIDIA``."""
    devices = cluster.states[i].devices
    if not devices:
        return ""
    card_type = devices[0].device.type
    return card_type.split(" ", 1)[1] if card_type.upper().startswith("NVIDIA ") else card_type


class FragMeasure:
    """``F(n)`` for every node (``frag``, total ``total``) and for hypothetical placements (``after``)."""

    def __init__(self, classes: Sequence[RequestClass], cluster: Cluster) -> None:
        self.cluster = cluster
        gpu = [c for c in classes if c.num_gpu > 0]
        self.thresholds = np.array(sorted({c.gpu_milli for c in gpu}) or [MILLI], dtype=np.int64)
        where = {int(t): k for k, t in enumerate(self.thresholds)}
        self.tidx = np.array([where[c.gpu_milli] for c in gpu], dtype=np.int64)
        self.p = np.array([c.probability for c in gpu], dtype=F64)
        self.cpu = np.array([c.cpu_milli for c in gpu], dtype=np.int64)
        self.k = np.array([c.num_gpu for c in gpu], dtype=np.int64)
        n = len(cluster.states)
        models = [node_model(cluster, i) for i in range(n)]
        self.access = np.array(
            [[not c.gpu_spec or model in c.gpu_spec for c in gpu] for model in models], dtype=bool
        ).reshape(n, len(gpu))
        self.R = np.zeros((n, len(self.thresholds)), dtype=np.int64)
        self.N = np.zeros((n, len(self.thresholds)), dtype=np.int64)
        self.G = np.zeros(n, dtype=np.int64)
        self.frag = np.zeros(n, dtype=F64)
        self.total = 0.0  # Σ frag, kept up to date by refresh
        self.refresh(np.arange(n))

    def refresh(self, rows: np.ndarray | int) -> None:
        """Recompute the figures of ``rows`` from the cluster's mirror (after a booking there)."""
        rows = np.atleast_1d(rows)
        cards = self.cluster.milli[rows]
        ge = cards[:, :, None] >= self.thresholds[None, None, :]
        self.R[rows] = (cards[:, :, None] * ge).sum(axis=1)
        self.N[rows] = ge.sum(axis=1)
        self.G[rows] = cards.sum(axis=1)
        old = self.frag[rows].sum()
        self.frag[rows] = self._frag(
            rows, self.cluster.cpu_free[rows], self.R[rows], self.N[rows], self.G[rows]
        )
        self.total += float(self.frag[rows].sum() - old)

    def _frag(
        self, rows: np.ndarray, cpu: np.ndarray, R: np.ndarray, N: np.ndarray, G: np.ndarray
    ) -> np.ndarray:
        fits = self.access[rows] & (cpu[:, None] >= self.cpu[None, :]) & (N[:, self.tidx] >= self.k[None, :])
        usable = np.where(fits, R[:, self.tidx], 0).astype(F64) @ self.p
        result: np.ndarray = G.astype(F64) - usable
        return result

    def after_share(self, rows: np.ndarray, free: np.ndarray, milli: int, cpu_milli: int) -> np.ndarray:
        """``F`` of node ``rows[k]`` after a card with ``free[k]`` milli gives ``milli`` and CPU is taken."""
        t = self.thresholds[None, :]
        left = free - milli
        was = free[:, None] >= t
        now = left[:, None] >= t
        R = self.R[rows] - np.where(was, free[:, None], 0) + np.where(now, left[:, None], 0)
        N = self.N[rows] - was + now
        return self._frag(rows, self.cluster.cpu_free[rows] - cpu_milli, R, N, self.G[rows] - milli)

    def after_whole(self, rows: np.ndarray, cards: int, cpu_milli: int) -> np.ndarray:
        """``F`` of nodes ``rows`` after ``cards`` free cards are taken (and CPU); 0 cards: CPU only."""
        R = self.R[rows] - cards * MILLI
        N = self.N[rows] - cards
        return self._frag(rows, self.cluster.cpu_free[rows] - cpu_milli, R, N, self.G[rows] - cards * MILLI)
