"""The real components the stress programs drive, built in-process.

:class:`Extender` is one scheduler process: the real aiohttp app (``build_context`` + ``create_app``,
without its watches) under a loopback ``TestServer`` whose handlers are cancelled when the caller
disconnects (so :meth:`Extender.kill` stops a bind where it stands, like SIGKILL), an API client going
through the fault proxy, and a snapshot fed by :meth:`Extender.sync` from the API server's current
objects (the program decides when the "watch" delivers: after every step). :class:`NodeSide` is one
node: the real agent (``Allocator`` behind ``DevicePluginService``) and a kubelet device-manager model
that admits a bound pod container by container (``GetPreferredAllocation``, then ``Allocate`` with
replica IDs it holds free), records what each container was served, and sets the pod Running, or
Failed with ``UnexpectedAdmissionError`` when Allocate refuses. Test code only.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from hami.core.model import Grant
from hami.kube.client import load_api_client
from hami.kubeletapi import api_pb2
from hami.scheduler.app import create_app
from hami.scheduler.config import SchedulerSettings
from hami.scheduler.main import build_context
from nodeagent.allocate_call import Allocator
from nodeagent.backends.simulated import SimBackend
from nodeagent.config import NodeSettings
from nodeagent.deviceplugin.server import DevicePluginService, kubelet_devices
from nodeagent.inventory import Inventory

from .checker import Served, bound_to, key_of, meta, phase_of

GPU = "nvidia.com/gpu"


class Extender:
    """One scheduler process (see the module docstring)."""

    def __init__(
        self,
        kubeconfig: str,
        clock: Callable[[], datetime.datetime],
        ticker: Callable[[], float],
        settings: SchedulerSettings,
    ) -> None:
        self.api = load_api_client(kubeconfig, request_timeout=120.0, component="integrity-scheduler")
        # the bind deadlines run on the world's ticker, so an ``Advance`` moves them too
        self.ctx = dataclasses.replace(build_context(settings, self.api, clock=clock), ticker=ticker)
        # extender calls: sent by kube-scheduler, received by a handler, handler returned, answer read
        self.sent = self.received = self.handled = self.answered = 0
        self.client: TestClient[Any, Any] | None = None

    async def start(self, nodes: Sequence[Mapping[str, Any]], pods: Sequence[Mapping[str, Any]]) -> None:
        app = create_app(self.ctx)

        @web.middleware
        async def count(request: web.Request, handler: Callable[[web.Request], Awaitable[Any]]) -> Any:
            self.received += 1
            try:
                return await handler(request)
            finally:
                self.handled += 1

        app.middlewares.append(count)
        self.client = TestClient(TestServer(app, host="127.0.0.1", handler_cancellation=True))
        await self.client.start_server()
        self.sync(nodes, pods)

    def sync(self, nodes: Sequence[Mapping[str, Any]], pods: Sequence[Mapping[str, Any]]) -> None:
        """The watches deliver: the snapshot catches up with the API server (a relist)."""
        self.ctx.snapshot.replace_nodes(nodes)
        self.ctx.snapshot.replace_pods(pods)
        self.ctx.snapshot.replace_quotas([])

    async def bind(self, name: str, node: str, uid: str, namespace: str = "default") -> str:
        """kube-scheduler's bind call; the extender's ``Error`` text ('' = bound)."""
        assert self.client is not None
        body = {"PodName": name, "PodNamespace": namespace, "PodUID": uid, "Node": node}
        self.sent += 1
        try:
            response = await self.client.post("/bind", json=body)
            if response.status != 200:
                return f"HTTP {response.status}: {await response.text()}"
            return str((await response.json()).get("Error") or "")
        finally:
            self.answered += 1

    @property
    def in_transit(self) -> int:
        """Extender calls on the wire: sent but not yet at a handler, or answered but not yet read."""
        return (self.sent - self.received) + (self.handled - self.answered)

    def metric(self, name: str, **labels: str) -> float:
        """The sum of the scheduler's samples ``name`` with these labels (read from its registry)."""
        return sum(
            sample.value
            for family in self.ctx.metrics.registry.collect()
            for sample in family.samples
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items())
        )

    def usage(self) -> dict[str, tuple[int, int, int]]:
        """Per card uuid: (memory MiB, slots, cores) the scheduler counts, from its allocation gauges."""
        out: dict[str, list[float]] = {}
        wanted = {
            "hami_gpu_memory_allocated_bytes": 0,
            "hami_gpu_shared_count": 1,
            "hami_gpu_core_allocated_ratio": 2,
        }
        for family in self.ctx.metrics.registry.collect():
            for sample in family.samples:
                if sample.name in wanted:
                    out.setdefault(sample.labels["device_uuid"], [0.0, 0.0, 0.0])[wanted[sample.name]] = (
                        sample.value
                    )
        return {uuid: (int(v[0]) // 1048576, int(v[1]), int(v[2])) for uuid, v in out.items()}

    async def stop(self) -> None:
        if self.client is not None:
            await self.client.close()
        await self.ctx.background.drain(5.0)

    def close_api(self) -> None:
        self.api.close()


class Rejected(Exception):
    """``context.abort`` of the device plugin: kubelet sees an RPC error."""


class _Context:
    """The part of a gRPC servicer context the device plugin uses."""

    async def abort(self, code: Any, details: str) -> None:
        raise Rejected(f"{code.name}: {details}")


def _gpus(container: Mapping[str, Any]) -> int:
    resources = container.get("resources") or {}
    merged = {**(resources.get("requests") or {}), **(resources.get("limits") or {})}
    try:
        return int(str(merged.get(GPU, "0")))
    except ValueError:
        return 0


def served_grants(envs: Mapping[str, str]) -> tuple[Grant, ...]:
    """The grants an Allocate answer gives one container: visible uuids, per-position memory, cores."""
    uuids = [u for u in envs.get("NVIDIA_VISIBLE_DEVICES", "").split(",") if u]
    cores = int(envs.get("CUDA_DEVICE_SM_LIMIT", "0") or 0)
    grants = []
    for position, uuid in enumerate(uuids):
        memory = envs.get(f"CUDA_DEVICE_MEMORY_LIMIT_{position}", "0").removesuffix("m")
        grants.append(Grant(uuid=uuid, memory_mib=int(memory or 0), cores=cores))
    return tuple(grants)


class NodeSide:
    """One node's agent and kubelet (see the module docstring)."""

    def __init__(self, name: str, cards_file: Any, agent_api: Any, settings: NodeSettings) -> None:
        self.name = name
        self.settings = settings
        self.inventory = Inventory(SimBackend(cards_file))
        self.allocator = Allocator(api=agent_api, node_name=name, settings=settings, inventory=self.inventory)
        self.plugin = DevicePluginService(
            inventory=self.inventory, settings=settings, allocator=self.allocator
        )
        self.ids: list[str] = []
        self.held: dict[tuple[str, str, str], list[str]] = {}  # (namespace, name, uid) -> replica ids
        self.admitting = asyncio.Lock()  # kubelet admits one pod at a time

    async def start(self) -> None:
        await self.inventory.refresh()
        self.ids = [d.ID for d in kubelet_devices(self.inventory.cards, self.settings)]

    def _free(self, pods: Mapping[tuple[str, str], Mapping[str, Any]]) -> list[str]:
        live = set()
        for (namespace, name, uid), ids in self.held.items():
            pod = pods.get((namespace, name))
            if (
                pod is not None
                and str(meta(pod).get("uid")) == uid
                and phase_of(pod) not in ("Succeeded", "Failed")
            ):
                live.update(ids)
        return [i for i in self.ids if i not in live]

    async def admit(
        self,
        pod: Mapping[str, Any],
        pods: Callable[[], Awaitable[Mapping[tuple[str, str], Mapping[str, Any]]]],
        set_status: Callable[[Mapping[str, Any], dict[str, Any]], Awaitable[None]],
        record: Callable[[Served], None],
    ) -> str:
        """Admit ``pod`` as kubelet does; returns what happened (for the log)."""
        async with self.admitting:
            namespace, name = key_of(pod)
            uid = str(meta(pod).get("uid"))
            spec = pod.get("spec") or {}
            inits = list(spec.get("initContainers") or [])
            containers = [*inits, *(spec.get("containers") or [])]
            held = self.held.setdefault((namespace, name, uid), [])
            for index, container in enumerate(containers):
                count = _gpus(container)
                if count <= 0:
                    continue
                free = self._free(await pods())
                if len(free) < count:
                    return await self._reject(pod, set_status, f"{count} {GPU} requested, {len(free)} free")
                chosen = free[:count]
                try:
                    preferred = await self.plugin.GetPreferredAllocation(
                        api_pb2.PreferredAllocationRequest(
                            container_requests=[
                                api_pb2.ContainerPreferredAllocationRequest(
                                    available_deviceIDs=free, allocation_size=count
                                )
                            ]
                        ),
                        _Context(),
                    )
                    ids = list(preferred.container_responses[0].deviceIDs)
                    if len(ids) == count and set(ids) <= set(free):
                        chosen = ids
                    answer = await self.plugin.Allocate(
                        api_pb2.AllocateRequest(
                            container_requests=[api_pb2.ContainerAllocateRequest(devices_ids=chosen)]
                        ),
                        _Context(),
                    )
                except Exception as exc:  # any RPC error fails admission (gRPC answers UNKNOWN for the rest)
                    return await self._reject(pod, set_status, f"{type(exc).__name__}: {exc}")
                held.extend(chosen)
                envs = dict(answer.container_responses[0].envs) if answer.container_responses else {}
                record(
                    Served(
                        namespace=namespace,
                        name=name,
                        uid=uid,
                        node=self.name,
                        index=index,
                        init=index < len(inits),
                        grants=served_grants(envs),
                    )
                )
            await set_status(pod, running_status(pod))
            return "admitted"

    async def _reject(
        self,
        pod: Mapping[str, Any],
        set_status: Callable[[Mapping[str, Any], dict[str, Any]], Awaitable[None]],
        why: str,
    ) -> str:
        await set_status(pod, {"phase": "Failed", "reason": "UnexpectedAdmissionError", "message": why})
        return f"admission failed: {why}"


def running_status(pod: Mapping[str, Any]) -> dict[str, Any]:
    """Running, init containers terminated with exit code 0."""
    inits = (pod.get("spec") or {}).get("initContainers") or []
    return {
        "phase": "Running",
        "initContainerStatuses": [
            {"name": c["name"], "state": {"terminated": {"exitCode": 0, "reason": "Completed"}}}
            for c in inits
        ],
    }


def admissible(pod: Mapping[str, Any], node: str) -> bool:
    return bound_to(pod) == node and phase_of(pod) == "Pending"
