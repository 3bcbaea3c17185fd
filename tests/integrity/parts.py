"""The real components the stress programs drive, built in-process.

:class:`Extender` is one scheduler process: the real aiohttp app (``build_context`` + ``create_app``,
without its watches) under a loopback ``TestServer`` whose handlers are cancelled when the caller
disconnects (so :meth:`Extender.kill` stops a bind where it stands, like SIGKILL), an API client going
through the fault proxy, and a snapshot fed by :meth:`Extender.sync` from the API server's current
objects (the program decides when the "watch" delivers: after every step). :class:`NodeSide` is one
node: the real agent (``Allocator`` behind ``DevicePluginService``) and the test kit's kubelet model
(:class:`hami_testkit.device_manager.DeviceManager`, the one the embedded cluster's kubelet stand-in
runs), calling the plugin's servicer in-process, that admits a bound pod container by container
(``GetPreferredAllocation``, then ``Allocate`` with replica IDs it holds free) and sets the pod
Running, or Failed with ``UnexpectedAdmissionError`` when Allocate refuses; :class:`NodeSide` records
what each container was served. Test code only.
"""

from __future__ import annotations

import dataclasses
import datetime
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from hami import objects
from hami.core.model import Grant
from hami.kube.client import load_api_client
from hami.kubeletapi import api_pb2
from hami.scheduler.app import create_app
from hami.scheduler.config import SchedulerSettings
from hami.scheduler.main import build_context
from hami_testkit.device_manager import DeviceManager, PluginRefused
from nodeagent.allocate_call import Allocator
from nodeagent.backends.simulated import SimBackend
from nodeagent.config import NodeSettings
from nodeagent.deviceplugin.server import DevicePluginService, kubelet_devices
from nodeagent.inventory import Inventory

from .checker import TERMINAL, Served, bound_to, key_of, meta, phase_of

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


class _Context:
    """The part of a gRPC servicer context the device plugin uses: ``abort`` is the RPC error kubelet
    sees."""

    async def abort(self, code: Any, details: str) -> None:
        raise PluginRefused(code.name, details)


class InProcessPlugin:
    """The agent's device-plugin servicer, called in-process as kubelet calls it over gRPC
    (:class:`hami_testkit.device_manager.PluginCalls`; any other exception is gRPC's ``UNKNOWN``)."""

    def __init__(self, service: DevicePluginService, ids: Sequence[str], options: Any) -> None:
        self.service = service
        self.devices = dict.fromkeys(ids, True)
        self.options = options

    async def _call(self, method: Callable[[Any, Any], Awaitable[Any]], request: Any) -> Any:
        try:
            return await method(request, _Context())
        except PluginRefused:
            raise
        except Exception as exc:  # gRPC answers UNKNOWN for an exception the servicer did not handle
            raise PluginRefused("UNKNOWN", f"{type(exc).__name__}: {exc}") from exc

    async def preferred(self, request: Any) -> Any:
        return await self._call(self.service.GetPreferredAllocation, request)

    async def allocate(self, request: Any) -> Any:
        return await self._call(self.service.Allocate, request)

    async def pre_start(self, request: Any) -> Any:
        return await self._call(self.service.PreStartContainer, request)


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
        self.calls: InProcessPlugin | None = None
        self.kubelet = DeviceManager(name, lambda: [GPU], self._plugin_for)

    async def start(self) -> None:
        await self.inventory.refresh()
        ids = [d.ID for d in kubelet_devices(self.inventory.cards, self.settings)]
        options = await self.plugin.GetDevicePluginOptions(api_pb2.Empty(), _Context())
        self.calls = InProcessPlugin(self.plugin, ids, options)

    async def _plugin_for(self, resource: str) -> InProcessPlugin:
        assert self.calls is not None, "start() the node first"
        return self.calls

    def admitted(self, pod: Mapping[str, Any]) -> bool:
        """Kubelet admits a pod (uid) once."""
        return (*key_of(pod), str(meta(pod).get("uid"))) in self.kubelet.admitted

    async def admit(
        self,
        pod: Mapping[str, Any],
        pods: Callable[[], Awaitable[Mapping[tuple[str, str], Mapping[str, Any]]]],
        set_status: Callable[[Mapping[str, Any], dict[str, Any]], Awaitable[None]],
        record: Callable[[Served], None],
    ) -> str:
        """Admit ``pod`` as kubelet does (the test kit's device manager); returns what happened (for the
        log)."""

        async def forget_gone() -> None:
            """What kubelet's pod watch would have told it by now: pods gone, replaced or finished."""
            current = await pods()
            for key, held in list(self.kubelet.assigned.items()):
                found = current.get(key)
                if found is None or str(meta(found).get("uid")) != held.uid or phase_of(found) in TERMINAL:
                    self.kubelet.release(key)

        async def write(key: tuple[str, str], status: dict[str, Any]) -> None:
            await set_status(pod, status)

        done = await self.kubelet.admit(pod, write, before_each=forget_gone)
        namespace, name = key_of(pod)
        containers = [c["name"] for c in objects.containers_init_first(pod)]
        inits = len((pod.get("spec") or {}).get("initContainers") or [])
        for entry in done.entries:
            index = containers.index(entry["containerName"])
            record(
                Served(
                    namespace=namespace,
                    name=name,
                    uid=str(meta(pod).get("uid")),
                    node=self.name,
                    index=index,
                    init=index < inits,
                    grants=served_grants(entry["envs"]),
                )
            )
        return "admitted" if done.admitted else f"admission failed: {done.message}"


def admissible(pod: Mapping[str, Any], node: str) -> bool:
    return bound_to(pod) == node and phase_of(pod) == "Pending"
