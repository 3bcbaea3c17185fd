"""Builders shared by the node-agent tests: simulated-card files, Nodes and Pods on the embedded API
server, pods as the scheduler's bind leaves them (:func:`placed`), the Allocator and the device plugin
served over a real unix socket, and what a test reads back (annotations, Events, kubelet's answers)."""

from __future__ import annotations

import datetime
from collections.abc import AsyncIterator, Iterable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import grpc
import kmock
import pytest
import yaml

from hami.annotations import (
    NODE_LOCK,
    POD_BIND_PHASE,
    BindPhase,
    allocation_annotations,
    bind_annotations,
)
from hami.core.model import Grant, MigAllocation, PodDevices
from hami.kube.nodelock import acquire_node_lock
from hami.kubeletapi import api_pb2, api_pb2_grpc
from nodeagent.allocate_call import Allocator
from nodeagent.backends.base import Backend
from nodeagent.backends.simulated import SimBackend
from nodeagent.config import NodeSettings
from nodeagent.deviceplugin.server import DevicePluginService
from nodeagent.inventory import Inventory
from nodeagent.podcache import NodePods
from tests.builders import create, make_node, make_pod

#: when the pods of these tests were bound (their hami.io/bind-time)
NOW = datetime.datetime(2026, 3, 1, 12, 0, tzinfo=datetime.UTC)
POD = "/api/v1/namespaces/default/pods/"
EVENTS = kmock.resource("v1/events")


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
    """A Node without our registration yet (``tests.builders.make_node`` with no cards)."""
    await create(k, make_node(name, cards=0, annotations=annotations))


async def create_pod(
    k: kmock.KubernetesEmulator, name: str, *, containers: list[dict[str, Any]], **kw: Any
) -> None:
    """A Pod as the API server stores it (``tests.builders.make_pod``: ``scheduler`` is
    ``spec.schedulerName``, ours by default; ``node`` ``spec.nodeName``; ``status`` extra status fields)."""
    await create(k, make_pod(name, containers=containers, **kw))


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


# ------------------------------------------------------------------------- pods as bind leaves them
def g(uuid: str, mem: int = 1000, cores: int = 10) -> Grant:
    """One granted card: ``mem`` MiB and ``cores`` % of card ``uuid``."""
    return Grant(uuid=uuid, memory_mib=mem, cores=cores)


def gpu(name: str, count: int = 1) -> dict[str, Any]:
    """A container asking kubelet for ``count`` cards."""
    return {"name": name, "image": "x", "resources": {"limits": {"nvidia.com/gpu": str(count)}}}


async def take_lock(api: Any, name: str, node: str = "n1") -> None:
    """``default/name`` takes ``node``'s lock now, as bind does (through hami.kube)."""
    await acquire_node_lock(api, node, "default", name, now=datetime.datetime.now(datetime.UTC))


async def placed(
    k: kmock.KubernetesEmulator,
    api: Any,
    name: str,
    devices: PodDevices,
    *,
    grant_node: str = "n1",
    node: str = "n1",
    phase: BindPhase = BindPhase.ALLOCATING,
    bound_at: datetime.datetime = NOW,
    mig: Iterable[MigAllocation] = (),
    extra: dict[str, str] | None = None,
    lock: bool = True,
    **kw: Any,
) -> None:
    """A pod as bind leaves it: the codec's allocation and bind annotations for ``grant_node`` (``extra``
    written over them), bound to ``node``, holding ``grant_node``'s lock unless ``lock`` is False. Its
    containers (``kw``, as :func:`create_pod`; one ``main`` by default) ask kubelet for the cards their
    entry grants (:func:`asking`)."""
    annotations = allocation_annotations(node=grant_node, devices=devices, mig=mig, now=bound_at)
    annotations.update(bind_annotations(phase, now=bound_at))
    annotations.update(extra or {})
    kw.setdefault("containers", [gpu("main", len(devices[0]) if devices else 1)])
    asking(devices, kw["containers"], kw.get("init_containers"))
    await create_pod(k, name, annotations=annotations, node=node, **kw)
    if lock:
        await take_lock(api, name, grant_node)


async def running_lock_holder(k: kmock.KubernetesEmulator, api: Any, name: str = "other") -> None:
    """A Running pod on n1 that holds n1's lock (kubelet admitted it long ago)."""
    await create_pod(k, name, containers=[{"name": "c", "image": "x"}], node="n1", phase="Running")
    await take_lock(api, name)


async def foreign_pod(
    k: kmock.KubernetesEmulator, name: str = "f", container: str = "main", **kw: Any
) -> None:
    """A pod another scheduler (``default-scheduler``) bound to n1, asking kubelet for one card."""
    await create_pod(k, name, containers=[gpu(container)], node="n1", scheduler="default-scheduler", **kw)


# ------------------------------------------------------------------------------- the agent's side
async def sim_inventory(tmp_path: Path, cards: list[dict[str, Any]]) -> Inventory:
    """An inventory of simulated ``cards`` (written to ``tmp_path/cards.yaml``), read once."""
    inventory = Inventory(SimBackend(write_cards(tmp_path / "cards.yaml", cards)))
    await inventory.refresh()
    return inventory


def make_allocator(
    api: Any,
    tmp_path: Path,
    inventory: Inventory,
    settings: NodeSettings,
    *,
    backend: Backend | None = None,
    pods: NodePods | None = None,
) -> Allocator:
    """The Allocator of node n1 (our scheduler's pods), with its hook and lock directories under
    ``tmp_path``; it reads the node's pods from ``pods`` (a list per call without)."""
    return Allocator(
        api=api,
        node_name="n1",
        settings=settings,
        hook_path=tmp_path / "hook",
        lock_dir=tmp_path / "vgpulock",
        backend=backend,
        inventory=inventory,
        pods=pods,
    )


@asynccontextmanager
async def plugin_stub(
    allocator: Allocator, inventory: Inventory, settings: NodeSettings, sock_dir: Path
) -> AsyncIterator[Any]:
    """The device plugin around ``allocator``, served on ``sock_dir``: yields kubelet's client stub;
    the Events still being written are drained on exit."""
    service = DevicePluginService(inventory=inventory, settings=settings, allocator=allocator)
    async with serving(service, sock_dir) as stub:
        yield stub
    await allocator.events.drain()


# --------------------------------------------------------------------------------- what comes back
def events(k: kmock.KubernetesEmulator, reason: str = "AllocationFailed") -> list[dict[str, Any]]:
    """The Events posted with ``reason``, oldest first."""
    return [r.data for r in k["post", EVENTS] if r.data["reason"] == reason]


async def bind_phase(k: kmock.KubernetesEmulator, name: str) -> str:
    return (await annotations_of(k, POD + name))[POD_BIND_PHASE]


async def visible(stub: Any, *ids: str) -> str:
    """Kubelet's Allocate with ``ids`` for one container: the ``NVIDIA_VISIBLE_DEVICES`` it got."""
    answer = await stub.Allocate(allocate_request(list(ids)), timeout=60)
    return str(dict(answer.container_responses[0].envs)["NVIDIA_VISIBLE_DEVICES"])


async def refused(stub: Any, *ids: str, code: grpc.StatusCode = grpc.StatusCode.FAILED_PRECONDITION) -> str:
    """Kubelet's Allocate (``ids``, GPU-a-0 by default) must fail with ``code`` and hand out nothing;
    its message."""
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        answer = await stub.Allocate(allocate_request(list(ids) or ["GPU-a-0"]), timeout=60)
        pytest.fail(f"Allocate answered {answer}")  # pragma: no cover - only on a regression
    assert caught.value.code() == code, caught.value.details()
    return str(caught.value.details())
