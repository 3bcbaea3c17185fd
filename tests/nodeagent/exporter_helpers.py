"""Builders for the exporter tests: pods carrying codec-built allocations, a fake ``/proc``, and a
scrape of a real ``/metrics`` endpoint parsed back with prometheus-client's own parser."""

from __future__ import annotations

import datetime
import hashlib
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import aiohttp
import kmock
from prometheus_client.parser import text_string_to_metric_families

from hami.annotations import POD_VGPU_NODE, allocation_annotations
from hami.core.model import Grant

NODE = "gpu-node-1"
NOW = datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)
MIB = 1024 * 1024

Samples = list[tuple[str, dict[str, str], float]]


def grant(uuid: str, memory: int, cores: int) -> Grant:
    return Grant(uuid=uuid, type="NVIDIA", memory_mib=memory, cores=cores)


def container_id(pod: str, container: str) -> str:
    """A stable 64-hex runtime ID for a (pod, container)."""
    return hashlib.sha256(f"{pod}/{container}".encode()).hexdigest()


def pod_uid(pod: str) -> str:
    return str(uuid.uuid5(uuid.NAMESPACE_DNS, pod))


async def create_gpu_pod(
    k: kmock.KubernetesEmulator,
    name: str,
    devices: Sequence[Sequence[Grant]],
    *,
    containers: Sequence[str],
    init_containers: Sequence[str] = (),
    node: str = NODE,
    phase: str = "Running",
    annotations: dict[str, str] | None = None,
    init_statuses: list[dict[str, Any]] | None = None,
    namespace: str = "default",
) -> None:
    """A pod the scheduler placed on ``node``: codec-built annotations, the vgpu-node label, and
    container statuses carrying runtime IDs (see :func:`container_id`)."""
    written = allocation_annotations(node=node, devices=tuple(tuple(g) for g in devices), now=NOW)
    written.update(annotations or {})
    status: dict[str, Any] = {
        "phase": phase,
        "containerStatuses": [
            {"name": c, "containerID": f"containerd://{container_id(name, c)}"} for c in containers
        ],
    }
    if init_statuses is not None:
        status["initContainerStatuses"] = init_statuses
    spec: dict[str, Any] = {"nodeName": node, "containers": [{"name": c} for c in containers]}
    if init_containers:
        spec["initContainers"] = [{"name": c} for c in init_containers]
    body = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "uid": pod_uid(name),
            "labels": {POD_VGPU_NODE: node},
            "annotations": written,
        },
        "spec": spec,
        "status": status,
    }
    response = await k.post(f"/api/v1/namespaces/{namespace}/pods", json=body)
    assert response.status in (200, 201), await response.text()


def write_cgroup(proc: Path, pid: int, text: str) -> None:
    (proc / str(pid)).mkdir(parents=True, exist_ok=True)
    (proc / str(pid) / "cgroup").write_text(text)


async def scrape(url: str, *, accept: str | None = None) -> Samples:
    """GET ``url`` and parse the Prometheus text format into (name, labels, value) samples."""
    headers = {"Accept": accept} if accept else {}
    async with aiohttp.ClientSession() as session, session.get(url, headers=headers) as response:
        assert response.status == 200, await response.text()
        text = await response.text()
    return [
        (s.name, dict(s.labels), s.value) for f in text_string_to_metric_families(text) for s in f.samples
    ]


def values(samples: Samples, name: str, **labels: str) -> list[float]:
    """Values of ``name`` whose labels include ``labels``."""
    return [v for n, got, v in samples if n == name and all(got.get(k) == w for k, w in labels.items())]


def value(samples: Samples, name: str, **labels: str) -> float:
    """The one value of ``name`` matching ``labels`` (fails when there are none or several)."""
    found = values(samples, name, **labels)
    assert len(found) == 1, f"{name}{labels}: expected one series, got {found}"
    return found[0]
