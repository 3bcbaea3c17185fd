"""The Prometheus listener of every service: ``GET /metrics`` (and the probes beside it) on an address.

Owns :func:`metrics_app` (``/metrics`` in Prometheus' text format, or OpenMetrics when the ``Accept``
header asks for it, plus the service's own GET routes such as ``/healthz``: :func:`alive`),
:func:`listening` (one
aiohttp app served on one address while inside; yields the bound address, port 0 chosen by the OS;
raises ``OSError`` when it cannot bind) and :func:`serve_retrying` (serve until cancelled; an address
that cannot be bound is logged and retried, since metrics must never stop the service they
describe). Collectors that block (NVML, ``/proc``) are read in a worker thread (``blocking=True``);
those that read state owned by the event loop are read on the loop. The registry is built by the
entry point and passed in: no global registry. Must not import the Kubernetes client or a service.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping

from aiohttp import web
from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder

from hami.process.flags import Address

log = logging.getLogger(__name__)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
#: Probe and scrape requests have no body worth more than this.
SMALL_BODY = 64 * 1024


async def alive(_request: web.Request) -> web.Response:
    """``GET /healthz``: the process answers."""
    return web.Response(text="ok\n")


def metrics_app(
    registry: CollectorRegistry, *, blocking: bool = False, routes: Mapping[str, Handler] | None = None
) -> web.Application:
    """``GET /metrics`` of ``registry`` and the extra GET ``routes`` (path -> handler); nothing else."""

    async def metrics(request: web.Request) -> web.Response:
        encode, content_type = choose_encoder(request.headers.get("Accept", ""))
        body = await asyncio.to_thread(encode, registry) if blocking else encode(registry)
        return web.Response(body=body, headers={"Content-Type": content_type})

    app = web.Application(client_max_size=SMALL_BODY)
    app.router.add_get("/metrics", metrics)
    for path, handler in (routes or {}).items():
        app.router.add_get(path, handler)
    return app


@contextlib.asynccontextmanager
async def listening(
    app: web.Application, address: Address, *, ssl_context: ssl.SSLContext | None = None
) -> AsyncIterator[Address]:
    """Serve ``app`` on ``address`` while inside; yields the bound address. Raises ``OSError`` when the
    address is taken or not available; the app is cleaned up on the way out either way."""
    runner = web.AppRunner(app, access_log=None, handle_signals=False)
    await runner.setup()
    try:
        await web.TCPSite(runner, address.host, address.port, ssl_context=ssl_context).start()
        host, port = runner.addresses[0][:2]
        yield Address(host=str(host), port=int(port))
    finally:
        await runner.cleanup()


async def serve_retrying(
    app: Callable[[], web.Application],
    address: Address,
    *,
    retry: float = 5.0,
    what: str = "/metrics",
    logger: logging.Logger = log,
) -> None:
    """Serve a fresh ``app()`` on ``address`` until cancelled; an address that cannot be bound is
    logged and tried again every ``retry`` seconds."""
    while True:
        try:
            async with listening(app(), address) as bound:
                logger.info("serving %s on %s", what, bound)
                await asyncio.Event().wait()
        except OSError as exc:
            logger.error("cannot serve %s on %s, retrying in %gs: %s", what, address, retry, exc)
            await asyncio.sleep(retry)
