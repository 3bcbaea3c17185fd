"""DeleteOptions as kube-apiserver reads them, for every DELETE the embedded apiserver serves.

A client may say how to delete in the body (a ``DeleteOptions`` in JSON, or in protobuf: client-go's
typed clients, e.g. Helm purging its release Secrets, read by :mod:`hami_testkit.protobuf`) or in the query
(``?propagationPolicy=Foreground&gracePeriodSeconds=0&dryRun=All``); the body wins. Owns
:func:`delete_options` (the options of one request, checked as kube-apiserver checks them: a field of
the wrong type is ``400 BadRequest``, an unknown ``propagationPolicy`` or ``dryRun`` value, or both
``orphanDependents`` and ``propagationPolicy``, is ``422 Invalid``) and :func:`precondition_failure`
(``preconditions.uid`` / ``resourceVersion`` against the stored object: ``409 Conflict``).

The options are read and checked, not acted on beyond that: ``dryRun: [All]`` deletes nothing (the
object is answered as it is), preconditions are enforced, and ``propagationPolicy`` /
``orphanDependents`` are the caller's to honour (the embedded cluster's garbage collection, where one
runs, reads them through :func:`delete_options`); ``gracePeriodSeconds`` changes nothing (objects go at
once). Simulation only; no I/O. Must not import ``hami.kube``, ``webhook`` or ``nodeagent``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from hami import objects
from hami_testkit.restapi import JsonDict, status

POLICIES = ("Foreground", "Background", "Orphan")
_FIELDS: dict[str, type | tuple[type, ...]] = {
    "gracePeriodSeconds": int,
    "preconditions": dict,
    "orphanDependents": bool,
    "propagationPolicy": str,
    "dryRun": list,
    "ignoreStoreReadErrorWithClusterBreakingPotential": bool,
}


class DeleteRefused(ValueError):
    """Options kube-apiserver refuses: ``code`` and the ``Status`` to answer with."""

    def __init__(self, code: int, body: JsonDict) -> None:
        super().__init__(body.get("message", ""))
        self.code = code
        self.body = body


def _bad(message: str) -> DeleteRefused:
    return DeleteRefused(400, status(400, "BadRequest", message))


def _invalid(field: str, detail: str) -> DeleteRefused:
    message = f'DeleteOptions.meta.k8s.io "" is invalid: {field}: {detail}'
    details = {"group": "meta.k8s.io", "kind": "DeleteOptions"}
    return DeleteRefused(422, status(422, "Invalid", message, details))


def _from_query(params: Mapping[str, str]) -> JsonDict:
    options: JsonDict = {}
    if "gracePeriodSeconds" in params:
        try:
            options["gracePeriodSeconds"] = int(params["gracePeriodSeconds"])
        except ValueError:
            raise _bad(f"gracePeriodSeconds: {params['gracePeriodSeconds']!r} is not an integer") from None
    if "orphanDependents" in params:
        text = params["orphanDependents"].lower()
        if text not in ("true", "false"):
            raise _bad(f"orphanDependents: {params['orphanDependents']!r} is not true or false")
        options["orphanDependents"] = text == "true"
    if "propagationPolicy" in params:
        options["propagationPolicy"] = params["propagationPolicy"]
    if "dryRun" in params:
        options["dryRun"] = [params["dryRun"]]
    return options


def delete_options(params: Mapping[str, str], body: Any) -> JsonDict:
    """The checked DeleteOptions of a DELETE with query ``params`` and parsed ``body`` (None: no body);
    raises :class:`DeleteRefused` with kube-apiserver's answer."""
    options = _from_query(params)
    if body is not None:
        if not isinstance(body, Mapping):
            raise _bad("the request body must be a DeleteOptions object")
        kind = body.get("kind")
        if kind is not None and kind != "DeleteOptions":
            raise _bad(f"the request body is a {kind}, not DeleteOptions")
        for field, expected in _FIELDS.items():
            value = body.get(field)
            if value is None:
                continue
            if not isinstance(value, expected) or (expected is int and isinstance(value, bool)):
                raise _bad(f"DeleteOptions.{field} has the wrong type: {type(value).__name__}")
            options[field] = value
    grace = options.get("gracePeriodSeconds")
    if grace is not None and not -(2**63) <= grace < 2**63:  # an int64 in kube-apiserver
        raise _bad(f"gracePeriodSeconds: {str(grace)[:30]} does not fit in 64 bits")
    policy = options.get("propagationPolicy")
    if policy is not None and policy not in POLICIES:
        supported = ", ".join(f'"{p}"' for p in POLICIES)
        raise _invalid("propagationPolicy", f'Unsupported value: "{policy}": supported values: {supported}')
    if policy is not None and options.get("orphanDependents") is not None:
        both = "orphanDependents and deletionPropagation cannot be both set"
        raise _invalid("propagationPolicy", f'Invalid value: "{policy}": {both}')
    for value in options.get("dryRun", []):
        if value != "All":
            raise _invalid("dryRun", f'Unsupported value: "{value}": supported values: "All"')
    preconditions = options.get("preconditions") or {}
    for field in ("uid", "resourceVersion"):
        if preconditions.get(field) is not None and not isinstance(preconditions[field], str):
            raise _bad(f"DeleteOptions.preconditions.{field} must be a string")
    return options


def precondition_failure(
    options: Mapping[str, Any], stored: Mapping[str, Any], plural: str
) -> JsonDict | None:
    """kube-apiserver's 409 when ``options``' preconditions do not hold for the ``stored`` object."""
    preconditions = options.get("preconditions") or {}
    meta = objects.meta(stored)
    for field, label in (("uid", "UID"), ("resourceVersion", "ResourceVersion")):
        wanted = preconditions.get(field)
        if wanted is not None and wanted != meta.get(field):
            message = (
                f"Precondition failed: {label} in precondition: {wanted}, "
                f"{label} in object meta: {meta.get(field, '')}"
            )
            return status(409, "Conflict", message, {"name": objects.name(stored), "kind": plural})
    return None
