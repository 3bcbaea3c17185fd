"""The API server behind the fault proxy: kmock's object store, served with kube-apiserver's rules.

kmock's emulator keeps the objects (``KubernetesEmulator.objects``: every version kept, merge and JSON
patches applied by kmock's own ``Object.patch``). Its HTTP dispatch is not used: it matches every
request against its whole request history, so each request costs more than the one before (a PATCH
took 3 ms after 20 requests, 17 ms after 100), which a stress run of thousands of requests cannot
afford. :class:`Store` serves the core-group REST calls the scheduler and the agent make straight from
that store, with what kube-apiserver does and kmock does not:

* every write sets a new ``metadata.resourceVersion`` (one counter, like etcd's revision), in the same
  step as the write (a JSON patch gets one more ``add`` op, so a failed ``test`` stores nothing);
* a failed JSON-patch ``test`` (or an op that does not apply) is 422, a merge patch naming a stale
  ``resourceVersion`` is 409;
* ``pods/binding``: 404 for a missing pod, 409 when the Binding's UID precondition fails or the pod
  already has a node, else ``spec.nodeName`` is set.

Test code only; imports kmock and jsonpatch (through kmock).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

import jsonpatch
import kmock

CORE = {
    "pods": kmock.resource("v1/pods"),
    "nodes": kmock.resource("v1/nodes"),
    "events": kmock.resource("v1/events"),
}


class ApiError(Exception):
    """An answer other than 2xx, as kube-apiserver's ``Status``."""

    def __init__(self, code: int, reason: str, message: str) -> None:
        super().__init__(message)
        self.code, self.reason, self.message = code, reason, message

    def status(self) -> dict[str, Any]:
        return {
            "kind": "Status",
            "apiVersion": "v1",
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        }


def _copy(raw: Mapping[str, Any]) -> dict[str, Any]:
    copied: dict[str, Any] = json.loads(json.dumps(raw))
    return copied


class Store:
    """Core-group objects (pods, nodes, events) in ``k``'s store, read and written as kube-apiserver would."""

    def __init__(self, k: kmock.KubernetesEmulator) -> None:
        self.k = k
        self._version = 0

    def next_version(self) -> str:
        self._version += 1
        return str(self._version)

    def _object(self, plural: str, namespace: str | None, name: str) -> Any:
        key = (CORE[plural], namespace, name)
        if key not in self.k.objects:
            return None
        obj = self.k.objects[key]
        return None if obj.deleted else obj

    def _missing(self, plural: str, name: str) -> ApiError:
        return ApiError(404, "NotFound", f'{plural} "{name}" not found')

    # ----------------------------------------------------------------------------------------- reads
    def get(self, plural: str, namespace: str | None, name: str) -> dict[str, Any] | None:
        obj = self._object(plural, namespace, name)
        return None if obj is None else _copy(obj.raw)

    def list(self, plural: str, namespace: str | None = None) -> list[dict[str, Any]]:
        """Objects in creation order (in ``namespace`` when given)."""
        return [
            _copy(obj.raw)
            for (resource, ns, _), obj in list(self.k.objects.items())
            if resource == CORE[plural] and not obj.deleted and (namespace is None or ns == namespace)
        ]

    # ---------------------------------------------------------------------------------------- writes
    def create(self, plural: str, body: Mapping[str, Any]) -> dict[str, Any]:
        metadata = body.get("metadata") or {}
        namespace, name = metadata.get("namespace"), str(metadata.get("name") or "")
        if self._object(plural, namespace, name) is not None:
            raise ApiError(409, "AlreadyExists", f'{plural} "{name}" already exists')
        stored = _copy(body)
        stored.setdefault("metadata", {})["resourceVersion"] = self.next_version()
        key = (CORE[plural], namespace, name)
        if key in self.k.objects:
            self.k.objects[key].create(stored)  # deleted before: a new life, the history kept
        else:
            self.k.objects[key] = stored
        return _copy(stored)

    def delete(self, plural: str, namespace: str | None, name: str) -> None:
        obj = self._object(plural, namespace, name)
        if obj is None:
            raise self._missing(plural, name)
        obj.delete()

    def patch(self, plural: str, namespace: str | None, name: str, patch: Any) -> dict[str, Any]:
        """A JSON patch (list) or a merge patch (dict); raises :class:`ApiError`."""
        obj = self._object(plural, namespace, name)
        if obj is None:
            raise self._missing(plural, name)
        version = self.next_version()
        if isinstance(patch, list):
            patch = [*patch, {"op": "add", "path": "/metadata/resourceVersion", "value": version}]
            try:
                jsonpatch.apply_patch(_copy(obj.raw), patch)  # check first: kmock would store half a failure
            except (jsonpatch.JsonPatchException, jsonpatch.JsonPointerException) as exc:
                raise ApiError(422, "Invalid", f"the server rejected our request: {exc}") from exc
        elif isinstance(patch, dict):
            wanted = (patch.get("metadata") or {}).get("resourceVersion")
            if wanted and wanted != (obj.raw.get("metadata") or {}).get("resourceVersion"):
                raise ApiError(
                    409, "Conflict", "the object has been modified; apply your changes to the latest version"
                )
            patch = {**patch, "metadata": {**(patch.get("metadata") or {}), "resourceVersion": version}}
        else:
            raise ApiError(400, "BadRequest", "a patch is a JSON object or a JSON array")
        obj.patch(patch)
        return _copy(obj.raw)

    def bind(self, namespace: str, name: str, body: Mapping[str, Any]) -> dict[str, Any]:
        """``POST pods/<name>/binding``."""
        pod = self.get("pods", namespace, name)
        if pod is None:
            raise self._missing("pods", name)
        uid = (body.get("metadata") or {}).get("uid")
        current = (pod.get("metadata") or {}).get("uid")
        if uid and uid != current:
            raise ApiError(
                409,
                "Conflict",
                f"Precondition failed: UID in precondition: {uid}, UID in object meta: {current}",
            )
        node = (pod.get("spec") or {}).get("nodeName")
        if node:
            raise ApiError(409, "Conflict", f"pod {name} is already assigned to node {node!r}")
        self.patch("pods", namespace, name, {"spec": {"nodeName": (body.get("target") or {}).get("name")}})
        return {"apiVersion": "v1", "kind": "Status", "status": "Success", "code": 201}


_PATH = re.compile(
    r"^/api/v1/(?:namespaces/(?P<ns>[^/]+)/)?(?P<plural>[a-z]+)(?:/(?P<name>[^/]+))?(?:/(?P<sub>[a-z]+))?$"
)


def serve(store: Store, method: str, path: str, body: bytes) -> tuple[int, dict[str, Any]]:
    """One REST call: ``(status, JSON body)``."""
    match = _PATH.match(path)
    if match is None or match["plural"] not in CORE:
        return 404, ApiError(404, "NotFound", f"{path} is not served here").status()
    namespace, plural, name, sub = match["ns"], match["plural"], match["name"], match["sub"]
    try:
        data = json.loads(body) if body else None
        if name is None and method == "GET":
            kind = {"pods": "PodList", "nodes": "NodeList", "events": "EventList"}[plural]
            meta = {"resourceVersion": str(store._version)}
            return 200, {
                "apiVersion": "v1",
                "kind": kind,
                "metadata": meta,
                "items": store.list(plural, namespace),
            }
        if name is None and method == "POST":
            return 201, store.create(
                plural,
                {**(data or {}), "metadata": {"namespace": namespace, **(data or {}).get("metadata", {})}},
            )
        if name is not None and sub == "binding" and method == "POST" and plural == "pods" and namespace:
            return 201, store.bind(namespace, name, data or {})
        if name is not None and sub in (None, "status"):
            if method == "GET" and sub is None:
                found = store.get(plural, namespace, name)
                if found is None:
                    raise ApiError(404, "NotFound", f'{plural} "{name}" not found')
                return 200, found
            if method == "PATCH":
                return 200, store.patch(plural, namespace, name, data)
            if method == "DELETE" and sub is None:
                store.delete(plural, namespace, name)
                return 200, {"kind": "Status", "apiVersion": "v1", "status": "Success"}
    except ApiError as exc:
        return exc.code, exc.status()
    except ValueError as exc:
        return 400, ApiError(400, "BadRequest", str(exc)).status()
    return 405, ApiError(405, "MethodNotAllowed", f"{method} {path} is not served here").status()
