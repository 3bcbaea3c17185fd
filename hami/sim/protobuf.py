"""Kubernetes' protobuf request bodies, read into the JSON the embedded apiserver stores.

client-go's typed clients (kubectl's ``create namespace``, ``auth can-i``, ``auth whoami``; Helm's
release Secrets and their deletion) send built-in objects as ``application/vnd.kubernetes.protobuf``:
the magic ``k8s\\x00`` and a ``runtime.Unknown`` envelope (``typeMeta``, ``raw``) around the object's
own message. Owns :func:`decode` for the kinds :data:`KINDS` names — Namespace, Secret, ConfigMap,
DeleteOptions, SelfSubjectAccessReview, SelfSubjectRulesReview, SelfSubjectReview — parsed by the
``protobuf`` library with the messages of :mod:`hami.sim.kubeproto` (Kubernetes' field numbers) and
turned into their JSON form: ``bytes`` as base64, ``Time`` as RFC 3339, maps as objects, fields left
unset absent. Any other kind, or a malformed body, raises :class:`ProtobufError` (answered 415, as
kube-apiserver answers a body it cannot read). Simulation only; pure: no I/O.
"""

from __future__ import annotations

import base64
import datetime
from typing import Any

from google.protobuf import message as _message  # type: ignore[import-untyped]  # no stubs shipped
from google.protobuf.descriptor import FieldDescriptor  # type: ignore[import-untyped]

from hami.sim.kubeproto import k8s_pb2

MAGIC = b"k8s\x00"
CONTENT_TYPE = "application/vnd.kubernetes.protobuf"

#: (apiVersion, kind) of the envelope -> the message of its ``raw`` bytes. client-go sends
#: DeleteOptions as ``v1`` (it is registered in every group) or as ``meta.k8s.io/v1``.
KINDS: dict[tuple[str, str], Any] = {
    ("v1", "Namespace"): k8s_pb2.Namespace,
    ("v1", "Secret"): k8s_pb2.Secret,
    ("v1", "ConfigMap"): k8s_pb2.ConfigMap,
    ("v1", "DeleteOptions"): k8s_pb2.DeleteOptions,
    ("meta.k8s.io/v1", "DeleteOptions"): k8s_pb2.DeleteOptions,
    ("authorization.k8s.io/v1", "SelfSubjectAccessReview"): k8s_pb2.SelfSubjectAccessReview,
    ("authorization.k8s.io/v1", "SelfSubjectRulesReview"): k8s_pb2.SelfSubjectRulesReview,
    ("authentication.k8s.io/v1", "SelfSubjectReview"): k8s_pb2.SelfSubjectReview,
}
_TIME = k8s_pb2.Time.DESCRIPTOR.full_name


class ProtobufError(ValueError):
    """A body that is not a protobuf object this apiserver reads."""


def _time(value: Any) -> str | None:
    if not value.seconds:
        return None  # Go's zero time: the field is unset
    try:
        moment = datetime.datetime.fromtimestamp(value.seconds, datetime.UTC)
    except (OverflowError, OSError, ValueError) as exc:
        raise ProtobufError(f"a time of {value.seconds} seconds is out of range") from exc
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def _value(field: Any, value: Any) -> Any:
    """One singular value of ``field`` in its JSON form."""
    if field.type == FieldDescriptor.TYPE_MESSAGE:
        return _time(value) if field.message_type.full_name == _TIME else as_json(value)
    if field.type == FieldDescriptor.TYPE_BYTES:
        return base64.b64encode(value).decode("ascii")
    if field.type == FieldDescriptor.TYPE_STRING:
        return _text(field.name, value)
    return value


def _text(name: str, value: Any) -> str:
    """A proto2 string: the library does not check UTF-8 on parse (invalid text comes back as bytes)."""
    if isinstance(value, bytes):
        try:
            return value.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ProtobufError(f"field {name} is not UTF-8 text") from exc
    return str(value)


def as_json(msg: Any) -> dict[str, Any]:
    """A parsed message as the JSON object Kubernetes would accept (the set fields only)."""
    result: dict[str, Any] = {}
    for field, value in msg.ListFields():
        if field.message_type is not None and field.message_type.GetOptions().map_entry:
            value_field = field.message_type.fields_by_name["value"]
            result[field.name] = {
                _text(f"{field.name} key", key): _value(value_field, item) for key, item in value.items()
            }
        elif field.is_repeated:
            result[field.name] = [_value(field, item) for item in value]
        else:
            converted = _value(field, value)
            if converted is not None:
                result[field.name] = converted
    return result


def decode(body: bytes) -> dict[str, Any]:
    """The JSON form of a protobuf-encoded Kubernetes object (see the module docstring)."""
    if not body.startswith(MAGIC):
        raise ProtobufError("the body does not start with the Kubernetes protobuf magic")
    envelope = k8s_pb2.Unknown()
    try:
        envelope.ParseFromString(body[len(MAGIC) :])
    except _message.DecodeError as exc:
        raise ProtobufError(f"the runtime.Unknown envelope cannot be read: {exc}") from exc
    kind, api_version = envelope.typeMeta.kind, envelope.typeMeta.apiVersion
    if envelope.contentEncoding:
        raise ProtobufError(f"unsupported content encoding {envelope.contentEncoding!r}")
    message_class = KINDS.get((api_version, kind))
    if message_class is None:
        raise ProtobufError(f"{api_version} {kind} is not read from protobuf by this apiserver")
    obj = message_class()
    try:
        obj.ParseFromString(envelope.raw)
    except _message.DecodeError as exc:
        raise ProtobufError(f"{api_version} {kind} cannot be read: {exc}") from exc
    try:
        return {"apiVersion": api_version, "kind": kind, **as_json(obj)}
    except UnicodeDecodeError as exc:  # a map key that is not UTF-8 (the library decodes keys itself)
        raise ProtobufError(f"{api_version} {kind} has text that is not UTF-8") from exc
