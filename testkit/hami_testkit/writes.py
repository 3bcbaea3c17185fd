"""The embedded apiserver's write path before kmock stores anything, and its error answers.

Owns :func:`before_store`, which :class:`hami_testkit.apiserver.AdmittingEmulator` runs on every request
ahead of kmock (kmock stores a write before any reaction runs), in kube-apiserver's order:

1. **server-side apply** (``PATCH`` with ``application/apply-patch+yaml``, what Helm 4 and
   ``kubectl apply --server-side`` send): creates the object when it is missing, else merges the applied
   configuration into it as a strategic merge patch (no field ownership: nothing applied before and
   left out now is removed);
2. on create: ``apiVersion``/``kind`` when missing, a name from ``generateName``; for a pod,
   kube-apiserver's defaults and the **mutating webhooks** of the stored MutatingWebhookConfigurations
   (when the emulator has an admission caller:
   :class:`hami_testkit.admission_standin.AdmissionStandIn.mutate`), a denial answered as kube-apiserver
   answers it; **strict field validation** when the client asks ``fieldValidation=Strict`` (kubectl
   does, having read the OpenAPI); then the create stamps (:func:`hami_testkit.restapi.stamp_create`);
3. ``PUT`` (which kmock lacks) replaces the object whole, refusing a stale ``resourceVersion`` (409) and
   pods (405: the admission policies guard pod patches);
4. on update: a merge patch that names a stale ``resourceVersion`` is 409 Conflict, as kube-apiserver's
   optimistic concurrency answers it; else the new ``resourceVersion``; a strategic merge patch is
   turned into the merge patch with the same effect (:mod:`hami_testkit.smp`: lists merged by the
   schema's merge keys); on delete, the DeleteOptions of the body (JSON or protobuf) or the query are
   checked (:mod:`hami_testkit.deletion`: a dry run deletes nothing, a failed precondition is 409) and
   the object's last version gets the new ``resourceVersion``.

:func:`error_status` renders an exception as kube-apiserver's ``Status`` (``pods "x" not found``,
``AlreadyExists``, a JSON patch that does not apply (a failed ``test``) as 422 ``Invalid``,
``InternalError``), never kmock's hints or a traceback.
Simulation only. Must not import ``hami.kube``, ``webhook`` or ``nodeagent``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, Protocol

import aiohttp.web
import jsonpatch
import kmock
import yaml

from hami import objects
from hami_testkit import openapi
from hami_testkit.admission_standin import AdmissionStandIn, Refused, apply_defaults, reason_for
from hami_testkit.deletion import DeleteRefused, delete_options, precondition_failure
from hami_testkit.kmock_seam import internals
from hami_testkit.restapi import JsonDict, kind_of, not_found, now_utc, stamp_create, stamp_update, status
from hami_testkit.smp import merge_patch_between, strategic_merge
from hami_testkit.store_index import stored

APPLY_PATCH = "application/apply-patch+yaml"
STRATEGIC = "application/strategic-merge-patch+json"
_MWCS = kmock.resource("admissionregistration.k8s.io/v1/mutatingwebhookconfigurations")


class Writable(Protocol):
    """What :func:`before_store` needs of the emulator."""

    revision: int
    admission: AdmissionStandIn | None

    @property
    def objects(self) -> Any: ...

    @property
    def resources(self) -> Any: ...

    def username(self, request: kmock.Request) -> str: ...

    def request(self, method: str, url: str, **kwargs: Any) -> Any: ...


def _json(code: int, body: Any) -> aiohttp.web.Response:
    return aiohttp.web.json_response(body, status=code)


def _strip_directives(node: Any) -> Any:
    if isinstance(node, dict):
        return {k: _strip_directives(v) for k, v in node.items() if not str(k).startswith("$")}
    if isinstance(node, list):
        return [_strip_directives(item) for item in node]
    return node


def _as_merge_patch(k: Writable, request: kmock.Request, patch: JsonDict) -> JsonDict:
    """A strategic merge patch as the merge patch that has the same effect on the stored object."""
    key = _key(request)
    if key not in k.objects or k.objects[key].deleted:
        stripped: JsonDict = _strip_directives(patch)
        return stripped  # kmock answers 404
    current = k.objects[key].raw
    schema = openapi.kind_schema(str(current.get("apiVersion", "")), str(current.get("kind", "")))
    if schema is None:  # no schema: lists are replaced, directives dropped
        merged = strategic_merge(current, patch, {}, lambda _: None)
    else:
        merged = strategic_merge(current, patch, schema[0], schema[1])
    result: JsonDict = merge_patch_between(current, merged if isinstance(merged, dict) else {})
    return result


def _key(request: kmock.Request, body: Mapping[str, Any] | None = None) -> tuple[Any, Any, Any]:
    namespace, name = objects.namespace(body) or None, objects.name(body) or None
    return request.resource, request.namespace or namespace, request.name or name


async def before_store(k: Writable, request: kmock.Request) -> aiohttp.web.StreamResponse | None:
    """An answer that replaces kmock's (SSA, a refusal), or None after preparing the request in place."""
    resource = request.resource
    if resource is None:
        return None
    content_type = request.headers.get("Content-Type", "")
    if request.method == kmock.method.PUT and request.name is not None and not request.subresource:
        return await _replace(k, request)
    if request.action == kmock.action.UPDATE and APPLY_PATCH in content_type:
        return await _server_side_apply(k, request)
    if request.action == kmock.action.CREATE and not request.subresource and isinstance(request.data, dict):
        return await _create(k, request, request.data)
    if request.action == kmock.action.UPDATE and request.data is not None:
        stale = _stale_version(k, request)
        if stale is not None:
            return stale
        if STRATEGIC in content_type and isinstance(request.data, dict):
            converted = _as_merge_patch(k, request, request.data)
            request.data.clear()
            request.data.update(converted)
        k.revision += 1
        stamp_update(request.data, k.revision)
    elif request.action == kmock.action.DELETE and request.name is not None:
        return _delete(k, request)
    return None


def _stale_version(k: Writable, request: kmock.Request) -> aiohttp.web.StreamResponse | None:
    """kube-apiserver's optimistic concurrency on a merge patch: one that names a ``resourceVersion``
    other than the stored one is 409 Conflict and changes nothing."""
    wanted = objects.meta(request.data).get("resourceVersion") if isinstance(request.data, dict) else None
    key = _key(request)
    if not wanted or key not in k.objects or k.objects[key].deleted:
        return None
    if str(wanted) == str(objects.meta(k.objects[key].raw).get("resourceVersion") or ""):
        return None
    assert request.resource is not None and request.name is not None
    return _json(409, _modified(str(request.resource.plural), request.name))


def _modified(plural: str, name: str) -> JsonDict:
    """409 Conflict for a write based on an older version of the object."""
    message = f'Operation cannot be fulfilled on {plural} "{name}": the object has been modified; '
    message += "please apply your changes to the latest version and try again"
    return status(409, "Conflict", message, {"name": name, "kind": plural})


def _delete(k: Writable, request: kmock.Request) -> aiohttp.web.StreamResponse | None:
    """A DELETE's options checked (:mod:`hami_testkit.deletion`); a dry run or a failed precondition answered
    here; else the object's last version stamped and kmock deletes it."""
    assert request.resource is not None
    if request.data is None and (request.body or b"").strip():
        return _json(400, status(400, "BadRequest", "the request body is not a DeleteOptions object"))
    try:
        options = delete_options(request.params, request.data)
    except DeleteRefused as exc:
        return _json(exc.code, exc.body)
    key = _key(request)
    if key not in k.objects or k.objects[key].deleted:
        return None  # kmock answers 404
    stored = k.objects[key].raw
    conflict = precondition_failure(options, stored, str(request.resource.plural))
    if conflict is not None:
        return _json(409, conflict)
    if options.get("dryRun"):
        return _json(200, stored)
    k.revision += 1
    k.objects[key].patch({"metadata": {"resourceVersion": str(k.revision)}})
    # kube-apiserver's part of a cascading delete, where a garbage collector runs to finish it
    # (hami_testkit.garbage_collector): Orphan and Foreground keep the object, marked by its finalizer
    policy = (
        "Orphan" if options.get("orphanDependents") is True else str(options.get("propagationPolicy") or "")
    )
    finalizer = {"Orphan": "orphan", "Foreground": "foregroundDeletion"}.get(policy)
    finalizers = list(objects.meta(stored).get("finalizers") or [])
    if finalizer and getattr(k, "collects_garbage", False) and finalizer not in finalizers:
        k.objects[key].patch({"metadata": {"finalizers": [*finalizers, finalizer]}})
    return None


async def _create(k: Writable, request: kmock.Request, body: JsonDict) -> aiohttp.web.StreamResponse | None:
    assert request.resource is not None
    meta = body.get("metadata") if isinstance(body.get("metadata"), dict) else None
    if meta is None or not (meta.get("name") or meta.get("generateName")):
        return _json(
            422, status(422, "Invalid", "metadata.name: Required value: name or generateName is required")
        )
    group, version = request.resource.group, request.resource.version
    body.setdefault("apiVersion", "v1" if not group else f"{group}/{version}")
    body.setdefault("kind", kind_of(k, request.resource))
    stamp_create(body, request.namespace, k.revision + 1, now_utc())  # the name, for what follows
    if request.resource.group == "" and request.resource.plural == "pods" and k.admission is not None:
        pod = apply_defaults(body)
        configs = [obj.raw for _, obj in stored(k, _MWCS) if not obj.deleted]
        mutated = await k.admission.mutate(pod, configs, k.username(request))
        if isinstance(mutated, Refused):
            return _json(mutated.code, status(mutated.code, reason_for(mutated), mutated.message))
        body.clear()
        body.update(mutated[0])
    elif request.resource.group == "" and request.resource.plural == "pods":
        body.setdefault("status", {"phase": "Pending"})
    if request.params.get("fieldValidation") == "Strict" and openapi.available():
        unknown = openapi.unknown_fields(body)
        if unknown:
            kind, version = body.get("kind", "?"), body.get("apiVersion", "?")
            fields = ", ".join(f'unknown field "{path}"' for path in unknown)
            message = f'{kind} in version "{version}" cannot be handled as a {kind}: '
            message += f"strict decoding error: {fields}"
            return _json(400, status(400, "BadRequest", message))
    k.revision += 1
    stamp_create(body, request.namespace, k.revision, now_utc())
    return None


async def _replace(k: Writable, request: kmock.Request) -> aiohttp.web.StreamResponse:
    """PUT: the object replaced whole (kmock has no PUT); a stale ``resourceVersion`` is a conflict."""
    assert request.resource is not None and request.name is not None
    plural, group = str(request.resource.plural), str(request.resource.group or "")
    if not isinstance(request.data, dict):
        return _json(400, status(400, "BadRequest", "the request body must be an object"))
    if group == "" and plural == "pods":  # admission policies guard pod writes: patches only here
        message = "the embedded apiserver does not replace pods; patch them instead"
        return _json(405, status(405, "MethodNotAllowed", message))
    key = _key(request)
    if key not in k.objects or k.objects[key].deleted:
        return _json(404, not_found(plural, request.name, group))
    old_meta = objects.meta(k.objects[key].raw)
    body = request.data
    meta = body.setdefault("metadata", {})
    if meta.get("resourceVersion") and meta["resourceVersion"] != old_meta.get("resourceVersion"):
        return _json(409, _modified(plural, request.name))
    for field in ("uid", "creationTimestamp", "namespace", "generation"):
        if old_meta.get(field) is not None:
            meta[field] = old_meta[field]
    body.setdefault("apiVersion", k.objects[key].raw.get("apiVersion"))
    body.setdefault("kind", k.objects[key].raw.get("kind"))
    kmock_parts = internals(k)
    async with kmock_parts.store_lock:
        k.revision += 1
        meta["resourceVersion"] = str(k.revision)
        k.objects[key].create(body)  # a new version that replaces the old one whole
        raw = k.objects[key].raw
        await kmock_parts.bus(request.resource).put({"type": "MODIFIED", "object": raw})
    return _json(200, raw)


async def _server_side_apply(k: Writable, request: kmock.Request) -> aiohttp.web.StreamResponse:
    try:
        body = yaml.safe_load(request.text or "")
    except yaml.YAMLError as exc:
        return _json(400, status(400, "BadRequest", f"error decoding YAML: {exc}"))
    if not isinstance(body, dict):
        return _json(400, status(400, "BadRequest", "the applied configuration must be an object"))
    body.get("metadata", {}).pop("managedFields", None)
    headers: dict[str, str] = {"Authorization": request.headers.get("Authorization", "")}
    params = {k_: v for k_, v in request.params.items() if k_ in ("fieldValidation", "dryRun")}
    path = request.url.path
    key = _key(request)
    if key in k.objects and not k.objects[key].deleted:
        headers["Content-Type"] = STRATEGIC
        method, target = "PATCH", path
    else:
        method, target = "POST", path.rsplit("/", 1)[0]
    async with k.request(method, target, data=json.dumps(body), headers=headers, params=params) as response:
        payload = await response.read()
        answer = aiohttp.web.Response(status=response.status, body=payload)
        answer.content_type = "application/json"
        return answer


def error_status(exc: Exception, request: kmock.Request | None) -> tuple[int, JsonDict]:
    """kube-apiserver's ``Status`` for an exception raised while serving ``request``."""
    resource = request.resource if request is not None else None
    if isinstance(exc, kmock.KubernetesError):
        named = resource is not None and resource.plural and request is not None
        name = (request.name if request is not None else None) or ""
        if isinstance(exc, kmock.KubernetesNotFoundError):
            if named and name and isinstance(exc, kmock.KubernetesObjectNotFoundError):
                assert resource is not None
                return 404, not_found(str(resource.plural), name, str(resource.group or ""))
            return 404, status(404, "NotFound", "the server could not find the requested resource")
        if exc.status == 409 and exc.reason == "Object Already Exists" and named:
            assert resource is not None and request is not None
            name = name or objects.name(request.data)
            which = {"name": name, "kind": str(resource.plural)}
            return 409, status(409, "AlreadyExists", f'{resource.plural} "{name}" already exists', which)
        details: Mapping[str, Any] | None = None
        if isinstance(exc.details, Mapping) and "traceback" not in exc.details:
            details = exc.details
        reason = exc.reason or "InternalError"
        return exc.status, status(exc.status, reason, exc.message or reason, details)
    if isinstance(exc, jsonpatch.JsonPatchException | jsonpatch.JsonPointerException):
        # a JSON patch that does not apply (a failed ``test`` included): kmock applies it whole or not
        # at all, and kube-apiserver answers 422
        message = f"the server rejected our request due to an error in our request: {exc}"
        return 422, status(422, "Invalid", message)
    return 500, status(500, "InternalError", f"Internal error occurred: {exc}")
