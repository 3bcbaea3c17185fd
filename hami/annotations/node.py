"""Node-side annotations: card registration, pair scores, cordon list
(docs/annotations.md, "Node annotations"; docs/protocol.md, "Fit", "Topology").

``hami.io/node-nvidia-register`` is a JSON array of cards, keys ``id index count devmem devcore type
numa mode migProfiles health``, each omitted when zero/false/empty; unknown keys are ignored and key
case is ignored (Go's decoder). The legacy colon form (``id,count,devmem,devcore,type,numa,health
[,index,mode]:`` per card) is still read, with HAMi's error texts. In either form a card id listed
twice refuses the registration (HAMi would book that card twice). ``read_node`` turns a node's
annotations into the core's :class:`~hami.core.model.NodeState` with zero usage; ``node_shape_problem``
says why a Node object cannot be read so at all (a field we read of the wrong JSON type).

Pure: ``hami.core.model`` and the stdlib.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import replace
from typing import Any, NotRequired, TypedDict

from hami.annotations._text import (
    INT64_MAX,
    INT64_MIN,
    FieldProblem,
    get_bool,
    get_int,
    get_list,
    get_object,
    get_str,
    go_bool,
    go_int,
    json_kind,
    split_list,
)
from hami.annotations.enforcement import read_card_enforcement
from hami.annotations.errors import AnnotationError
from hami.annotations.keys import (
    NODE_DEVICE_CORDON,
    NODE_HANDSHAKE,
    NODE_LOCK,
    NODE_PAIR_SCORES,
    NODE_REGISTER,
)
from hami.annotations.limits import check_length, load_json
from hami.core.model import Device, DeviceMode, DeviceState, MigPlacement, MigProfile, NodeState

#: HAMi's errors when reading the registration.
MISSING_REGISTER = f"annos not found {NODE_REGISTER}"
NO_GPU = "no gpu found on node"


class PlacementWire(TypedDict):
    start: int
    size: int


class MigProfileWire(TypedDict):
    name: str
    memoryMB: int
    core: int
    sliceCount: int
    placements: list[PlacementWire]


class DeviceWire(TypedDict):
    id: str
    index: NotRequired[int]
    count: NotRequired[int]
    devmem: NotRequired[int]
    devcore: NotRequired[int]
    type: NotRequired[str]
    numa: NotRequired[int]
    mode: NotRequired[str]
    migProfiles: NotRequired[list[MigProfileWire]]
    health: NotRequired[bool]


class PairScoreWire(TypedDict):
    uuid: str
    score: dict[str, int]


# ----------------------------------------------------------------------------------- registration JSON


def encode_node_devices(devices: Iterable[Device]) -> str:
    """The registration JSON (compact, Go's key order, zero/false/empty keys omitted)."""
    wire: list[DeviceWire] = []
    for device in devices:
        entry: DeviceWire = {"id": device.uuid}
        if device.index:
            entry["index"] = device.index
        if device.count:
            entry["count"] = device.count
        if device.memory_mib:
            entry["devmem"] = device.memory_mib
        if device.cores:
            entry["devcore"] = device.cores
        if device.type:
            entry["type"] = device.type
        if device.numa:
            entry["numa"] = device.numa
        if device.mode:
            entry["mode"] = device.mode
        if device.mig_profiles:
            entry["migProfiles"] = [_profile_wire(profile) for profile in device.mig_profiles]
        if device.health:
            entry["health"] = True
        wire.append(entry)
    return json.dumps(wire, separators=(",", ":"))


def _profile_wire(profile: MigProfile) -> MigProfileWire:
    return {
        "name": profile.name,
        "memoryMB": profile.memory_mib,
        "core": profile.cores,
        "sliceCount": profile.slice_count,
        "placements": [{"start": p.start, "size": p.size} for p in profile.placements],
    }


def decode_node_devices(text: str) -> tuple[Device, ...]:
    """Read ``hami.io/node-nvidia-register``: JSON (current), or the legacy colon form.

    Both forms refuse a card id listed twice: one card registered twice would be booked twice.
    """
    check_length(NODE_REGISTER, text)
    head = text.lstrip()[:1]
    if head in ("[", "{") or text.strip() == "null":
        return _decode_json(text)
    return decode_node_devices_legacy(text)


def _decode_json(text: str) -> tuple[Device, ...]:
    document = load_json(NODE_REGISTER, text)
    try:
        entries = get_list(document, "the registration")
        devices = tuple(_decode_card(position, raw) for position, raw in enumerate(entries))
    except FieldProblem as exc:
        raise AnnotationError(NODE_REGISTER, text, str(exc)) from exc
    if not devices:
        raise AnnotationError(NODE_REGISTER, text, NO_GPU)
    return _unique(text, devices)


def _unique(text: str, devices: tuple[Device, ...]) -> tuple[Device, ...]:
    """``devices``, or an AnnotationError naming the first card id listed twice."""
    first: dict[str, int] = {}
    for position, device in enumerate(devices):
        earlier = first.setdefault(device.uuid, position)
        if earlier != position:
            reason = f"duplicate card id {device.uuid!r} (cards {earlier} and {position})"
            raise AnnotationError(NODE_REGISTER, text, reason)
    return devices


def _decode_card(position: int, raw: Any) -> Device:
    try:
        card = get_object(raw, "a card")
        profiles = tuple(_decode_profile(item) for item in get_list(card.get("migprofiles"), "'migProfiles'"))
        return Device(
            uuid=get_str(card, "id", required=True),
            index=get_int(card, "index", minimum=0),
            count=get_int(card, "count", minimum=0, bits=32),
            memory_mib=get_int(card, "devmem", minimum=0, bits=32),
            cores=get_int(card, "devcore", minimum=0, bits=32),
            type=get_str(card, "type"),
            numa=get_int(card, "numa"),
            mode=get_str(card, "mode"),
            health=get_bool(card, "health"),
            mig_profiles=profiles,
        )
    except FieldProblem as exc:
        raise FieldProblem(f"card {position}: {exc}") from exc


def _decode_profile(raw: Any) -> MigProfile:
    profile = get_object(raw, "a MIG profile")
    placements = []
    for item in get_list(profile.get("placements"), "'placements'"):
        placement = get_object(item, "a placement")
        placements.append(
            MigPlacement(
                start=get_int(placement, "start", minimum=0), size=get_int(placement, "size", minimum=0)
            )
        )
    return MigProfile(
        name=get_str(profile, "name", required=True),
        memory_mib=get_int(profile, "memoryMB", minimum=0),
        cores=get_int(profile, "core", minimum=0),
        slice_count=get_int(profile, "sliceCount", minimum=0),
        placements=tuple(placements),
    )


# --------------------------------------------------------------------------------- legacy colon form

_DIGITS = re.compile(r"[+-]?[0-9]+")
_LEGACY_INTS = {1: ("count", 32), 2: ("devmem", 32), 3: ("devcore", 32), 5: ("numa", 64), 7: ("index", 64)}


def encode_node_devices_legacy(devices: Iterable[Device]) -> str:
    """The 9-field colon form (what HAMi's encoder writes); for tests and old readers only."""
    return "".join(
        f"{d.uuid},{d.count},{d.memory_mib},{d.cores},{d.type},{d.numa},{'true' if d.health else 'false'},"
        f"{d.index},{d.mode}:"
        for d in devices
    )


def decode_node_devices_legacy(text: str) -> tuple[Device, ...]:
    """Read the colon form with HAMi's rules and error texts (docs/annotations.md, "Node annotations"); a card
    id listed twice is refused (HAMi accepts it)."""
    check_length(NODE_REGISTER, text)
    if ":" not in text:
        raise AnnotationError(NODE_REGISTER, text, "node annotation missing device separator")
    devices: list[Device] = []
    for segment in text.split(":"):
        if not segment:
            continue
        if "," not in segment:
            raise AnnotationError(NODE_REGISTER, text, f'malformed node annotation segment: "{segment}"')
        fields = segment.split(",")
        if len(fields) not in (7, 9):
            raise AnnotationError(
                NODE_REGISTER, text, f"unexpected field count {len(fields)} in node annotation"
            )
        numbers = {
            name: _legacy_int(text, name, fields[position], bits)
            for position, (name, bits) in _LEGACY_INTS.items()
            if position < len(fields)
        }
        health = go_bool(fields[6])
        if health is None:
            why = f'strconv.ParseBool: parsing "{fields[6]}": invalid syntax'
            raise AnnotationError(NODE_REGISTER, text, f"invalid health field: {why}")
        index = numbers.get("index", 0)
        if index < 0:
            raise AnnotationError(NODE_REGISTER, text, f"index field must not be negative: {index}")
        devices.append(
            Device(
                uuid=fields[0],
                count=numbers["count"],
                memory_mib=numbers["devmem"],
                cores=numbers["devcore"],
                type=fields[4],
                numa=numbers["numa"],
                health=health,
                index=index,
                mode=fields[8] if len(fields) == 9 else DeviceMode.HAMI_CORE.value,
            )
        )
    return _unique(text, tuple(devices))


def _legacy_int(text: str, name: str, raw: str, bits: int) -> int:
    value = go_int(raw, bits=bits)
    if value is None:
        why = "value out of range" if _DIGITS.fullmatch(raw) else "invalid syntax"
        reason = f'invalid {name} field: strconv.ParseInt: parsing "{raw}": {why}'
        raise AnnotationError(NODE_REGISTER, text, reason)
    return value


# ------------------------------------------------------------------------------- pair scores, cordon


def encode_pair_scores(scores: Mapping[str, Mapping[str, int]]) -> str:
    """``[{"uuid":"GPU-0","score":{"GPU-1":100}}]`` in the mapping's order."""
    wire: list[PairScoreWire] = [{"uuid": uuid, "score": dict(row)} for uuid, row in scores.items()]
    return json.dumps(wire, separators=(",", ":"))


def decode_pair_scores(text: str) -> dict[str, dict[str, int]]:
    """Read ``hami.io/node-nvidia-score``: card uuid -> (other card uuid -> score, a Go ``int``)."""
    document = load_json(NODE_PAIR_SCORES, text)
    scores: dict[str, dict[str, int]] = {}
    try:
        for position, raw in enumerate(get_list(document, "the pair scores")):
            entry = get_object(raw, f"entry {position}")
            uuid = get_str(entry, "uuid", required=True)
            if uuid in scores:
                raise FieldProblem(f"entry {position}: duplicate uuid {uuid!r}")
            row = entry.get("score")
            if row is None:
                row = {}
            if not isinstance(row, dict):
                raise FieldProblem(f"entry {position}: 'score' must be an object, got {json_kind(row)}")
            scores[uuid] = {other: _score(position, other, value) for other, value in row.items()}
    except FieldProblem as exc:
        raise AnnotationError(NODE_PAIR_SCORES, text, str(exc)) from exc
    return scores


def _score(position: int, other: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise FieldProblem(
            f"entry {position}: score for {other!r} must be an integer, got {json_kind(value)}"
        )
    if not INT64_MIN <= value <= INT64_MAX:
        raise FieldProblem(f"entry {position}: score for {other!r} does not fit in 64 bits")
    return int(value)


def encode_cordon(uuids: Iterable[str]) -> str:
    """``hami.io/device-cordon``: sorted comma list."""
    return ",".join(sorted(set(uuids)))


def decode_cordon(text: str | None) -> frozenset[str]:
    """Card uuids excluded from new placements: entries trimmed, empty entries dropped."""
    return frozenset(split_list(text))


# --------------------------------------------------------------------------------------------- node

#: The node annotations the scheduler and the doctor read.
NODE_KEYS = (NODE_REGISTER, NODE_PAIR_SCORES, NODE_DEVICE_CORDON, NODE_HANDSHAKE, NODE_LOCK)


def node_shape_problem(node: object) -> str | None:
    """Why ``node`` is not a Node object the scheduler can read, or None: its metadata, annotations,
    status or allocatable not a JSON object, or one of :data:`NODE_KEYS` not a string. kube-apiserver
    never stores such a Node; a test server, a list or a hand-written manifest may hold one, and the
    accessors of :mod:`hami.objects` would read the field as absent (a registration gone, a lock
    unseen), so the node is excluded instead."""
    if not isinstance(node, Mapping):
        return "the Node is not an object"
    metadata = node.get("metadata")
    if not isinstance(metadata, Mapping):
        return "metadata is not an object"
    annotations = metadata.get("annotations")
    if annotations is not None and not isinstance(annotations, Mapping):
        return "metadata.annotations is not an object"
    for key in NODE_KEYS:
        value = (annotations or {}).get(key)
        if value is not None and not isinstance(value, str):
            return f"annotation {key} is not a string"
    status = node.get("status")
    if status is not None and not isinstance(status, Mapping):
        return "status is not an object"
    allocatable = (status or {}).get("allocatable")
    if allocatable is not None and not isinstance(allocatable, Mapping):
        return "status.allocatable is not an object"
    return None


def read_node(name: str, annotations: Mapping[str, str]) -> NodeState:
    """A node's cards (zero usage), pair scores and cordon list from its annotations.

    Raises :class:`AnnotationError` for a missing or unreadable registration (HAMi then skips the
    node), and for unreadable pair scores (HAMi fails the whole node on those too). Each card carries
    its enforcement from ``hami.io/node-enforcement`` (``read_card_enforcement``: ``none`` when the
    node does not list it, or when the annotation is missing or unreadable; never an error here).
    """
    register = annotations.get(NODE_REGISTER)
    if register is None:
        raise AnnotationError(NODE_REGISTER, None, MISSING_REGISTER)
    devices = decode_node_devices(register)
    scores_text = annotations.get(NODE_PAIR_SCORES)
    scores = decode_pair_scores(scores_text) if scores_text is not None else {}
    kinds, _ = read_card_enforcement(annotations)
    if kinds:
        devices = tuple(
            replace(device, enforcement=kinds[device.uuid]) if device.uuid in kinds else device
            for device in devices
        )
    return NodeState(
        name=name,
        devices=tuple(DeviceState(device=device) for device in devices),
        pair_scores=scores,
        cordoned=decode_cordon(annotations.get(NODE_DEVICE_CORDON)),
    )
