"""GPU fragmentation against a target workload, and the placement rule that grows it least: one
implementation for the scheduler's ``fragmentation`` policy and ``hami simulate``.

Owns :class:`TargetClass`, :class:`Target` (a workload, with the memos that keep the figures incremental),
:class:`NodeFrag`, :func:`gradient`, :func:`place` (the cards a pod would take on a node and their score),
:func:`node_priorities` (``/prioritize`` under the ``fragmentation`` node policy) and :func:`card_order`
(Fit's card order under the ``fragmentation`` GPU policy, which bind's choice follows).

The measure (Weng et al., "Beware of Fragmentation", USENIX ATC '23): a card's free share ``l`` is its
free memory in milli of the card (``1000 x free / total``; cards that can take no pod at all — unhealthy,
cordoned, another vendor, MIG — count 0). For a class m of the target workload (``k_m`` cards of
``memory_m``/``cores_m`` each, maybe limited to some card types and, in the simulator, needing
``cpu_m`` of the node's CPU) a card is *usable* when one of the class's containers could take it by the
Fit rules that depend on the card alone (a free slot, memory, cores, exclusive use: checks 6, 9, 10, 13,
14). The node's free GPU ``G = Σ l`` is all fragment to a class that cannot use the node (no card asked,
fewer than ``k_m`` usable cards, too little CPU), else only the cards it cannot use:
``frag_m = G - R_m`` with ``R_m = Σ l`` over usable cards. ``F(n) = Σ_m p_m frag_m = G - Σ_m p_m fits_m
R_m``. A placement's score is ``int(100 σ((F(n) - F(n'))/1000))`` (n' = the node after it): 50 when the
fragmentation does not change, higher when it shrinks. Per container the cards are chosen one at a time,
each the card with the best score (the lowest position on ties).

Incremental: a card's (``l``, usable classes) is memoised by its usage; a node's sums by the identity of
its :class:`~hami.core.model.NodeState` (a new state is built only when a grant changes); a node's score
for a request by the node's card usage and the request. A new target (the learned workload moved) starts
with empty memos. Pure: stdlib only; must not import a Kubernetes client, aiohttp, kopf, grpc, pynvml,
``logging``, ``os`` or ``time``.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass

from hami.core.fit import Steering, memory_need
from hami.core.model import (
    PERCENT_NOT_GIVEN,
    ContainerRequest,
    DeviceMode,
    DeviceState,
    NodeState,
    PodRequest,
    is_vendor_card,
)
from hami.core.score import FRAGMENTATION, MAX_PRIORITY, parse_gpu_policy

MILLI = 1000
#: Memo sizes: beyond them a memo starts again empty (template nodes in requests are not bounded).
MEMO_LIMIT = 65536

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
    types: tuple[str, ...] = ()  # card types it may use (lower-case substrings); () = any
    weight: float = 1.0


@dataclass(frozen=True, slots=True)
class CardInfo:
    """A card's free share in milli and the GPU classes (positions in ``Target.gpu``) that could use it."""

    milli: int
    usable: tuple[int, ...]
    mask: int


@dataclass(frozen=True, slots=True)
class NodeFrag:
    """A node's sums: free share ``g``, per GPU class ``r`` (usable share) and ``n`` (usable cards)."""

    g: int
    r: tuple[int, ...]
    n: tuple[int, ...]


_NONE = CardInfo(0, (), 0)


def _accepts(key: CardKey, need: int, cores: int) -> bool:
    """Fit's checks 6, 9, 10, 13, 14 for one container on a card with this usage (cores clamped)."""
    _, _, memory, total_cores, count, used, used_mem, used_cores = key
    if count <= used or memory - used_mem < need or total_cores - used_cores < cores:
        return False
    if total_cores == 100 and cores == 100 and used > 0:
        return False
    return not (total_cores != 0 and used_cores == total_cores and cores == 0)


@dataclass(frozen=True, slots=True)
class NodeView:
    """A node as the measure sees it: its card usages, their sums, and ``F`` at ``cpu``."""

    keys: tuple[CardKey, ...]
    sums: NodeFrag
    cpu: int | None
    frag: float
    usage: int  # the card usages interned: equal for nodes whose cards are used alike


class Target:
    """A target workload: classes with probabilities (``weight`` over the sum of all weights).

    Holds the memos (cards, nodes, scores); build a new one when the workload changes.
    """

    def __init__(self, classes: Iterable[TargetClass], *, memo_limit: int = MEMO_LIMIT) -> None:
        self._limit = memo_limit
        kept = tuple(c for c in classes if c.weight > 0 and c.nums >= 0)
        total = math.fsum(c.weight for c in kept)
        if not kept or total <= 0:
            raise ValueError("a target workload needs at least one class with a positive weight")
        self.classes = kept
        self.gpu = tuple(c for c in kept if c.nums > 0)
        self.p = tuple(c.weight / total for c in self.gpu)
        self.k = tuple(c.nums for c in self.gpu)
        self.cpu = tuple(c.cpu_milli for c in self.gpu)
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
                if _accepts(key, memory_need(request, memory), request.cores):
                    usable.append(m)
                    mask |= 1 << m
            info = CardInfo(MILLI * max(0, memory - used_mem) // memory, tuple(usable), mask)
            if len(self._cards) >= self._limit:
                self._cards.clear()
            self._cards[key] = info
        return info

    def frag(self, sums: NodeFrag, cpu: int | None = None) -> float:
        """``F = G - Σ_m p_m fits_m R_m`` (``cpu`` None: CPU is not part of the measure)."""
        return _frag(self, sums.g, sums.r, sums.n, cpu)

    def sums(self, keys: Iterable[CardKey]) -> NodeFrag:
        """The sums over cards with these usages."""
        width = len(self.gpu)
        r, n = [0] * width, [0] * width
        g = 0
        for key in keys:
            info = self.card(key)
            g += info.milli
            for m in info.usable:
                r[m] += info.milli
                n[m] += 1
        return NodeFrag(g, tuple(r), tuple(n))

    def node(self, node: NodeState, cpu: int | None = None) -> NodeView:
        """A node's view, memoised per node name until its state object changes (a grant changed);
        a change of ``cpu`` alone recomputes only ``F``."""
        entry = self._nodes.get(node.name)
        if entry is not None and entry[0] is node:
            view = entry[1]
            if view.cpu == cpu:
                return view
            view = NodeView(view.keys, view.sums, cpu, self.frag(view.sums, cpu), view.usage)
        else:
            keys = card_keys(node)
            sums = self.sums(keys)
            view = NodeView(keys, sums, cpu, self.frag(sums, cpu), self.intern(keys))
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


def _frag(target: Target, g: int, r: Sequence[int], n: Sequence[int], cpu: int | None) -> float:
    usable = 0.0
    k, need = target.k, target.cpu
    for m, p in enumerate(target.p):
        if n[m] >= k[m] and (cpu is None or cpu >= need[m]):
            usable += p * r[m]
    return g - usable


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


def gradient(before: float, after: float) -> int:
    """``int(100 σ((before - after)/1000))``: 0..99, 50 when the fragmentation does not change."""
    x = max(-700.0, min(700.0, (before - after) / MILLI))
    return math.floor(100.0 / (1.0 + math.exp(-x)))


def priority(score: int) -> int:
    """A placement score (0..99) on kube-scheduler's extender range 0..10 (rounded)."""
    return min(MAX_PRIORITY, (score + 5) // 10)


@dataclass(frozen=True, slots=True, kw_only=True)
class Placement:
    """Where the pod's app containers would go on one node (positions in ``devices``) and the score."""

    score: int
    before: float
    after: float
    cards: tuple[tuple[int, ...], ...]


class _Walk:
    """A node's sums while picks are applied one at a time (one :func:`place` call)."""

    def __init__(self, target: Target, view: NodeView, cpu: int | None) -> None:
        self.t = target
        self.g = view.sums.g
        self.r = list(view.sums.r)
        self.n = list(view.sums.n)
        self.keys = list(view.keys)
        self.cpu = cpu

    def after(self, j: int, new: CardKey) -> float:
        """``F`` if card ``j`` had usage ``new`` (the picks so far applied)."""
        t = self.t
        old, now = t.card(self.keys[j]), t.card(new)
        changed = old.mask | now.mask
        usable = 0.0
        cpu, r, n, k, need = self.cpu, self.r, self.n, t.k, t.cpu
        for m, p in enumerate(t.p):
            rm, nm = r[m], n[m]
            if changed >> m & 1:
                if old.mask >> m & 1:
                    rm -= old.milli
                    nm -= 1
                if now.mask >> m & 1:
                    rm += now.milli
                    nm += 1
            if nm >= k[m] and (cpu is None or cpu >= need[m]):
                usable += p * rm
        return self.g - old.milli + now.milli - usable

    def apply(self, j: int, new: CardKey) -> None:
        old, now = self.t.card(self.keys[j]), self.t.card(new)
        self.g += now.milli - old.milli
        for m in old.usable:
            self.r[m] -= old.milli
            self.n[m] -= 1
        for m in now.usable:
            self.r[m] += now.milli
            self.n[m] += 1
        self.keys[j] = new

    def frag(self) -> float:
        return _frag(self.t, self.g, self.r, self.n, self.cpu)


def _granted(key: CardKey, need: int, cores: int) -> CardKey:
    ok, card_type, memory, total_cores, count, used, used_mem, used_cores = key
    return (ok, card_type, memory, total_cores, count, used + 1, used_mem + need, used_cores + cores)


def place(
    target: Target,
    node: NodeState,
    request: PodRequest,
    *,
    cpu_milli: int = 0,
    cpu_free: int | None = None,
) -> Placement | None:
    """The cards the pod's app containers would take on ``node`` under the rule, and the score; None
    when a container finds too few cards (by the per-card checks and the pod's type/uuid steering).

    Each card in turn is the one whose booking scores best (lowest position on ties), the earlier picks
    applied; the score is that of the whole placement. ``cpu_free``/``cpu_milli``: the node's free CPU
    and the pod's request (the simulator), None/0 in the scheduler. Init containers hold nothing once
    done and are left out.
    """
    view = target.node(node, cpu_free)
    walk = _Walk(target, view, None if cpu_free is None else cpu_free - cpu_milli)
    steer = Steering.of(request, parse_gpu_policy(FRAGMENTATION), node.cordoned, {})
    chosen: list[tuple[int, ...]] = []
    for container in request.containers[request.init_count :]:
        if container is None or container.nums <= 0:
            chosen.append(())
            continue
        cores = min(container.cores, 100)
        allowed = [
            j
            for j, s in enumerate(node.devices)
            if view.keys[j][0] and steer.type_ok(container, s) and steer.uuid_ok(s.device.uuid)
        ]
        picks: list[int] = []
        for _ in range(container.nums):
            best: tuple[int, int, CardKey] | None = None
            seen: dict[CardKey, int] = {}
            for j in allowed:
                key = walk.keys[j]
                need = memory_need(container, key[2])
                if j in picks or not _accepts(key, need, cores):
                    continue
                new = _granted(key, need, cores)
                score = seen.get(key)
                if score is None:
                    score = seen[key] = gradient(view.frag, walk.after(j, new))
                if best is None or score > best[1]:
                    best = (j, score, new)
            if best is None:
                return None
            walk.apply(best[0], best[2])
            picks.append(best[0])
        chosen.append(tuple(picks))
    after = walk.frag()
    return Placement(score=gradient(view.frag, after), before=view.frag, after=after, cards=tuple(chosen))


def _request_key(request: PodRequest) -> tuple[object, ...] | None:
    """What the score of a request depends on besides the node; None when it names card uuids."""
    if request.use_uuids or request.nouse_uuids:
        return None
    return (
        request.containers[request.init_count :],
        request.use_types,
        request.nouse_types,
        request.vgpu_mode,
    )


def node_priorities(target: Target, request: PodRequest, nodes: Iterable[NodeState]) -> dict[str, int]:
    """``/prioritize`` under the ``fragmentation`` node policy: per node the score of the pod's best
    placement there (:func:`place`) on 0..10; 0 where the rule finds no cards (MIG cards, say).

    A node's score is memoised by its card usage and the request, so an unchanged node costs a lookup.
    """
    wanted = _request_key(request)
    asked = None if wanted is None else target.intern(wanted)
    out: dict[str, int] = {}
    for node in nodes:
        memo = None if asked is None else (target.node(node).usage, asked)
        score = None if memo is None else target.remembered(memo)
        if score is None:
            found = place(target, node, request)
            score = found.score if found is not None else -1
            if memo is not None:
                target.remember(memo, score)
        out[node.name] = priority(score) if score >= 0 else 0
    return out


def card_scores(
    target: Target, cards: Sequence[DeviceState], cordoned: frozenset[str], container: ContainerRequest
) -> list[int]:
    """Bind's card order under the ``fragmentation`` GPU policy: per card the score (0..99) of giving
    it one card of ``container`` (-1 where the card cannot take it), against the cards' current usage."""
    keys = tuple(card_key(s, cordoned) for s in cards)
    sums = target.sums(keys)
    view = NodeView(keys, sums, None, target.frag(sums), -1)
    walk = _Walk(target, view, None)
    cores = min(container.cores, 100)
    out: list[int] = []
    for j, key in enumerate(keys):
        need = memory_need(container, key[2])
        if not key[0] or not _accepts(key, need, cores):
            out.append(-1)
            continue
        out.append(gradient(view.frag, walk.after(j, _granted(key, need, cores))))
    return out


def card_order(
    target: Target,
    cards: Sequence[DeviceState],
    cordoned: frozenset[str],
    container: ContainerRequest,
    numa_bind: bool,
) -> list[int]:
    """Positions of ``cards`` sorted so that Fit, walking from the end, tries the best-scored card first
    (the lowest position on ties); with numa-bind the NUMA groups stay contiguous, the lowest first."""
    scores = card_scores(target, cards, cordoned, container)
    if numa_bind:
        return sorted(range(len(cards)), key=lambda i: (-cards[i].device.numa, scores[i], -i))
    return sorted(range(len(cards)), key=lambda i: (scores[i], -i))
