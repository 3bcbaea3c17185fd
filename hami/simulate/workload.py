"""What arrives, in which order, and what the fragmentation measure expects to arrive.

Owns :func:`arrivals` (one seed's arrival order: the trace's pods shuffled, then topped up with pods
drawn with replacement until the GPU demand reaches ``inflate`` x capacity, or trimmed by dropping
random pods when it exceeds it — as the paper's simulator tunes a trace) and :func:`target_workload`
(the paper's typical pods: request classes by frequency until they cover 95 % of the pods).
Randomness comes only from the ``numpy.random.Generator`` passed in. Pure: no I/O, no clock.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from hami.simulate.trace import TracePod

COVERAGE = 0.95


def arrivals(
    pods: Sequence[TracePod], capacity_milli: int, inflate: float, rng: np.random.Generator
) -> list[int]:
    """Indices into ``pods`` in arrival order for one run.

    Shuffle all pods; if their GPU demand is below ``inflate x capacity``, append uniformly drawn pods
    until the next draw's per-card share would pass the target; if above, drop uniformly chosen pods
    until it is at or below it. Pods without a GPU request never stop the top-up.
    """
    order = [int(i) for i in rng.permutation(len(pods))]
    target = inflate * capacity_milli
    total = sum(p.gpu_request for p in pods)
    if total > target:
        while total > target and order:
            at = int(rng.integers(len(order)))
            total -= pods[order.pop(at)].gpu_request
    elif total < target and total > 0:
        while True:
            drawn = int(rng.integers(len(pods)))
            if total + pods[drawn].gpu_milli > target:
                break
            total += pods[drawn].gpu_request
            order.append(drawn)
    return order


@dataclass(frozen=True, slots=True, kw_only=True)
class RequestClass:
    """A class of the target workload: what a pod of it asks for and how likely it is."""

    cpu_milli: int
    gpu_milli: int
    num_gpu: int
    gpu_spec: tuple[str, ...]
    probability: float
    memory_mib: int = 0  # the median host memory of the class's pods


def _class_key(pod: TracePod) -> tuple[int, int, int, str]:
    return (pod.cpu_milli, pod.gpu_milli, pod.num_gpu, "|".join(pod.gpu_spec))


def target_workload(pods: Sequence[TracePod], coverage: float = COVERAGE) -> tuple[RequestClass, ...]:
    """The most frequent request classes covering ``coverage`` of ``pods``, probabilities renormalised.

    Classes are keyed by (CPU, per-card share, cards, allowed models) — memory is not part of the key;
    ties in frequency put the larger key first (the paper simulator's order).
    """
    counts = Counter(_class_key(p) for p in pods)
    memory: dict[tuple[int, int, int, str], list[int]] = {}
    for p in pods:
        memory.setdefault(_class_key(p), []).append(p.memory_mib)
    ranked = sorted(counts.items(), key=lambda kv: (kv[1], kv[0]), reverse=True)
    need = coverage * len(pods)
    kept: list[tuple[tuple[int, int, int, str], int]] = []
    covered = 0
    for key, count in ranked:
        if covered >= need:
            break
        kept.append((key, count))
        covered += count
    return tuple(
        RequestClass(
            cpu_milli=key[0],
            gpu_milli=key[1],
            num_gpu=key[2],
            gpu_spec=tuple(s for s in key[3].split("|") if s),
            probability=count / covered,
            memory_mib=sorted(memory[key])[len(memory[key]) // 2],
        )
        for key, count in kept
    )
