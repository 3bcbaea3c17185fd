"""Topology-aware choice among the cards Fit collected (docs/protocol.md, "Topology", NVLink pair scores).

Owns :func:`select`: given every card that passed Fit (in walk order) and the node's pair scores,
pick ``nums`` of them. ``nums == 1``: the card whose summed score to all other candidates is lowest
(keep well-connected cards free), first minimum in walk order. ``nums > 1``: every ``nums``-subset
in lexicographic order of candidate positions (exhaustive, as HAMi), the highest sum of
``score[a][b]`` for ``a`` before ``b`` wins, first maximum kept. Missing scores count 0.

Worked example: candidates A, B, C with A-B 100, A-C 10, B-C 20 (both directions). ``nums=1``: sums
A 110, B 120, C 30 -> C. ``nums=2``: {A,B}=100, {A,C}=10, {B,C}=20 -> {A,B}.

Pure: stdlib only; must not import a Kubernetes client, aiohttp, kopf, grpc, pynvml, ``logging``,
``os`` or ``time``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from itertools import combinations

PairScores = Mapping[str, Mapping[str, int]]


def _score(scores: PairScores, a: str, b: str) -> int:
    return scores.get(a, {}).get(b, 0)


def select(uuids: Sequence[str], nums: int, scores: PairScores) -> tuple[int, ...]:
    """Positions (into ``uuids``) of the chosen cards, in candidate order."""
    if nums >= len(uuids):
        return tuple(range(len(uuids)))
    if nums == 1:
        sums = [sum(_score(scores, u, v) for j, v in enumerate(uuids) if j != i) for i, u in enumerate(uuids)]
        return (sums.index(min(sums)),)
    best: tuple[int, ...] = ()
    best_total = 0
    for subset in combinations(range(len(uuids)), nums):
        total = sum(_score(scores, uuids[a], uuids[b]) for a, b in combinations(subset, 2))
        if not best or total > best_total:  # the first subset is always taken (negative totals)
            best, best_total = subset, total
    return best
