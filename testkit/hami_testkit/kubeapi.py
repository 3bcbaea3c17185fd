"""A small async REST client for the embedded API server, used by the demo and its stand-ins.

Owns the handful of calls the simulation needs (get, list, create, merge/JSON patch, delete, watch)
as raw JSON dicts over aiohttp. The services use ``hami.kube`` (the official client); the stand-ins
run on the same event loop as the embedded apiserver, where the sync client must not run, so they
speak HTTP directly. Simulation only. Must not import the Kubernetes client, ``webhook`` or ``nodeagent``.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Mapping
from typing import Any

import aiohttp

JsonDict = dict[str, Any]

MERGE_PATCH = "application/merge-patch+json"
JSON_PATCH = "application/json-patch+json"


class ApiError(RuntimeError):
    """A non-2xx answer: keeps the status, the API's reason and message, and the request line."""

    def __init__(self, status: int, reason: str, message: str, request: str) -> None:
        super().__init__(f"{request}: HTTP {status} {reason}: {message}")
        self.status = status
        self.reason = reason
        self.message = message


def pods_path(namespace: str | None = None, name: str | None = None, sub: str | None = None) -> str:
    path = "/api/v1/pods" if namespace is None else f"/api/v1/namespaces/{namespace}/pods"
    if name is not None:
        path += f"/{name}"
    if sub is not None:
        path += f"/{sub}"
    return path


def nodes_path(name: str | None = None) -> str:
    return "/api/v1/nodes" if name is None else f"/api/v1/nodes/{name}"


MWC_PATH = "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations"


class SimApi:
    """Raw JSON access to one apiserver at ``base_url`` through a caller-owned aiohttp session."""

    def __init__(self, session: aiohttp.ClientSession, base_url: str, token: str | None = None) -> None:
        self._session = session
        self._base = base_url.rstrip("/")
        self._headers = {"Authorization": f"Bearer {token}"} if token else {}

    async def _call(self, method: str, path: str, body: Any = None, content_type: str | None = None) -> Any:
        headers = dict(self._headers)
        data = None
        if body is not None:
            headers["Content-Type"] = content_type or "application/json"
            data = json.dumps(body)
        async with self._session.request(method, self._base + path, data=data, headers=headers) as response:
            text = await response.text()
            if response.status >= 300:
                reason, message = response.reason or "", text[:500]
                try:
                    status = json.loads(text)
                    reason, message = str(status.get("reason", reason)), str(status.get("message", message))
                except (ValueError, AttributeError):
                    pass
                raise ApiError(response.status, reason, message, f"{method} {path}")
            return json.loads(text) if text else None

    async def get(self, path: str) -> JsonDict | None:
        """The object at ``path``, or None when it does not exist (404)."""
        try:
            result: JsonDict = await self._call("GET", path)
        except ApiError as exc:
            if exc.status == 404:
                return None
            raise
        return result

    async def list_objects(self, path: str) -> list[JsonDict]:
        result = await self._call("GET", path)
        items: list[JsonDict] = result.get("items") or []
        return items

    async def create(self, path: str, body: Mapping[str, Any]) -> JsonDict:
        result: JsonDict = await self._call("POST", path, body)
        return result

    async def merge_patch(self, path: str, body: Mapping[str, Any]) -> JsonDict:
        result: JsonDict = await self._call("PATCH", path, body, MERGE_PATCH)
        return result

    async def json_patch(self, path: str, operations: list[JsonDict]) -> JsonDict:
        result: JsonDict = await self._call("PATCH", path, operations, JSON_PATCH)
        return result

    async def delete(self, path: str) -> None:
        await self._call("DELETE", path)

    async def watch(self, path: str) -> AsyncIterator[tuple[str, JsonDict]]:
        """Yield ``(type, object)`` forever, reconnecting when the stream ends.

        No ``resourceVersion`` is sent, so every (re)connect starts with the whole current state as
        ADDED events; consumers must treat ADDED as "upsert".
        """
        headers = dict(self._headers)
        while True:
            try:
                async with self._session.get(
                    self._base + path,
                    params={"watch": "true"},
                    headers=headers,
                    timeout=aiohttp.ClientTimeout(total=None, sock_read=None),
                ) as response:
                    if response.status >= 300:
                        raise ApiError(response.status, response.reason or "", await response.text(), path)
                    async for line in response.content:
                        if not line.strip():
                            continue
                        event = json.loads(line)
                        yield str(event.get("type", "")), event.get("object") or {}
            except (aiohttp.ClientPayloadError, aiohttp.ServerDisconnectedError):
                pass  # the stream broke: reconnect and start again from the full state
            await asyncio.sleep(0.2)  # do not spin when the server is going away
