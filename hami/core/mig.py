"""Dynamic MIG: choose a profile and a placement for a memory need on one card (docs/protocol.md, "MIG").

Owns profile choice (smallest profile by memory, then slice count, that still has a free placement)
and placement choice (``1g.``/``3g.`` profiles from the highest start down, others from the lowest
start up; the first placement not overlapping an occupied one wins).

Worked example on an A100 (3g: starts 0,4 size 4; 2g: starts 0,2,4 size 2; 1g: starts 0..6 size 1):
booking 3g, 2g, 1g, 1g in turn lands at 4 ([4,8)), 0 ([0,2)), 3 (6,5,4 overlap [4,8)), 2.

Pure: stdlib only; must not import a Kubernetes client, aiohttp, kopf, grpc, pynvml, ``logging``,
``os`` or ``time``.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from hami.core.model import Device, MigPlacement, MigProfile, MigReservation


def _high_first(profile: MigProfile) -> bool:
    return profile.name.startswith(("1g.", "3g."))


def free_placement(profile: MigProfile, occupied: Sequence[MigPlacement]) -> MigPlacement | None:
    """The first placement of ``profile`` that overlaps nothing in ``occupied``, in the order of
    docs/protocol.md, "MIG"."""
    # A zero-size placement would overlap nothing and let a revisited card book forever.
    usable = [p for p in profile.placements if p.size > 0]
    usable.sort(key=lambda p: p.start, reverse=_high_first(profile))
    for placement in usable:
        if not any(placement.overlaps(o) for o in occupied):
            return placement
    return None


def choose(device: Device, memory: int, occupied: Sequence[MigPlacement]) -> MigReservation | None:
    """Smallest profile with ``memory_mib >= memory`` that still has a free placement, booked."""
    for profile in sorted(device.mig_profiles, key=lambda p: (p.memory_mib, p.slice_count)):
        if profile.memory_mib < memory:
            continue
        placement = free_placement(profile, occupied)
        if placement is not None:
            return MigReservation(profile=profile.name, placement=placement)
    return None


def book_all(
    device: Device, existing: Iterable[MigReservation], needs: Iterable[int]
) -> list[MigReservation] | None:
    """Book every memory need in turn on top of ``existing``; None when one of them does not fit.

    Fit's custom rule (docs/protocol.md, "MIG") books the picks already made on this card in this request,
    each with its own memory need, and then asks whether the new need still fits.
    """
    occupied = [r.placement for r in existing]
    booked: list[MigReservation] = []
    for need in needs:
        reservation = choose(device, need, occupied)
        if reservation is None:
            return None
        occupied.append(reservation.placement)
        booked.append(reservation)
    return booked


def profile_of(device: Device, name: str) -> MigProfile | None:
    return next((p for p in device.mig_profiles if p.name == name), None)
