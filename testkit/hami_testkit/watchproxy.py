"""A streaming reverse proxy in front of an API server that breaks watches on command.

Owns :class:`WatchProxy`: serves on 127.0.0.1 (OS-chosen port) and forwards every request to
``upstream`` unchanged (method, path and query, body, ``Authorization``, ``Content-Type``, ``Accept``,
``User-Agent``), streaming the answer chunk by chunk, so watches pass through as they are. Its faults,
each armed by the caller (a test or ``benchmarks/bench_faults.py``; docs/scale.md, "Scale faults"):

* :meth:`WatchProxy.break_watches` ends every open watch stream of one resource (``pods``, ``nodes``,
  ...) and, with ``gone=True``, answers that resource's next watch requests naming a
  ``resourceVersion`` with kube-apiserver's ``410 Gone`` Status (``Expired``: the version was
  compacted), so the client lists again: a relist, as after an etcd compaction or an API server restart.
* :meth:`WatchProxy.hold_lists`: the next LISTs of a resource are served by the API server at once (each
  list is taken at that moment's resourceVersion) but their answers are held until
  :meth:`WatchProxy.release`; :meth:`WatchProxy.hold_watches` holds the next watch requests before they
  reach the API server. So a caller decides exactly what happens between a list being taken, the client
  applying it, and the watch that follows it catching up.

Counters: ``lists`` and ``watches`` per resource (requests forwarded), ``gone`` (410s answered). Test-kit
code: imports aiohttp only.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
from dataclasses import dataclass, field

import aiohttp
from aiohttp import web

_PATH = re.compile(r"^/api/v1/(?:namespaces/[^/]+/)?([a-z]+)$")
_FORWARDED = ("Authorization", "Content-Type", "Accept", "User-Agent")


@dataclass(eq=False)
class _Gate:
    """Requests of one kind (LIST answers, or watch requests) of one resource, held until released."""

    armed: int = 0  # how many more to hold
    open: asyncio.Event = field(default_factory=asyncio.Event)
    held: int = 0  # waiting now

    async def pass_(self) -> None:
        if self.armed <= 0:
            return
        self.armed -= 1
        self.held += 1
        try:
            await self.open.wait()
        finally:
            self.held -= 1


def _gone() -> web.Response:
    body = {
        "kind": "Status",
        "apiVersion": "v1",
        "status": "Failure",
        "message": "too old resource version (the proxy broke the watch)",
        "reason": "Expired",
        "code": 410,
    }
    return web.Response(status=410, body=json.dumps(body).encode(), content_type="application/json")


class WatchProxy:
    """``url`` serves ``upstream``; see the module docstring. ``async with WatchProxy(up) as proxy``."""

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream.rstrip("/")
        self.url = ""
        self.lists: dict[str, int] = {}
        self.watches: dict[str, int] = {}
        self.gone = 0
        self._streams: dict[str, set[aiohttp.ClientResponse]] = {}
        self._gone: set[str] = set()
        self._breaks: dict[str, int] = {}  # per resource, how many times its watches were broken
        self._gates: dict[tuple[str, str], _Gate] = {}
        self._session: aiohttp.ClientSession | None = None
        self._runner: web.AppRunner | None = None

    async def __aenter__(self) -> WatchProxy:
        connector = aiohttp.TCPConnector(limit=0)
        self._session = aiohttp.ClientSession(
            connector=connector, timeout=aiohttp.ClientTimeout(total=None), auto_decompress=False
        )
        app = web.Application(client_max_size=256 * 1024 * 1024)
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, handle_signals=False, shutdown_timeout=1.0)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        host, port = self._runner.addresses[0][:2]
        self.url = f"http://{host}:{port}"
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        for gate in self._gates.values():
            gate.armed = 0
            gate.open.set()
        for streams in self._streams.values():
            for stream in list(streams):
                stream.close()
        if self._runner is not None:
            await self._runner.cleanup()
        if self._session is not None:
            await self._session.close()

    # ------------------------------------------------------------------------------------ faults
    def break_watches(self, resource: str, *, gone: bool = True) -> int:
        """End every open watch of ``resource``; with ``gone``, its next resumes get 410. How many ended."""
        if gone:
            self._gone.add(resource)
        self._breaks[resource] = self._breaks.get(resource, 0) + 1  # a watch on its way ends too
        streams = self._streams.get(resource, set())
        for stream in list(streams):
            stream.close()
        return len(streams)

    def open_watches(self, resource: str) -> int:
        return len(self._streams.get(resource, ()))

    def hold_lists(self, resource: str, count: int = 1) -> None:
        """Hold the answers of ``resource``'s next ``count`` LISTs (each taken by the API server at once)."""
        self._arm(("list", resource), count)

    def hold_watches(self, resource: str, count: int = 1) -> None:
        """Hold ``resource``'s next ``count`` watch requests before they reach the API server."""
        self._arm(("watch", resource), count)

    def _arm(self, key: tuple[str, str], count: int) -> None:
        gate = self._gates.setdefault(key, _Gate())
        gate.armed += count
        gate.open.clear()

    def held(self, resource: str, what: str = "list") -> int:
        """Requests (``what``: ``list`` or ``watch``) of ``resource`` waiting to be released now."""
        gate = self._gates.get((what, resource))
        return gate.held if gate is not None else 0

    def release(self, resource: str, what: str = "list") -> None:
        """Let the held ``what`` (``list`` or ``watch``) requests of ``resource`` go, and hold no more."""
        gate = self._gates.get((what, resource))
        if gate is not None:
            gate.armed = 0
            gate.open.set()

    # ----------------------------------------------------------------------------------- serving
    async def _handle(self, request: web.Request) -> web.StreamResponse:
        assert self._session is not None
        match = _PATH.match(request.path) if request.method == "GET" else None
        resource = match.group(1) if match else None
        watching = request.query.get("watch") in ("true", "1", "True")
        breaks = self._breaks.get(resource or "", 0)
        if resource is not None and watching:
            if resource in self._gone and request.query.get("resourceVersion"):
                self._gone.discard(resource)
                self.gone += 1
                return _gone()
            await self._gates.get(("watch", resource), _Gate()).pass_()
            self.watches[resource] = self.watches.get(resource, 0) + 1
        elif resource is not None:
            self.lists[resource] = self.lists.get(resource, 0) + 1
        headers = {k: request.headers[k] for k in _FORWARDED if k in request.headers}
        body = await request.read()
        upstream = await self._session.request(
            request.method, self.upstream + request.path_qs, data=body or None, headers=headers
        )
        try:
            gate = self._gates.get(("list", resource)) if resource is not None and not watching else None
            if gate is not None and gate.armed > 0:
                payload = await upstream.read()  # taken now; answered on release
                await gate.pass_()
                return web.Response(status=upstream.status, body=payload, content_type=upstream.content_type)
            response = web.StreamResponse(status=upstream.status)
            response.content_type = upstream.content_type
            try:
                await response.prepare(request)
            except ConnectionError:  # the caller gave up (its read timeout) before the answer came
                return response
            streams = self._streams.setdefault(resource, set()) if resource and watching else None
            if streams is not None:
                streams.add(upstream)
                if self._breaks.get(resource or "", 0) != breaks:  # broken while it was being opened
                    upstream.close()
            try:
                with contextlib.suppress(aiohttp.ClientError, ConnectionError):
                    async for chunk in upstream.content.iter_any():
                        await response.write(chunk)
            finally:
                if streams is not None:
                    streams.discard(upstream)
            with contextlib.suppress(ConnectionError, RuntimeError):
                await response.write_eof()
            return response
        finally:
            upstream.release()
