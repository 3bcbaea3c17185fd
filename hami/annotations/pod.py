"""Pod-side scheduling annotations: the device lists, bind phase and times
(docs/protocol.md, "Extender", "Node lock").

Device list (``hami.io/vgpu-devices-to-allocate`` and ``hami.io/vgpu-devices-allocated``): per container,
init containers first, each card as ``uuid,type,usedmem,usedcores:`` and ``;`` after every container::

    device4,NVIDIA,1000,20:;                      one container, one card
    uuid1,NVIDIA,1000,30:;;                       a GPU container, then a GPU-less one
    ;uuid1,NVIDIA,1000,30:;                       a GPU-less container first

Decoding presents exactly the containers the encoder wrote: HAMi's split on ``;`` yields one extra
empty container after the final ``;``; we drop that one (it is the terminator, not a container), so
``decode(encode(x)) == x`` for every pod (pods have at least one container). Text without a final
``;`` keeps its last part as a container, and the empty string is one empty container, as in HAMi.
Within a container, segments without a comma are ignored, fewer than 4 fields is HAMi's error, extra
fields are ignored, memory and cores are 32-bit integers.

Pure: ``hami.core.model``, ``hami.objects`` and the stdlib; the caller passes ``now``.
"""

from __future__ import annotations

import datetime
from collections.abc import Iterable, Mapping
from enum import StrEnum
from typing import Any

from hami import objects
from hami.annotations._text import go_int
from hami.annotations.errors import AnnotationError
from hami.annotations.keys import (
    POD_BIND_PHASE,
    POD_BIND_TIME,
    POD_DEVICES_ALLOCATED,
    POD_DEVICES_TO_ALLOCATE,
    POD_MIG_ALLOCATIONS,
    POD_VGPU_NODE,
    POD_VGPU_TIME,
)
from hami.annotations.limits import check_length
from hami.annotations.mig import decode_mig_allocations, encode_mig_allocations
from hami.core.model import Grant, MigAllocation, PodDevices

#: HAMi's error for a card entry with fewer than four fields.
MISSING_FIELDS = "pod annotation format error, missing fields, do not use nodeName in task spec"
_SEPARATORS = frozenset(",:;")


class BindPhase(StrEnum):
    """``hami.io/bind-phase``: set by bind (allocating) and by the node agent (success / failed)."""

    ALLOCATING = "allocating"
    SUCCESS = "success"
    FAILED = "failed"


# ------------------------------------------------------------------------------------- device lists


def encode_pod_devices(devices: PodDevices) -> str:
    """The device-list annotation for ``devices`` (one entry per container, init first).

    Raises ValueError for a uuid or type containing ``,`` ``:`` or ``;``, or a memory/cores value
    outside 32 bits: such text could not be read back.
    """
    parts: list[str] = []
    for grants in devices:
        for grant in grants:
            for name, text in (("uuid", grant.uuid), ("type", grant.type)):
                if _SEPARATORS.intersection(text):
                    raise ValueError(f"card {name} {text!r} must not contain ',', ':' or ';'")
            for name, number in (("memory", grant.memory_mib), ("cores", grant.cores)):
                if go_int(str(number), bits=32) is None:
                    raise ValueError(f"card {grant.uuid!r}: {name} {number} does not fit in 32 bits")
            parts.append(f"{grant.uuid},{grant.type},{grant.memory_mib},{grant.cores}:")
        parts.append(";")
    return "".join(parts)


def decode_pod_devices(text: str, *, key: str = POD_DEVICES_ALLOCATED) -> PodDevices:
    """Read a device list; ``key`` (allocated or to-allocate) is named in errors."""
    check_length(key, text)
    containers = text.split(";")
    if text.endswith(";"):
        containers.pop()  # the encoder's terminator after the last container
    return tuple(_decode_container(key, text, part) for part in containers)


def _decode_container(key: str, text: str, part: str) -> tuple[Grant, ...]:
    grants: list[Grant] = []
    for segment in part.split(":"):
        if "," not in segment:
            continue  # HAMi skips these (the empty text after each card's ':' among them)
        fields = segment.split(",")
        if len(fields) < 4:
            raise AnnotationError(key, text, f"{MISSING_FIELDS}: {segment!r}")
        memory = go_int(fields[2], bits=32)
        cores = go_int(fields[3], bits=32)
        if memory is None:
            raise AnnotationError(key, text, f"memory {fields[2]!r} of {segment!r} is not a 32-bit integer")
        if cores is None:
            raise AnnotationError(key, text, f"cores {fields[3]!r} of {segment!r} is not a 32-bit integer")
        grants.append(Grant(uuid=fields[0], type=fields[1], memory_mib=memory, cores=cores))
    return tuple(grants)


def pending_container(devices: PodDevices) -> int | None:
    """Index of the first container that still has cards to hand out (the node agent's next one)."""
    return next((index for index, grants in enumerate(devices) if grants), None)


def blank_container(devices: PodDevices, index: int) -> PodDevices:
    """``devices`` with container ``index`` emptied (the node agent consumed it); others unchanged."""
    if not 0 <= index < len(devices):
        raise IndexError(f"container index {index} out of range for {len(devices)} containers")
    return (*devices[:index], (), *devices[index + 1 :])


def allocation_done(devices: PodDevices) -> bool:
    """True when no container has cards left to hand out (bind-phase may become ``success``)."""
    return pending_container(devices) is None


# ----------------------------------------------------------------------------------- times and phase


def encode_unix_time(moment: datetime.datetime) -> str:
    """Unix seconds as a decimal string (``hami.io/vgpu-time``, ``hami.io/bind-time``)."""
    if moment.tzinfo is None:
        raise ValueError(f"{moment!r} has no time zone; pass an aware datetime")
    return str(int(moment.timestamp()))


def decode_unix_time(text: str, *, key: str = POD_BIND_TIME) -> datetime.datetime:
    """Unix seconds -> aware UTC datetime."""
    check_length(key, text)
    seconds = go_int(text)
    if seconds is None:
        raise AnnotationError(key, text, "expected Unix seconds (a decimal integer)")
    try:
        return datetime.datetime.fromtimestamp(seconds, datetime.UTC)
    except (OverflowError, OSError, ValueError) as exc:
        raise AnnotationError(key, text, f"Unix seconds out of range: {exc}") from exc


def decode_bind_phase(text: str) -> BindPhase:
    check_length(POD_BIND_PHASE, text)
    try:
        return BindPhase(text)
    except ValueError:
        expected = ", ".join(phase.value for phase in BindPhase)
        raise AnnotationError(POD_BIND_PHASE, text, f"expected one of {expected}") from None


# --------------------------------------------------------------------------------- whole-pod helpers


def pod_annotations(pod: Mapping[str, Any]) -> Mapping[str, str]:
    """``metadata.annotations`` of a raw pod (or node) JSON object: its string entries (empty when
    absent; metadata or annotations that are not objects, and values that are not text, read as
    absent: see :func:`hami.objects.annotations`)."""
    return objects.annotations(pod)


def read_pod_devices(pod: Mapping[str, Any]) -> PodDevices | None:
    """The pod's ``hami.io/vgpu-devices-allocated`` (usage accounting, metrics); None when absent."""
    text = pod_annotations(pod).get(POD_DEVICES_ALLOCATED)
    return None if text is None else decode_pod_devices(text, key=POD_DEVICES_ALLOCATED)


def read_pod_to_allocate(pod: Mapping[str, Any]) -> PodDevices | None:
    """The pod's ``hami.io/vgpu-devices-to-allocate`` (what the node agent still has to hand out)."""
    text = pod_annotations(pod).get(POD_DEVICES_TO_ALLOCATE)
    return None if text is None else decode_pod_devices(text, key=POD_DEVICES_TO_ALLOCATE)


def read_pod_mig_allocations(pod: Mapping[str, Any]) -> tuple[MigAllocation, ...]:
    """The pod's ``hami.io/vgpu-mig-allocations``; empty when absent."""
    text = pod_annotations(pod).get(POD_MIG_ALLOCATIONS)
    return () if text is None else decode_mig_allocations(text)


def read_bind_phase(pod: Mapping[str, Any]) -> BindPhase | None:
    text = pod_annotations(pod).get(POD_BIND_PHASE)
    return None if text is None else decode_bind_phase(text)


def read_bind_time(pod: Mapping[str, Any]) -> datetime.datetime | None:
    text = pod_annotations(pod).get(POD_BIND_TIME)
    return None if text is None else decode_unix_time(text, key=POD_BIND_TIME)


def read_vgpu_node(pod: Mapping[str, Any]) -> str | None:
    """The node the scheduler chose (``hami.io/vgpu-node``); a pod without it is not tracked
    (docs/protocol.md, "Usage")."""
    return pod_annotations(pod).get(POD_VGPU_NODE)


def allocation_annotations(
    *, node: str, devices: PodDevices, mig: Iterable[MigAllocation] = (), now: datetime.datetime
) -> dict[str, str]:
    """What the scheduler writes on the pod once a node is chosen (docs/protocol.md, "Extender"). Also label
    the pod with ``hami.io/vgpu-node=<node>`` (same key, written as a label by the caller)."""
    encoded = encode_pod_devices(devices)
    annotations = {
        POD_VGPU_NODE: node,
        POD_VGPU_TIME: encode_unix_time(now),
        POD_DEVICES_TO_ALLOCATE: encoded,
        POD_DEVICES_ALLOCATED: encoded,
    }
    bookings = tuple(mig)
    if bookings:
        annotations[POD_MIG_ALLOCATIONS] = encode_mig_allocations(bookings)
    return annotations


def bind_annotations(phase: BindPhase, *, now: datetime.datetime | None = None) -> dict[str, str]:
    """``hami.io/bind-phase`` (and ``hami.io/bind-time`` when ``now`` is given, as bind does)."""
    annotations = {POD_BIND_PHASE: phase.value}
    if now is not None:
        annotations[POD_BIND_TIME] = encode_unix_time(now)
    return annotations
