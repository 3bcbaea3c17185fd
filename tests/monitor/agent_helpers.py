"""Builders shared by the node-agent tests: simulated-card files, Nodes and Pods on the embedded API
server."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import kmock
import yaml


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
) -> None:
    spec: dict[str, Any] = {"containers": containers}
    if init_containers:
        spec["initContainers"] = init_containers
    if node:
        spec["nodeName"] = node
    metadata: dict[str, Any] = {"name": name, "namespace": namespace, "uid": f"uid-{name}"}
    if annotations:
        metadata["annotations"] = annotations
    body = {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec, "status": {"phase": phase}}
    await k.post(f"/api/v1/namespaces/{namespace}/pods", json=body)


async def annotations_of(k: kmock.KubernetesEmulator, path: str) -> dict[str, str]:
    response = await k.get(path)
    body = await response.json()
    return dict((body.get("metadata") or {}).get("annotations") or {})
