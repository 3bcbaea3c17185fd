"""A fake HTTP endpoint for the stand-ins' tests: one POST route on an OS-chosen loopback port, closed
on the way out (the fake extender of the kube-scheduler stand-in's tests, the fake webhook of the
admission stand-in's)."""

from __future__ import annotations

import contextlib
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable

from aiohttp import web
from aiohttp.test_utils import TestServer


@contextlib.asynccontextmanager
async def serving(
    route: str,
    handler: Callable[[web.Request], Awaitable[web.StreamResponse]],
    *,
    tls: ssl.SSLContext | None = None,
) -> AsyncIterator[TestServer]:
    """``handler`` answering POST ``route`` on 127.0.0.1 (HTTPS with ``tls``) until the block ends."""
    app = web.Application()
    app.router.add_post(route, handler)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server(ssl=tls)
    try:
        yield server
    finally:
        await server.close()
