"""The search behind :func:`hami.core.preempt.preempt_node`: which pods, among those that may go, to evict.

Owns :class:`Holder` (a pod holding grants on the node), :func:`cost` (the order victim sets are
compared in) and :class:`VictimSearch` (one node's search: per card, by size, greedy). Every fit
question goes to the allocation core (``allocate(...).fits`` for a yes/no, ``fit_node`` for the
allocation); nothing here knows a fit rule. Questions are cached by what they remove: pods with the
same usage (and the same namespace while a quota counts) are interchangeable, so only the cheapest
pods of each kind are tried. ``budget`` bounds the questions, ``GENERATED`` the sets built.

Pure: stdlib only; must not import a Kubernetes client, aiohttp, kopf, grpc, pynvml, ``logging``,
``os`` or ``time``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass, field, fields, replace
from itertools import combinations, product
from typing import Any

from hami.core.allocate import Policy, allocate, fit_node
from hami.core.model import (
    Allocation,
    Device,
    DeviceMode,
    DeviceState,
    NamespaceQuota,
    NodeState,
    PodRequest,
    is_vendor_card,
)
from hami.core.usage import CardUsage, PodUsage, apply_usage

__all__ = ["BUDGET", "CardMemo", "Cost", "Holder", "VictimSearch", "cheap", "cost", "release", "remove"]

#: Fit questions one node may ask before the greedy pass answers instead of the exact search.
BUDGET = 400
#: Candidate sets one node may build for the exact search.
GENERATED = 5000
#: Options kept per card (cheapest first) when combining cards.
OPTIONS_PER_CARD = 8


@dataclass(frozen=True, slots=True, kw_only=True)
class Holder:
    """A pod holding grants on the node. ``started``: Unix seconds it started (larger = younger)."""

    uid: str
    namespace: str = ""
    priority: int = 0
    started: float = 0.0
    violates_pdb: bool = False  # evicting it would violate a PodDisruptionBudget
    usage: PodUsage


Cost = tuple[int, tuple[int, ...], int, tuple[float, ...], tuple[str, ...]]


def cost(victims: Iterable[Holder]) -> Cost:
    """The order victim sets are compared in, smaller first: fewest pods, lowest priorities (highest
    first), fewest PDB violations, youngest (oldest first), uids (:mod:`hami.core.preempt`)."""
    chosen = list(victims)
    return (
        len(chosen),
        tuple(sorted((h.priority for h in chosen), reverse=True)),
        sum(1 for h in chosen if h.violates_pdb),
        tuple(-t for t in sorted(h.started for h in chosen)),
        tuple(sorted(h.uid for h in chosen)),
    )


def cheap(holder: Holder) -> tuple[int, bool, float, str]:
    """Cheapest to evict first: lower priority, no PDB violated, younger, then uid."""
    return (holder.priority, holder.violates_pdb, -holder.started, holder.uid)


def _importance(holder: Holder) -> tuple[bool, int, float, str]:
    """Reprieved first, as kube-scheduler does: pods whose eviction would violate a PDB, then higher
    priority, then older, then uid."""
    return (not holder.violates_pdb, -holder.priority, holder.started, holder.uid)


def remove(node: NodeState, victims: Sequence[Holder]) -> NodeState:
    """The node without the victims' usage (one pass over their cards)."""
    if not victims:
        return node
    return apply_usage(node, PodUsage(cards=tuple(c for h in victims for c in h.usage.cards)), sign=-1)


def release(quota: NamespaceQuota | None, namespace: str, victims: Sequence[Holder]) -> NamespaceQuota | None:
    """The namespace quota once the victims of that namespace are gone."""
    if quota is None:
        return None
    same = [h.usage for h in victims if h.namespace == namespace]
    return replace(
        quota,
        memory_used=quota.memory_used - sum(u.memory for u in same),
        cores_used=quota.cores_used - sum(u.cores for u in same),
    )


def _coverable(card_sets: Sequence[frozenset[str]], limit: int) -> bool:
    """Whether at most ``limit`` cards touch every set (the pods could all sit on the pod's cards)."""
    if not card_sets:
        return True
    if limit <= 0:
        return False
    return any(_coverable([s for s in card_sets if card not in s], limit - 1) for card in card_sets[0])


Signature = tuple[tuple[CardUsage, ...], str]
#: What Fit reads of a card besides its uuid (only steering reads that) and index (only the order).
_DEVICE_AS_FIT_SEES_IT = tuple(f.name for f in fields(Device) if f.name not in ("uuid", "index"))
_USAGE_AS_FIT_SEES_IT = tuple(f.name for f in fields(DeviceState) if f.name != "device")


@dataclass(slots=True)
class CardMemo:
    """Per-card answers for one card's share of a request, shared by the nodes of one preemption:
    ``kinds`` numbers each kind of card (registration and usage as Fit sees them, the uuid only as
    steering sees it), ``answers`` maps (kind, usage removed from the card) -> fits, ``bounds`` keeps
    what was freed by the sets asked about (Fit is monotone: freeing more never makes a pod not fit)."""

    kinds: dict[Hashable, int] = field(default_factory=dict)
    answers: dict[tuple[int, frozenset[tuple[Hashable, int]]], bool] = field(default_factory=dict)
    #: per kind: the (slots, MiB, cores) freed by sets that did not fit, and by sets that did
    bounds: dict[int, tuple[list[tuple[int, int, int]], list[tuple[int, int, int]]]] = field(
        default_factory=dict
    )


class VictimSearch:
    """One node's search. Fit questions are cached by what they remove (pods with the same usage,
    and the same namespace when a quota counts, are interchangeable) and counted against the budget."""

    def __init__(
        self,
        request: PodRequest,
        node: NodeState,
        policy: Policy,
        quota: NamespaceQuota | None,
        pool: Sequence[Holder],
        budget: int,
        memo: dict[Hashable, CardMemo] | None = None,
    ) -> None:
        self.request, self.node, self.policy, self.quota = request, node, policy, quota
        self.pool = tuple(pool)
        self.by_uid = {h.uid: h for h in pool}
        self.cards = {h.uid: frozenset(c.uuid for c in h.usage.cards) for h in pool}
        self._on_card: dict[str, list[Holder]] = {}
        for holder in self.pool:
            for uuid in sorted(self.cards[holder.uid]):
                self._on_card.setdefault(uuid, []).append(holder)
        self._costs: dict[frozenset[str], Cost] = {}
        self.sig: dict[str, Signature] = {
            h.uid: (h.usage.cards, h.namespace if quota is not None else "") for h in pool
        }
        self.budget = budget
        self.asked = 0
        self.exact = True
        self._known: dict[frozenset[tuple[Signature, int]], bool] = {}
        self._cards_alone: dict[int, NodeState] = {}
        self._likeness: dict[int, int] = {}  # card -> its kind's number in the memo
        self.memo = memo if memo is not None else {}

    @property
    def spent(self) -> bool:
        return self.asked >= self.budget

    def _without(self, node: NodeState, uids: Iterable[str]) -> NodeState:
        return remove(node, [self.by_uid[u] for u in sorted(uids)])

    def _quotas(self, uids: Iterable[str]) -> dict[str, NamespaceQuota]:
        quota = release(self.quota, self.request.namespace, [self.by_uid[u] for u in uids])
        return {} if quota is None else {self.request.namespace: quota}

    def fits(self, uids: Iterable[str]) -> bool:
        """Does the pod fit the node once ``uids`` are gone?"""
        chosen = frozenset(uids)
        key = frozenset(Counter(self.sig[u] for u in chosen).items())
        known = self._known.get(key)
        if known is None:
            self.asked += 1
            state = self._without(self.node, chosen)
            known = allocate(self.request, [state], self.policy, quotas=self._quotas(chosen)).fits(state.name)
            self._known[key] = known
        return known

    def card_fits(self, card: int, uids: Iterable[str], share: PodRequest, memo: CardMemo) -> bool:
        """Does ``share`` (one card's part of the request) fit card ``card`` alone once ``uids`` are
        gone? ``memo`` holds the answers for this share: a card with the same registration, usage,
        steering and removed usage gives the same answer, on any node; and on a card without MIG
        instances, freeing at least as many slots, MiB and cores as a set that fits fits too (at
        most as many as a set that does not, does not)."""
        chosen = frozenset(uids)
        state = self.node.devices[card]
        dev = state.device
        removed = Counter(
            (c.slots, c.memory, c.cores, c.unreserved, c.reservations)
            for u in chosen
            for c in self.by_uid[u].usage.cards
            if c.uuid == dev.uuid
        )
        like = self._likeness.get(card)
        if like is None:  # the card and its usage as Fit sees them, the uuid only as steering sees it
            seen = (
                tuple(getattr(dev, name) for name in _DEVICE_AS_FIT_SEES_IT),
                tuple(getattr(state, name) for name in _USAGE_AS_FIT_SEES_IT),
                (dev.uuid in self.node.cordoned, dev.uuid in share.use_uuids, dev.uuid in share.nouse_uuids),
            )
            like = self._likeness[card] = memo.kinds.setdefault(seen, len(memo.kinds))
        key = (like, frozenset(removed.items()))
        known = memo.answers.get(key)
        if known is not None:
            return known
        vector = self._freed(card, removed)
        failed, fitting = memo.bounds.setdefault(like, ([], []))
        if vector is not None:
            if any(all(f >= v for f, v in zip(past, vector, strict=True)) for past in failed):
                return False
            if any(all(v >= t for v, t in zip(vector, past, strict=True)) for past in fitting):
                return True
        self.asked += 1
        alone = self._cards_alone.get(card)
        if alone is None:
            alone = self._cards_alone[card] = NodeState(
                name=self.node.name,
                devices=(state,),
                pair_scores=self.node.pair_scores,
                cordoned=self.node.cordoned,
            )
        single = self._without(alone, chosen)
        known = memo.answers[key] = allocate(share, [single], self.policy).fits(single.name)
        if vector is not None:  # keep only the frontier: the largest sets that failed, the smallest that fit
            if known:
                fitting[:] = [t for t in fitting if not all(t_ >= v for t_, v in zip(t, vector, strict=True))]
                fitting.append(vector)
            else:
                failed[:] = [f for f in failed if not all(v >= f_ for v, f_ in zip(vector, f, strict=True))]
                failed.append(vector)
        return known

    def _freed(
        self, card: int, removed: Counter[tuple[int, int, int, bool, Any]]
    ) -> tuple[int, int, int] | None:
        """(slots, MiB, cores) the removed usage frees on the card; None where MIG placements count."""
        state = self.node.devices[card]
        if state.device.mode == DeviceMode.MIG or state.reservations or any(r[4] for r in removed):
            return None
        return (
            sum(r[0] * n for r, n in removed.items()),
            sum(r[1] * n for r, n in removed.items()),
            sum(r[2] * n for r, n in removed.items()),
        )

    def place(self, uids: Iterable[str]) -> Allocation | None:
        """The allocation once ``uids`` are gone (the core's full Fit), or None."""
        chosen = frozenset(uids)
        self.asked += 1
        decision = fit_node(
            self.request, self._without(self.node, chosen), self.policy, quotas=self._quotas(chosen)
        )
        return decision if isinstance(decision, Allocation) else None

    def _sets(self, holders: Sequence[Holder], size: int) -> list[tuple[Cost, tuple[Holder, ...]]] | None:
        """Sets of ``size`` holders, cheapest first: one per distinct mix of interchangeable pods (the
        cheapest pods of each kind); None when there would be more than ``GENERATED``."""
        kinds: dict[Signature, list[Holder]] = {}
        for holder in sorted(holders, key=cheap):
            kinds.setdefault(self.sig[holder.uid], []).append(holder)
        groups = list(kinds.values())
        room = [sum(len(g) for g in groups[i:]) for i in range(len(groups) + 1)]
        out: list[tuple[Holder, ...]] = []

        def pick(i: int, left: int, chosen: tuple[Holder, ...]) -> bool:
            if left == 0:
                out.append(chosen)
                return len(out) <= GENERATED
            if room[i] < left:
                return True
            for k in range(min(left, len(groups[i])), -1, -1):
                if not pick(i + 1, left - k, chosen + tuple(groups[i][:k])):
                    return False
            return True

        if not pick(0, size, ()):
            return None
        return sorted(((cost(chosen), chosen) for chosen in out), key=lambda pair: pair[0])

    # ------------------------------------------------------------------------------- strategies

    def per_card(self) -> tuple[frozenset[str], Allocation] | None:
        """One container asking for ``nums`` cards: card-by-card options, combined; None if it
        does not apply or finds nothing within the budget."""
        asking = [i for i, c in enumerate(self.request.containers) if c is not None and c.nums > 0]
        if len(asking) != 1 or self.quota is not None:
            return None
        container = self.request.containers[asking[0]]
        assert container is not None
        vendor = [i for i, s in enumerate(self.node.devices) if is_vendor_card(s.device)]
        if container.nums > 1 and any(self.node.devices[i].device.mode == DeviceMode.MIG for i in vendor):
            return None  # one MIG card may supply several instances: cards are not independent
        one = replace(container, nums=1)
        containers = tuple(one if i == asking[0] else c for i, c in enumerate(self.request.containers))
        share = replace(self.request, containers=containers)
        memo = self.memo.setdefault((share, self.policy), CardMemo())
        several = container.nums > 1
        # cheapest-looking cards first (the cost of evicting all their pods): with one card wanted,
        # the best option found so far bounds the search of the others
        usable: list[tuple[int, list[frozenset[str]]]] = []
        bound: Cost | None = None
        for index in sorted(vendor, key=lambda i: cost(self._here(i))):
            found = self._options(index, share, memo, several, None if several else bound)
            if found:
                usable.append((index, found))
                best = self.cost_of(found[0])
                bound = best if bound is None or best < bound else bound
        if len(usable) < container.nums:
            return None
        candidates: set[frozenset[str]] = set()
        for chosen in combinations(usable, container.nums):
            for picks in product(*(found for _, found in chosen)):
                candidates.add(frozenset().union(*picks))
                if len(candidates) >= GENERATED:
                    self.exact = False
                    break
        return self._first(candidates)

    def cost_of(self, uids: frozenset[str]) -> Cost:
        """:func:`cost` of the pods with these uids (cached)."""
        found = self._costs.get(uids)
        if found is None:
            found = self._costs[uids] = cost(self.by_uid[u] for u in uids)
        return found

    def _here(self, card: int) -> list[Holder]:
        return self._on_card.get(self.node.devices[card].device.uuid, [])

    def _options(
        self, card: int, share: PodRequest, memo: CardMemo, several: bool, bound: Cost | None
    ) -> list[frozenset[str]]:
        """Minimal sets of this card's pods whose eviction lets one card's share fit there, cheapest
        first. One card wanted: only the cheapest, and only if it beats ``bound`` (the best of the
        cards searched before). ``several`` cards: the smallest size and one more (a pod holding
        two of them may serve both), at most ``OPTIONS_PER_CARD``."""
        here = self._here(card)
        if several and self.card_fits(card, (), share, memo):
            return [frozenset()]  # room for a share already (one card wanted: the node would fit)
        if not here:
            return []
        if len(here) > 2 and not self.card_fits(card, {h.uid for h in here}, share, memo):
            return []  # even evicting them all leaves no room here
        found: list[frozenset[str]] = []
        smallest = len(here)
        for size in range(1, len(here) + 1):
            if size > smallest + (1 if several else 0) or (bound is not None and size > bound[0]):
                break
            sets = self._sets(here, size)
            if sets is None:
                self.exact = False
                break
            if len(sets) > 1 and (bound is None or sets[0][0] < bound) and not self.spent:
                self._probe(card, [chosen for _, chosen in sets], share, memo)
            for price, chosen in sets:
                if bound is not None and price >= bound:
                    return found  # sorted, and larger sets cost more: nothing here beats the bound
                uids = frozenset(h.uid for h in chosen)
                if any(f <= uids for f in found):
                    continue
                if self.spent:
                    self.exact = False
                    return self._cheapest(found, several)
                if self.card_fits(card, uids, share, memo):
                    found.append(uids)
                    smallest = min(smallest, size)
                    if not several:
                        return found  # the cheapest of the smallest size: nothing here beats it
        return self._cheapest(found, several)

    def _probe(
        self, card: int, sets: Sequence[tuple[Holder, ...]], share: PodRequest, memo: CardMemo
    ) -> None:
        """Ask first about the set freeing the most on this card: when even it does not fit, no set
        it outweighs in slots, MiB and cores needs asking (cards with MIG instances: no probe)."""
        uuid = self.node.devices[card].device.uuid

        def weight(chosen: tuple[Holder, ...]) -> tuple[int, int, int]:
            on = [c for h in chosen for c in h.usage.cards if c.uuid == uuid]
            return (sum(c.memory for c in on), sum(c.cores for c in on), sum(c.slots for c in on))

        if self._freed(card, Counter()) is not None:
            self.card_fits(card, {h.uid for h in max(sets, key=weight)}, share, memo)

    def _cheapest(self, found: list[frozenset[str]], several: bool) -> list[frozenset[str]]:
        found.sort(key=self.cost_of)
        if not several:
            return found[:1]
        if len(found) > OPTIONS_PER_CARD:
            self.exact = False
        return found[:OPTIONS_PER_CARD]

    def _first(self, candidates: Iterable[frozenset[str]]) -> tuple[frozenset[str], Allocation] | None:
        """The cheapest candidate the whole node confirms (``budget`` permitting)."""
        for uids in sorted(candidates, key=self.cost_of):
            if self.spent:
                self.exact = False
                return None
            allocation = self.place(uids)
            if allocation is not None:
                return uids, allocation
        return None

    def by_size(self) -> tuple[frozenset[str], Allocation] | None:
        """Candidate sets of 1, 2, ... pods (the ones that can sit on the pod's cards), cheapest first."""
        limit = sum(c.nums for c in self.request.containers if c is not None and c.nums > 0)
        for size in range(1, len(self.pool) + 1):
            sets = self._sets(self.pool, size)
            if sets is None:
                self.exact = False
                return None
            for _, chosen in sets:
                if self.quota is None and not _coverable([self.cards[h.uid] for h in chosen], limit):
                    continue
                if self.spent:
                    self.exact = False
                    return None
                uids = frozenset(h.uid for h in chosen)
                if self.fits(uids):
                    allocation = self.place(uids)
                    if allocation is not None:
                        return uids, allocation
        return None

    def greedy(self) -> frozenset[str]:
        """Evict every candidate, then give back the most important ones while the pod still fits."""
        chosen = frozenset(self.by_uid)
        for holder in sorted(self.pool, key=_importance):
            trial = chosen - {holder.uid}
            if self.fits(trial):
                chosen = trial
        return chosen
