"""The aiohttp applications of ``hami scheduler``: the extender verbs and the probes, on two listeners.

Owns the two listeners and their routes: the verbs kube-scheduler calls over loopback in the same pod
(``POST /filter``, ``/prioritize``, ``/bind``, ``/preempt``; ``--listen``, 127.0.0.1 by default) and, on
a separate listener, what the kubelet's probes and Prometheus read (``GET /healthz``, ``/readyz``,
``/metrics``; ``--metrics-listen``, the shared listener of :mod:`hami.process.http`); neither serves the
other's routes. Request bodies are capped (``--max-body-bytes``, HAMi's 1 MiB): a declared larger body
is answered 413 before it is read, an undeclared (chunked) one as soon as it passes the cap, and the
connection is closed. Also the HTTP status rules (docs/protocol.md, "Extender": an empty body is HTTP 400
``Please send a request body``; unreadable JSON and every other failure are HTTP 200 with ``Error`` set) and
the ``FilteringFailed`` Events (through the aggregating, bounded :class:`~hami.kube.events.EventRecorder`,
only about a pod the API server has that names our scheduler and is not bound), flushed when the verbs
app stops. The service is wired and run by :mod:`hami.scheduler.main`. Must not import the Kubernetes
client (only ``hami.kube``).
"""

from __future__ import annotations

import contextlib
import json
import ssl
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from hami import objects
from hami.kube.events import EventRecorder
from hami.process.flags import Address
from hami.process.http import Handler, alive, listening, metrics_app
from hami.scheduler.bind import handle_bind
from hami.scheduler.context import Context
from hami.scheduler.filter import FILTERING_FAILED, handle_filter
from hami.scheduler.preempt import PreemptError, handle_preempt
from hami.scheduler.prioritize import handle_prioritize
from hami.scheduler.snapshot import Snapshot
from hami.scheduler.wire import (
    ExtenderBindingResult,
    WireError,
    filter_result,
    parse_binding_args,
    parse_extender_args,
    parse_preemption_args,
)

CONTEXT: web.AppKey[Context] = web.AppKey("context", Context)
RECORDER: web.AppKey[EventRecorder] = web.AppKey("recorder", EventRecorder)
MAX_BODY: web.AppKey[int] = web.AppKey("max_body", int)
NO_BODY = "Please send a request body"


def _json(payload: Any) -> web.Response:
    return web.Response(
        body=json.dumps(payload, separators=(",", ":")).encode(), content_type="application/json"
    )


def _too_large(limit: int) -> web.Response:
    response = web.Response(status=413, text=f"request body larger than {limit} bytes")
    response.force_close()  # the rest of the body is never read
    return response


@web.middleware
async def _body_limit(request: web.Request, handler: Callable[..., Any]) -> web.StreamResponse:
    """Answer 413 to a body over the cap: at once when declared, when it passes the cap when chunked."""
    limit = request.app[MAX_BODY]
    if request.content_length is not None and request.content_length > limit:
        return _too_large(limit)
    try:
        response: web.StreamResponse = await handler(request)
    except web.HTTPRequestEntityTooLarge:
        return _too_large(limit)
    return response


def _ours_to_schedule(scheduler_name: str) -> Callable[[Mapping[str, Any]], bool]:
    """Whether a pod read from the API server waits for this scheduler (named, not bound)."""

    def accept(pod: Mapping[str, Any]) -> bool:
        return objects.scheduler_name(pod) == scheduler_name and not objects.node_name(pod)

    return accept


#: One verb's work on a non-empty body: the answer, and whether it counts as ``ok`` (else ``error``).
Verb = Callable[[web.Request, Context, bytes], Awaitable[tuple[web.Response, bool]]]


def _verb(name: str) -> Callable[[Verb], Handler]:
    """A verb's view: an empty body is HTTP 400 ``Please send a request body``; every request is
    counted and timed in ``hami_scheduler_requests_total`` / ``hami_scheduler_request_seconds``."""

    def wrap(handle: Verb) -> Handler:
        async def view(request: web.Request) -> web.StreamResponse:
            ctx = request.app[CONTEXT]
            started = time.perf_counter()
            body = await request.read()
            if body:
                response, ok = await handle(request, ctx, body)
            else:
                response, ok = web.Response(status=400, text=NO_BODY), False
                if name == "bind":
                    ctx.metrics.bound("invalid")
            ctx.metrics.observe(name, "ok" if ok else "error", time.perf_counter() - started)
            return response

        return view

    return wrap


@_verb("filter")
async def filter_view(request: web.Request, ctx: Context, body: bytes) -> tuple[web.Response, bool]:
    try:
        args = parse_extender_args(body)
        outcome = handle_filter(ctx, args)
    except WireError as exc:
        result = filter_result(error=str(exc))
    else:
        result = outcome.result
        if outcome.failure is not None and args["Pod"] is not None:
            request.app[RECORDER].record(
                args["Pod"],
                reason=FILTERING_FAILED,
                message=outcome.failure,
                accept=_ours_to_schedule(ctx.settings.scheduler_name),
            )
    return _json(result), not result["Error"]


@_verb("prioritize")
async def prioritize_view(_request: web.Request, ctx: Context, body: bytes) -> tuple[web.Response, bool]:
    try:
        scores: Any = handle_prioritize(ctx, parse_extender_args(body))
    except WireError as exc:
        # HostPriorityList has no error field: answer 400 so kube-scheduler reports the extender error
        return web.Response(status=400, text=str(exc)), False
    return _json(scores), True


@_verb("bind")
async def bind_view(_request: web.Request, ctx: Context, body: bytes) -> tuple[web.Response, bool]:
    try:
        result = await handle_bind(ctx, parse_binding_args(body))
    except WireError as exc:
        ctx.metrics.bound("invalid")
        result = ExtenderBindingResult(Error=str(exc))
    return _json(result), not result["Error"]


@_verb("preempt")
async def preempt_view(_request: web.Request, ctx: Context, body: bytes) -> tuple[web.Response, bool]:
    try:
        outcome = handle_preempt(ctx, parse_preemption_args(body))
    except WireError as exc:
        return web.Response(status=400, text=str(exc)), False
    except PreemptError as exc:
        return web.Response(status=exc.status, text=str(exc)), False
    preempted = len(outcome.result["NodeNameToMetaVictims"])
    ctx.metrics.preempted(outcome.offered, preempted, outcome.proposed, outcome.added)
    return _json(outcome.result), True


def _readiness(snapshot: Snapshot) -> Handler:
    async def readyz(_request: web.Request) -> web.Response:
        if snapshot.ready:
            return web.Response(text="ok")
        return web.Response(status=503, text="snapshot not synced yet")

    return readyz


def create_app(ctx: Context, *, recorder: EventRecorder | None = None) -> web.Application:
    """The verbs app (``--listen``); the snapshot is fed apart (:mod:`hami.scheduler.watches`)."""
    limit = ctx.settings.max_body_bytes
    app = web.Application(client_max_size=limit, middlewares=[_body_limit])
    app[CONTEXT] = ctx
    app[MAX_BODY] = limit
    if recorder is None:
        recorder = EventRecorder(ctx.api, component=ctx.settings.scheduler_name, clock=ctx.clock)
    app[RECORDER] = recorder
    app.router.add_post("/filter", filter_view)
    app.router.add_post("/prioritize", prioritize_view)
    app.router.add_post("/bind", bind_view)
    app.router.add_post("/preempt", preempt_view)
    app.on_cleanup.append(_flush_events)
    return app


async def _flush_events(app: web.Application) -> None:
    await app[RECORDER].flush()


def create_probe_app(ctx: Context) -> web.Application:
    """The probes and metrics app (``--metrics-listen``): GET only, no extender verb."""
    routes = {"/healthz": alive, "/readyz": _readiness(ctx.snapshot)}
    return metrics_app(ctx.metrics.registry, routes=routes)  # the collector reads the loop's snapshot


@dataclass(frozen=True, slots=True)
class Listeners:
    """The bound addresses: (host, port) of the verbs and of the probes/metrics listener."""

    verbs: tuple[str, int]
    metrics: tuple[str, int]


@contextlib.asynccontextmanager
async def serving(
    ctx: Context, *, ssl_context: ssl.SSLContext | None = None, recorder: EventRecorder | None = None
) -> AsyncIterator[Listeners]:
    """Both listeners serving (ports 0: chosen by the OS) until the block ends; then both stop."""
    settings = ctx.settings
    verbs_app = create_app(ctx, recorder=recorder)
    async with (
        listening(verbs_app, settings.listen, ssl_context=ssl_context) as verbs,
        listening(create_probe_app(ctx), settings.metrics_listen) as probes,
    ):
        yield Listeners(verbs=_pair(verbs), metrics=_pair(probes))


def _pair(address: Address) -> tuple[str, int]:
    return address.host, address.port
