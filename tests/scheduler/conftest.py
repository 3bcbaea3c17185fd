"""The running extender for the scheduler tests.

``start_extender`` runs the real aiohttp apps under ``aiohttp.test_utils.TestServer`` on 127.0.0.1 (the
verbs app and the probes/metrics app) and the service's sync tasks (list+watch from this test's
embedded API server (kmock), the registration pass: ``keep_synced``); the clock is fixed at ``NOW``.
"""

from __future__ import annotations

import asyncio
import datetime
from collections.abc import AsyncIterator, Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import kmock
import pytest
from aiohttp.test_utils import TestClient, TestServer

from hami.kube.client import load_api_client
from hami.kube.events import EventRecorder
from hami.scheduler.app import create_app, create_probe_app
from hami.scheduler.config import SchedulerSettings
from hami.scheduler.main import build_context
from hami.scheduler.watches import keep_synced
from hami_testkit.apiserver import write_kubeconfig
from tests.builders import NOW
from tests.eventually import eventually

from .kit import Extender, StartExtender


@pytest.fixture
async def start_extender(
    apiserver: kmock.KubernetesEmulator, kubeconfig: Path
) -> AsyncIterator[StartExtender]:
    """Seed objects first (``nodes``/``pods``/``quotas``), then call to start the extender and wait for
    its snapshot. ``clock`` replaces the fixed ``NOW``, ``ticker`` the monotonic clock of bind deadlines,
    ``api_url`` the API server the extender talks to (a fault proxy in front of this test's), ``events``
    EventRecorder options (interval, max_objects, clock, ...)."""
    running: list[tuple[TestClient[Any, Any], Any]] = []
    syncing: list[asyncio.Task[None]] = []

    async def start(
        nodes: list[dict[str, Any]] = (),  # type: ignore[assignment]
        pods: list[dict[str, Any]] = (),  # type: ignore[assignment]
        quotas: list[dict[str, Any]] = (),  # type: ignore[assignment]
        *,
        clock: Callable[[], datetime.datetime] | None = None,
        ticker: Callable[[], float] | None = None,
        api_url: str | None = None,
        events: dict[str, Any] | None = None,
        **overrides: Any,
    ) -> Extender:
        for node in nodes:
            await apiserver.post("/api/v1/nodes", json=node)
        for quota in quotas:
            namespace = quota["metadata"]["namespace"]
            await apiserver.post(f"/api/v1/namespaces/{namespace}/resourcequotas", json=quota)
        for pod in pods:
            await apiserver.post(f"/api/v1/namespaces/{pod['metadata']['namespace']}/pods", json=pod)
        settings = replace(SchedulerSettings(), **overrides)  # the production API timeout (30 s)
        config = kubeconfig
        if api_url is not None:  # e.g. a fault proxy in front of the embedded API server
            config = write_kubeconfig(kubeconfig.with_name(f"kubeconfig-{len(running)}"), api_url)
        api = load_api_client(str(config), request_timeout=settings.api_timeout)
        ctx = build_context(settings, api, clock=clock or (lambda: NOW))
        if ticker is not None:  # the monotonic clock of bind deadlines
            ctx = replace(ctx, ticker=ticker)
        options: dict[str, Any] = {"clock": ctx.clock, **(events or {})}
        recorder = EventRecorder(api, component=settings.scheduler_name, **options)
        client: TestClient[Any, Any] = TestClient(
            TestServer(create_app(ctx, recorder=recorder), host="127.0.0.1")
        )
        probes: TestClient[Any, Any] = TestClient(TestServer(create_probe_app(ctx), host="127.0.0.1"))
        await client.start_server()
        await probes.start_server()
        running.append((client, api))
        running.append((probes, None))
        syncing.append(asyncio.create_task(keep_synced(ctx), name="sync"))
        await eventually(
            lambda: ctx.snapshot.ready and ctx.disruptions.synced,
            "the first list of nodes, pods, quotas and PodDisruptionBudgets",
        )
        return Extender(ctx=ctx, client=client, apiserver=apiserver, probes=probes, recorder=recorder)

    yield start
    for task in syncing:  # the watches stop and the background writes drain before the API client closes
        task.cancel()
    for result in await asyncio.gather(*syncing, return_exceptions=True):
        if isinstance(result, BaseException) and not isinstance(result, asyncio.CancelledError):
            raise result  # a sync task that failed during the test
    for client, api in reversed(running):
        await client.close()
        if api is not None:
            api.close()
