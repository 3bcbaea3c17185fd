"""GPU fragmentation against a target workload: the measure behind the ``fragmentation`` policies of the
scheduler and ``hami simulate`` (one implementation; the placement rule is :mod:`hami.core.fragplacement`).

Owns :class:`TargetClass`, :class:`Target` (a workload, with the memos that keep the figures
incremental), :class:`CardInfo`, :class:`NodeFrag`, :class:`NodeView`, and the per-card rules
:func:`card_key`, :func:`accepts`, :func:`granted`.

The measure (Weng et al., "Beware of Fragmentation", USENIX ATC '23): a card's free share ``l`` is its free
memory in milli of the card (``1000 x free / total``; cards that can take no pod at all — unhealthy, cordoned,
another vendor, MIG — count 0). For a class m of the target workload (``k_m`` cards of
``memory_m``/``cores_m`` each, maybe limited to some card types and, in the simulator, needing ``cpu_m`` of
the node's CPU and maybe ``mem_m`` of its host memory) a card is *usable* when one of the class's containers
could take it by the Fit rules that depend on the card alone (a free slot, memory, cores, exclusive use:
checks 6, 9, 10, 13, 14). The node's free GPU ``G = Σ l`` is all fragment to a class that cannot use the node
(no card asked, fewer than ``k_m`` usable cards, too little CPU or host memory), else only the cards it cannot
use: ``frag_m = G - R_m`` with ``R_m = Σ l`` over usable cards. ``F(n) = Σ_m p_m frag_m = G - Σ_m p_m fits_m
R_m``. Given the cluster's cards per type (``supply``), ``G`` counts each card's ``l`` less the share its
type holds back for the classes restricted to it (:func:`reserves`): a card that type-restricted demand
waits for is not free for the measure to the extent they need it, so taking it costs what it is worth
to them (without, FGD draws unrestricted pods to the types fewer classes accept, scarce or not).

Incremental: a card's (``l``, usable classes) is memoised by its usage, a node's sums by the identity of
its :class:`~hami.core.model.NodeState` (a new state is built only when a grant changes), and
:meth:`Target.remember` keeps scores for the placement rule; a new target (the learned workload moved)
starts with empty memos. Every memo is bounded. Pure: stdlib only; must not import a Kubernetes
client, aiohttp, kopf, grpc, pynvml, ``logging``, ``os`` or ``time``.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from hami.core.fit import memory_need
from hami.core.model import (
    PERCENT_NOT_GIVEN,
    ContainerRequest,
    DeviceMode,
    DeviceState,
    NodeState,
    is_vendor_card,
)

MILLI = 1000
#: How much of a free card's share the measure holds back for the demand restricted to its type, per
#: unit of that demand's density over the average (see :func:`reserves`).
RESERVE = 1.0
#: The reserves count only where some type's restricted demand per card reaches this share of the average
#: demand per card; below, FGD's own balance serves the few restricted pods and the reserves only perturb
#: it (docs/policies.md, the held-out protocol: chosen on the design family).
RESERVE_FLOOR = 0.5
#: Memo sizes: beyond them a memo starts again empty (template nodes in requests are not bounded).
MEMO_LIMIT = 65536

#: What a node has free besides its cards, or what a pod asks of it: (milli-CPU, host memory MiB).
Host = tuple[int, int]

#: A card's usage as the measure sees it: (takes pods at all, type, memory, cores, slots, used slots,
#: used memory, used cores).
CardKey = tuple[bool, str, int, int, int, int, int, int]


@dataclass(frozen=True, slots=True, kw_only=True)
class TargetClass:
    """One kind of pod of the target workload: per card what it asks, how many cards, how likely."""

    nums: int  # cards per pod; 0: no card (CPU only: every free share is fragment to it)
    memory_mib: int = 0  # per card in MiB when > 0, else ``percentage`` of each card
    percentage: int = PERCENT_NOT_GIVEN
    cores: int = 0
    cpu_milli: int = 0  # CPU it needs on the node (the simulator; the scheduler does not see CPU)
    host_memory_mib: int = 0  # host memory it needs on the node (likewise)
    types: tuple[str, ...] = ()  # card types it may use (lower-case substrings); () = any
    weight: float = 1.0


@dataclass(frozen=True, slots=True)
class CardInfo:
    """A card's free share in milli, the GPU classes (positions in ``Target.gpu``) that could use it, and
    its free share as ``F``'s first term counts it (``free`` = ``(1 - reserve of its model) milli``)."""

    milli: int
    usable: tuple[int, ...]
    mask: int
    free: float


@dataclass(frozen=True, slots=True)
class NodeFrag:
    """A node's sums: free share ``g`` (as ``F`` counts it, see :attr:`CardInfo.free`), per GPU class ``r``
    (usable share) and ``n`` (usable cards), and ``held``: the free share the card-type reserves hold back
    (``Σ (milli - free)``; 0 without reserves)."""

    g: float
    r: tuple[int, ...]
    n: tuple[int, ...]
    held: float = 0.0


_NONE = CardInfo(0, (), 0, 0.0)


def accepts(key: CardKey, need: int, cores: int) -> bool:
    """Fit's checks 6, 9, 10, 13, 14 for one container on a card with this usage (cores clamped)."""
    _, _, memory, total_cores, count, used, used_mem, used_cores = key
    if count <= used or memory - used_mem < need or total_cores - used_cores < cores:
        return False
    if total_cores == 100 and cores == 100 and used > 0:
        return False
    return not (total_cores != 0 and used_cores == total_cores and cores == 0)


@dataclass(frozen=True, slots=True)
class NodeView:
    """A node as the measure sees it: its card usages, their sums, and ``F`` with ``host`` free."""

    keys: tuple[CardKey, ...]
    sums: NodeFrag
    host: Host | None
    frag: float
    usage: int  # the card usages interned: equal for nodes whose cards are used alike


class Target:
    """A target workload: classes with probabilities (``weight`` over the sum of all weights).

    Holds the memos (cards, nodes, scores); build a new one when the workload changes.
    """

    def __init__(
        self,
        classes: Iterable[TargetClass],
        *,
        supply: Mapping[str, int] | None = None,
        memo_limit: int = MEMO_LIMIT,
    ) -> None:
        self._limit = memo_limit
        kept = tuple(c for c in classes if c.weight > 0 and c.nums >= 0)
        total = math.fsum(c.weight for c in kept)
        if not kept or total <= 0:
            raise ValueError("a target workload needs at least one class with a positive weight")
        self.classes = kept
        self.gpu = tuple(c for c in kept if c.nums > 0)
        self.p = tuple(c.weight / total for c in self.gpu)
        self.k = tuple(c.nums for c in self.gpu)
        self.host = tuple((c.cpu_milli, c.host_memory_mib) for c in self.gpu)
        #: Per card type (lower-case): the share of a free card the type-restricted demand holds for itself.
        self.reserve = reserves(self.gpu, self.p, supply or {})
        self._requests = tuple(
            ContainerRequest(
                nums=1, memory_mib=c.memory_mib, percentage=c.percentage, cores=min(c.cores, 100)
            )
            for c in self.gpu
        )
        self._cards: dict[CardKey, CardInfo] = {}
        self._nodes: dict[str, tuple[NodeState, NodeView]] = {}
        self._scores: dict[tuple[object, ...], int] = {}
        self._interned: dict[Hashable, int] = {}
        self._numbers = itertools.count()

    # ---------------------------------------------------------------------------------- the measure

    def card(self, key: CardKey) -> CardInfo:
        """``l`` and the usable classes of a card with this usage (memoised)."""
        info = self._cards.get(key)
        if info is None:
            ok, card_type, memory, _, _, _, used_mem, _ = key
            if not ok:
                return _NONE
            lowered = card_type.lower()
            usable: list[int] = []
            mask = 0
            for m, request in enumerate(self._requests):
                types = self.gpu[m].types
                if types and not any(t in lowered for t in types):
                    continue
                if accepts(key, memory_need(request, memory), request.cores):
                    usable.append(m)
                    mask |= 1 << m
            milli = MILLI * max(0, memory - used_mem) // memory
            info = CardInfo(milli, tuple(usable), mask, (1.0 - self.reserve.get(lowered, 0.0)) * milli)
            if len(self._cards) >= self._limit:
                self._cards.clear()
            self._cards[key] = info
        return info

    def frag(self, sums: NodeFrag, host: Host | None = None) -> float:
        """``F = G - Σ_m p_m fits_m R_m`` (``host`` None: CPU and memory are not part of the measure)."""
        return self.frag_of(sums.g, sums.r, sums.n, host)

    def fits(self, m: int, n: int, host: Host | None) -> bool:
        """Whether GPU class ``m`` can use a node with ``n`` usable cards and ``host`` free."""
        if n < self.k[m]:
            return False
        if host is None:
            return True
        need = self.host[m]
        return host[0] >= need[0] and host[1] >= need[1]

    def frag_of(self, g: float, r: Sequence[int], n: Sequence[int], host: Host | None) -> float:
        usable = 0.0
        for m, p in enumerate(self.p):
            if self.fits(m, n[m], host):
                usable += p * r[m]
        return g - usable

    def sums(self, keys: Iterable[CardKey]) -> NodeFrag:
        """The sums over cards with these usages."""
        width = len(self.gpu)
        r, n = [0] * width, [0] * width
        g = held = 0.0
        for key in keys:
            info = self.card(key)
            g += info.free
            held += info.milli - info.free
            for m in info.usable:
                r[m] += info.milli
                n[m] += 1
        return NodeFrag(g, tuple(r), tuple(n), held)

    def node(self, node: NodeState, host: Host | None = None) -> NodeView:
        """A node's view, memoised per node name until its state object changes (a grant changed);
        a change of ``host`` alone recomputes only ``F``."""
        entry = self._nodes.get(node.name)
        if entry is not None and entry[0] is node:
            view = entry[1]
            if view.host == host:
                return view
            view = NodeView(view.keys, view.sums, host, self.frag(view.sums, host), view.usage)
        else:
            keys = card_keys(node)
            sums = self.sums(keys)
            view = NodeView(keys, sums, host, self.frag(sums, host), self.intern(keys))
            if len(self._nodes) >= self._limit:
                self._nodes.clear()
        self._nodes[node.name] = (node, view)
        return view

    def intern(self, value: Hashable) -> int:
        """A small number for ``value``, the same for equal values (never reused for another)."""
        found = self._interned.get(value)
        if found is None:
            if len(self._interned) >= self._limit:
                self._interned.clear()
            found = self._interned[value] = next(self._numbers)
        return found

    def remembered(self, key: tuple[object, ...]) -> int | None:
        """A score remembered for ``key`` (see :func:`node_priorities`)."""
        return self._scores.get(key)

    def remember(self, key: tuple[object, ...], score: int) -> None:
        if len(self._scores) >= self._limit:
            self._scores.clear()
        self._scores[key] = score


def card_share(cls: TargetClass) -> float:
    """The share of each card a class asks for: its percentage, else its cores, else a whole card."""
    if cls.percentage != PERCENT_NOT_GIVEN:
        return min(cls.percentage, 100) / 100
    return min(cls.cores, 100) / 100 if cls.cores > 0 else 1.0


def reserves(gpu: Sequence[TargetClass], p: Sequence[float], supply: Mapping[str, int]) -> dict[str, float]:
    """Per card type (lower-case): ``RESERVE`` x how much more of the demand, per card, waits for that type
    alone than for the average card. ``supply``: cards per type in the cluster.

    A class limited to some types spreads its demand (``p`` x cards x share) evenly over the cards of the
    types it accepts; a type's density is the sum of what falls on one of its cards, against the whole
    GPU demand spread over every card. Unrestricted classes hold nothing (they can go anywhere). No
    reserves at all (``{}``) unless some type's density reaches :data:`RESERVE_FLOOR` of the average.
    """
    cards: dict[str, int] = {}
    for name, count in supply.items():
        if count > 0:
            cards[name.lower()] = cards.get(name.lower(), 0) + count
    total = sum(cards.values())
    demand = math.fsum(q * c.nums * card_share(c) for c, q in zip(gpu, p, strict=True))
    if total == 0 or demand <= 0:
        return {}
    density = dict.fromkeys(cards, 0.0)
    for cls, q in zip(gpu, p, strict=True):
        if not cls.types:
            continue
        accepted = [name for name in cards if any(t in name for t in cls.types)]
        held = sum(cards[name] for name in accepted)
        for name in accepted:
            density[name] += q * cls.nums * card_share(cls) / held
    average = demand / total
    if max(density.values(), default=0.0) < RESERVE_FLOOR * average:
        return {}
    return {name: RESERVE * d / average for name, d in density.items() if d > 0}


def card_key(state: DeviceState, cordoned: frozenset[str] = frozenset()) -> CardKey:
    dev = state.device
    ok = (
        state.healthy
        and dev.uuid not in cordoned
        and is_vendor_card(dev)
        and dev.mode != DeviceMode.MIG
        and dev.memory_mib > 0
    )
    return (ok, dev.type, dev.memory_mib, dev.cores, dev.count, state.used, state.used_mem, state.used_cores)


def card_keys(node: NodeState) -> tuple[CardKey, ...]:
    return tuple(card_key(s, node.cordoned) for s in node.devices)


def granted(key: CardKey, need: int, cores: int) -> CardKey:
    """The usage after one more container got ``need`` MiB and ``cores`` on the card."""
    ok, card_type, memory, total_cores, count, used, used_mem, used_cores = key
    return (ok, card_type, memory, total_cores, count, used + 1, used_mem + need, used_cores + cores)
