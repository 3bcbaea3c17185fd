"""Kubernetes' protobuf request bodies, read into the JSON the embedded apiserver stores.

client-go's typed clients (kubectl's ``create namespace``, Helm's release Secrets) send built-in objects
as ``application/vnd.kubernetes.protobuf``: the magic ``k8s\\x00`` and a ``runtime.Unknown`` envelope
(``typeMeta``, ``raw``) around the object's own message. Owns :func:`decode` for the kinds such clients
create or replace here — Namespace, Secret, ConfigMap — with their ObjectMeta (field numbers from
Kubernetes' ``generated.proto``); any other kind, or a malformed body, raises :class:`ProtobufError`
(answered 415, as kube-apiserver answers a body it cannot read). ``bytes`` fields become base64 as in
JSON. Simulation only; pure: stdlib only.
"""

from __future__ import annotations

import base64
import datetime
from typing import Any

MAGIC = b"k8s\x00"
CONTENT_TYPE = "application/vnd.kubernetes.protobuf"

# A schema maps a field number to (json name, type); a type is a scalar name, a nested schema (dict),
# ("map", value type), ("repeated", type) or "time".
Schema = dict[int, tuple[str, Any]]

_TIME: Schema = {1: ("seconds", "int"), 2: ("nanos", "int")}
_OWNER: Schema = {
    1: ("kind", "string"),
    3: ("name", "string"),
    4: ("uid", "string"),
    5: ("apiVersion", "string"),
    6: ("controller", "bool"),
    7: ("blockOwnerDeletion", "bool"),
}
_META: Schema = {
    1: ("name", "string"),
    2: ("generateName", "string"),
    3: ("namespace", "string"),
    5: ("uid", "string"),
    6: ("resourceVersion", "string"),
    7: ("generation", "int"),
    8: ("creationTimestamp", "time"),
    9: ("deletionTimestamp", "time"),
    10: ("deletionGracePeriodSeconds", "int"),
    11: ("labels", ("map", "string")),
    12: ("annotations", ("map", "string")),
    13: ("ownerReferences", ("repeated", _OWNER)),
    14: ("finalizers", ("repeated", "string")),
}
KINDS: dict[str, Schema] = {
    "Secret": {
        1: ("metadata", _META),
        2: ("data", ("map", "bytes")),
        3: ("type", "string"),
        4: ("stringData", ("map", "string")),
        5: ("immutable", "bool"),
    },
    "ConfigMap": {
        1: ("metadata", _META),
        2: ("data", ("map", "string")),
        3: ("binaryData", ("map", "bytes")),
        4: ("immutable", "bool"),
    },
    "Namespace": {
        1: ("metadata", _META),
        2: ("spec", {1: ("finalizers", ("repeated", "string"))}),
        3: ("status", {1: ("phase", "string")}),
    },
}
_UNKNOWN: Schema = {
    1: ("typeMeta", {1: ("apiVersion", "string"), 2: ("kind", "string")}),
    2: ("raw", "raw"),
    3: ("contentEncoding", "string"),
    4: ("contentType", "string"),
}


class ProtobufError(ValueError):
    """A body that is not a protobuf object this apiserver reads."""


def _varint(data: bytes, at: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if at >= len(data) or shift > 63:
            raise ProtobufError("truncated varint")
        byte = data[at]
        at += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            return value, at


def _fields(data: bytes) -> list[tuple[int, int | bytes]]:
    """(field number, varint value or length-delimited bytes) in order; other wire types refused."""
    found: list[tuple[int, int | bytes]] = []
    at = 0
    while at < len(data):
        tag, at = _varint(data, at)
        number, wire = tag >> 3, tag & 7
        if wire == 0:
            value, at = _varint(data, at)
            found.append((number, value))
        elif wire == 2:
            length, at = _varint(data, at)
            if at + length > len(data):
                raise ProtobufError("truncated field")
            found.append((number, data[at : at + length]))
            at += length
        else:
            raise ProtobufError(f"unsupported wire type {wire}")
    return found


def _scalar(kind: Any, value: int | bytes) -> Any:
    if kind == "raw":
        return value
    if isinstance(kind, dict):
        if not isinstance(value, bytes):
            raise ProtobufError("a message field is not length-delimited")
        return _message(kind, value)
    if kind == "time":
        if not isinstance(value, bytes):
            raise ProtobufError("a time field is not length-delimited")
        seconds = int(_message(_TIME, value).get("seconds", 0))
        if seconds == 0:
            return None  # Go's zero time: the field is unset
        moment = datetime.datetime.fromtimestamp(seconds, datetime.UTC)
        return moment.strftime("%Y-%m-%dT%H:%M:%SZ")
    if kind in ("int", "bool"):
        if not isinstance(value, int):
            raise ProtobufError("a varint field is length-delimited")
        return bool(value) if kind == "bool" else (value - (1 << 64) if value >= 1 << 63 else value)
    if not isinstance(value, bytes):
        raise ProtobufError("a string field is a varint")
    if kind == "bytes":
        return base64.b64encode(value).decode("ascii")
    try:
        return value.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ProtobufError("a string field is not UTF-8") from exc


def _message(schema: Schema, data: bytes) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for number, value in _fields(data):
        if number not in schema:
            continue  # a field this apiserver does not keep
        name, kind = schema[number]
        if isinstance(kind, tuple) and kind[0] == "map":
            if not isinstance(value, bytes):
                raise ProtobufError("a map entry is not length-delimited")
            entry = _message({1: ("key", "string"), 2: ("value", kind[1])}, value)
            result.setdefault(name, {})[entry.get("key", "")] = entry.get("value", "" if kind[1] else None)
        elif isinstance(kind, tuple) and kind[0] == "repeated":
            result.setdefault(name, []).append(_scalar(kind[1], value))
        else:
            scalar = _scalar(kind, value)
            if scalar is not None:
                result[name] = scalar
    return result


def decode(body: bytes) -> dict[str, Any]:
    """The JSON form of a protobuf-encoded Kubernetes object (see the module docstring)."""
    if not body.startswith(MAGIC):
        raise ProtobufError("the body does not start with the Kubernetes protobuf magic")
    envelope = _message(_UNKNOWN, body[len(MAGIC) :])
    type_meta = envelope.get("typeMeta") or {}
    kind, api_version = str(type_meta.get("kind", "")), str(type_meta.get("apiVersion", ""))
    if envelope.get("contentEncoding"):
        raise ProtobufError(f"unsupported content encoding {envelope['contentEncoding']!r}")
    schema = KINDS.get(kind) if api_version == "v1" else None
    if schema is None:
        raise ProtobufError(f"{api_version} {kind} is not read from protobuf by this apiserver")
    raw = envelope.get("raw", b"")
    obj = _message(schema, raw if isinstance(raw, bytes) else b"")
    return {"apiVersion": api_version, "kind": kind, **obj}
