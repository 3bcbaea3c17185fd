"""The aiohttp applications of ``hami scheduler``, and the wiring of the snapshot to the watches.

Owns the two listeners and their routes: the verbs kube-scheduler calls over loopback in the same pod
(``POST /filter``, ``/prioritize``, ``/bind``; ``--listen``, 127.0.0.1 by default) and, on a separate
listener, what the kubelet's probes and Prometheus read (``GET /healthz``, ``/readyz``, ``/metrics``;
``--metrics-listen``); neither serves the other's routes. Request bodies are capped
(``--max-body-bytes``, HAMi's 1 MiB): a declared larger body is answered 413 before it is read, an
undeclared (chunked) one as soon as it passes the cap, and the connection is closed. Also the HTTP
status rules (spec-scheduler §15: an empty body is HTTP 400 ``Please send a request body``; unreadable
JSON and every other failure are HTTP 200 with ``Error`` set), the ``FilteringFailed`` Events (through
the aggregating, bounded :class:`~hami.kube.events.EventRecorder`, only about a pod the API server has
that names our scheduler and is not bound), and the service lifecycle: list+watch threads for Nodes,
Pods and ResourceQuotas feeding the snapshot, the registration pass (handshakes, spec-scheduler §5.3)
and the background tasks, all stopped on cleanup. Must not import the Kubernetes client (only
``hami.kube``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import signal
import ssl
import time
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from hami.annotations import NODE_HANDSHAKE, HandshakeKind, encode_handshake
from hami.core.model import NodeState
from hami.kube.events import EventRecorder, record_event
from hami.kube.nodes import patch_node_annotations
from hami.kube.watch import Kind, ListWatcher
from hami.scheduler.bind import handle_bind
from hami.scheduler.config import SchedulerSettings
from hami.scheduler.context import Background, Context, utc_now
from hami.scheduler.filter import FILTERING_FAILED, handle_filter
from hami.scheduler.metrics import Metrics
from hami.scheduler.prioritize import handle_prioritize
from hami.scheduler.quotas import QuotaBook
from hami.scheduler.snapshot import Snapshot, local_time
from hami.scheduler.wire import (
    ExtenderBindingResult,
    WireError,
    filter_result,
    parse_binding_args,
    parse_extender_args,
)

logger = logging.getLogger(__name__)

CONTEXT: web.AppKey[Context] = web.AppKey("context", Context)
RECORDER: web.AppKey[EventRecorder] = web.AppKey("recorder", EventRecorder)
MAX_BODY: web.AppKey[int] = web.AppKey("max_body", int)
NO_BODY = "Please send a request body"
MALFORMED_REGISTRATION = "InvalidNodeRegistration"
#: The Event reason on an object the watch skipped because handling it failed.
SKIPPED_OBJECT = "SkippedByGPUScheduler"


def build_context(
    settings: SchedulerSettings,
    api: Any,
    *,
    clock: Callable[[], Any] = utc_now,
) -> Context:
    """Build the snapshot, metrics and background tasks, with the snapshot's callbacks wired to writers."""
    background = Background()
    metrics = Metrics()
    in_flight: set[str] = set()

    async def write_handshake(name: str) -> None:
        try:
            value = encode_handshake(HandshakeKind.REQUESTING, local_time(clock()))
            await patch_node_annotations(api, name, {NODE_HANDSHAKE: value})
        finally:
            in_flight.discard(name)

    def on_handshake(name: str) -> None:
        if name not in in_flight:
            in_flight.add(name)
            background.spawn(write_handshake(name), f"handshake on node {name}")

    def on_malformed(node: Mapping[str, Any], message: str) -> None:
        event = record_event(
            api,
            involved=node,
            reason=MALFORMED_REGISTRATION,
            message=f"node excluded from GPU scheduling: {message}",
            type="Warning",
            component=settings.scheduler_name,
        )
        background.spawn(
            event, f"{MALFORMED_REGISTRATION} event on node {(node.get('metadata') or {}).get('name')}"
        )

    snapshot = Snapshot(
        count_resource=settings.device_config.resources.count,
        handshake_window=settings.handshake_window,
        on_malformed=on_malformed,
        on_handshake=on_handshake,
        on_lock=metrics.lock_holds.seen,
        quotas=QuotaBook(
            memory_resource=settings.device_config.resources.memory,
            cores_resource=settings.device_config.resources.cores,
            memory_factor=settings.device_config.effective_memory_factor,
        ),
        clock=clock,
        allocating_horizon=settings.allocating_horizon,
    )

    def nodes_for_metrics() -> Iterable[tuple[str, NodeState | None, str | None]]:
        local_now = local_time(clock())
        return [(e.name, e.state, snapshot.problem(e.name, local_now)) for e in snapshot.entries()]

    metrics.attach(nodes_for_metrics, snapshot.tracked_count)
    return Context(
        settings=settings, api=api, snapshot=snapshot, metrics=metrics, background=background, clock=clock
    )


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
        spec = pod.get("spec") or {}
        return spec.get("schedulerName") == scheduler_name and not spec.get("nodeName")

    return accept


async def filter_view(request: web.Request) -> web.Response:
    ctx = request.app[CONTEXT]
    started = time.perf_counter()
    body = await request.read()
    if not body:
        ctx.metrics.observe("filter", "error", time.perf_counter() - started)
        return web.Response(status=400, text=NO_BODY)
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
    ctx.metrics.observe("filter", "error" if result["Error"] else "ok", time.perf_counter() - started)
    return _json(result)


async def prioritize_view(request: web.Request) -> web.Response:
    ctx = request.app[CONTEXT]
    started = time.perf_counter()
    body = await request.read()
    if not body:
        ctx.metrics.observe("prioritize", "error", time.perf_counter() - started)
        return web.Response(status=400, text=NO_BODY)
    try:
        scores: Any = handle_prioritize(ctx, parse_extender_args(body))
        outcome = "ok"
    except WireError as exc:
        # HostPriorityList has no error field: answer 400 so kube-scheduler reports the extender error
        ctx.metrics.observe("prioritize", "error", time.perf_counter() - started)
        return web.Response(status=400, text=str(exc))
    ctx.metrics.observe("prioritize", outcome, time.perf_counter() - started)
    return _json(scores)


async def bind_view(request: web.Request) -> web.Response:
    ctx = request.app[CONTEXT]
    started = time.perf_counter()
    body = await request.read()
    if not body:
        ctx.metrics.observe("bind", "error", time.perf_counter() - started)
        ctx.metrics.bound("invalid")
        return web.Response(status=400, text=NO_BODY)
    try:
        result = await handle_bind(ctx, parse_binding_args(body))
    except WireError as exc:
        ctx.metrics.bound("invalid")
        result = ExtenderBindingResult(Error=str(exc))
    ctx.metrics.observe("bind", "error" if result["Error"] else "ok", time.perf_counter() - started)
    return _json(result)


async def healthz_view(request: web.Request) -> web.Response:
    return web.Response(text="ok")


async def readyz_view(request: web.Request) -> web.Response:
    ctx = request.app[CONTEXT]
    if ctx.snapshot.ready:
        return web.Response(text="ok")
    return web.Response(status=503, text="snapshot not synced yet")


async def metrics_view(request: web.Request) -> web.Response:
    body = request.app[CONTEXT].metrics.render()
    return web.Response(body=body, headers={"Content-Type": "text/plain; version=0.0.4; charset=utf-8"})


async def _registration_pass(ctx: Context, on_handshake: Callable[[str], None] | None) -> None:
    """Every resync period, (re)request the handshake on nodes that still lack it (failed writes)."""
    while True:
        await asyncio.sleep(ctx.settings.resync_seconds)
        if on_handshake is not None:
            for name in ctx.snapshot.needs_handshake():
                on_handshake(name)


def _skip_reporter(ctx: Context) -> Callable[[str, dict[str, Any], Exception], None]:
    """A Warning Event on an object the watch skipped because handling it failed (ListWatcher's
    ``on_skip``: once per object and reason)."""

    def report(kind: str, obj: dict[str, Any], error: Exception) -> None:
        metadata = obj.get("metadata") or {}
        event = record_event(
            ctx.api,
            involved={"apiVersion": "v1", "kind": kind, "metadata": metadata},
            reason=SKIPPED_OBJECT,
            message=f"{ctx.settings.scheduler_name} could not handle this {kind} and skipped it (one "
            f"skipped while listing is left out of GPU scheduling): {type(error).__name__}: {error}",
            type="Warning",
            component=ctx.settings.scheduler_name,
        )
        ctx.background.spawn(event, f"{SKIPPED_OBJECT} event on {kind} {metadata.get('name')}")

    return report


def _watching(ctx: Context) -> Callable[[web.Application], AsyncIterator[None]]:
    async def lifecycle(app: web.Application) -> AsyncIterator[None]:
        loop = asyncio.get_running_loop()
        snapshot = ctx.snapshot

        def count(
            kind: str, handler: Callable[[str, dict[str, Any]], None]
        ) -> Callable[[str, dict[str, Any]], None]:
            def apply(event: str, obj: dict[str, Any]) -> None:
                ctx.metrics.watch_events.labels(kind).inc()
                handler(event, obj)

            return apply

        feeds: tuple[tuple[Kind, str, Callable[..., None], Callable[[str, dict[str, Any]], None]], ...] = (
            ("nodes", "node", snapshot.nodes_listed, snapshot.node_event),
            ("pods", "pod", snapshot.pods_listed, snapshot.pod_event),
            ("resourcequotas", "quota", snapshot.quotas_listed, snapshot.quota_event),
        )
        watchers = [
            ListWatcher(
                ctx.api,
                resource,
                loop=loop,
                on_list=on_list,
                on_event=count(kind, on_event),
                on_restart=ctx.metrics.watch_restarted(resource),
                on_skip=_skip_reporter(ctx),
            )
            for resource, kind, on_list, on_event in feeds
        ]
        for watcher in watchers:
            watcher.start()
        resync = loop.create_task(_registration_pass(ctx, snapshot.on_handshake))
        try:
            yield
        finally:
            resync.cancel()
            await asyncio.gather(*(asyncio.to_thread(w.stop) for w in watchers))
            await ctx.background.drain()

    return lifecycle


def create_app(ctx: Context, *, watch: bool = True, recorder: EventRecorder | None = None) -> web.Application:
    """The verbs app (``--listen``); with ``watch`` the snapshot is fed by list+watch while it runs."""
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
    if watch:
        app.cleanup_ctx.append(_watching(ctx))
    app.on_cleanup.append(_flush_events)
    return app


async def _flush_events(app: web.Application) -> None:
    await app[RECORDER].flush()


def create_probe_app(ctx: Context) -> web.Application:
    """The probes and metrics app (``--metrics-listen``): GET only, no extender verb."""
    app = web.Application(client_max_size=64 * 1024)
    app[CONTEXT] = ctx
    app.router.add_get("/healthz", healthz_view)
    app.router.add_get("/readyz", readyz_view)
    app.router.add_get("/metrics", metrics_view)
    return app


@dataclass(frozen=True, slots=True)
class Listeners:
    """The bound addresses: (host, port) of the verbs and of the probes/metrics listener."""

    verbs: tuple[str, int]
    metrics: tuple[str, int]


def _bound(runner: web.AppRunner) -> tuple[str, int]:
    host, port = runner.addresses[0][:2]
    return str(host), int(port)


@contextlib.asynccontextmanager
async def serving(
    ctx: Context,
    *,
    ssl_context: ssl.SSLContext | None = None,
    watch: bool = True,
    recorder: EventRecorder | None = None,
) -> AsyncIterator[Listeners]:
    """Both listeners serving (ports 0: chosen by the OS) until the block ends; then both stop."""
    settings = ctx.settings
    verbs = web.AppRunner(create_app(ctx, watch=watch, recorder=recorder), access_log=None)
    probes = web.AppRunner(create_probe_app(ctx), access_log=None)
    await verbs.setup()
    try:
        await probes.setup()
        try:
            await web.TCPSite(verbs, settings.host, settings.port, ssl_context=ssl_context).start()
            await web.TCPSite(probes, settings.metrics_host, settings.metrics_port).start()
            yield Listeners(verbs=_bound(verbs), metrics=_bound(probes))
        finally:
            await probes.cleanup()
    finally:
        await verbs.cleanup()


async def serve(ctx: Context, *, ssl_context: ssl.SSLContext | None = None) -> None:
    """Serve until SIGTERM or SIGINT, then stop gracefully (watches, background tasks, Events)."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    async with serving(ctx, ssl_context=ssl_context) as listeners:
        logger.info(
            "hami scheduler %s: verbs on %s:%d (%s), probes and metrics on %s:%d",
            ctx.settings.scheduler_name,
            *listeners.verbs,
            "https" if ssl_context else "http",
            *listeners.metrics,
        )
        await stop.wait()
