"""One node's agent: its parts built and its loops run, the same for ``hami-node-agent`` (one node per
process, :mod:`nodeagent.__main__`) and the fleet (many simulated nodes in one event loop,
:mod:`nodeagent.fleet`).

Owns :func:`open_backend_patiently` (a backend that cannot start is retried every minute, never an exit),
:func:`mps_control` (the node's MPS control daemon, MPS mode only) and :func:`run_node`: over an API
client and the node's pod cache it opens the backend, builds every collaborator of the node (inventory,
allocator, device plugin service, kubelet runner, registrar, the exporter's grant book and collectors),
starts or adopts the MPS daemon and restores its namespaces, then runs each loop as a named task (health
poll, registrar, kubelet plugin, exporter pods, the MPS daemon watch and namespace sweep) until cancelled,
draining the last Events and stopping the daemon on the way out. What it does not own is what a process
holds once whatever the number of nodes: the API client, how the pod cache is fed (its own watch for one
node, one shared watch for a fleet), the ``/metrics`` listener and the process set-up; the caller passes
those in (``collect`` receives the node's Prometheus collectors). Must not import pynvml or the
Kubernetes client.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass

from prometheus_client.registry import Collector

from hami.core.model import DeviceMode
from hami.kube.protocol import KubeApi
from nodeagent.allocate_call import Allocator
from nodeagent.backends import Backend, BackendUnavailable, open_backend
from nodeagent.config import AgentConfig, NodeSettings
from nodeagent.deviceplugin.kubelet import KubeletRunner
from nodeagent.deviceplugin.server import DevicePluginService
from nodeagent.exporter import NodeCollector
from nodeagent.grants import GrantBook
from nodeagent.inventory import Inventory
from nodeagent.mps.control import MpsControl
from nodeagent.mps.keeper import restore, sweep
from nodeagent.podcache import PodCache, PodCacheCollector
from nodeagent.registrar import Registrar

log = logging.getLogger("nodeagent")

#: Seconds between attempts to start a backend that is unavailable (no driver yet, bad file).
BACKEND_RETRY = 60.0
#: Seconds between the kubelet runner's looks at kubelet's socket and its own (a kubelet restart).
SOCKET_WATCH = 1.0


async def open_backend_patiently(config: AgentConfig, retry: float = BACKEND_RETRY) -> Backend:
    """Open the configured backend, waiting (never exiting) while it is unavailable."""
    while True:
        try:
            return open_backend(
                config.backend,
                sim_devices=config.sim_devices,
                topology=config.topology_score,
                health_recovery=config.health_recovery,
            )
        except BackendUnavailable as exc:
            level = logging.WARNING if config.backend == "auto" else logging.ERROR
            log.log(level, "node %s: no card backend (%s); retrying in %gs", config.node_name, exc, retry)
            await asyncio.sleep(retry)


def mps_control(config: AgentConfig, settings: NodeSettings) -> MpsControl | None:
    """The node's MPS control daemon, on an MPS-mode node only (``operatingmode: mps``)."""
    if settings.mode != DeviceMode.MPS.value:
        return None
    return MpsControl(
        binary=config.mps_control,
        root=config.mps_root,
        protocol=config.mps_protocol,
        quit_on_stop=config.mps_quit_on_stop,
    )


#: Receives each Prometheus collector of a node (a registry's ``register``, or the fleet's merge).
Collect = Callable[[Collector], None]


@dataclass(slots=True, kw_only=True)
class NodeAgent:
    """One node's collaborators, as :func:`build_node` wires them."""

    config: AgentConfig
    settings: NodeSettings
    backend: Backend
    inventory: Inventory
    pods: PodCache
    mps: MpsControl | None
    allocator: Allocator
    service: DevicePluginService
    runner: KubeletRunner
    grants: GrantBook
    registrar: Registrar


def build_node(
    config: AgentConfig,
    settings: NodeSettings,
    api: KubeApi,
    backend: Backend,
    pods: PodCache,
    *,
    socket_watch: float = SOCKET_WATCH,
) -> NodeAgent:
    """Every collaborator of one node over its opened backend and its pod cache (nothing runs yet)."""
    inventory = Inventory(backend)
    mps = mps_control(config, settings)
    allocator = Allocator(
        api=api,
        node_name=config.node_name,
        settings=settings,
        hook_path=config.hook_path,
        lock_dir=config.lock_dir,
        backend=backend,
        inventory=inventory,
        scheduler_name=config.scheduler_name,
        mps=mps,
        pods=pods,
    )
    service = DevicePluginService(inventory=inventory, settings=settings, allocator=allocator)
    runner = KubeletRunner(
        service=service,
        kubelet_dir=config.kubelet_dir,
        resource_name=settings.resource_name,
        preferred_allocation=settings.preferred_allocation,
        retry=config.retry_interval,
        watch_interval=socket_watch,
        node_name=config.node_name,
    )
    registrar = Registrar(
        api=api,
        node_name=config.node_name,
        inventory=inventory,
        settings=settings,
        hook_path=config.hook_path,
        interval=config.register_interval,
        retry=config.retry_interval,
        refresh=config.refresh_interval,
        mps=mps,
    )
    return NodeAgent(
        config=config,
        settings=settings,
        backend=backend,
        inventory=inventory,
        pods=pods,
        mps=mps,
        allocator=allocator,
        service=service,
        runner=runner,
        grants=GrantBook(api=api, node_name=config.node_name, pods=pods),
        registrar=registrar,
    )


async def run_node(
    config: AgentConfig,
    settings: NodeSettings,
    api: KubeApi,
    pods: PodCache,
    *,
    collect: Collect,
    socket_watch: float = SOCKET_WATCH,
    built: Callable[[NodeAgent], None] = lambda _: None,
) -> None:
    """Open the node's backend (patiently), build its parts, hand its collectors to ``collect`` (and the
    parts to ``built``), and run its loops until cancelled; the backend is closed on the way out."""
    backend = await open_backend_patiently(config)
    log.info(
        "node %s: using the %s backend, resource %s", config.node_name, backend.name, settings.resource_name
    )
    try:
        node = build_node(config, settings, api, backend, pods, socket_watch=socket_watch)
        mps, registrar = node.mps, node.registrar
        core_limit = not settings.device.disable_core_limit  # as Allocate reads it

        async def restore_namespaces() -> bool:
            assert mps is not None
            return await restore(mps, api=api, node_name=config.node_name, core_limit=core_limit, pods=pods)

        if mps is not None:
            await mps.start()  # adopts a daemon that answers; a failed start is retried by watch()
            await restore_namespaces()  # the running pods' namespaces; a failure is retried by watch()
        collect(
            NodeCollector(
                node_name=config.node_name,
                inventory=node.inventory,
                settings=settings,
                grants=node.grants,
                legacy=config.legacy_metrics,
                mps=mps,
            )
        )
        collect(PodCacheCollector(pods, config.node_name))
        built(node)
        try:
            async with asyncio.TaskGroup() as tasks:
                tasks.create_task(node.inventory.poll(config.health_interval), name="health-poll")
                tasks.create_task(registrar.run(), name="registrar")
                tasks.create_task(node.runner.run(), name="kubelet-plugin")
                tasks.create_task(node.grants.run(config.health_interval), name="exporter-pods")
                if mps is not None:
                    watch = mps.watch(config.health_interval, restore_namespaces)
                    tasks.create_task(watch, name="mps-daemon")
                    tasks.create_task(
                        sweep(
                            mps,
                            api=api,
                            node_name=config.node_name,
                            interval=config.register_interval,
                            pods=pods,
                        ),
                        name="mps-namespaces",
                    )
        finally:
            await node.allocator.events.drain(seconds=2.0)  # the last Events, briefly; never blocks long
            if mps is not None:
                await mps.stop()  # quits the daemon only when this agent started it and --mps-quit-on-stop
    finally:
        backend.close()
