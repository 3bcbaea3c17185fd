"""The API server of the stress programs: the test kit's embedded apiserver, as every other test uses it.

:func:`running` starts :func:`hami_testkit.apiserver.embedded_apiserver` (kube-apiserver's rules: a new
``resourceVersion`` on every write, 422 for a failed JSON-patch ``test``, 409 for a merge patch naming a
stale ``resourceVersion``, 409 for a Binding of a pod that has a node or another uid; docs/testing.md,
"The API server: kmock") and yields an :class:`Objects`: what the world itself reads and writes. Reads
come straight from the emulator's store (``KubernetesEmulator.objects``, kmock's public view; copies, so
the caller cannot change what is stored); writes go over HTTP like any client's, so watchers see them.
The scheduler and the agent reach the same server through :class:`~.faults.FaultProxy`.

Test code only; imports the test kit.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator, Mapping
from typing import Any

import aiohttp
import kmock

from hami_testkit.apiserver import AdmittingEmulator, embedded_apiserver
from hami_testkit.kubeapi import ApiError, SimApi

__all__ = ["ApiError", "Objects", "running"]

RESOURCES = {"pods": kmock.resource("v1/pods"), "nodes": kmock.resource("v1/nodes")}


def _copy(raw: Mapping[str, Any]) -> dict[str, Any]:
    copied: dict[str, Any] = json.loads(json.dumps(raw))
    return copied


def _path(plural: str, namespace: str | None, name: str | None = None, sub: str | None = None) -> str:
    path = f"/api/v1/namespaces/{namespace}/{plural}" if namespace else f"/api/v1/{plural}"
    return path + (f"/{name}" if name else "") + (f"/{sub}" if sub else "")


class Objects:
    """Pods and nodes of one embedded apiserver: read from its store, written over HTTP."""

    def __init__(self, emulator: AdmittingEmulator, api: SimApi) -> None:
        self.emulator = emulator
        self.api = api
        self.url = str(emulator.url).rstrip("/")

    # ----------------------------------------------------------------------------------------- reads
    def get(self, plural: str, namespace: str | None, name: str) -> dict[str, Any] | None:
        key = (RESOURCES[plural], namespace, name)
        stored = self.emulator.objects
        if key not in stored or stored[key].deleted:
            return None
        return _copy(stored[key].raw)

    def list(self, plural: str, namespace: str | None = None) -> list[dict[str, Any]]:
        """Objects in creation order (in ``namespace`` when given)."""
        return [
            _copy(obj.raw)
            for (resource, ns, _), obj in list(self.emulator.objects.items())
            if resource == RESOURCES[plural] and not obj.deleted and (namespace is None or ns == namespace)
        ]

    # ---------------------------------------------------------------------------------------- writes
    async def create(self, plural: str, body: Mapping[str, Any]) -> dict[str, Any]:
        namespace = (body.get("metadata") or {}).get("namespace")
        return await self.api.create(_path(plural, namespace), body)

    async def delete(self, plural: str, namespace: str | None, name: str) -> None:
        await self.api.delete(_path(plural, namespace, name))

    async def patch(self, plural: str, namespace: str | None, name: str, patch: Any) -> dict[str, Any]:
        """A JSON patch (list) or a merge patch (dict); raises :class:`ApiError`."""
        path = _path(plural, namespace, name)
        if isinstance(patch, list):
            return await self.api.json_patch(path, patch)
        return await self.api.merge_patch(path, patch)

    async def set_status(self, namespace: str, name: str, status: Mapping[str, Any]) -> dict[str, Any]:
        """What kubelet writes: ``pods/<name>/status``."""
        return await self.api.merge_patch(_path("pods", namespace, name, "status"), {"status": dict(status)})


@contextlib.asynccontextmanager
async def running() -> AsyncIterator[Objects]:
    """An embedded apiserver on an OS-chosen loopback port, and the world's access to it."""
    async with embedded_apiserver() as emulator, aiohttp.ClientSession() as session:
        yield Objects(emulator, SimApi(session, str(emulator.url)))
