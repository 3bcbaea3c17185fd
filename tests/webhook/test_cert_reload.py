"""The chart-mode webhook serves a rotated certificate without a restart and without dropping a connection.

The chart mounts the TLS Secret read-only; the certgen CronJob (or cert-manager) re-issues it and the
kubelet swaps the mounted files (one ``..data`` rename, as ``webhook.tlsbundle.write_bundle`` does here).
The webhook must then present the new certificate to new connections, keep its listener (Kopf's own
file watch closes it and every open connection, failing admissions in between) and keep serving
when the files are broken (a half-written or mismatched pair is never loaded).
"""

from __future__ import annotations

import logging
import ssl
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import aiohttp
import pytest
from cryptography import x509

from tests.eventually import eventually
from webhook import tlsbundle
from webhook.config import WebhookSettings

from .webhook_cases import GPU, ctr, make_pod
from .webhook_harness import (
    Cluster,
    listening,
    operator_settings,
    review,
    running_operator,
    served_certificate,
)


@dataclass
class ChartWebhook:
    settings: WebhookSettings
    first: tlsbundle.Bundle

    @property
    def url(self) -> str:
        return f"https://{self.settings.listen}/webhook"


def foreign(now: datetime, names: tuple[str, ...], *, previous: bytes = b"") -> tlsbundle.Bundle:
    """What the certgen Job writes into the Secret: a one-shot CA (key discarded) and a certificate;
    ``ca.crt`` also carries the previous CA during the overlap."""
    made = tlsbundle.generate(names, now=now)
    return tlsbundle.Bundle(ca_cert=made.ca_cert + previous, cert=made.cert, key=made.key)


@pytest.fixture
def chart_webhook(cluster: Cluster, tmp_path: Path) -> Iterator[ChartWebhook]:
    tls = tmp_path / "tls"
    settings = operator_settings(cluster, tls, manage_config=False, config_name="hami-webhook-reload")
    first = foreign(datetime.now(UTC), settings.hostnames)
    tlsbundle.write_bundle(tls, first, now=datetime.now(UTC))
    with running_operator(settings):
        yield ChartWebhook(settings=settings, first=first)


def serial(der: bytes) -> int:
    return x509.load_der_x509_certificate(der).serial_number


def pem_serial(pem: bytes) -> int:
    return x509.load_pem_x509_certificate(pem).serial_number


@pytest.fixture
async def counted_session(
    chart_webhook: ChartWebhook,
) -> AsyncIterator[tuple[aiohttp.ClientSession, list[int]]]:
    """One keep-alive session trusting the first CA; the list counts the TCP connections it opened."""
    settings = chart_webhook.settings
    await eventually(lambda: listening(settings.listen.host, settings.listen.port), "the webhook's port")
    opened: list[int] = []

    async def on_connection(_session: Any, _context: SimpleNamespace, _params: Any) -> None:
        opened.append(1)

    trace = aiohttp.TraceConfig()
    trace.on_connection_create_end.append(on_connection)
    context = ssl.create_default_context(cadata=chart_webhook.first.ca_cert.decode())
    connector = aiohttp.TCPConnector(ssl=context, limit=1)
    async with aiohttp.ClientSession(connector=connector, trace_configs=[trace]) as session:
        yield session, opened


async def admit(session: aiohttp.ClientSession, url: str) -> dict[str, Any]:
    async with session.post(url, json=review(make_pod(ctr(limits={GPU: "1"})))) as response:
        assert response.status == 200, await response.text()
        body: dict[str, Any] = await response.json()
    return body


async def test_a_rotated_certificate_is_served_without_dropping_a_connection(
    chart_webhook: ChartWebhook, counted_session: tuple[aiohttp.ClientSession, list[int]]
) -> None:
    session, opened = counted_session
    tls, url = chart_webhook.settings.tls_dir, chart_webhook.url
    assert (await admit(session, url))["response"]["allowed"] is True
    assert opened == [1]

    # the CronJob re-issues; the kubelet swaps the mounted files
    now = datetime.now(UTC)
    second = foreign(now, chart_webhook.settings.hostnames, previous=chart_webhook.first.ca_cert)
    tlsbundle.write_bundle(tls, second, now=now + timedelta(seconds=1))

    async def new_certificate() -> bool:
        return serial(await served_certificate(url, second.ca_cert)) == pem_serial(second.cert)

    await eventually(new_certificate, "the webhook to serve the rotated certificate")
    # the connection opened before the rotation is still served: the listener was never restarted
    assert (await admit(session, url))["response"]["allowed"] is True
    assert opened == [1]


async def test_a_broken_pair_is_never_loaded(
    chart_webhook: ChartWebhook,
    counted_session: tuple[aiohttp.ClientSession, list[int]],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A key that does not belong to the certificate (a torn update) keeps the previous pair in use."""
    session, opened = counted_session
    tls, url = chart_webhook.settings.tls_dir, chart_webhook.url
    assert (await admit(session, url))["response"]["allowed"] is True
    now = datetime.now(UTC)
    other = foreign(now, chart_webhook.settings.hostnames)
    mismatched = tlsbundle.Bundle(ca_cert=other.ca_cert, cert=other.cert, key=chart_webhook.first.key)
    caplog.set_level(logging.WARNING, logger="hami.webhook")
    tlsbundle.write_bundle(tls, mismatched, now=now + timedelta(seconds=1))

    async def refused() -> bool:
        return any("kept serving the previous certificate" in r.getMessage() for r in caplog.records)

    await eventually(refused, "the webhook to notice the broken pair")
    assert serial(await served_certificate(url, chart_webhook.first.ca_cert)) == pem_serial(
        chart_webhook.first.cert
    )
    assert (await admit(session, url))["response"]["allowed"] is True
    assert opened == [1]

    third = foreign(now, chart_webhook.settings.hostnames)
    tlsbundle.write_bundle(tls, third, now=now + timedelta(seconds=2))

    async def third_served() -> bool:
        trusted = third.ca_cert + chart_webhook.first.ca_cert
        return serial(await served_certificate(url, trusted)) == pem_serial(third.cert)

    await eventually(third_served, "the webhook to serve the next good pair")
