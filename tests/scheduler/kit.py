"""Builders for the scheduler tests: registered nodes, GPU pods, the running extender's handle."""

from __future__ import annotations

import asyncio
import datetime
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import kmock
from aiohttp.test_utils import TestClient

from hami.annotations import (
    NODE_HANDSHAKE,
    NODE_REGISTER,
    HandshakeKind,
    encode_handshake,
    encode_node_devices,
)
from hami.core.model import Device
from hami.kube.events import EventRecorder
from hami.scheduler.context import Context
from hami.scheduler.snapshot import local_time

NOW = datetime.datetime(2026, 5, 1, 10, 0, 0, tzinfo=datetime.UTC)
HANDSHAKE = encode_handshake(HandshakeKind.REQUESTING, local_time(NOW))


def card(node: str, index: int, *, count: int = 10, memory: int = 10000, cores: int = 100) -> Device:
    return Device(
        uuid=f"GPU-{node}-{index}",
        index=index,
        count=count,
        memory_mib=memory,
        cores=cores,
        type="NVIDIA-Tesla V100-PCIE-32GB",
        mode="hami-core",
        health=True,
    )


def make_node(
    name: str,
    cards: int = 2,
    *,
    memory: int = 10000,
    count: int = 10,
    register: str | None = None,
    annotations: dict[str, str] | None = None,
) -> dict[str, Any]:
    """A registered, healthy node (handshake answered, allocatable > 0) unless told otherwise."""
    text = (
        register
        if register is not None
        else encode_node_devices([card(name, i, count=count, memory=memory) for i in range(cards)])
    )
    merged = {NODE_REGISTER: text, NODE_HANDSHAKE: HANDSHAKE, **(annotations or {})}
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "annotations": merged},
        "status": {"allocatable": {"nvidia.com/gpu": str(cards * count)}},
    }


def make_pod(
    name: str,
    *,
    gpus: int = 1,
    memory: int = 1000,
    cores: int = 30,
    annotations: dict[str, str] | None = None,
    namespace: str = "default",
) -> dict[str, Any]:
    limits = {
        "nvidia.com/gpu": str(gpus),
        "nvidia.com/gpumem": str(memory),
        "nvidia.com/gpucores": str(cores),
    }
    container: dict[str, Any] = {"name": "main", "image": "cuda"}
    if gpus:
        container["resources"] = {"limits": limits}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "uid": f"uid-{name}",
            "annotations": annotations or {},
        },
        "spec": {"schedulerName": "hami-scheduler", "containers": [container]},
        "status": {"phase": "Pending"},
    }


async def until(predicate: Callable[[], bool], what: str, seconds: float = 5.0) -> None:
    """Poll ``predicate`` on the loop until it holds, at most ``seconds``."""
    deadline = asyncio.get_running_loop().time() + seconds
    while not predicate():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.005)


@dataclass
class Extender:
    ctx: Context
    client: TestClient[Any, Any]  # the verbs listener
    apiserver: kmock.KubernetesEmulator
    probes: TestClient[Any, Any]  # /healthz, /readyz, /metrics
    recorder: EventRecorder  # the aggregated FilteringFailed Events

    async def post(self, path: str, body: Any) -> Any:
        response = await self.client.post(path, json=body)
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
