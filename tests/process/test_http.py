"""The one Prometheus listener: /metrics in either format, the service's probes beside it, a taken
address raised at once (listening) or retried (serve_retrying)."""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Iterable

import aiohttp
import pytest
from aiohttp import web
from prometheus_client import CollectorRegistry, Counter
from prometheus_client.core import GaugeMetricFamily, Metric

from hami.process.flags import Address
from hami.process.http import listening, metrics_app, serve_retrying
from tests.eventually import eventually

LOOPBACK = Address(host="127.0.0.1", port=0)


class ThreadNoting:
    """A collector that notes which thread reads it."""

    def __init__(self) -> None:
        self.threads: list[int] = []

    def collect(self) -> Iterable[Metric]:
        self.threads.append(threading.get_ident())
        yield GaugeMetricFamily("demo_gauge", "a gauge", value=1)


def registry_with(collector: ThreadNoting) -> CollectorRegistry:
    registry = CollectorRegistry()
    Counter("demo_requests", "requests", registry=registry).inc()
    registry.register(collector)
    return registry


@pytest.mark.parametrize("blocking", [False, True])
async def test_metrics_in_both_formats_and_the_probes(blocking: bool) -> None:
    collector = ThreadNoting()

    async def healthz(_request: web.Request) -> web.Response:
        return web.Response(text="ok\n")

    app = metrics_app(registry_with(collector), blocking=blocking, routes={"/healthz": healthz})
    async with listening(app, LOOPBACK) as bound, aiohttp.ClientSession() as session:
        assert bound.host == "127.0.0.1" and bound.port > 0
        url = f"http://{bound}"
        async with session.get(url + "/metrics") as response:
            assert response.headers["Content-Type"].startswith("text/plain; version=0.0.4")
            text = await response.text()
            assert "demo_requests_total 1.0" in text and "demo_gauge 1.0" in text
        accept = "application/openmetrics-text; version=1.0.0"
        async with session.get(url + "/metrics", headers={"Accept": accept}) as response:
            assert response.headers["Content-Type"].startswith("application/openmetrics-text")
            assert (await response.text()).rstrip().endswith("# EOF")
        async with session.get(url + "/healthz") as response:
            assert (response.status, await response.text()) == (200, "ok\n")
        for method, path in (("GET", "/other"), ("POST", "/metrics")):
            async with session.request(method, url + path) as response:
                assert response.status in (404, 405), (method, path)
    loop_thread = threading.get_ident()
    assert len(collector.threads) == 2
    assert all((thread != loop_thread) == blocking for thread in collector.threads)


async def test_a_taken_address_raises_at_once() -> None:
    async with listening(metrics_app(CollectorRegistry()), LOOPBACK) as bound:
        with pytest.raises(OSError):
            async with listening(metrics_app(CollectorRegistry()), bound):
                pass


async def test_serve_retrying_waits_for_a_taken_address(caplog: pytest.LogCaptureFixture) -> None:
    holder = listening(metrics_app(CollectorRegistry()), LOOPBACK)
    taken = await holder.__aenter__()
    with caplog.at_level(logging.INFO, logger="hami.process.http"):
        fresh = lambda: metrics_app(CollectorRegistry())  # noqa: E731
        server = asyncio.create_task(serve_retrying(fresh, taken, retry=0.01))

        def running() -> None:
            assert not server.done(), server

        try:
            await eventually(
                lambda: "cannot serve /metrics on" in caplog.text, "a refused try", alive=running
            )
            await holder.__aexit__(None, None, None)  # the address comes free: the next try serves
            await eventually(lambda: f"serving /metrics on {taken}" in caplog.text, "serving", alive=running)
            async with aiohttp.ClientSession() as session, session.get(f"http://{taken}/metrics") as got:
                assert got.status == 200
        finally:
            server.cancel()
            await asyncio.gather(server, return_exceptions=True)
