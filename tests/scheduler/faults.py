"""API faults for the bind tests: kube-apiserver's Binding conflicts, lost answers, and late writes.

- :func:`conflicting_bindings`: a Binding of a pod that already has ``spec.nodeName`` is answered 409
  (``pod p is already assigned to node "n2"``), and one whose ``metadata.uid`` is not the pod's is
  answered 409 too, as kube-apiserver does (the embedded server would move the pod).
- :func:`lost_binding`: the Binding is applied, then the answer is lost (500, or a hang past the
  client's timeout). kmock applies a PATCH before any reaction runs, so ``<< 500`` on a PATCH already
  is "applied, answer lost"; this is the same for the ``binding`` subresource.
- :class:`FaultProxy`: an HTTP proxy in front of the embedded API server (watch streams included)
  that can *defer* a matching request: the client gets 500 at once, and the request reaches the API
  server only when the test calls :meth:`FaultProxy.deliver` — a write that lands after its sender
  gave up on it.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import kmock
import pytest
from aiohttp import web

from hami_testkit.restapi import Response  # kmock.Response (exported, not in its __all__)

PODS = kmock.resource("v1/pods")
BINDING = kmock.subresource("binding")


def _status(code: int, reason: str, message: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Status", "status": "Failure", "reason": reason, "code": code,
            "message": message}  # fmt: skip


async def apply_binding(apiserver: kmock.KubernetesEmulator, request: kmock.Request) -> Response | None:
    """Apply one Binding as kube-apiserver would; a Response when it refuses, None when applied."""
    path = f"/api/v1/namespaces/{request.namespace}/pods/{request.name}"
    found = await apiserver.get(path)
    if found.status != 200:
        return Response(status=found.status, payload=await found.json())
    pod = await found.json()
    current = (pod.get("spec") or {}).get("nodeName")
    name = request.name
    if current:
        message = (
            f'Operation cannot be fulfilled on pods/binding "{name}": '
            f'pod {name} is already assigned to node "{current}"'
        )
        return Response(status=409, payload=_status(409, "Conflict", message))
    uid = (request.data.get("metadata") or {}).get("uid")
    if uid and uid != (pod.get("metadata") or {}).get("uid"):
        stored = (pod.get("metadata") or {}).get("uid")
        message = f"Precondition failed: UID in precondition: {uid}, UID in object meta: {stored}"
        return Response(status=409, payload=_status(409, "Conflict", message))
    await apiserver.patch(path, json={"spec": {"nodeName": request.data["target"]["name"]}})
    return None


def conflicting_bindings(apiserver: kmock.KubernetesEmulator) -> None:
    """Bindings as kube-apiserver answers them: 409 for a pod already bound or a uid that differs."""

    async def bind(request: kmock.Request) -> Any:
        refused = await apply_binding(apiserver, request)
        if refused is not None:
            return refused
        return {"apiVersion": "v1", "kind": "Status", "status": "Success", "code": 201}

    (apiserver**5)["post", PODS, BINDING] << bind


def lost_binding(
    apiserver: kmock.KubernetesEmulator, *, release: asyncio.Event | None = None, times: int = 1
) -> list[str]:
    """The next ``times`` Bindings are applied and their answers lost: 500 at once, or (with
    ``release``) held until the event is set, past the client's timeout. Returns the names bound."""
    bound: list[str] = []

    async def bind(request: kmock.Request) -> Response:
        refused = await apply_binding(apiserver, request)
        if refused is not None:
            return refused
        bound.append(str(request.name))
        if release is not None:
            await release.wait()
        return Response(status=500, payload=_status(500, "InternalError", "answer lost"))

    (apiserver**10)["post", PODS, BINDING][:times] << bind
    return bound


@dataclass
class Deferred:
    """Requests matching ``match`` (method, path, body) are held, ``times`` of them at most, and
    answered ``status`` at once; held requests reach the API server only through ``deliver``."""

    match: Callable[[str, str, bytes], bool]
    times: int = 1
    status: int = 500
    held: list[tuple[str, str, dict[str, str], bytes]] = field(default_factory=list)
    seen: asyncio.Event = field(default_factory=asyncio.Event)


class FaultProxy:
    """Forwards everything to ``upstream`` except the requests a :class:`Deferred` holds."""

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream.rstrip("/")
        self.faults: list[Deferred] = []
        self.url = ""
        self._session: aiohttp.ClientSession | None = None
        self._runner: web.AppRunner | None = None

    def defer(self, match: Callable[[str, str, bytes], bool], times: int = 1, status: int = 500) -> Deferred:
        fault = Deferred(match=match, times=times, status=status)
        self.faults.append(fault)
        return fault

    async def deliver(self, fault: Deferred) -> list[int]:
        """Send the held requests to the API server now; their statuses."""
        assert self._session is not None
        statuses = []
        for method, path, headers, body in fault.held:
            async with self._session.request(method, self.upstream + path, headers=headers, data=body) as got:
                await got.read()
                statuses.append(got.status)
        fault.held.clear()
        return statuses

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        assert self._session is not None
        body = await request.read()
        path = request.rel_url.raw_path_qs
        headers = {
            k: v for k, v in request.headers.items() if k.lower() in ("content-type", "accept", "user-agent")
        }
        for fault in self.faults:
            if fault.times > 0 and fault.match(request.method, request.rel_url.path, body):
                fault.times -= 1
                fault.held.append((request.method, path, headers, body))
                fault.seen.set()
                reason = "InternalError" if fault.status >= 500 else "Invalid"
                payload = _status(fault.status, reason, "injected by the fault proxy")
                return web.Response(
                    status=fault.status, text=json.dumps(payload), content_type="application/json"
                )
        async with self._session.request(
            request.method, self.upstream + path, headers=headers, data=body or None
        ) as got:
            response = web.StreamResponse(status=got.status)
            response.content_type = got.content_type
            await response.prepare(request)
            try:
                async for chunk in got.content.iter_any():
                    await response.write(chunk)
            except (aiohttp.ClientError, ConnectionResetError):
                pass  # the upstream stream ended (shutdown): the client sees the stream end
            await response.write_eof()
            return response

    async def start(self) -> None:
        self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None))
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, shutdown_timeout=0.1)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = self._runner.addresses[0][1]
        self.url = f"http://127.0.0.1:{port}"

    async def stop(self) -> None:
        if self._session is not None:
            await self._session.close()
        if self._runner is not None:
            await self._runner.cleanup()


@pytest.fixture(name="proxy")
async def proxy_fixture(apiserver: kmock.KubernetesEmulator) -> AsyncIterator[FaultProxy]:
    """A fault proxy in front of this test's API server. Request it before ``start_extender`` (the
    proxy must outlive the extenders that talk through it)."""
    running = FaultProxy(str(apiserver.url))
    await running.start()
    yield running
    await running.stop()


def pod_write(name: str, needle: str = "") -> Callable[[str, str, bytes], bool]:
    """Matches a PATCH of pod ``default/<name>`` whose body contains ``needle``."""
    path = f"/api/v1/namespaces/default/pods/{name}"
    return lambda method, at, body: method == "PATCH" and at == path and needle.encode() in body
