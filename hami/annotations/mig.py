"""``hami.io/vgpu-mig-allocations``: the MIG instances booked for a pod (docs/protocol.md, "MIG").

A JSON array of ``{containerIndex, deviceIndex, gpuUUID, profile, placement:{start,size}}``; the node
agent later adds ``migUUID``, ``gpuInstanceID`` and ``computeInstanceID`` (all three or none). Two
entries for the same (containerIndex, deviceIndex) are invalid. Pure: ``hami.core.model``, stdlib.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import NotRequired, TypedDict

from hami.annotations._text import FieldProblem, get_int, get_list, get_object, get_str
from hami.annotations.errors import AnnotationError
from hami.annotations.keys import POD_MIG_ALLOCATIONS
from hami.annotations.limits import load_json
from hami.core.model import MigAllocation, MigPlacement


class PlacementWire(TypedDict):
    start: int
    size: int


class MigAllocationWire(TypedDict):
    containerIndex: int
    deviceIndex: int
    gpuUUID: str
    profile: str
    placement: PlacementWire
    migUUID: NotRequired[str]
    gpuInstanceID: NotRequired[int]
    computeInstanceID: NotRequired[int]


_INSTANCE_FIELDS = ("migUUID", "gpuInstanceID", "computeInstanceID")


def encode_mig_allocations(allocations: Iterable[MigAllocation]) -> str:
    """Compact JSON in Go's field order. Raises ValueError for values the decoder would refuse."""
    wire: list[MigAllocationWire] = []
    for allocation in allocations:
        entry: MigAllocationWire = {
            "containerIndex": allocation.container_index,
            "deviceIndex": allocation.device_index,
            "gpuUUID": allocation.gpu_uuid,
            "profile": allocation.profile,
            "placement": {"start": allocation.placement.start, "size": allocation.placement.size},
        }
        mig_uuid, gi, ci = allocation.mig_uuid, allocation.gpu_instance_id, allocation.compute_instance_id
        if mig_uuid is not None and gi is not None and ci is not None:
            entry["migUUID"] = mig_uuid
            entry["gpuInstanceID"] = gi
            entry["computeInstanceID"] = ci
        elif (mig_uuid, gi, ci) != (None, None, None):
            raise ValueError(
                f"MIG allocation needs all of {', '.join(_INSTANCE_FIELDS)} or none: {allocation}"
            )
        wire.append(entry)
    text = json.dumps(wire, separators=(",", ":"))
    decode_mig_allocations(text)  # refuse to write what we could not read back
    return text


def decode_mig_allocations(text: str) -> tuple[MigAllocation, ...]:
    """Strictly decode the annotation; unknown keys are ignored, key case is ignored (like Go)."""
    document = load_json(POD_MIG_ALLOCATIONS, text)
    allocations: list[MigAllocation] = []
    seen: set[tuple[int, int]] = set()
    try:
        entries = get_list(document, "the MIG allocations")
    except FieldProblem as exc:
        raise AnnotationError(POD_MIG_ALLOCATIONS, text, str(exc)) from exc
    for position, raw in enumerate(entries):
        try:
            allocation = _decode_entry(raw)
        except FieldProblem as exc:
            raise AnnotationError(POD_MIG_ALLOCATIONS, text, f"entry {position}: {exc}") from exc
        slot = (allocation.container_index, allocation.device_index)
        if slot in seen:
            raise AnnotationError(
                POD_MIG_ALLOCATIONS,
                text,
                f"entry {position}: duplicate containerIndex {slot[0]} / deviceIndex {slot[1]}",
            )
        seen.add(slot)
        allocations.append(allocation)
    return tuple(allocations)


def _decode_entry(raw: object) -> MigAllocation:
    entry = get_object(raw, "an allocation")
    placement = get_object(entry.get("placement"), "'placement'")
    present = [name for name in _INSTANCE_FIELDS if entry.get(name.lower()) is not None]
    if present and len(present) != len(_INSTANCE_FIELDS):
        raise FieldProblem(
            f"{', '.join(_INSTANCE_FIELDS)} must be given together or not at all, got only "
            f"{', '.join(present)}"
        )
    return MigAllocation(
        container_index=get_int(entry, "containerIndex", default=None, minimum=0),
        device_index=get_int(entry, "deviceIndex", default=None, minimum=0),
        gpu_uuid=get_str(entry, "gpuUUID", required=True),
        profile=get_str(entry, "profile", required=True),
        placement=MigPlacement(
            start=get_int(placement, "start", default=None, minimum=0),
            size=get_int(placement, "size", default=None, minimum=1),
        ),
        mig_uuid=get_str(entry, "migUUID", required=True) if present else None,
        gpu_instance_id=get_int(entry, "gpuInstanceID", default=None, minimum=0) if present else None,
        compute_instance_id=get_int(entry, "computeInstanceID", default=None, minimum=0) if present else None,
    )
