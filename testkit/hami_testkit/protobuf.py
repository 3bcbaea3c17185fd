"""Kubernetes' protobuf request bodies, read into the JSON the embedded apiserver stores.

client-go's typed clients (kubectl's ``create deployment``, ``create job``, ``create namespace``,
``auth can-i``, ``auth whoami``; Helm's release Secrets and their deletion) send built-in objects as
``application/vnd.kubernetes.protobuf``: the magic ``k8s\\x00`` and a ``runtime.Unknown`` envelope
(``typeMeta``, ``raw``) around the object's own message. Owns :func:`decode` for the kinds :data:`KINDS`
names — Namespace, Secret, ConfigMap, Pod, Deployment, ReplicaSet, Job, DeleteOptions and the self
reviews — parsed by the ``protobuf`` library with the messages of :mod:`hami_testkit.kubeproto`
(Kubernetes' field numbers) and turned into their JSON form: ``bytes`` as base64, ``Time`` as RFC 3339,
``IntOrString`` as a number or a string, ``Quantity`` as its string, maps as objects. Go writes every
non-pointer field, set or not: a zero value there means unset and is left out (as Go's ``omitempty``
does), while a field marked ``pointer`` in ``k8s.proto`` keeps its zero (``replicas: 0``). A field the
messages do not list that carries a value is refused, naming where it is, instead of being dropped.
Any other kind, or a malformed body, raises :class:`ProtobufError` (answered 415, as kube-apiserver
answers a body it cannot read, with the way round: send the object as JSON). Simulation only; pure: no
I/O.
"""

from __future__ import annotations

import base64
import datetime
from typing import Any

from google.protobuf import empty_pb2  # type: ignore[import-untyped]  # no stubs shipped
from google.protobuf import message as _message
from google.protobuf.descriptor import FieldDescriptor  # type: ignore[import-untyped]
from google.protobuf.unknown_fields import UnknownFieldSet  # type: ignore[import-untyped]

from hami_testkit.kubeproto import k8s_pb2

MAGIC = b"k8s\x00"
CONTENT_TYPE = "application/vnd.kubernetes.protobuf"

#: (apiVersion, kind) of the envelope -> the message of its ``raw`` bytes. client-go sends
#: DeleteOptions as ``v1`` (it is registered in every group) or as ``meta.k8s.io/v1``.
KINDS: dict[tuple[str, str], Any] = {
    ("v1", "Namespace"): k8s_pb2.Namespace,
    ("v1", "Secret"): k8s_pb2.Secret,
    ("v1", "ConfigMap"): k8s_pb2.ConfigMap,
    ("v1", "Pod"): k8s_pb2.Pod,
    ("apps/v1", "Deployment"): k8s_pb2.Deployment,
    ("apps/v1", "ReplicaSet"): k8s_pb2.ReplicaSet,
    ("batch/v1", "Job"): k8s_pb2.Job,
    ("v1", "DeleteOptions"): k8s_pb2.DeleteOptions,
    ("meta.k8s.io/v1", "DeleteOptions"): k8s_pb2.DeleteOptions,
    ("authorization.k8s.io/v1", "SelfSubjectAccessReview"): k8s_pb2.SelfSubjectAccessReview,
    ("authorization.k8s.io/v1", "SelfSubjectRulesReview"): k8s_pb2.SelfSubjectRulesReview,
    ("authentication.k8s.io/v1", "SelfSubjectReview"): k8s_pb2.SelfSubjectReview,
}
_TIME = k8s_pb2.Time.DESCRIPTOR.full_name
_INT_OR_STRING = k8s_pb2.IntOrString.DESCRIPTOR.full_name
_QUANTITY = k8s_pb2.Quantity.DESCRIPTOR.full_name
#: What a client whose kind is not read here can do instead (kubectl sends JSON for these).
WAY_ROUND = (
    "send it as JSON: kubectl apply -f FILE, "
    "or kubectl create ... --dry-run=client -o json | kubectl apply -f -"
)


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


def _int_or_string(value: Any, where: str) -> int | str:
    _check_unknown(value, where)
    if value.type == 0:
        return int(value.intVal)
    if value.type == 1:
        return _text(where, value.strVal)
    raise ProtobufError(f"{where}: IntOrString type {value.type} is neither 0 (int) nor 1 (string)")


def _value(field: Any, value: Any, where: str) -> Any:
    """One singular value of ``field`` (at ``where``) in its JSON form."""
    if field.type == FieldDescriptor.TYPE_MESSAGE:
        name = field.message_type.full_name
        if name == _TIME:
            _check_unknown(value, where)
            return _time(value)
        if name == _INT_OR_STRING:
            return _int_or_string(value, where)
        if name == _QUANTITY:
            _check_unknown(value, where)
            return _text(where, value.string)
        return as_json(value, where)
    if field.type == FieldDescriptor.TYPE_BYTES:
        return base64.b64encode(value).decode("ascii")
    if field.type == FieldDescriptor.TYPE_STRING:
        return _text(where, value)
    return value


def _text(name: str, value: Any) -> str:
    """A proto2 string: the library does not check UTF-8 on parse (invalid text comes back as bytes)."""
    if isinstance(value, bytes):
        try:
            return value.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ProtobufError(f"field {name} is not UTF-8 text") from exc
    return str(value)


def _check_unknown(msg: Any, where: str) -> None:
    """Refuse a field the messages do not list when it carries a value (its zero loses nothing)."""
    for unknown in UnknownFieldSet(msg):
        if _zero(unknown.data):
            continue
        raise ProtobufError(
            f"{where or 'the object'}: field {unknown.field_number} of {msg.DESCRIPTOR.name} is not read "
            "by this apiserver"
        )


#: how deep an unknown field's zero is looked for (Kubernetes' structs nest a few levels; deeper is refused)
ZERO_DEPTH = 16


def _zero(data: Any) -> bool:
    """An unknown field's value is Go's zero: 0, empty, or a struct of zeros (Go writes a non-pointer
    struct even when empty, e.g. a self review's ``status``). Bytes that do not read as protobuf are text.
    Walked without recursion, at most :data:`ZERO_DEPTH` deep: a body of nested fields is refused, it
    never exhausts the stack."""
    stack: list[tuple[Any, int]] = [(data, 0)]
    while stack:
        value, depth = stack.pop()
        if depth > ZERO_DEPTH:
            return False
        if isinstance(value, UnknownFieldSet):
            stack.extend((item.data, depth + 1) for item in value)
            continue
        if not isinstance(value, bytes):
            if value != 0:
                return False
            continue
        if not value:
            continue
        inner = empty_pb2.Empty()
        try:
            inner.ParseFromString(value)
        except _message.DecodeError:
            return False
        stack.extend((item.data, depth + 1) for item in UnknownFieldSet(inner))
    return True


def _is_unset(field: Any, value: Any) -> bool:
    """A non-pointer scalar at its zero value: Go wrote it although nobody set it."""
    if field.type == FieldDescriptor.TYPE_MESSAGE or value not in (0, "", b"", False):
        return False
    return not field.GetOptions().Extensions[k8s_pb2.pointer]


def as_json(msg: Any, where: str = "") -> dict[str, Any]:
    """A parsed message as the JSON object Kubernetes would accept (the set fields only; ``where`` is
    its path in the object, for errors)."""
    _check_unknown(msg, where)
    result: dict[str, Any] = {}
    for field, value in msg.ListFields():
        path = f"{where}.{field.name}" if where else field.name
        if field.message_type is not None and field.message_type.GetOptions().map_entry:
            value_field = field.message_type.fields_by_name["value"]
            result[field.name] = {
                _text(f"{path} key", key): _value(value_field, item, f"{path}[{key}]")
                for key, item in value.items()
            }
        elif field.is_repeated:
            result[field.name] = [_value(field, item, f"{path}[{i}]") for i, item in enumerate(value)]
        elif not _is_unset(field, value):
            converted = _value(field, value, path)
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
        readable = ", ".join(sorted({k for _, k in KINDS}))
        raise ProtobufError(
            f"{api_version} {kind} is not read from protobuf by this apiserver (it reads {readable}); "
            + WAY_ROUND
        )
    obj = message_class()
    try:
        obj.ParseFromString(envelope.raw)
    except _message.DecodeError as exc:
        raise ProtobufError(f"{api_version} {kind} cannot be read: {exc}") from exc
    try:
        return {"apiVersion": api_version, "kind": kind, **as_json(obj)}
    except UnicodeDecodeError as exc:  # a map key that is not UTF-8 (the library decodes keys itself)
        raise ProtobufError(f"{api_version} {kind} has text that is not UTF-8") from exc
    except ProtobufError as exc:
        raise ProtobufError(f"{api_version} {kind}: {exc}; {WAY_ROUND}") from exc
