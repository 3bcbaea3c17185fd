"""Nominated pods hold their cards: where a preemptor will land on the node it was nominated to, and
what that holds against the other pods (kube-scheduler's ``addGENominatedPods``, for devices).

Owns :class:`Nominee` (a pending pod nominated to the node: key, priority, request), :class:`Occupant`
(a pod counted on the node that may be assumed gone: its priority, whether it is being deleted, its
usage), :class:`Reservation`, :func:`reserve` (a node's nominees -> their reservations),
:func:`held_against` (the reservations a pod must respect) and :func:`with_reservations` (a node
with those reservations counted as used).

kube-scheduler's rule, mirrored: when it filters pod P on a node, it adds the pods nominated to that
node whose priority is >= P's (P itself excepted) as if they ran there. kube-scheduler sees no card,
so the extender does the same with the cards each nominee will get. Which cards: the nominee is
placed with the allocation core (:func:`~hami.core.allocate.fit_node`, the scheduler's own rules and
policy, so the answer is deterministic) on the node as it will be once the pods being deleted are gone
(kube-scheduler deletes the victims before, or right after, nominating). Where it does not fit so,
the pods it outranks are assumed gone too (kube-scheduler may nominate before the victims' deletions
show). Where it does not fit even then, it could only land by evicting pods at least as important as
itself: it holds nothing (a stale or bogus nomination blocks nothing). Nominees are placed one after
another, highest priority first (then by key), each on the node with the earlier ones' cards taken,
as kube-scheduler adds them all; a nominee holds at most what its own request takes.

Pure: stdlib only; must not import a Kubernetes client, aiohttp, kopf, grpc, pynvml, ``logging``,
``os`` or ``time``.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from hami.core.allocate import Policy, fit_node
from hami.core.model import Allocation, NodeState, PodRequest
from hami.core.usage import PodUsage, apply_usage, pod_usage

__all__ = ["Nominee", "Occupant", "Reservation", "held_against", "reserve", "with_reservations"]

PodKey = tuple[str, str]


@dataclass(frozen=True, slots=True, kw_only=True)
class Nominee:
    """A pending pod nominated to the node (``status.nominatedNodeName``)."""

    key: PodKey
    priority: int
    request: PodRequest


@dataclass(frozen=True, slots=True, kw_only=True)
class Occupant:
    """A pod counted on the node whose departure may be assumed (its usage is in the node's state)."""

    priority: int
    usage: PodUsage
    leaving: bool = False  # being deleted


@dataclass(frozen=True, slots=True, kw_only=True)
class Reservation:
    """The cards ``key`` will get on the node, held for it against pods of priority <= ``priority``."""

    key: PodKey
    priority: int
    allocation: Allocation
    usage: PodUsage


def _without(node: NodeState, occupants: Iterable[Occupant]) -> NodeState:
    for occupant in occupants:
        node = apply_usage(node, occupant.usage, sign=-1)
    return node


def _place(request: PodRequest, node: NodeState, policy: Policy) -> Allocation | None:
    decision = fit_node(request, node, policy)
    return decision if isinstance(decision, Allocation) else None


def reserve(
    node: NodeState, nominees: Iterable[Nominee], occupants: Sequence[Occupant], policy: Policy
) -> tuple[Reservation, ...]:
    """The reservations of the ``nominees`` on ``node`` (its current state, every counted pod in it),
    highest priority first (see the module docstring). ``occupants``: the counted pods that may be
    assumed gone; a counted pod not among them (unknown priority) never is."""
    held = node
    leaving = [o for o in occupants if o.leaving]
    found: list[Reservation] = []
    for nominee in sorted(nominees, key=lambda n: (-n.priority, n.key)):
        placed = _place(nominee.request, _without(held, leaving), policy)
        if placed is None:
            outranked = [o for o in occupants if o.leaving or o.priority < nominee.priority]
            if len(outranked) > len(leaving):
                placed = _place(nominee.request, _without(held, outranked), policy)
        if placed is None:
            continue
        usage = pod_usage(placed.devices, nominee.request.init_count, init_done=False, mig=placed.mig)
        held = apply_usage(held, usage)
        found.append(Reservation(key=nominee.key, priority=nominee.priority, allocation=placed, usage=usage))
    return tuple(found)


def held_against(
    reservations: Iterable[Reservation], priority: int, key: PodKey | None = None
) -> tuple[Reservation, ...]:
    """The reservations a pod of ``priority`` (``key``: itself, never held against itself) must
    respect: those of nominees of equal or higher priority."""
    return tuple(r for r in reservations if r.priority >= priority and r.key != key)


def with_reservations(node: NodeState, reservations: Iterable[Reservation]) -> NodeState:
    """``node`` with the reservations' cards counted as used."""
    for reservation in reservations:
        node = apply_usage(node, reservation.usage)
    return node
