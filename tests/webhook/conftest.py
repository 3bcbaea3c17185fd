"""Fixtures for the webhook: one embedded API server and one Kopf operator per test module.

Both run in threads with their own event loops (see ``webhook_harness``).
"""

from __future__ import annotations

import asyncio
import base64
import ssl
import threading
from collections.abc import AsyncIterator, Iterator
from typing import Any

import aiohttp
import kmock
import pytest

from hami_testkit.apiserver import embedded_apiserver, write_kubeconfig
from tests.eventually import time_scale

from .webhook_harness import (
    WAIT,
    Cluster,
    LoopThread,
    Operator,
    Webhook,
    operator_settings,
    running_operator,
    scoped_mwc,
)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """The embedded API server (kmock + reactions, as ``hami_testkit.apiserver``) in its own thread."""
    found: dict[str, kmock.KubernetesEmulator] = {}
    ready = threading.Event()

    async def serve(stop: asyncio.Event) -> None:
        async with embedded_apiserver() as emulator:
            found["emulator"] = emulator
            ready.set()
            await stop.wait()

    thread = LoopThread("kmock", serve)
    thread.start()
    ready.wait(WAIT * time_scale())
    assert "emulator" in found, thread.error
    emulator = found["emulator"]
    path = write_kubeconfig(tmp_path_factory.mktemp("kube") / "kubeconfig", str(emulator.url))
    yield Cluster(url=str(emulator.url).rstrip("/"), emulator=emulator, kubeconfig=path)
    thread.stop()


@pytest.fixture(scope="module")
def operator_overrides() -> dict[str, Any]:
    """WebhookSettings fields a test module changes for its operator (override in the module)."""
    return {}


@pytest.fixture(scope="module")
def operator(
    cluster: Cluster, tmp_path_factory: pytest.TempPathFactory, operator_overrides: dict[str, Any]
) -> Iterator[Operator]:
    """One operator per test module (start-ups are the slow part of this suite)."""
    settings = operator_settings(cluster, tmp_path_factory.mktemp("tls"), **operator_overrides)
    with running_operator(settings):
        yield Operator(settings=settings, cluster=cluster)


@pytest.fixture
async def webhook(operator: Operator) -> AsyncIterator[Webhook]:
    mwc = await scoped_mwc(operator)
    config = mwc["webhooks"][0]["clientConfig"]
    ca = base64.b64decode(config["caBundle"])
    context = ssl.create_default_context(cadata=ca.decode())
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=context)) as session:
        yield Webhook(url=config["url"], ca=ca, session=session)
