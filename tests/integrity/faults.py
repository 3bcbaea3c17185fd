"""The API server the components under test talk to, with faults as data.

The scheduler and the node agent reach the API server (the test kit's embedded apiserver, started by
:func:`~.apiserver.running`) over HTTP through :class:`FaultProxy`, a reverse proxy on 127.0.0.1 with an
OS-chosen port that forwards each request to it unchanged and returns its answer unchanged. Each
request is classified (``pod-get``, ``pod-patch``, ``binding``, ``node-get``, ``node-patch``,
``pod-list``, ``event``, ``other``), attributed to a caller by its User-Agent (``integrity-scheduler``
or ``integrity-agent``, see :data:`WHO`) and checked against the armed one-shot :class:`Rule` list.
A matching rule applies its :class:`Mode`:

* ``fail``  the request is answered 500 and never applied;
* ``lost``  applied, but the answer is lost (500): the caller cannot tell whether it landed;
* ``late``  answered 504 at once (the caller gives up), applied only when the program releases it:
  a write that lands after its writer gave up (and maybe after its undo);
* ``hold``  parked: applied and answered when released (a slow API server);
* ``slow``  applied at once, the answer parked until released (a lost-in-transit answer that arrives).

A parked request has a time limit (``limit``, on the world's ``clock``), as kube-apiserver times a request
out: released after it, a held or late request is never applied and a held answer becomes a 504.

Nothing here sleeps: parked requests wait on an ``asyncio.Event`` that the program sets (``release``).
The proxy keeps the counters the settle loop needs (``received``, ``inflight``, ``waiting``,
``released``). Events are never faulted. The faults live here, in front of the API server, not in
it: the test kit's emulator stays the one every test uses. Test code only; imports aiohttp.
"""

from __future__ import annotations

import asyncio
import datetime
import json
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from enum import StrEnum

import aiohttp
from aiohttp import web

#: User-Agent prefix -> caller name used in rules (``load_api_client(component=...)``).
WHO = {"integrity-scheduler": "scheduler", "integrity-agent": "agent"}

_POD = re.compile(r"^/api/v1/namespaces/[^/]+/pods/([^/]+)(?:/([^/]+))?$")
_NODE = re.compile(r"^/api/v1/nodes/([^/]+)(?:/status)?$")
_PODS = re.compile(r"^/api/v1/(?:namespaces/[^/]+/)?pods$")
_EVENTS = re.compile(r"^/api/v1/namespaces/[^/]+/events")


class Mode(StrEnum):
    FAIL = "fail"
    LOST = "lost"
    LATE = "late"
    HOLD = "hold"
    SLOW = "slow"


def classify(method: str, path: str) -> tuple[str, str | None]:
    """``(kind, subject)``: what a request does and the pod or node it names."""
    method = method.upper()
    if _EVENTS.match(path):
        return "event", None
    if match := _POD.match(path):
        name, sub = match.groups()
        if sub == "binding":
            return "binding", name
        if sub is not None:
            return f"pod-{sub}", name
        return {"GET": "pod-get", "PATCH": "pod-patch", "DELETE": "pod-delete"}.get(method, "other"), name
    if match := _NODE.match(path):
        return {"GET": "node-get", "PATCH": "node-patch"}.get(method, "other"), match.group(1)
    if _PODS.match(path) and method == "GET":
        return "pod-list", None
    return "other", None


@dataclass(eq=False, kw_only=True)
class Rule:
    """One armed fault: the ``skip``+1-th request of ``who`` doing ``kind`` on ``subject`` gets ``mode``."""

    owner: int  # the actor that armed it (disarmed with it)
    who: str
    kind: str
    subject: str | None
    mode: Mode
    skip: int = 0


@dataclass(frozen=True, kw_only=True)
class Call:
    """One request as the proxy forwards it (what an observer sees before it lands)."""

    who: str
    kind: str
    subject: str | None
    method: str
    target: str  # path and query
    body: bytes
    content_type: str | None


#: Called before a request is applied; may return a callback that receives the answer's status.
Observer = Callable[[Call], Awaitable[Callable[[int], None] | None]]


@dataclass(eq=False, kw_only=True)
class Parked:
    """A request (or its answer) waiting for the program to release it."""

    number: int
    summary: str
    mode: Mode
    waiting: bool  # a caller is blocked on the answer
    expires: datetime.datetime | None  # released after this (world clock), it times out instead
    release: asyncio.Event = field(default_factory=asyncio.Event)
    expired: bool = False


def _status(code: int, reason: str, message: str) -> web.Response:
    body: dict[str, object] = {"kind": "Status", "apiVersion": "v1", "status": "Failure", "message": message}
    body |= {"reason": reason, "code": code}
    return web.Response(status=code, body=json.dumps(body).encode(), content_type="application/json")


class FaultProxy:
    """Serves the API server at ``upstream`` on 127.0.0.1 with an OS-chosen port, applying the armed
    faults."""

    def __init__(
        self,
        upstream: str,
        *,
        clock: Callable[[], datetime.datetime] | None = None,
        limit: datetime.timedelta = datetime.timedelta(seconds=30),
    ) -> None:
        self.upstream = upstream.rstrip("/")
        self._session: aiohttp.ClientSession | None = None
        self._clock, self._limit = clock, limit
        self._rules: list[Rule] = []
        self.parked: list[Parked] = []  # not yet released, in arrival order
        self.fired: list[str] = []  # one line per fault applied, for the failure report
        self.received = self.inflight = self.released = 0
        self._numbers = 0
        self._late: set[asyncio.Task[None]] = set()
        self._runner: web.AppRunner | None = None
        self.observer: Observer | None = None
        self.url = ""

    # ------------------------------------------------------------------------------------ lifecycle
    async def start(self) -> str:
        self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None))
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, handle_signals=False, shutdown_timeout=1.0)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        host, port = self._runner.addresses[0][:2]
        self.url = f"http://{host}:{port}"
        return self.url

    async def stop(self) -> None:
        """Release what is still parked (answers go out, late writes land), then stop serving."""
        while self.parked:
            self.release(self.parked[0])
        if self._late:
            await asyncio.wait(set(self._late), timeout=10)
        if self._runner is not None:
            await self._runner.cleanup()
        if self._session is not None:
            await self._session.close()

    # ---------------------------------------------------------------------------------------- rules
    def arm(self, rule: Rule) -> None:
        self._rules.append(rule)

    def disarm(self, owner: int) -> None:
        self._rules = [r for r in self._rules if r.owner != owner]

    @property
    def waiting(self) -> int:
        """Requests whose caller is blocked on a parked answer."""
        return sum(p.waiting for p in self.parked)

    def release(self, entry: Parked) -> None:
        self.parked.remove(entry)
        self.released += 1
        entry.expired = (
            entry.expires is not None and self._clock is not None and self._clock() > entry.expires
        )
        entry.release.set()

    def _match(self, who: str, kind: str, subject: str | None) -> Rule | None:
        for rule in self._rules:
            if rule.who != who or rule.kind != kind:
                continue
            if rule.subject is not None and rule.subject != subject:
                continue
            if rule.skip > 0:
                rule.skip -= 1
                return None
            self._rules.remove(rule)
            return rule
        return None

    # -------------------------------------------------------------------------------------- serving
    async def _forward(self, call: Call) -> web.Response:
        """Send the call to the API server (the observer sees writes first) and answer with its answer."""
        after = None
        if self.observer is not None and call.method != "GET" and call.kind != "event":
            after = await self.observer(call)
        assert self._session is not None, "start() the proxy first"
        headers = {"Accept": "application/json"}
        if call.content_type:
            headers["Content-Type"] = call.content_type
        async with self._session.request(
            call.method, self.upstream + call.target, data=call.body or None, headers=headers
        ) as answer:
            status, payload = answer.status, await answer.read()
        if after is not None:
            after(status)
        return web.Response(status=status, body=payload, content_type="application/json")

    def _park(self, summary: str, mode: Mode, *, waiting: bool) -> Parked:
        self._numbers += 1
        expires = self._clock() + self._limit if self._clock is not None else None
        entry = Parked(number=self._numbers, summary=summary, mode=mode, waiting=waiting, expires=expires)
        self.parked.append(entry)
        return entry

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        self.received += 1
        self.inflight += 1
        try:
            return await self._serve(request, body)
        finally:
            self.inflight -= 1

    async def _serve(self, request: web.Request, body: bytes) -> web.StreamResponse:
        agent = request.headers.get("User-Agent", "")
        who = next((name for prefix, name in WHO.items() if agent.startswith(prefix)), "other")
        kind, subject = classify(request.method, request.path)
        call = Call(
            who=who,
            kind=kind,
            subject=subject,
            method=request.method,
            target=request.path_qs,
            body=body,
            content_type=request.headers.get("Content-Type"),
        )
        rule = self._match(who, kind, subject) if kind != "event" else None
        if rule is None:
            return await self._forward(call)
        summary = f"{rule.mode} {request.method} {request.path} ({who})"
        self.fired.append(summary)
        if rule.mode is Mode.FAIL:
            return _status(500, "InternalError", f"injected: {summary}")
        if rule.mode is Mode.LOST:
            await self._forward(call)
            return _status(500, "InternalError", f"injected: answer lost: {summary}")
        if rule.mode is Mode.LATE:
            entry = self._park(summary, rule.mode, waiting=False)
            task = asyncio.get_running_loop().create_task(self._late_write(entry, call))
            self._late.add(task)
            task.add_done_callback(self._late.discard)
            return _status(504, "Timeout", f"injected: timed out (the write lands later): {summary}")
        if rule.mode is Mode.HOLD:
            entry = self._park(summary, rule.mode, waiting=True)
            await self._wait(entry)
            if entry.expired:
                return _status(504, "Timeout", f"injected: timed out, never applied: {summary}")
            return await self._forward(call)
        response = await self._forward(call)  # SLOW: applied now, answered on release
        entry = self._park(summary, rule.mode, waiting=True)
        await self._wait(entry)
        if entry.expired:
            return _status(504, "Timeout", f"injected: timed out (it was applied): {summary}")
        return response

    async def _wait(self, entry: Parked) -> None:
        self.inflight -= 1
        try:
            await entry.release.wait()
        finally:
            self.inflight += 1

    async def _late_write(self, entry: Parked, call: Call) -> None:
        await entry.release.wait()
        if entry.expired:
            return
        self.inflight += 1
        try:
            await self._forward(call)
        finally:
            self.inflight -= 1
