"""Card scores, card ordering by GPU policy, and the node score (docs/protocol.md, "Scoring").

Owns :func:`card_score`, :func:`parse_gpu_policy`, :func:`order_cards`, :func:`node_score` and
:func:`node_priority`, the one node ranking: HAMi's node score mapped onto kube-scheduler's 0..10 under
the node policy (what ``/prioritize`` answers), and :func:`demote_busy`, which ranks the nodes a bind
would find busy now below the others (not HAMi's: docs/compatibility.md, "Scheduler extender", item
30; which nodes are busy is the scheduler's to say). Scores use float32 arithmetic like HAMi's Go code
(:func:`hami.core.gocompat.f32`), so ties (which decide the card) fall the same way.

Pure: stdlib only; must not import a Kubernetes client, aiohttp, kopf, grpc, pynvml, ``logging``,
``os`` or ``time``.
"""

from __future__ import annotations

from collections.abc import Sequence, Set
from dataclasses import dataclass

from hami.core.gocompat import f32
from hami.core.model import PERCENT_NOT_GIVEN, ContainerRequest, DeviceState, NodeState, ScoringWeights

BINPACK = "binpack"
SPREAD = "spread"
MUTEX = "mutex"
TOPOLOGY = "topology-aware"
NUMA = "numa"
#: Node and card policy: the placement that grows GPU fragmentation least (hami.core.fragmentation).
FRAGMENTATION = "fragmentation"
_SORT_KEYS = (BINPACK, SPREAD, NUMA)
#: kube-scheduler's extender priority range is 0..MAX_PRIORITY.
MAX_PRIORITY = 10


def card_score(state: DeviceState, request: ContainerRequest | None, weights: ScoringWeights) -> float:
    """``10 x (Ws(n+used)/count + Wc(c+usedcores)/totalcore + Wm(m+usedmem)/totalmem)`` in float32.

    The request counts only when its type equals the card type exactly (``NVIDIA`` vs a model name
    like ``NVIDIA A100`` never does in production). Worked example: card 10 slots / 100 cores /
    1000 MiB with 2 tasks, 40 cores, 500 MiB used, type ``NVIDIA``, request 30 cores, 25 %:
    n=1, c=30, m=1000x25/100=250 -> 10 x (3/10 + 70/100 + 750/1000) = 10 x 1.75 = 17.5.
    """
    dev = state.device
    if dev.count == 0 or dev.cores == 0 or dev.memory_mib == 0:
        return 0.0
    n = c = m = 0
    if request is not None and request.type == dev.type:
        n, c = 1, request.cores
        pct = request.percentage
        m = dev.memory_mib * pct // 100 if pct not in (0, PERCENT_NOT_GIVEN) else request.memory_mib
    slot = f32(f32(n + state.used) / f32(dev.count))
    core = f32(f32(c + state.used_cores) / f32(dev.cores))
    mem = f32(f32(m + state.used_mem) / f32(dev.memory_mib))
    total = f32(f32(f32(weights.slot * slot) + f32(weights.core * core)) + f32(weights.memory * mem))
    return f32(10 * total)


@dataclass(frozen=True, slots=True, kw_only=True)
class GpuPolicy:
    """A parsed ``hami.io/gpu-scheduler-policy`` / ``--gpu-scheduler-policy`` value."""

    entries: tuple[str, ...]
    chain: bool  # a comma list or exactly "numa": sort by a key chain
    mutex: bool
    topology: bool
    fragmentation: bool = False  # exactly "fragmentation": cards by hami.core.fragmentation when a
    # target workload is given, else (like any unknown value) as spread


def parse_gpu_policy(raw: str) -> GpuPolicy:
    entries = tuple(e.strip() for e in raw.split(","))
    return GpuPolicy(
        entries=entries,
        chain="," in raw or raw.strip() == NUMA,
        mutex=MUTEX in entries,
        topology=TOPOLOGY in entries,
        fragmentation=entries == (FRAGMENTATION,),
    )


def _chain(policy: GpuPolicy, numa_bind: bool) -> list[str]:
    keys: list[str] = []
    for entry in policy.entries:
        if entry in _SORT_KEYS and entry not in keys:
            keys.append(entry)
    if not keys:
        keys = [SPREAD]
    if numa_bind:
        # NUMA groups must stay contiguous for numa-bind (docs/protocol.md, "Several cards"): NUMA becomes the
        # primary key.
        keys = [NUMA, *(k for k in keys if k != NUMA)]
    return keys


def order_cards(
    cards: Sequence[DeviceState], scores: Sequence[float], policy: GpuPolicy, numa_bind: bool
) -> list[int]:
    """Positions of ``cards`` sorted ascending by the policy comparator; Fit walks them from the end.

    Python's sort is stable, so equal keys keep registration order and the last registered card is
    tried first (HAMi: Go's insertion sort for <= 12 cards).
    """
    positions = range(len(cards))

    def numa(i: int) -> int:
        return cards[i].device.numa

    if policy.chain:
        keys = _chain(policy, numa_bind)

        def chained(i: int) -> tuple[float, ...]:
            parts: list[float] = []
            for key in keys:
                parts.append(scores[i] if key == BINPACK else -scores[i] if key == SPREAD else numa(i))
            parts.append(cards[i].device.index)
            return tuple(parts)

        return sorted(positions, key=chained)
    single = policy.entries[0]
    if single == BINPACK:
        if numa_bind:
            return sorted(positions, key=lambda i: (-numa(i), scores[i]))
        return sorted(positions, key=lambda i: (scores[i], numa(i)))
    if single == MUTEX:
        # HAMi tests the single "mutex" value before numa-bind, so NUMA never becomes primary here.
        return sorted(positions, key=lambda i: (-cards[i].used, numa(i)))
    if numa_bind:
        return sorted(positions, key=lambda i: (numa(i), -scores[i]))
    return sorted(positions, key=lambda i: (-scores[i], numa(i)))


def node_score(node: NodeState) -> float:
    """HAMi's node score of the usage on ``node`` (0..30): derived once when the node state is built.

    ``10 x (Σused/Σcount + Σusedcores/Σtotalcore + Σusedmem/Σtotalmem)``, 0 if any total is 0.
    Example (HAMi's filter cases): node1 with 3 of 10 slots, 30 of 100 cores and 300 of 1000 MiB in
    use -> 10 x (0.3 + 0.3 + 0.3) = 9.0; see tests/core/test_score.py for more.
    """
    return node.summary.score


def node_priority(score: float, node_policy: str) -> int:
    """A node score (0..30) as kube-scheduler's 0..10 under ``node_policy``: the one node ranking.

    ``binpack`` (the default, any other value too) prefers fuller nodes: ``round(score / 3)``;
    ``spread`` prefers emptier ones: ``10 - round(score / 3)`` (clamped to 0..10). Worked example: a
    node with 3/10 slots, 30/100 cores and 300/1000 MiB in use scores 9.0 -> binpack 3, spread 7.
    """
    fullness = max(0, min(MAX_PRIORITY, round(score / 3)))
    return MAX_PRIORITY - fullness if node_policy == SPREAD else fullness


def demote_busy(priorities: dict[str, int], busy: Set[str]) -> int:
    """Rank the nodes of ``busy`` below every other node of ``priorities`` (0..10 by node), in place:
    each busy node 0, each other at least 1 (their order among themselves otherwise kept; 0 and 1 tie).
    Nothing changes when no node of ``priorities`` is busy, nor when every one is (a busy node still takes the
    pod when it is the only choice). Returns how many nodes were demoted (0: nothing changed).

    Example: binpack's ``{a: 4, b: 0, c: 2}`` with ``a`` busy -> ``{a: 0, b: 1, c: 2}``."""
    hit = [name for name in busy if name in priorities]
    if not hit or len(hit) == len(priorities):
        return 0
    for name, value in priorities.items():  # values only: the keys stay as they are
        if value < 1:
            priorities[name] = 1
    for name in hit:
        priorities[name] = 0
    return len(hit)
