"""Usage accounting: fold a pod's grants into per-card usage and apply it to a node
(docs/protocol.md, "Usage").

Owns :func:`pod_usage` (one pod's collapsed usage, per card uuid) and :func:`apply_usage` (add or
remove that usage on a :class:`~hami.core.model.NodeState` in O(cards of the pod)), so the scheduler's
snapshot never walks the cluster; :func:`apply_usages`, many of those changes on one node at once.
Removing a pod with ``sign=-1`` exactly undoes adding it.

Pure: stdlib only; must not import a Kubernetes client, aiohttp, kopf, grpc, pynvml, ``logging``,
``os`` or ``time``.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from hami.core.model import DeviceMode, DeviceState, MigAllocation, MigReservation, NodeState, PodDevices


@dataclass(frozen=True, slots=True, kw_only=True)
class CardUsage:
    """What one pod holds on one card after the collapse of docs/protocol.md, "Usage".

    ``slots`` is 0 only for a card that the pod names in MIG reservations but in no grant
    (a left-over reservation: it is booked, but takes no slot). ``unreserved`` is True when some
    grant on the card has no matching MIG reservation (fail closed on a MIG card).
    """

    uuid: str
    slots: int
    memory: int
    cores: int
    unreserved: bool = False
    reservations: tuple[MigReservation, ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class PodUsage:
    """One pod's usage, one :class:`CardUsage` per card uuid, sorted by uuid."""

    cards: tuple[CardUsage, ...]

    @property
    def memory(self) -> int:
        """Total MiB over all cards (what a namespace quota counts, docs/protocol.md, "Quotas")."""
        return sum(c.memory for c in self.cards)

    @property
    def cores(self) -> int:
        return sum(c.cores for c in self.cards)


def collapse(
    containers: Iterable[Iterable[tuple[str, int, int]]], init_count: int
) -> dict[str, tuple[int, int, int]]:
    """Collapse per-container ``(uuid, memory, cores)`` entries into ``uuid -> (slots, memory, cores)``.

    Init containers run one after another, so they contribute their per-field maximum and one slot;
    app containers run together and add up (one slot per occurrence). Effective per card: the larger of
    the two per field, slots ``max(init, app, 1)``. Example: init 5000 MiB/20 % and app 4000 MiB/20 %
    on one card -> 5000 MiB, 20 %, 1 slot; two app containers of 4000/20 -> 8000 MiB, 40 %, 2 slots.
    """
    init: dict[str, tuple[int, int]] = {}
    app: dict[str, tuple[int, int, int]] = {}
    for position, entries in enumerate(containers):
        for uuid, memory, cores in entries:
            if position < init_count:
                m, c = init.get(uuid, (0, 0))
                init[uuid] = (max(m, memory), max(c, cores))
            else:
                s, m, c = app.get(uuid, (0, 0, 0))
                app[uuid] = (s + 1, m + memory, c + cores)
    out: dict[str, tuple[int, int, int]] = {}
    for uuid in init.keys() | app.keys():
        im, ic = init.get(uuid, (0, 0))
        aslots, am, ac = app.get(uuid, (0, 0, 0))
        out[uuid] = (max(1 if uuid in init else 0, aslots, 1), max(im, am), max(ic, ac))
    return out


def pod_usage(
    devices: PodDevices, init_count: int, *, init_done: bool, mig: Sequence[MigAllocation] = ()
) -> PodUsage:
    """The collapsed usage of one tracked pod (docs/protocol.md, "Usage").

    ``devices`` are the decoded ``hami.io/vgpu-devices-allocated`` lists (init containers first);
    ``init_done`` (every init container terminated with exit code 0) drops the init containers.
    ``mig`` are the pod's ``hami.io/vgpu-mig-allocations``; a reservation matches the grant at its
    (container, device) position when the uuids agree.
    """
    start = init_count if init_done else 0
    if not mig:  # no MIG reservation (most pods): every card granted counts as unreserved, none booked
        folded = collapse(
            (((g.uuid, g.memory_mib, g.cores) for g in grants) for grants in devices[start:]),
            max(init_count - start, 0),
        )
        return PodUsage(
            cards=tuple(
                CardUsage(uuid=uuid, slots=slots, memory=memory, cores=cores, unreserved=True)
                for uuid, (slots, memory, cores) in sorted(folded.items())
            )
        )
    kept = [(p, grants) for p, grants in enumerate(devices) if p >= start]
    reserved_at = {(m.container_index, m.device_index): m for m in mig}
    unreserved: set[str] = set()
    for position, grants in kept:
        for index, grant in enumerate(grants):
            found = reserved_at.get((position, index))
            if found is None or found.gpu_uuid != grant.uuid:
                unreserved.add(grant.uuid)
    folded = collapse(
        ([(g.uuid, g.memory_mib, g.cores) for g in grants] for _, grants in kept),
        max(init_count - start, 0),
    )
    booked: dict[str, list[MigReservation]] = {}
    for m in mig:
        booked.setdefault(m.gpu_uuid, []).append(MigReservation(profile=m.profile, placement=m.placement))
    cards = [
        CardUsage(
            uuid=uuid,
            slots=folded[uuid][0] if uuid in folded else 0,
            memory=folded[uuid][1] if uuid in folded else 0,
            cores=folded[uuid][2] if uuid in folded else 0,
            unreserved=uuid in unreserved,
            reservations=tuple(booked.get(uuid, ())),
        )
        for uuid in sorted(folded.keys() | booked.keys())
    ]
    return PodUsage(cards=tuple(cards))


def apply_usage(node: NodeState, usage: PodUsage, *, sign: int = 1) -> NodeState:
    """Add (``sign=1``) or remove (``sign=-1``) one pod's usage on ``node``; returns the new node.

    Entries naming a card the node does not have are ignored. MIG fail-closed rules
    (docs/protocol.md, "Usage"): a grant on a MIG card without its reservation, or a reservation on a non-MIG
    card, counts one inconsistency on that card (the card is unhealthy while any remain).
    """
    if sign not in (1, -1):
        raise ValueError(f"sign must be 1 or -1, got {sign!r}")
    states = list(node.devices)
    touched = False
    for card in usage.cards:
        position = node.positions.get(card.uuid)
        if position is None:
            continue
        state = states[position]
        is_mig = state.device.mode == DeviceMode.MIG
        bad = (is_mig and card.unreserved) or (not is_mig and bool(card.reservations))
        states[position] = replace(
            state,
            used=state.used + sign * card.slots,
            used_mem=state.used_mem + sign * card.memory,
            used_cores=state.used_cores + sign * card.cores,
            inconsistencies=state.inconsistencies + (sign if bad else 0),
            reservations=_change(state.reservations, card.reservations, sign),
        )
        touched = True
    return replace(node, devices=tuple(states)) if touched else node


def apply_usages(node: NodeState, changes: Iterable[tuple[PodUsage, int]]) -> NodeState:
    """:func:`apply_usage` for many pods' changes ``(usage, sign)`` in their order: the same node as
    applying them one by one, with each touched card and the node built once (a node's pods booked
    together: the scheduler's first list of 50,000 pods, a node registering with its pods counted)."""
    totals: dict[
        int, list[Any]
    ] = {}  # position -> [used, used_mem, used_cores, inconsistencies, reservations]
    positions = node.positions
    for usage, sign in changes:
        if sign not in (1, -1):
            raise ValueError(f"sign must be 1 or -1, got {sign!r}")
        for card in usage.cards:
            position = positions.get(card.uuid)
            if position is None:
                continue
            total = totals.get(position)
            state = node.devices[position]
            if total is None:
                total = totals[position] = [
                    state.used,
                    state.used_mem,
                    state.used_cores,
                    state.inconsistencies,
                    state.reservations,
                ]
            is_mig = state.device.mode == DeviceMode.MIG
            bad = (is_mig and card.unreserved) or (not is_mig and bool(card.reservations))
            total[0] += sign * card.slots
            total[1] += sign * card.memory
            total[2] += sign * card.cores
            total[3] += sign if bad else 0
            total[4] = _change(total[4], card.reservations, sign)
    if not totals:
        return node
    states = list(node.devices)
    for position, (used, used_mem, used_cores, inconsistencies, reservations) in totals.items():
        states[position] = replace(
            states[position],
            used=used,
            used_mem=used_mem,
            used_cores=used_cores,
            inconsistencies=inconsistencies,
            reservations=reservations,
        )
    return replace(node, devices=tuple(states))


def _change(
    current: tuple[MigReservation, ...], delta: tuple[MigReservation, ...], sign: int
) -> tuple[MigReservation, ...]:
    if not delta:
        return current
    if sign > 0:
        return current + delta
    remaining = list(current)
    for reservation in delta:
        if reservation in remaining:
            remaining.remove(reservation)  # one occurrence: two pods may book equal-looking entries
    return tuple(remaining)


def add_grant(state: DeviceState, memory: int, cores: int, reservation: MigReservation | None) -> DeviceState:
    """The card after one more container got ``memory``/``cores`` on it (app containers,
    docs/protocol.md, "Pod on a node")."""
    return replace(
        state,
        used=state.used + 1,
        used_mem=state.used_mem + memory,
        used_cores=state.used_cores + cores,
        reservations=state.reservations + ((reservation,) if reservation else ()),
    )
