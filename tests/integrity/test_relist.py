"""A relist while binds are in flight (issue 24, "Scale faults"; docs/scale.md, "Scale faults", a): the
scheduler's pod watch is broken with ``410 Gone`` and it lists every pod again while pods are bound.

The real extender (``build_context`` + ``create_app`` + its list+watch feeds, ``keep_synced``) talks to the
test kit's embedded API server through :class:`hami_testkit.watchproxy.WatchProxy`, which breaks the pod
watch, holds the new LIST's answer (the list is taken at once) and holds the watch that follows it, so
each test decides exactly what is bound between the list being taken, applied and caught up with. The
test plays kube-scheduler (``/filter`` then ``/bind`` over HTTP); no agent runs, so a bound node's lock
stays and each node takes one pod. The verdict is :func:`hami_testkit.audit.audit` over what the API
server stores (its own test: ``test_audit.py``).

Nodes ``n1``, ``n2``, ``n3``: one card each (8,000 MiB, 100 cores, 3 slots). Namespace ``team`` has a
ResourceQuota of 4,000 MiB of GPU memory: one pod of 3,000 MiB fits it, two do not.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp.test_utils import TestClient, TestServer

from hami.annotations import (
    NODE_HANDSHAKE,
    NODE_REGISTER,
    HandshakeKind,
    encode_handshake,
    encode_node_devices,
)
from hami.core.model import Device
from hami.kube.client import load_api_client
from hami.scheduler.app import create_app
from hami.scheduler.config import SchedulerSettings
from hami.scheduler.context import Context
from hami.scheduler.main import build_context
from hami.scheduler.snapshot import local_time
from hami.scheduler.watches import keep_synced
from hami_testkit.apiserver import embedded_apiserver, write_kubeconfig
from hami_testkit.audit import Audit, audit
from hami_testkit.kubeapi import SimApi
from hami_testkit.watchproxy import WatchProxy
from tests.eventually import eventually

from .cluster import MEMORY, SLOTS, START, make_pod
from .program import Shape

pytestmark = pytest.mark.timeout(300)

NAMESPACE = "team"
QUOTA_MIB = 4000
POD = Shape("app", 1, 3000, 10)


def three_nodes() -> list[dict[str, Any]]:
    """``n1``, ``n2``, ``n3``: the stress programs' node shape, one card each."""
    handshake = encode_handshake(HandshakeKind.REQUESTING, local_time(START))
    out = []
    for name in ("n1", "n2", "n3"):
        card = Device(
            uuid=f"GPU-{name}-0", index=0, count=SLOTS, memory_mib=MEMORY, cores=100,
            type="NVIDIA-Tesla V100-PCIE-32GB", mode="hami-core", health=True,
        )  # fmt: skip
        annotations = {NODE_REGISTER: encode_node_devices([card]), NODE_HANDSHAKE: handshake}
        out.append(
            {
                "apiVersion": "v1",
                "kind": "Node",
                "metadata": {"name": name, "annotations": annotations},
                "status": {"allocatable": {"nvidia.com/gpu": str(SLOTS)}},
            }
        )
    return out


@dataclasses.dataclass
class Harness:
    ctx: Context
    client: TestClient[Any, Any]
    api: SimApi
    proxy: WatchProxy
    url: str

    async def create(self, name: str) -> dict[str, Any]:
        pod = make_pod(name, 0, POD)
        pod["metadata"]["namespace"] = NAMESPACE
        del pod["metadata"]["uid"]
        return await self.api.create(f"/api/v1/namespaces/{NAMESPACE}/pods", pod)

    async def schedule(self, pod: dict[str, Any], nodes: list[str]) -> str:
        """kube-scheduler's cycle for ``pod``: ``/filter`` over ``nodes``, ``/bind`` to the first that
        passed. The bind's answer (``""`` when bound), or the filter's verdict when none passed."""
        answer = await self._post("/filter", {"Pod": pod, "NodeNames": nodes})
        passed = answer.get("NodeNames") or []
        if not passed:
            return f"filter: {answer.get('FailedNodes') or answer.get('Error')}"
        meta = pod["metadata"]
        bound = await self._post(
            "/bind",
            {"PodName": meta["name"], "PodNamespace": NAMESPACE, "PodUID": meta["uid"], "Node": passed[0]},
        )
        return str(bound.get("Error") or "")

    async def _post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        response = await self.client.post(path, json=body)
        assert response.status == 200, await response.text()
        answer: dict[str, Any] = await response.json()
        return answer

    async def audit(self) -> Audit:
        nodes = await self.api.list_objects("/api/v1/nodes")
        pods = await self.api.list_objects("/api/v1/pods")
        quotas = await self.api.list_objects(f"/api/v1/namespaces/{NAMESPACE}/resourcequotas")
        return audit(nodes, pods, quotas)


@contextlib.asynccontextmanager
async def harness(tmp_path: Path) -> AsyncIterator[Harness]:
    async with (
        embedded_apiserver() as emulator,
        aiohttp.ClientSession() as session,
        WatchProxy(str(emulator.url)) as proxy,
    ):
        api = SimApi(session, str(emulator.url).rstrip("/"))
        for node in three_nodes():
            await api.create("/api/v1/nodes", node)
        await api.create("/api/v1/namespaces", {"metadata": {"name": NAMESPACE}})
        quota = {
            "metadata": {"name": "gpu", "namespace": NAMESPACE},
            "spec": {"hard": {"limits.nvidia.com/gpumem": str(QUOTA_MIB)}},
        }
        await api.create(f"/api/v1/namespaces/{NAMESPACE}/resourcequotas", quota)
        config = write_kubeconfig(tmp_path / "kubeconfig", proxy.url)
        settings = SchedulerSettings()
        client_api = load_api_client(str(config), request_timeout=settings.api_timeout)
        ctx = build_context(settings, client_api, clock=lambda: START)
        client: TestClient[Any, Any] = TestClient(TestServer(create_app(ctx), host="127.0.0.1"))
        await client.start_server()
        sync = asyncio.create_task(keep_synced(ctx), name="sync")
        try:
            await eventually(lambda: ctx.snapshot.ready or None, "the scheduler's first lists", within=60)
            yield Harness(ctx, client, api, proxy, proxy.url)
        finally:
            proxy.release("pods", "list")
            proxy.release("pods", "watch")
            sync.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await sync
            await client.close()
            client_api.close()


async def _relist_taken(h: Harness, *, hold_watch: bool) -> None:
    """Break the pod watch (410 on its resume) and wait until the new LIST was taken (answer held)."""
    h.proxy.hold_lists("pods")
    if hold_watch:
        h.proxy.hold_watches("pods")
    h.proxy.break_watches("pods", gone=True)
    await eventually(lambda: h.proxy.held("pods", "list") or None, "the relist, taken and held", within=60)


async def test_a_pod_bound_while_the_relist_is_taken_still_counts_against_the_quota(tmp_path: Path) -> None:
    """p1 is created and bound after the relist was taken (so the list does not have it); the list is
    applied before the watch catches up; p2 then asks the same namespace's quota on another node. Was:
    the list's arrival forgot p1's booking, p2 bound: ``namespace team: GPU memory 6000 > quota 4000 MiB``."""
    async with harness(tmp_path) as h:
        await _relist_taken(h, hold_watch=True)
        p1 = await h.create("p1")
        assert await h.schedule(p1, ["n1"]) == ""
        h.proxy.release("pods", "list")
        # the list is dispatched on the loop before the watch that follows it is sent
        await eventually(
            lambda: h.proxy.held("pods", "watch") or None, "the watch after the relist", within=60
        )
        p2 = await h.create("p2")
        outcome = await h.schedule(p2, ["n2"])
        h.proxy.release("pods", "watch")
        verdict = await h.audit()
        assert verdict.quotas == [], verdict.quotas
        assert verdict.cards == [], verdict.cards
        assert outcome != "", "p2 was bound beyond the quota"


async def test_binds_across_repeated_relists_never_overcommit(tmp_path: Path) -> None:
    """A stream of pods (each asking every node) bound while the pod watch is broken again and again: the
    quota holds one, each card three by slots but one by the quota; the verdict over what is stored
    shows no over-committed card or quota, and every pod is bound or refused with a reason."""
    async with harness(tmp_path) as h:
        outcomes = []
        for index in range(12):
            if index % 3 == 0:
                await _relist_taken(h, hold_watch=False)
            pod = await h.create(f"s{index}")
            outcomes.append(await h.schedule(pod, ["n1", "n2", "n3"]))
            if index % 3 == 1:
                h.proxy.release("pods", "list")
        h.proxy.release("pods", "list")
        verdict = await h.audit()
        assert verdict.problems == [], verdict.problems
        assert outcomes.count("") == 1, outcomes  # the quota's one pod
        assert h.proxy.gone >= 4, h.proxy.gone
