"""ENTRY POINT ``python -m nodeagent.fleet``: many simulated nodes' agents in one process, one event loop.

SIMULATION ONLY (``--backend sim``; NVML is refused): for an embedded cluster of a thousand nodes on a
small machine (``hami demo --generate N``, the scale benchmarks). Each node runs the agent's own code,
wired by :func:`nodeagent.wiring.run_node` exactly as ``hami-node-agent`` wires its one node:
registration every ``--register-interval`` s, its device plugin on its own socket under its own kubelet
directory (registered with that directory's ``kubelet.sock``), ``Allocate`` and the node-lock release,
the card health poll, the exporter's grants. What one agent process holds once is held once for the
whole fleet: one API client (one connection pool, one worker-thread pool), one list + watch of the pods
split by ``spec.nodeName`` into each node's pod cache (:class:`nodeagent.podcache.PodFanout`), one
``/metrics`` + ``/healthz`` listener whose families merge every node's (:class:`FleetCollector`). The
nodes start spread over ``--start-spread`` seconds (default: one registration interval), as a DaemonSet's
pods would, so their registrations do not all fall in the same instant.

Owns the fleet file (:func:`parse_fleet_file`; YAML or JSON, paths relative to the file)::

    nodes:
      - name: gpu-0001               # the Node's name (required, unique)
        sim_devices: n1/devices.yaml # its simulated cards (required; nodeagent/backends/simulated.py)
        kubelet_dir: n1/dp           # its kubelet device-plugin directory (required, unique)
        config: n1/config.json       # optional: per-node overrides (HAMi's config.json)
        hook_path: n1/hook           # optional: --hook-path (HAMi-core), lock_dir likewise

and the fleet's own flags (``--fleet FILE``, ``--start-spread S``, ``--socket-watch S``); every other flag
is the agent's (:mod:`nodeagent.config`) and applies to every node, except the per-node ones, which come
from the file and are refused on the command line. An MPS-mode node is refused (its control daemon is
per node: it runs its own agent). Errors name the file, the entry and the field. Must not import pynvml
or the Kubernetes client.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import re
import sys
from collections.abc import Coroutine, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, NoReturn

import yaml
from prometheus_client import CollectorRegistry
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from hami.core.model import DeviceMode
from hami.kube.client import KubeError
from hami.process.entry import configure_logging, reachable_api, refuse, until_signalled
from hami.process.flags import Flag, Flags, add_flags, env_name, number
from hami.process.http import alive, metrics_app, serve_retrying
from hami.settings import ConfigError
from nodeagent.config import AgentConfig, NodeSettings, build_parser, load_node_settings, parse_agent_config
from nodeagent.podcache import PodCache, PodFanout
from nodeagent.wiring import SOCKET_WATCH, run_node

log = logging.getLogger("nodeagent.fleet")

PROGRAM = "python -m nodeagent.fleet"
#: The agent's flags each node takes from the fleet file instead.
PER_NODE_FLAGS = ("node-name", "sim-devices", "kubelet-dir", "config", "hook-path", "lock-dir")
NODE_FIELDS = ("name", "sim_devices", "kubelet_dir", "config", "hook_path", "lock_dir")
#: A Node's name: a DNS subdomain (lower-case alphanumerics, '-' and '.').
_NODE_NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")
MAX_NODES = 100_000
MAX_FILE_BYTES = 64 * 2**20


@dataclass(frozen=True, slots=True, kw_only=True)
class FleetNode:
    """One node of the fleet file: what the agent's per-node flags would say."""

    name: str
    sim_devices: Path
    kubelet_dir: Path
    config: Path | None = None
    hook_path: Path | None = None
    lock_dir: Path | None = None

    def agent_config(self, base: AgentConfig) -> AgentConfig:
        """``base`` (the fleet's flags) with this node's own values."""
        return replace(
            base,
            node_name=self.name,
            sim_devices=self.sim_devices,
            kubelet_dir=self.kubelet_dir,
            config=self.config,
            hook_path=self.hook_path,
            lock_dir=self.lock_dir if self.lock_dir is not None else base.lock_dir,
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class FleetConfig:
    """The fleet's settings: the agent's flags for every node, the nodes, and the fleet's own knobs."""

    base: AgentConfig
    nodes: tuple[FleetNode, ...]
    start_spread: float
    socket_watch: float = SOCKET_WATCH

    def node_configs(self) -> list[AgentConfig]:
        return [node.agent_config(self.base) for node in self.nodes]


# ------------------------------------------------------------------------------------------ the file
def parse_fleet_file(text: str, *, source: str, base_dir: Path) -> tuple[FleetNode, ...]:
    """The fleet file's nodes (module docstring); raises :class:`ConfigError` naming the entry and field."""
    where = f"fleet file {source!r}"
    try:
        document = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{where}: not valid YAML or JSON: {exc}") from exc
    if not isinstance(document, Mapping) or set(document) != {"nodes"}:
        shown = str(document)[:80]
        raise ConfigError(f"{where}: top level must be a mapping with only 'nodes', got {shown!r}")
    entries = document["nodes"]
    if not isinstance(entries, list) or not entries:
        raise ConfigError(f"{where}: 'nodes' must be a non-empty list")
    if len(entries) > MAX_NODES:
        raise ConfigError(f"{where}: {len(entries)} nodes, at most {MAX_NODES}")
    nodes = tuple(_node(entry, f"{where}: nodes[{i}]", base_dir) for i, entry in enumerate(entries))
    for attr in ("name", "kubelet_dir"):
        seen: set[object] = set()
        for node in nodes:
            value = getattr(node, attr)
            if value in seen:
                raise ConfigError(f"{where}: node {node.name!r}: {attr} {str(value)!r} is used twice")
            seen.add(value)
    return nodes


def _node(entry: object, where: str, base_dir: Path) -> FleetNode:
    if not isinstance(entry, Mapping):
        raise ConfigError(f"{where}: must be a mapping, got {entry!r}")
    for key in entry:
        if key not in NODE_FIELDS:
            raise ConfigError(f"{where}: unknown field {key!r}; known: {', '.join(NODE_FIELDS)}")
    name = entry.get("name")
    if not isinstance(name, str) or not _NODE_NAME.match(name):
        raise ConfigError(f"{where}.name: must be a Node name (a-z, 0-9, '-', '.'), got {name!r}")
    where = f"{where} ({name})"

    def path(key: str, *, required: bool) -> Path | None:
        value = entry.get(key)
        if value is None and not required:
            return None
        if not isinstance(value, str) or not value or "\0" in value:
            raise ConfigError(f"{where}.{key}: must be a path, got {value!r}")
        return base_dir / value  # an absolute path stays as written

    sim_devices, kubelet_dir = path("sim_devices", required=True), path("kubelet_dir", required=True)
    assert sim_devices is not None and kubelet_dir is not None
    return FleetNode(
        name=name,
        sim_devices=sim_devices,
        kubelet_dir=kubelet_dir,
        config=path("config", required=False),
        hook_path=path("hook_path", required=False),
        lock_dir=path("lock_dir", required=False),
    )


def read_fleet_file(path: Path) -> tuple[FleetNode, ...]:
    try:
        with path.open("rb") as file:
            raw = file.read(MAX_FILE_BYTES + 1)
    except OSError as exc:
        raise ConfigError(f"cannot read fleet file {str(path)!r}: {exc}") from exc
    if len(raw) > MAX_FILE_BYTES:
        raise ConfigError(f"fleet file {str(path)!r}: larger than {MAX_FILE_BYTES} bytes")
    return parse_fleet_file(raw.decode("utf-8", "replace"), source=str(path), base_dir=path.parent)


# ------------------------------------------------------------------------------------------ flags
def _fleet_file(flag: str, text: str) -> Path:
    if not text:
        raise ConfigError(f"--{flag} FILE is required (or env {env_name(flag)}): the fleet's nodes")
    return Path(text)


def _spread(flag: str, text: str) -> float | None:
    """Seconds, 0 or more; unset: one registration interval (decided by the caller)."""
    return number(minimum=0)(flag, text) if text else None


FLEET_FILE = Flag(
    name="fleet", parse=_fleet_file, metavar="FILE", help="the fleet file: its nodes and their files"
)
START_SPREAD = Flag(
    name="start-spread",
    parse=_spread,
    metavar="SECONDS",
    help="seconds over which the nodes start (unset: one --register-interval; 0: all at once)",
)
SOCKET_WATCH_FLAG = Flag(
    name="socket-watch",
    parse=number(positive=True),
    default=f"{SOCKET_WATCH:g}",
    metavar="SECONDS",
    help="seconds between each node's looks at its kubelet.sock and its plugin socket",
)
#: The fleet's own flags (the agent's, :data:`nodeagent.config.FLAGS`, come with them).
FLEET_FLAGS: Flags = (FLEET_FILE, START_SPREAD, SOCKET_WATCH_FLAG)


class _PerNode(argparse.Action):
    """An agent flag each fleet node takes from the fleet file: refused on the command line."""

    def __call__(self, parser: argparse.ArgumentParser, *_: object, **__: object) -> NoReturn:
        parser.error(f"{self.option_strings[0]} is per node: set it in the --fleet file")


def build_fleet_parser(environ: Mapping[str, str]) -> argparse.ArgumentParser:
    """The fleet's flags on top of the agent's (the per-node ones refused)."""
    parser = argparse.ArgumentParser(
        prog=PROGRAM,
        description="SIMULATION: many simulated nodes' agents in one process (--backend sim only).",
        parents=[build_parser(environ)],
        conflict_handler="resolve",
        allow_abbrev=False,
    )
    add_flags(parser, FLEET_FLAGS, environ)
    for flag in PER_NODE_FLAGS:
        parser.add_argument(f"--{flag}", action=_PerNode, help="per node: from the --fleet file")
    return parser


def parse_fleet_config(argv: Sequence[str], environ: Mapping[str, str]) -> FleetConfig:
    """Flags (the fleet's and the agent's) and the fleet file; raises :class:`ConfigError`."""
    build_fleet_parser(environ).parse_args(argv)  # --help, unknown and per-node flags
    own = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    add_flags(own, FLEET_FLAGS, environ)
    args, rest = own.parse_known_args(argv)
    backend = environ.get(env_name("backend"))
    if backend not in (None, "", "sim"):
        raise ConfigError(f"{env_name('backend')}={backend!r}: the fleet runs simulated nodes only (sim)")
    # a later --backend in the agent's flags wins over this one: the check below refuses it
    base = parse_agent_config(["--backend", "sim", "--node-name", "fleet", *rest], environ)
    if base.backend != "sim":
        raise ConfigError(f"--backend {base.backend}: the fleet runs simulated nodes only (--backend sim)")
    spread = START_SPREAD.read(args)
    return FleetConfig(
        base=base,
        nodes=read_fleet_file(FLEET_FILE.read(args)),
        start_spread=base.register_interval if spread is None else spread,
        socket_watch=SOCKET_WATCH_FLAG.read(args),
    )


def fleet_settings(configs: Iterable[AgentConfig]) -> list[NodeSettings]:
    """Each node's settings (device config and its overrides); an MPS-mode node is refused."""
    found = []
    for config in configs:
        settings = load_node_settings(config)
        if settings.mode == DeviceMode.MPS.value:
            raise ConfigError(
                f"fleet node {config.node_name}: operatingmode mps is not simulated in a fleet (its MPS "
                "control daemon is per node): run hami-node-agent for it"
            )
        found.append(settings)
    return found


# ------------------------------------------------------------------------------------------ metrics
class FleetCollector:
    """Every node's collectors as one: families of the same name merged (each node's samples carry its
    ``node`` label), so one registry serves the fleet without duplicate names."""

    def __init__(self) -> None:
        self._parts: list[Collector] = []

    def add(self, collector: Collector) -> None:
        self._parts.append(collector)

    def describe(self) -> list[Metric]:
        return []  # names are known only once nodes are built; the registry checks none

    def collect(self) -> list[Metric]:
        merged: dict[str, Metric] = {}
        for part in list(self._parts):
            for family in part.collect():
                have = merged.get(family.name)
                if have is None:
                    have = merged[family.name] = Metric(
                        family.name, family.documentation, family.type, family.unit
                    )
                have.samples.extend(family.samples)
        return list(merged.values())


# ------------------------------------------------------------------------------------------ running
async def run(fleet: FleetConfig) -> None:
    """Run every node of the fleet until cancelled."""
    configs = fleet.node_configs()
    settings = fleet_settings(configs)
    api = await asyncio.to_thread(reachable_api, fleet.base.kubeconfig, component="hami-node-agent-fleet")
    caches = {config.node_name: PodCache(api, config.node_name) for config in configs}
    fanout = PodFanout(api, caches)
    fanout.start()  # before anything reads a cache; readers list while it is not synced yet
    merged = FleetCollector()
    registry = CollectorRegistry()
    registry.register(merged)
    count = len(configs)
    log.info("fleet: %d simulated nodes, starting over %gs", count, fleet.start_spread)
    try:
        async with asyncio.TaskGroup() as tasks:
            for i, (config, node_settings) in enumerate(zip(configs, settings, strict=True)):
                node = run_node(
                    config,
                    node_settings,
                    api,
                    caches[config.node_name],
                    collect=merged.add,
                    socket_watch=fleet.socket_watch,
                )
                delay = fleet.start_spread * i / count
                tasks.create_task(_after(delay, node), name=f"node-{config.node_name}")
            tasks.create_task(
                serve_retrying(
                    lambda: metrics_app(registry, blocking=True, routes={"/healthz": alive}),
                    fleet.base.metrics_listen,
                    retry=fleet.base.retry_interval,
                    what="/metrics and /healthz",
                    logger=log,
                ),
                name="metrics",
            )
    finally:
        await fanout.stop()
        api.close()


async def _after(delay: float, node: Coroutine[Any, Any, None]) -> None:
    try:
        if delay > 0:
            await asyncio.sleep(delay)
    except asyncio.CancelledError:
        node.close()  # never started: no "never awaited" warning
        raise
    await node


def main(argv: Sequence[str] | None = None) -> int:
    arguments = list(sys.argv[1:] if argv is None else argv)
    try:
        fleet = parse_fleet_config(arguments, os.environ)
    except ConfigError as exc:
        return refuse(PROGRAM, exc)
    configure_logging(fleet.base.log_level)
    try:
        if asyncio.run(until_signalled(run(fleet))):
            log.info("fleet of %d nodes: stopping", len(fleet.nodes))
    except (ConfigError, KubeError) as exc:
        return refuse(PROGRAM, exc)
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())


__all__ = [
    "FleetCollector",
    "FleetConfig",
    "FleetNode",
    "build_fleet_parser",
    "main",
    "parse_fleet_config",
    "parse_fleet_file",
    "run",
]
