"""The ``fragmentation`` placement rule: where a pod grows the GPU fragmentation of
:mod:`hami.core.fragmentation` least — the scheduler's ``fragmentation`` node and GPU policies, and
``hami simulate``'s ``fgd`` / ``fragmentation`` scores (one implementation).

Owns :func:`gradient` (a placement's score), :func:`priority`, :class:`Placement`, :func:`place` (the
cards a pod would take on a node, and the score), :func:`node_priorities` (``/prioritize`` under the
node policy), :func:`card_scores` and :func:`card_order` (Fit's card order under the GPU policy, which
bind's choice follows).

A placement's score is ``int(100 σ((F(n) - F(n'))/1000))`` (n' = the node after it): 50 when the
fragmentation does not change, higher when it shrinks. Per container the cards are chosen one at a time,
each the card with the best score (the lowest position on ties). A node's score for a request is
memoised by the node's card usage and the request, so an unchanged node costs a lookup. Pure: stdlib
only; must not import a Kubernetes client, aiohttp, kopf, grpc, pynvml, ``logging``, ``os`` or
``time``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from hami.core.fit import Steering, memory_need
from hami.core.fragmentation import MILLI, CardKey, Host, NodeView, Target, accepts, card_key, granted
from hami.core.model import NVIDIA, ContainerRequest, DeviceState, NodeState, PodRequest
from hami.core.score import FRAGMENTATION, MAX_PRIORITY, parse_gpu_policy


def gradient(before: float, after: float) -> int:
    """``int(100 σ((before - after)/1000))``: 0..99, 50 when the fragmentation does not change."""
    x = max(-700.0, min(700.0, (before - after) / MILLI))
    return math.floor(100.0 / (1.0 + math.exp(-x)))


def reserved_gradient(before: float, after: float, held_before: float, held_after: float) -> int:
    """A placement's score when card-type reserves hold back ``held`` of the free share (before, after):
    FGD's :func:`gradient` of the fragmentation without the reserves, moved by what the reserves change
    in the exact score, rounded to whole points (0..99). A reserve worth less than half a point moves
    nothing, so a placement that leaves FGD's measure unchanged keeps its 50; without reserves (``held``
    unchanged) this is :func:`gradient` itself."""
    if held_before == held_after:
        return gradient(before, after)
    raw_before, raw_after = before + held_before, after + held_after
    base = gradient(raw_before, raw_after)
    shift = _sigmoid((before - after) / MILLI) - _sigmoid((raw_before - raw_after) / MILLI)
    return max(0, min(99, base + round(100.0 * shift)))


def _sigmoid(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-max(-700.0, min(700.0, x))))


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
    """A node's sums while picks are applied one at a time (one :func:`place` call), with each GPU
    class's term ``p_m fits_m R_m`` of ``F`` with the walk's host (CPU, memory) free."""

    def __init__(self, target: Target, view: NodeView, host: Host | None) -> None:
        self.t = target
        self.g = view.sums.g
        self.held = view.sums.held
        self.r = list(view.sums.r)
        self.n = list(view.sums.n)
        self.keys = list(view.keys)
        self.host = host
        self.terms = [self._term(m, self.r[m], self.n[m]) for m in range(len(target.p))]
        self.total = sum(self.terms)

    def _term(self, m: int, r: int, n: int) -> float:
        return self.t.p[m] * r if self.t.fits(m, n, self.host) else 0.0

    def after(self, j: int, new: CardKey) -> float:
        """``F`` if card ``j`` had usage ``new`` (the picks so far applied). More usage never makes a
        card usable to more classes, so only the classes that could use it before change."""
        old, now = self.t.card(self.keys[j]), self.t.card(new)
        total = self.total
        r, n, terms = self.r, self.n, self.terms
        for m in old.usable:
            inside = now.mask >> m & 1
            total += self._term(m, r[m] - old.milli + now.milli * inside, n[m] - 1 + inside) - terms[m]
        return self.g - old.free + now.free - total

    def held_after(self, j: int, new: CardKey) -> float:
        """The reserves' held-back share if card ``j`` had usage ``new``."""
        old, now = self.t.card(self.keys[j]), self.t.card(new)
        return self.held - (old.milli - old.free) + (now.milli - now.free)

    def apply(self, j: int, new: CardKey) -> None:
        old, now = self.t.card(self.keys[j]), self.t.card(new)
        self.g += now.free - old.free
        self.held += (now.milli - now.free) - (old.milli - old.free)
        for m in old.usable:
            self.r[m] -= old.milli
            self.n[m] -= 1
        for m in now.usable:
            self.r[m] += now.milli
            self.n[m] += 1
        for m in old.usable:
            self.terms[m] = self._term(m, self.r[m], self.n[m])
        self.total = sum(self.terms)
        self.keys[j] = new

    def frag(self) -> float:
        return self.g - self.total


def _steered(request: PodRequest) -> bool:
    return bool(
        request.use_types
        or request.nouse_types
        or request.use_uuids
        or request.nouse_uuids
        or request.vgpu_mode is not None
    )


def place(
    target: Target,
    node: NodeState,
    request: PodRequest,
    *,
    host_request: Host = (0, 0),
    host_free: Host | None = None,
    steer: Steering | None = None,
) -> Placement | None:
    """The cards the pod's app containers would take on ``node`` under the rule, and the score; None
    when a container finds too few cards (by the per-card checks and the pod's type/uuid steering).

    Each card in turn is the one whose booking scores best (lowest position on ties), the earlier picks
    applied; the score is that of the whole placement. ``host_free``/``host_request``: the node's free
    (CPU, memory) and the pod's request (the simulator), None/(0, 0) in the scheduler. Init containers
    hold nothing once done and are left out. ``steer``: the pod's :class:`~hami.core.fit.Steering`
    (built when not given; only its type and uuid checks are used).
    """
    view = target.node(node, host_free)
    left = None if host_free is None else (host_free[0] - host_request[0], host_free[1] - host_request[1])
    walk = _Walk(target, view, left)
    if steer is None:
        steer = steering(request)
    steered = _steered(request)
    chosen: list[tuple[int, ...]] = []
    held = view.sums.held
    pending: tuple[int, CardKey, float, float] | None = None  # the last pick, applied when another follows
    for container in request.containers[request.init_count :]:
        if container is None or container.nums <= 0:
            chosen.append(())
            continue
        cores = min(container.cores, 100)
        allowed = [
            j
            for j, s in enumerate(node.devices)
            if view.keys[j][0]
            and (
                steer.type_ok(container, s) and steer.uuid_ok(s.device.uuid)
                if steered
                else container.type == NVIDIA
            )
        ]
        picks: list[int] = []
        for _ in range(container.nums):
            if pending is not None:
                walk.apply(pending[0], pending[1])
            best: tuple[int, int, CardKey, float, float] | None = None
            seen: dict[CardKey, tuple[int, float, float]] = {}
            for j in allowed:
                key = walk.keys[j]
                need = memory_need(container, key[2])
                if j in picks or not accepts(key, need, cores):
                    continue
                new = granted(key, need, cores)
                known = seen.get(key)
                if known is None:
                    after, kept = walk.after(j, new), walk.held_after(j, new)
                    known = seen[key] = (reserved_gradient(view.frag, after, held, kept), after, kept)
                if best is None or known[0] > best[1]:
                    best = (j, known[0], new, known[1], known[2])
            if best is None:
                return None
            pending = (best[0], best[2], best[3], best[4])
            picks.append(best[0])
        chosen.append(tuple(picks))
    after, kept = (walk.frag(), walk.held) if pending is None else (pending[2], pending[3])
    return Placement(
        score=reserved_gradient(view.frag, after, held, kept),
        before=view.frag,
        after=after,
        cards=tuple(chosen),
    )


def steering(request: PodRequest) -> Steering:
    """The pod's type and uuid steering (card cordons are part of the card usage, not of this)."""
    return Steering.of(request, parse_gpu_policy(FRAGMENTATION), frozenset(), {})


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
    steer = steering(request)
    out: dict[str, int] = {}
    for node in nodes:
        memo = None if asked is None else (target.node(node).usage, asked)
        score = None if memo is None else target.remembered(memo)
        if score is None:
            found = place(target, node, request, steer=steer)
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
        if not key[0] or not accepts(key, need, cores):
            out.append(-1)
            continue
        new = granted(key, need, cores)
        out.append(reserved_gradient(view.frag, walk.after(j, new), sums.held, walk.held_after(j, new)))
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
