"""Two listeners, as ``hami scheduler`` runs them: the verbs on loopback, probes and metrics apart.

kube-scheduler calls ``/filter``, ``/prioritize`` and ``/bind`` over loopback inside the scheduler pod;
nothing else may reach them. The kubelet's probes and Prometheus reach ``/healthz``, ``/readyz`` and
``/metrics`` on the metrics listener, which serves nothing else. Started with ``serving``, the same
code ``hami scheduler`` runs (:func:`hami.scheduler.main.serve`, every loop a named task), with the
default hosts and OS-chosen ports.
"""

from __future__ import annotations

import argparse
import asyncio
import socket
import threading
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import aiohttp
import kmock
import pytest

from hami.kube.client import load_api_client
from hami.scheduler.app import Listeners
from hami.scheduler.config import add_arguments, from_args
from hami.scheduler.main import build_context, serve
from tests.builders import NOW, make_node, make_pod
from tests.eventually import eventually

VERBS = ("/filter", "/prioritize", "/bind")
PROBES = ("/healthz", "/readyz", "/metrics")


def non_loopback_address() -> str | None:
    """An address of this machine on a non-loopback interface (no packet is sent), if it has one."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(("192.0.2.1", 9))  # TEST-NET-1: only picks the outgoing interface
        except OSError:
            return None
        address = str(probe.getsockname()[0])
    return None if address.startswith("127.") or address == "0.0.0.0" else address


@pytest.fixture
async def running(apiserver: kmock.KubernetesEmulator, kubeconfig: Path) -> AsyncIterator[Listeners]:
    """The scheduler with its default listen hosts (ports left to the OS), synced with one node."""
    await apiserver.post("/api/v1/nodes", json=make_node("n1"))
    parser = argparse.ArgumentParser()
    add_arguments(parser, {})
    settings = replace(from_args(parser.parse_args([])), port=0, metrics_port=0, api_timeout=5.0)
    api = load_api_client(str(kubeconfig), request_timeout=settings.api_timeout)
    ctx = build_context(settings, api, clock=lambda: NOW)
    bound: asyncio.Future[Listeners] = asyncio.get_running_loop().create_future()
    service = asyncio.create_task(serve(ctx, on_listening=bound.set_result))
    try:
        await eventually(lambda: bound.done() or service.done(), "the listeners or the service's end")
        assert bound.done(), service  # a service that failed to start fails here, with its exception
        await eventually(lambda: ctx.snapshot.ready, "the first lists")
        yield bound.result()
    finally:
        service.cancel()
        await asyncio.gather(service, return_exceptions=True)
        api.close()


async def test_every_loop_is_a_named_task(running: Listeners) -> None:
    names = {task.get_name() for task in asyncio.all_tasks()}
    assert {
        "listeners",
        "watch-nodes",
        "watch-pods",
        "watch-resourcequotas",
        "watch-poddisruptionbudgets",
        "registration-resync",
        "workload-learning",
    } <= names
    assert {t.name for t in threading.enumerate() if t.name.startswith("hami-watch-")} == {
        "hami-watch-nodes",
        "hami-watch-pods",
        "hami-watch-resourcequotas",
        "hami-watch-poddisruptionbudgets",
    }


async def test_verbs_bind_loopback_and_probes_all_interfaces_by_default(running: Listeners) -> None:
    assert running.verbs[0] == "127.0.0.1" and running.verbs[1] > 0
    assert running.metrics[0] == "0.0.0.0" and running.metrics[1] > 0
    assert running.verbs[1] != running.metrics[1]


async def test_verbs_are_not_served_on_the_metrics_listener(running: Listeners) -> None:
    verbs, metrics = f"http://127.0.0.1:{running.verbs[1]}", f"http://127.0.0.1:{running.metrics[1]}"
    body: dict[str, Any] = {"Pod": make_pod("p"), "Nodes": None, "NodeNames": ["n1"]}
    async with aiohttp.ClientSession() as session:
        for path in VERBS:
            async with session.post(metrics + path, json=body) as response:
                assert response.status == 404, path
        for path in PROBES:
            async with session.get(metrics + path) as response:
                assert response.status == 200, path
        # and the verbs listener serves only the verbs
        async with session.post(verbs + "/filter", json=body) as response:
            assert response.status == 200
            assert (await response.json())["NodeNames"] == ["n1"]
        for path in PROBES:
            async with session.get(verbs + path) as response:
                assert response.status == 404, path


async def test_verbs_are_unreachable_from_another_interface(running: Listeners) -> None:
    address = non_loopback_address()
    if address is None:
        pytest.skip("this machine has no non-loopback IPv4 address to connect from")
    async with aiohttp.ClientSession() as session:
        async with session.get(f"http://{address}:{running.metrics[1]}/healthz") as response:
            assert response.status == 200  # the metrics listener is on every interface
        with pytest.raises(aiohttp.ClientConnectorError):
            await session.post(f"http://{address}:{running.verbs[1]}/bind", json={"PodName": "p"})
