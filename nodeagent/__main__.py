"""ENTRY POINT ``hami-node-agent`` / ``python -m nodeagent``: the node agent for one node, one process.

Builds what the process holds (settings, API client, the node's pod cache, the exporter's registry) and
runs the node through :func:`nodeagent.wiring.run_node`, which builds every collaborator of the node
(backend, inventory, allocator, device plugin service, kubelet runner, registrar) and runs each loop as a
named task: the same wiring the fleet (:mod:`nodeagent.fleet`, many simulated nodes in one process) runs
per node.
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

from hami.kube.client import KubeError
from hami.process.entry import configure_logging, reachable_api, refuse, until_signalled
from hami.process.http import alive, metrics_app, serve_retrying
from hami.settings import ConfigError
from nodeagent.config import AgentConfig, load_node_settings, parse_agent_config
from nodeagent.podcache import PodCache
from nodeagent.wiring import run_node

log = logging.getLogger("nodeagent")

PROGRAM = "hami-node-agent"


async def run(config: AgentConfig) -> None:
    """Run the agent until cancelled."""
    settings = load_node_settings(config)
    api = await asyncio.to_thread(reachable_api, config.kubeconfig, component=PROGRAM)
    pods = PodCache(api, config.node_name)
    pods.start()  # before anything reads it; readers list while it is not synced yet
    registry = CollectorRegistry()
    ready = asyncio.Event()  # the node is built (its backend opened): /metrics and /healthz serve from then

    async def serve_metrics() -> None:
        await ready.wait()
        await serve_retrying(
            lambda: metrics_app(registry, blocking=True, routes={"/healthz": alive}),
            config.metrics_listen,
            retry=config.retry_interval,
            what="/metrics and /healthz",
            logger=log,
        )

    try:
        async with asyncio.TaskGroup() as tasks:
            tasks.create_task(
                run_node(config, settings, api, pods, collect=registry.register, built=lambda _: ready.set()),
                name="node",
            )
            tasks.create_task(serve_metrics(), name="metrics")
    finally:
        await pods.stop()
        api.close()


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
