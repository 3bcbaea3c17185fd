"""The running extender's handle for the scheduler tests (raw objects: ``tests.builders``; waits:
``tests.eventually``)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import kmock
from aiohttp import ClientTimeout
from aiohttp.test_utils import TestClient

from hami.kube.events import EventRecorder
from hami.scheduler.context import Context

NO_DEADLINE = ClientTimeout(total=None, sock_connect=None, sock_read=None)


@dataclass
class Extender:
    ctx: Context
    client: TestClient[Any, Any]  # the verbs listener
    apiserver: kmock.KubernetesEmulator
    probes: TestClient[Any, Any]  # /healthz, /readyz, /metrics
    recorder: EventRecorder  # the aggregated FilteringFailed Events

    async def post(self, path: str, body: Any) -> Any:
        # no client deadline: a bind may queue behind many others on a loaded machine; the test's own
        # pytest-timeout is the guard against one that never ends
        response = await self.client.post(path, json=body, timeout=NO_DEADLINE)
        assert response.status == 200, await response.text()
        return await response.json()

    async def filter(self, pod: dict[str, Any], names: list[str]) -> Any:
        return await self.post("/filter", {"Pod": pod, "Nodes": None, "NodeNames": names})

    async def prioritize(self, pod: dict[str, Any], names: list[str]) -> Any:
        return await self.post("/prioritize", {"Pod": pod, "Nodes": None, "NodeNames": names})

    async def bind(self, name: str, node: str, namespace: str = "default") -> Any:
        body = {"PodName": name, "PodNamespace": namespace, "PodUID": f"uid-{name}", "Node": node}
        return await self.post("/bind", body)

    async def stored(self, path: str) -> Any:
        return await (await self.apiserver.get(path)).json()

    async def pod(self, name: str, namespace: str = "default") -> Any:
        return await self.stored(f"/api/v1/namespaces/{namespace}/pods/{name}")

    async def node(self, name: str) -> Any:
        return await self.stored(f"/api/v1/nodes/{name}")

    async def settle(self) -> None:
        """Wait for the background Events/handshakes to be written (aggregated Events: flushed now)."""
        await self.ctx.background.drain()
        await self.recorder.flush()


StartExtender = Callable[..., Awaitable[Extender]]
