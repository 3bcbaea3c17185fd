"""PURE: reading an AdmissionReview request body before Kopf sees it, and the status of a refusal.

Owns :func:`read_review` (the bytes POSTed to ``/webhook`` -> the review, or :class:`Malformed` with a
short reason) and :func:`with_status_reason` (the ``status.reason`` kube-apiserver passes on to the
user, from the code of a refusal).

The webhook listens on every interface without client authentication, so a body is hostile until
checked. Kopf reads the envelope without checking it: a body that is not an object, an envelope
without ``request``, a ``request.object`` that is not an object, a missing ``resource`` all end in an
``AttributeError``/``KeyError`` there, answered 500 with a traceback in the log (issue 26). Here,
before any of that:

* at most :data:`MAX_BODY` bytes (kube-apiserver's own limit on a request body), UTF-8, JSON;
* no ``NaN``/``Infinity`` (not JSON; Python's parser accepts them), no number beyond a float
  (``1e999``), no integer of more than :data:`MAX_DIGITS` digits, nesting at most :data:`MAX_DEPTH`
  deep (checked without recursion; the parser's own recursion limit answers deeper texts);
* the envelope of ``admission.k8s.io/v1`` as kube-apiserver sends it (the fields Kopf and the
  handler read, each of its type), and, for a pod, the fields :func:`webhook.mutation.plan` reads, of
  the types the API server guarantees (``metadata.labels`` a map of strings, a container's
  ``resources.limits`` a map of quantity strings, ...). Anything else is :class:`Malformed`.

Reasons never quote more than :data:`QUOTE` characters of the input (a 5,000-digit uid is not
echoed). Must not import kopf, aiohttp, logging or the Kubernetes client.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any

#: kube-apiserver refuses request bodies above 3 MiB; an AdmissionReview carries at most the object
#: and its old version, each below etcd's 1.5 MiB.
MAX_BODY = 3 * 1024 * 1024
#: A pod is about 10 levels deep (its managedFields a few more); 64 leaves room and stops recursion.
MAX_DEPTH = 64
#: int64, the widest integer in any Kubernetes object, has 19 digits.
MAX_DIGITS = 20
#: kube-apiserver's uids are 36-character UUIDs.
MAX_UID = 128
#: The most characters of the input a reason quotes.
QUOTE = 60
API_VERSION = "admission.k8s.io/v1"
OPERATIONS = ("CREATE", "UPDATE", "DELETE", "CONNECT")
#: metav1.StatusReason of the codes the webhook refuses with (what kubectl shows in parentheses).
STATUS_REASONS = {400: "BadRequest", 403: "Forbidden", 422: "Invalid", 500: "InternalError"}


class Malformed(ValueError):
    """The body is not an AdmissionReview the webhook can judge; the message says why (short)."""


def quote(value: object) -> str:
    """``repr`` of ``value`` cut to :data:`QUOTE` characters (control characters escaped)."""
    text = repr(value)
    return text if len(text) <= QUOTE else f"{text[:QUOTE]}... ({len(text)} characters)"


def read_review(body: bytes) -> dict[str, Any]:
    """The AdmissionReview in ``body``, checked (module docstring); :class:`Malformed` otherwise."""
    if len(body) > MAX_BODY:
        raise Malformed(f"body of {len(body)} bytes, more than {MAX_BODY}")
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise Malformed(f"body is not UTF-8 ({exc.reason} at byte {exc.start})") from None
    try:
        data = json.loads(text, parse_constant=_constant, parse_int=_integer, parse_float=_float)
    except RecursionError:
        raise Malformed(f"JSON nested more than {MAX_DEPTH} deep") from None
    except json.JSONDecodeError as exc:
        raise Malformed(f"body is not JSON: {exc.msg} at line {exc.lineno} column {exc.colno}") from None
    _check_depth(data)
    _check_envelope(data)
    return data  # type: ignore[no-any-return]  # checked to be an object above


def with_status_reason(response: Mapping[str, Any]) -> Mapping[str, Any]:
    """The AdmissionReview ``response`` with ``status.reason`` and ``status.status`` filled in from
    ``status.code`` (Kopf sets only code and message). kube-apiserver hands this status to the user
    as it is, so ``kubectl`` says ``Error from server (Forbidden): ... denied the request: ...``."""
    payload = response.get("response")
    status = payload.get("status") if isinstance(payload, Mapping) else None
    if not isinstance(status, dict) or status.get("reason"):
        return response
    code = status.get("code")
    if isinstance(code, int) and code in STATUS_REASONS:
        status["reason"] = STATUS_REASONS[code]
    status.setdefault("status", "Failure")
    return response


# ------------------------------------------------------------------------------------------- parsing


def _constant(name: str) -> Any:
    raise Malformed(f"{name} is not a JSON number")


def _integer(text: str) -> int:
    digits = len(text.lstrip("-"))
    if digits > MAX_DIGITS:
        raise Malformed(f"an integer of {digits} digits (at most {MAX_DIGITS})")
    return int(text)


def _float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise Malformed(f"the number {quote(text)} is out of range")
    return value


def _check_depth(data: Any) -> None:
    stack = [(data, 1)]
    while stack:
        value, depth = stack.pop()
        if depth > MAX_DEPTH:
            raise Malformed(f"JSON nested more than {MAX_DEPTH} deep")
        if isinstance(value, dict):
            stack.extend((item, depth + 1) for item in value.values())
        elif isinstance(value, list):
            stack.extend((item, depth + 1) for item in value)


# ------------------------------------------------------------------------------------------ envelope

# The type each field must have when present: a ``(type, name)`` pair per path; None is absent.
_STR, _BOOL, _MAP, _LIST = (str, "a string"), (bool, "a boolean"), (dict, "an object"), (list, "a list")
Fields = tuple[tuple[tuple[str, ...], tuple[type, str]], ...]
_POD_FIELDS: Fields = (
    (("metadata",), _MAP),
    (("metadata", "name"), _STR),
    (("metadata", "uid"), _STR),
    (("metadata", "generateName"), _STR),
    (("metadata", "namespace"), _STR),
    (("metadata", "labels"), _MAP),
    (("metadata", "annotations"), _MAP),
    (("spec",), _MAP),
    (("spec", "schedulerName"), _STR),
    (("spec", "nodeName"), _STR),
    (("spec", "runtimeClassName"), _STR),
    (("spec", "containers"), _LIST),
    (("spec", "initContainers"), _LIST),
)
_CONTAINER_FIELDS: Fields = (
    (("name",), _STR),
    (("resources",), _MAP),
    (("resources", "limits"), _MAP),
    (("resources", "requests"), _MAP),
    (("env",), _LIST),
    (("envFrom",), _LIST),
    (("securityContext",), _MAP),
    (("securityContext", "privileged"), _BOOL),
)
_ENV_FIELDS: Fields = (
    (("name",), _STR),
    (("value",), _STR),
    (("valueFrom",), _MAP),
)


def _check_envelope(data: Any) -> None:
    if not isinstance(data, dict):
        raise Malformed(f"the body is {_kind(data)}, not an AdmissionReview object")
    if data.get("apiVersion") != API_VERSION or data.get("kind") != "AdmissionReview":
        raise Malformed(
            f"expected apiVersion {API_VERSION} and kind AdmissionReview, got "
            f"{quote(data.get('apiVersion'))} and {quote(data.get('kind'))}"
        )
    request = data.get("request")
    if not isinstance(request, dict):
        raise Malformed(f"request is {_kind(request)}, not an object")
    uid = request.get("uid")
    if not isinstance(uid, str) or not 0 < len(uid) <= MAX_UID:
        raise Malformed(f"request.uid must be a string of 1 to {MAX_UID} characters, got {quote(uid)}")
    resource = request.get("resource")
    if not isinstance(resource, dict) or not all(
        isinstance(resource.get(key), str) for key in ("group", "version", "resource")
    ):
        raise Malformed(f"request.resource must be an object of group, version, resource: {quote(resource)}")
    if request.get("operation") not in OPERATIONS:
        operation = quote(request.get("operation"))
        raise Malformed(f"request.operation must be one of {', '.join(OPERATIONS)}, got {operation}")
    for key, kind in (("subResource", _STR), ("dryRun", _BOOL), ("userInfo", _MAP)):
        _typed(request.get(key), f"request.{key}", kind)
    if not isinstance(request.get("userInfo"), dict):
        raise Malformed("request.userInfo is missing")
    objects = {key: request.get(key) for key in ("object", "oldObject")}
    for key, value in objects.items():
        _typed(value, f"request.{key}", _MAP)
    if objects["object"] is None and (request["operation"] == "CREATE" or objects["oldObject"] is None):
        raise Malformed("request.object is missing")
    if resource["group"] == "" and resource["resource"] == "pods":
        for key, value in objects.items():
            if value is not None:
                _check_pod(value, f"request.{key}")


def _check_pod(pod: dict[str, Any], where: str) -> None:
    _fields(pod, where, _POD_FIELDS)
    metadata = pod.get("metadata") or {}
    for key in ("labels", "annotations"):
        for name, value in (metadata.get(key) or {}).items():
            _typed(value, f"{where}.metadata.{key}[{quote(name)}]", _STR, optional=False)
    spec = pod.get("spec") or {}
    for group in ("initContainers", "containers"):
        for index, container in enumerate(spec.get(group) or ()):
            at = f"{where}.spec.{group}[{index}]"
            if not isinstance(container, dict):
                raise Malformed(f"{at} is {_kind(container)}, not an object")
            _check_container(container, at)


def _check_container(container: dict[str, Any], at: str) -> None:
    _fields(container, at, _CONTAINER_FIELDS)
    resources = container.get("resources") or {}
    for key in ("limits", "requests"):
        for name, value in (resources.get(key) or {}).items():
            _typed(value, f"{at}.resources.{key}[{quote(name)}]", _STR, optional=False)
    for key in ("env", "envFrom"):
        for index, entry in enumerate(container.get(key) or ()):
            if not isinstance(entry, dict):
                raise Malformed(f"{at}.{key}[{index}] is {_kind(entry)}, not an object")
            if key == "env":
                _fields(entry, f"{at}.env[{index}]", _ENV_FIELDS)


def _fields(obj: dict[str, Any], where: str, fields: Fields) -> None:
    """Each field of ``fields`` is absent or of its type: never an explicit ``null``, which
    kube-apiserver never sends for these and which Kopf reads as a mapping (``metadata: null``)."""
    for path, kind in fields:
        value: Any = obj
        present = True
        for key in path:
            present = isinstance(value, dict) and key in value
            value = value.get(key) if present else None
        _typed(value, ".".join((where, *path)), kind, optional=not present)


def _typed(value: Any, where: str, kind: tuple[type, str], *, optional: bool = True) -> None:
    expected, name = kind
    if (value is not None or not optional) and not isinstance(value, expected):
        raise Malformed(f"{where} must be {name}, got {_kind(value)}")


def _kind(value: Any) -> str:
    """The JSON kind of ``value``, as a reason names it (never the value itself, which may be huge)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return f"a string of {len(value)} characters" if len(value) > QUOTE else f"the string {value!r}"
    return "a list" if isinstance(value, list) else "an object"
