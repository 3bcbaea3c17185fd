"""Harness for the webhook tests: threads for the API server and the operator, HTTP helpers.

Both run in threads with their own event loops (Kopf cancels tasks created after it started, so it
must never share a loop with kmock or with a test). Tests talk to them over real loopback HTTP(S):
the API server's REST endpoints and the webhook URL the operator published in its
MutatingWebhookConfiguration, verified against the caBundle published there.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import ssl
import threading
import time
import urllib.parse
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import aiohttp
import kmock

from hami.kube.admissionreview import pod_create_review
from hami.process.flags import Address
from hami_testkit.processes import PortReservations
from tests.eventually import eventually, time_scale
from webhook.config import WebhookSettings
from webhook.handlers import run

MWC_PATH = "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations"
WAIT = 15.0  # seconds the operator may take to start on an idle machine (stretched by the load)


#: the operators' listen ports, held for the life of the test process (a few per operator)
PORTS = PortReservations()


def free_port() -> int:
    return PORTS.take()


class LoopThread(threading.Thread):
    """Runs ``factory(stop)`` with ``asyncio.run`` in a thread; ``stop()`` sets the event and joins."""

    def __init__(self, name: str, factory: Callable[[asyncio.Event], Awaitable[None]]) -> None:
        super().__init__(name=name, daemon=True)
        self.factory = factory
        self.loop: asyncio.AbstractEventLoop | None = None
        self.event: asyncio.Event | None = None
        self.started_flag = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        async def main() -> None:
            self.loop = asyncio.get_running_loop()
            self.event = asyncio.Event()
            self.started_flag.set()
            await self.factory(self.event)

        try:
            asyncio.run(main())
        except BaseException as exc:  # reported by the fixture that owns the thread
            self.error = exc
            self.started_flag.set()

    def stop(self, timeout: float = WAIT) -> None:
        if self.loop is not None and self.event is not None and not self.loop.is_closed():
            with contextlib.suppress(RuntimeError):
                self.loop.call_soon_threadsafe(self.event.set)
        self.join(timeout)
        assert not self.is_alive(), f"thread {self.name} did not stop"


@dataclass
class Cluster:
    url: str
    emulator: kmock.KubernetesEmulator
    kubeconfig: Path


@dataclass
class Operator:
    settings: WebhookSettings
    cluster: Cluster


def operator_settings(cluster: Cluster, tls_dir: Path, **overrides: Any) -> WebhookSettings:
    base = WebhookSettings(
        kubeconfig=str(cluster.kubeconfig),
        listen=Address(host="127.0.0.1", port=free_port()),
        tls_dir=tls_dir,
        manage_config=True,
        config_name="hami-webhook-test",
        service_name="hami-webhook",
        service_namespace="hami-system",
        health_listen=Address(host="127.0.0.1", port=free_port()),
        metrics_listen=Address(host="127.0.0.1", port=free_port()),
        cert_check_interval=0.1,
        log_level="DEBUG",
    )
    return replace(base, **overrides)


@contextlib.contextmanager
def running_operator(settings: WebhookSettings, **options: Any) -> Iterator[None]:
    """``webhook.handlers.run`` (with ``options``) in its own thread; stopped (and joined) on exit."""
    ready = threading.Event()

    async def operate(stop: asyncio.Event) -> None:
        await run(settings, stop_flag=stop, ready_flag=ready, **options)

    thread = LoopThread("kopf", operate)
    thread.start()
    deadline = time.monotonic() + WAIT * time_scale()
    while not ready.wait(0.05):
        assert thread.error is None, thread.error
        assert time.monotonic() < deadline, "the operator did not become ready"
    try:
        yield
    finally:
        thread.stop()
        assert thread.error is None, thread.error


# ---------------------------------------------------------------------------------------- HTTP helpers


async def api_get(cluster: Cluster, path: str) -> dict[str, Any] | None:
    async with aiohttp.ClientSession() as session, session.get(cluster.url + path) as response:
        if response.status == 404:
            return None
        assert response.status == 200, await response.text()
        data: dict[str, Any] = await response.json()
        return data


async def api_post(cluster: Cluster, path: str, body: dict[str, Any]) -> dict[str, Any]:
    async with aiohttp.ClientSession() as session, session.post(cluster.url + path, json=body) as response:
        assert response.status in (200, 201), await response.text()
        data: dict[str, Any] = await response.json()
        return data


async def listening(host: str, port: int) -> bool:
    """Whether something accepts TCP connections on ``host:port`` (Kopf reports ready before it listens)."""
    try:
        _, writer = await asyncio.open_connection(host, port)
    except OSError:
        return False
    writer.close()
    await writer.wait_closed()
    return True


async def scoped_mwc(operator: Operator, *, ca: bytes | None = None) -> dict[str, Any]:
    """The operator's MutatingWebhookConfiguration once it is scoped (and carries ``ca`` when given)."""

    async def check() -> dict[str, Any] | None:
        mwc = await api_get(operator.cluster, f"{MWC_PATH}/{operator.settings.config_name}")
        hooks = (mwc or {}).get("webhooks") or []
        if len(hooks) != 1 or "matchConditions" not in hooks[0]:
            return None
        if ca is not None and base64.b64decode(hooks[0]["clientConfig"]["caBundle"]) != ca:
            return None
        return mwc

    result: dict[str, Any] = await eventually(check, "the scoped MutatingWebhookConfiguration")
    return result


def review(pod: dict[str, Any], *, namespace: str = "default") -> dict[str, Any]:
    """The AdmissionReview kube-apiserver would send for creating ``pod`` in ``namespace``."""
    return pod_create_review(pod, username="tester", namespace=namespace)


@dataclass
class Webhook:
    """A client for the published webhook: URL and CA straight from the MutatingWebhookConfiguration."""

    url: str
    ca: bytes
    session: aiohttp.ClientSession

    async def admit(self, pod: dict[str, Any], *, namespace: str = "default") -> dict[str, Any]:
        request = review(pod, namespace=namespace)
        async with self.session.post(self.url, json=request) as response:
            assert response.status == 200, await response.text()
            body: dict[str, Any] = await response.json()
        assert body["response"]["uid"] == request["request"]["uid"]
        result: dict[str, Any] = body["response"]
        return result


async def served_certificate(url: str, ca: bytes, *, server_hostname: str | None = None) -> bytes:
    """The certificate (DER) the server at ``url`` presents, after verifying it against ``ca``."""
    parsed = urllib.parse.urlsplit(url)
    context = ssl.create_default_context(cadata=ca.decode())
    _reader, writer = await asyncio.open_connection(
        parsed.hostname, parsed.port, ssl=context, server_hostname=server_hostname or parsed.hostname
    )
    try:
        der: bytes = writer.get_extra_info("ssl_object").getpeercert(binary_form=True)
    finally:
        writer.close()
        with contextlib.suppress(ConnectionError, ssl.SSLError):
            await writer.wait_closed()
    return der
