"""ENTRY POINT ``hami-node-agent`` / ``python -m nodeagent``: the node agent wired in one function.

Builds every collaborator at the top (settings, API client, backend, inventory, allocator, device
plugin service, kubelet runner, registrar, the exporter's registry) and runs each loop as a named task.
A node whose backend cannot start (no NVIDIA driver with ``--backend nvml``/``auto``, a bad sim file)
logs one clear error and retries every minute instead of exiting, so the DaemonSet does not
crash-loop; an unusable kubeconfig or an API server that cannot be reached at start-up is one line and
exit 2 (a wrong flag, not a wait for hardware). The exporter is two more tasks: the pod list behind its
grant metrics and ``/metrics`` + ``/healthz`` (the shared listener of :mod:`hami.process.http`, its
collector read in a worker thread), which reads the same inventory. On an MPS-mode node
(``operatingmode: mps``) the MPS control daemon (:class:`nodeagent.mps.control.MpsControl`) is started or
adopted before the device plugin serves, the namespaces of the pods running on the node restored on it
(``nodeagent.mps.keeper.restore``: after the agent's container restarts its daemon is a new one), watched
by one more task (which restores them again on each new daemon) and its gone pods' namespaces closed
by another (``nodeagent.mps.keeper``). The node's pods are read from one pod cache
(:class:`nodeagent.podcache.PodCache`, a list + watch of the pods bound to this node), started before
anything reads it and stopped on the way out; its families join the exporter's registry. Process
set-up (logging, one-line errors, SIGTERM/SIGINT) is the shared :mod:`hami.process.entry`.
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
from collections.abc import Sequence

from prometheus_client import CollectorRegistry

from hami.core.model import DeviceMode
from hami.kube.client import KubeError
from hami.kube.protocol import KubeApi
from hami.process.entry import configure_logging, reachable_api, refuse, until_signalled
from hami.process.http import alive, metrics_app, serve_retrying
from hami.settings import ConfigError
from nodeagent.allocate_call import Allocator
from nodeagent.backends import Backend, BackendUnavailable, open_backend
from nodeagent.config import AgentConfig, NodeSettings, load_node_settings, parse_agent_config
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

PROGRAM = "hami-node-agent"
#: Seconds between attempts to start a backend that is unavailable (no driver yet, bad file).
BACKEND_RETRY = 60.0


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


async def run(config: AgentConfig) -> None:
    """Run the agent until cancelled."""
    settings = load_node_settings(config)
    api = await asyncio.to_thread(reachable_api, config.kubeconfig, component=PROGRAM)
    backend = await open_backend_patiently(config)
    log.info(
        "node %s: using the %s backend, resource %s", config.node_name, backend.name, settings.resource_name
    )
    inventory = Inventory(backend)
    pods = PodCache(api, config.node_name)
    pods.start()  # before anything reads it; readers list while it is not synced yet
    try:
        await _run(config, settings, api, backend, inventory, pods)
    finally:
        await pods.stop()
        backend.close()
        api.close()


async def _run(
    config: AgentConfig,
    settings: NodeSettings,
    api: KubeApi,
    backend: Backend,
    inventory: Inventory,
    pods: PodCache,
) -> None:
    """The agent's parts and loops over the opened backend and the started pod cache."""
    mps = mps_control(config, settings)
    core_limit = not settings.device.disable_core_limit  # as Allocate reads it

    async def restore_namespaces() -> bool:
        assert mps is not None
        return await restore(mps, api=api, node_name=config.node_name, core_limit=core_limit, pods=pods)

    if mps is not None:
        await mps.start()  # adopts a daemon that answers; a failed start is retried by watch()
        await restore_namespaces()  # the running pods' namespaces; a failure is retried by watch()
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
    grants = GrantBook(api=api, node_name=config.node_name, pods=pods)
    registry = CollectorRegistry()
    registry.register(
        NodeCollector(
            node_name=config.node_name,
            inventory=inventory,
            settings=settings,
            grants=grants,
            legacy=config.legacy_metrics,
            mps=mps,
        )
    )
    registry.register(PodCacheCollector(pods, config.node_name))

    try:
        async with asyncio.TaskGroup() as tasks:
            tasks.create_task(inventory.poll(config.health_interval), name="health-poll")
            tasks.create_task(registrar.run(), name="registrar")
            tasks.create_task(runner.run(), name="kubelet-plugin")
            tasks.create_task(grants.run(config.health_interval), name="exporter-pods")
            if mps is not None:
                tasks.create_task(mps.watch(config.health_interval, restore_namespaces), name="mps-daemon")
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
            tasks.create_task(
                serve_retrying(
                    lambda: metrics_app(registry, blocking=True, routes={"/healthz": alive}),
                    config.metrics_listen,
                    retry=config.retry_interval,
                    what="/metrics and /healthz",
                    logger=log,
                ),
                name="metrics",
            )
    finally:
        await allocator.events.drain(seconds=2.0)  # the last Events, briefly; never blocks shutdown long
        if mps is not None:
            await mps.stop()  # quits the daemon only when this agent started it and --mps-quit-on-stop


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


def main(argv: Sequence[str] | None = None) -> int:
    try:
        config = parse_agent_config(argv, os.environ)
    except ConfigError as exc:
        return refuse(PROGRAM, exc)
    configure_logging(config.log_level)
    try:
        if asyncio.run(until_signalled(run(config))):
            log.info("node %s: stopping", config.node_name)
    except (ConfigError, KubeError) as exc:  # bad files, an unusable kubeconfig, no API server
        return refuse(PROGRAM, exc)
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
