"""Builders shared by the node-agent tests: simulated-card files, Nodes and Pods on the embedded API
server, and the device plugin served over a real unix socket."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import grpc
import kmock
import yaml

from hami.annotations import NODE_LOCK
from hami.kubeletapi import api_pb2, api_pb2_grpc
from monitor.deviceplugin.server import DevicePluginService


def write_cards(path: Path, cards: list[dict[str, Any]], links: list[dict[str, Any]] | None = None) -> Path:
    document: dict[str, Any] = {"cards": cards}
    if links:
        document["links"] = links
    path.write_text(yaml.safe_dump(document))
    return path


def card(
    uuid: str, *, memory: int = 32768, numa: int = 0, healthy: bool = True, **extra: Any
) -> dict[str, Any]:
    return {
        "uuid": uuid,
        "model": "Tesla V100-PCIE-32GB",
        "memory_mib": memory,
        "numa": numa,
        "healthy": healthy,
        **extra,
    }


async def create_node(
    k: kmock.KubernetesEmulator, name: str, annotations: dict[str, str] | None = None
) -> None:
    metadata: dict[str, Any] = {"name": name}
    if annotations is not None:
        metadata["annotations"] = annotations
    await k.post("/api/v1/nodes", json={"apiVersion": "v1", "kind": "Node", "metadata": metadata})


async def create_pod(
    k: kmock.KubernetesEmulator,
    name: str,
    *,
    containers: list[dict[str, Any]],
    init_containers: list[dict[str, Any]] | None = None,
    annotations: dict[str, str] | None = None,
    node: str | None = None,
    namespace: str = "default",
    phase: str = "Pending",
    scheduler: str | None = "hami-scheduler",
    status: dict[str, Any] | None = None,
) -> None:
    """A Pod as the API server stores it; ``scheduler`` is ``spec.schedulerName`` (our scheduler's by
    default, None = unset), ``status`` extra status fields (e.g. kubelet's container statuses)."""
    spec: dict[str, Any] = {"containers": containers}
    if init_containers:
        spec["initContainers"] = init_containers
    if node:
        spec["nodeName"] = node
    if scheduler:
        spec["schedulerName"] = scheduler
    metadata: dict[str, Any] = {"name": name, "namespace": namespace, "uid": f"uid-{name}"}
    if annotations:
        metadata["annotations"] = annotations
    body = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": metadata,
        "spec": spec,
        "status": {"phase": phase, **(status or {})},
    }
    await k.post(f"/api/v1/namespaces/{namespace}/pods", json=body)


async def annotations_of(k: kmock.KubernetesEmulator, path: str) -> dict[str, str]:
    response = await k.get(path)
    body = await response.json()
    return dict((body.get("metadata") or {}).get("annotations") or {})


@asynccontextmanager
async def serving(service: DevicePluginService, sock_dir: Path) -> AsyncIterator[Any]:
    """Serve ``service`` on ``<sock_dir>/nvidia-gpu.sock``; yields a DevicePlugin stub, stops it all after."""
    path = f"unix://{sock_dir / 'nvidia-gpu.sock'}"
    server = grpc.aio.server()
    api_pb2_grpc.add_DevicePluginServicer_to_server(service, server)
    server.add_insecure_port(path)
    await server.start()
    channel = grpc.aio.insecure_channel(path)
    try:
        yield api_pb2_grpc.DevicePluginStub(channel)
    finally:
        await channel.close()
        await server.stop(grace=None)


def allocate_request(*containers: list[str]) -> Any:
    """What kubelet sends: one ContainerAllocateRequest per container, with its replica IDs."""
    return api_pb2.AllocateRequest(
        container_requests=[api_pb2.ContainerAllocateRequest(devices_ids=ids) for ids in containers]
    )


async def node_lock(k: kmock.KubernetesEmulator) -> str | None:
    return (await annotations_of(k, "/api/v1/nodes/n1")).get(NODE_LOCK)


def asking(
    devices: Any, containers: list[dict[str, Any]], init_containers: list[dict[str, Any]] | None = None
) -> None:
    """Give each container without an ``nvidia.com/gpu`` value the card count of its entry in ``devices``
    (init containers first), as the pod the scheduler granted them asked: the grants come from the spec."""
    for container, grants in zip([*(init_containers or []), *containers], devices, strict=False):
        resources = container.setdefault("resources", {})
        limits = resources.setdefault("limits", {})
        if (
            grants
            and "nvidia.com/gpu" not in limits
            and "nvidia.com/gpu" not in resources.get("requests", {})
        ):
            limits["nvidia.com/gpu"] = str(len(grants))
