"""The node agent's settings: its flag schema, HAMi's device-config YAML and the per-node JSON overrides,
folded into one frozen :class:`AgentConfig` (the process) and :class:`NodeSettings` (the node's cards).

Owns :data:`FLAGS`, every flag of the agent declared once (type, default, ``HAMI_<FLAG>`` env variable
and help, as a :class:`~hami.process.flags.Flag`; ``--node-name`` also reads the downward API's
``NODE_NAME``), :class:`AgentConfig` whose defaults are those flags' own, and the per-node config format
(HAMi device-plugin ``config.json``)::

    {"nodeconfig": [{"name": "gpu-node-1", "operatingmode": "hami-core", "devicesplitcount": 4,
                     "devicememoryscaling": 1.5, "devicecorescaling": 1, "preconfigureddevicememory": 0,
                     "libcudaloglevel": 1, "enablenumatopology": true,
                     "filterdevices": {"uuid": ["GPU-..."], "index": [3]},
                     "enablegetpreferredallocation": false}]}

Only the entry whose ``name`` equals the node's name applies; its keys override the YAML. Reading the YAML
is :mod:`hami.devicefile`'s. Errors are :class:`hami.settings.ConfigError` naming the flag (or variable),
the file, the key and the offending value. Must not import grpc, pynvml or the Kubernetes client.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from hami import devicefile
from hami.core.model import DeviceMode
from hami.process.flags import (
    KUBECONFIG,
    LOG_LEVEL,
    Address,
    Flag,
    Flags,
    add_flags,
    address,
    boolean,
    env_name,
    number,
    optional_path,
    path,
)
from hami.settings import ConfigError, DeviceConfig, from_device_config

BACKENDS = ("auto", "nvml", "sim")


@dataclass(frozen=True, slots=True, kw_only=True)
class NodeSettings:
    """Everything that shapes this node's registration, kubelet devices and Allocate answers."""

    device: DeviceConfig = field(default_factory=DeviceConfig)
    split_count: int = 10
    memory_scaling: float = 1.0
    core_scaling: float = 1.0
    preconfigured_memory: int = 0
    mode: str = DeviceMode.HAMI_CORE.value
    filter_uuids: frozenset[str] = frozenset()
    filter_indexes: frozenset[int] = frozenset()
    numa_topology: bool = False
    preferred_allocation: bool = False
    lib_cuda_log_level: str = ""

    @property
    def resource_name(self) -> str:
        return self.device.resources.count


def _node_name(flag: str, text: str) -> str:
    if not text:
        raise ConfigError(f"--{flag} is required (or env NODE_NAME / {env_name(flag)})")
    return text


def _backend(flag: str, text: str) -> str:
    """Only a value from the environment gets here unchecked: argparse's choices refuse a bad flag."""
    if text not in BACKENDS:
        raise ConfigError(f"{env_name(flag)} must be auto, nvml or sim, got {text!r}")
    return text


def _recovery(flag: str, text: str) -> float:
    seconds = number()(flag, text)
    if seconds < 0:
        raise ConfigError(f"--{flag} must be 0 (never) or positive seconds, got {seconds!r}")
    return seconds


def _not_empty(what: str) -> Callable[[str, str], str]:
    def parse(flag: str, text: str) -> str:
        value = text.strip()
        if not value:
            raise ConfigError(f"--{flag} {what}")
        return value

    return parse


def _mps_root(flag: str, text: str) -> Path:
    root = Path(text)
    if not root.is_absolute():
        raise ConfigError(f"--{flag} must be an absolute directory, got {text!r}")
    return root


def _mps_protocol(flag: str, text: str) -> int:
    value = text.strip()
    if value not in ("2", "3"):
        raise ConfigError(f"--{flag} must be 2 or 3, got {value!r}")
    return int(value)


_INTERVAL = number(positive=True)

NODE_NAME = Flag(
    name="node-name",
    parse=_node_name,
    metavar="NAME",
    help="this node's name (required)",
    also_env=("NODE_NAME",),
)
BACKEND = Flag(
    name="backend",
    parse=_backend,
    default="auto",
    choices=BACKENDS,
    help="card discovery: auto (NVML), nvml, or sim",
)
SIM_DEVICES = Flag(
    name="sim-devices",
    parse=optional_path,
    metavar="FILE",
    help="YAML file of simulated cards (with --backend sim)",
)
REGISTER_INTERVAL = Flag(
    name="register-interval",
    parse=_INTERVAL,
    default="30",
    metavar="SECONDS",
    help="seconds between registration cycles",
)
RETRY_INTERVAL = Flag(
    name="retry-interval",
    parse=_INTERVAL,
    default="5",
    metavar="SECONDS",
    help="seconds before retrying a failed registration",
)
REFRESH_INTERVAL = Flag(
    name="refresh-interval",
    parse=_INTERVAL,
    default="300",
    metavar="SECONDS",
    help="re-patch the registration at least this often (seconds)",
)
HEALTH_INTERVAL = Flag(
    name="health-interval",
    parse=_INTERVAL,
    default="5",
    metavar="SECONDS",
    help="seconds between card health polls",
)
HEALTH_RECOVERY = Flag(
    name="health-recovery",
    parse=_recovery,
    default="300",  # 0 = an unhealthy card never comes back (HAMi)
    metavar="SECONDS",
    help="seconds without a critical XID before an unhealthy card is probed and may come back (0 = never)",
)
KUBELET_DIR = Flag(
    name="kubelet-dir",
    parse=path,
    default="/var/lib/kubelet/device-plugins",
    metavar="DIR",
    help="kubelet device-plugin directory",
)
CONFIG = Flag(
    name="config",
    parse=optional_path,
    metavar="FILE",
    help="per-node overrides (HAMi device-plugin config.json)",
)
DEVICE_CONFIG = Flag(
    name="device-config",
    parse=optional_path,
    metavar="FILE",
    help="HAMi device-config YAML (top key nvidia:)",
)
HOOK_PATH = Flag(
    name="hook-path",
    parse=optional_path,
    metavar="DIR",
    help="HAMi HOOK_PATH on the host (e.g. /usr/local; HAMi-core in HOOK/vgpu); unset = no mounts",
)
LOCK_DIR = Flag(
    name="lock-dir",
    parse=path,
    default="/tmp/vgpulock",  # HAMi-core's lock directory on the host (with --hook-path)
    metavar="DIR",
    help="host dir HAMi-core containers share for locks, mounted at /tmp/vgpulock (with --hook-path)",
)
TOPOLOGY_SCORE = Flag(
    name="topology-score",
    metavar="true|false",
    parse=boolean,
    default="false",
    help="register NVLink/PCIe pair scores (true/false)",
)
METRICS_LISTEN = Flag(
    name="metrics-listen",
    parse=address,
    default="0.0.0.0:9394",
    metavar="HOST:PORT",
    help="where /metrics and /healthz are served",
)
LEGACY_METRICS = Flag(
    name="legacy-metrics",
    metavar="true|false",
    parse=boolean,
    default="false",
    help="also export HAMi's legacy camel-case metric names (true/false)",
)
SCHEDULER_NAME = Flag(
    name="scheduler-name",
    metavar="NAME",
    parse=_not_empty("must not be empty"),
    default="hami-scheduler",  # Allocate serves only pods this scheduler placed
    help="Allocate serves only pods with this spec.schedulerName",
)
MPS_CONTROL = Flag(
    name="mps-control",
    parse=_not_empty("must name the MPS control daemon binary"),
    default="nvidia-cuda-mps-control",
    metavar="PATH",
    help="MPS control daemon binary from the host driver (operatingmode mps only)",
)
MPS_ROOT = Flag(
    name="mps-root",
    parse=_mps_root,
    default="/run/hami/mps",  # pipe/, log/, shm/ of the MPS daemon, same path on the host
    metavar="DIR",
    help="host directory of the MPS daemon's pipe/, log/ and shm/ (mounted at the same path)",
)
MPS_PROTOCOL = Flag(
    name="mps-protocol",
    metavar="2|3",
    parse=_mps_protocol,
    default="3",
    help="MPS protocol to ask for: 3 (namespaces where the driver has them) or 2",
)
MPS_QUIT_ON_STOP = Flag(
    name="mps-quit-on-stop",
    metavar="true|false",
    parse=boolean,
    default="false",
    help="quit the MPS daemon this agent started when the agent stops",
)

#: The agent's schema, in ``--help`` order.
FLAGS: Flags = (
    KUBECONFIG,
    NODE_NAME,
    BACKEND,
    SIM_DEVICES,
    REGISTER_INTERVAL,
    RETRY_INTERVAL,
    REFRESH_INTERVAL,
    HEALTH_INTERVAL,
    HEALTH_RECOVERY,
    KUBELET_DIR,
    CONFIG,
    DEVICE_CONFIG,
    HOOK_PATH,
    LOCK_DIR,
    TOPOLOGY_SCORE,
    METRICS_LISTEN,
    LEGACY_METRICS,
    SCHEDULER_NAME,
    MPS_CONTROL,
    MPS_ROOT,
    MPS_PROTOCOL,
    MPS_QUIT_ON_STOP,
    LOG_LEVEL,
)


@dataclass(frozen=True, slots=True, kw_only=True)
class AgentConfig:
    """Process-level knobs; each default is its flag's (:data:`FLAGS`, ``docs/node-agent.md``)."""

    kubeconfig: str | None = KUBECONFIG.default_value
    node_name: str
    backend: str = BACKEND.default_value
    sim_devices: Path | None = SIM_DEVICES.default_value
    register_interval: float = REGISTER_INTERVAL.default_value
    retry_interval: float = RETRY_INTERVAL.default_value
    refresh_interval: float = REFRESH_INTERVAL.default_value
    health_interval: float = HEALTH_INTERVAL.default_value
    health_recovery: float = HEALTH_RECOVERY.default_value
    kubelet_dir: Path = KUBELET_DIR.default_value
    config: Path | None = CONFIG.default_value
    device_config: Path | None = DEVICE_CONFIG.default_value
    hook_path: Path | None = HOOK_PATH.default_value
    lock_dir: Path = LOCK_DIR.default_value
    topology_score: bool = TOPOLOGY_SCORE.default_value
    metrics_listen: Address = METRICS_LISTEN.default_value
    legacy_metrics: bool = LEGACY_METRICS.default_value
    scheduler_name: str = SCHEDULER_NAME.default_value
    mps_control: str = MPS_CONTROL.default_value
    mps_root: Path = MPS_ROOT.default_value
    mps_protocol: int = MPS_PROTOCOL.default_value  # ask for protocol 3 (namespaces) where the driver has it
    mps_quit_on_stop: bool = MPS_QUIT_ON_STOP.default_value  # quit the daemon this agent started at stop
    log_level: str = LOG_LEVEL.default_value


def build_parser(environ: Mapping[str, str]) -> argparse.ArgumentParser:
    """The agent's parser: :data:`FLAGS`, each defaulting to its env variable when that is set."""
    parser = argparse.ArgumentParser(prog="hami-node-agent", description="HAMi-compatible node agent.")
    add_flags(parser, FLAGS, environ)
    return parser


def parse_agent_config(argv: Sequence[str] | None, environ: Mapping[str, str]) -> AgentConfig:
    """Flags over env over defaults; raises :class:`ConfigError` naming the bad flag or variable."""
    args = build_parser(environ).parse_args(argv)
    return AgentConfig(
        kubeconfig=KUBECONFIG.read(args),
        node_name=NODE_NAME.read(args),
        backend=BACKEND.read(args),
        sim_devices=SIM_DEVICES.read(args),
        register_interval=REGISTER_INTERVAL.read(args),
        retry_interval=RETRY_INTERVAL.read(args),
        refresh_interval=REFRESH_INTERVAL.read(args),
        health_interval=HEALTH_INTERVAL.read(args),
        health_recovery=HEALTH_RECOVERY.read(args),
        kubelet_dir=KUBELET_DIR.read(args),
        config=CONFIG.read(args),
        device_config=DEVICE_CONFIG.read(args),
        hook_path=HOOK_PATH.read(args),
        lock_dir=LOCK_DIR.read(args),
        topology_score=TOPOLOGY_SCORE.read(args),
        metrics_listen=METRICS_LISTEN.read(args),
        legacy_metrics=LEGACY_METRICS.read(args),
        scheduler_name=SCHEDULER_NAME.read(args),
        mps_control=MPS_CONTROL.read(args),
        mps_root=MPS_ROOT.read(args),
        mps_protocol=MPS_PROTOCOL.read(args),
        mps_quit_on_stop=MPS_QUIT_ON_STOP.read(args),
        log_level=LOG_LEVEL.read(args),
    )


# ------------------------------------------------------------------------------------- config files
def load_node_settings(config: AgentConfig) -> NodeSettings:
    """Read ``--device-config`` (:mod:`hami.devicefile`) and ``--config`` and fold them for
    ``config.node_name``."""
    device_doc = devicefile.read_device_document(config.device_config)
    overrides = _read_json(config.config) if config.config else None
    return node_settings(device_doc, overrides, config.node_name, source=str(config.config))


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ConfigError(f"cannot read config file {str(path)!r}: {exc}") from exc


def node_settings(
    device_doc: Mapping[str, Any] | None,
    overrides: Mapping[str, Any] | None,
    node_name: str,
    *,
    source: str = "config.json",
) -> NodeSettings:
    """Device-config YAML (HAMi chart defaults where absent) with this node's ``nodeconfig`` entry on top."""
    device = from_device_config(device_doc)
    nvidia: Mapping[str, Any] = (device_doc or {}).get("nvidia") or {}
    settings = NodeSettings(
        device=device,
        split_count=device.device_split_count,
        memory_scaling=device.device_memory_scaling,
        core_scaling=device.device_core_scaling,
        preconfigured_memory=device.preconfigured_device_memory,
        numa_topology=_bool(nvidia, "enableNumaTopology", "nvidia", default=False),
        lib_cuda_log_level=str(nvidia.get("libCudaLogLevel") or ""),
    )
    entry = _node_entry(overrides, node_name, source)
    if entry is None:
        return _checked(settings, source)
    where = f"{source}: nodeconfig[name={node_name}]"
    changes: dict[str, Any] = {}
    for key, attr in (
        ("devicesplitcount", "split_count"),
        ("preconfigureddevicememory", "preconfigured_memory"),
    ):
        if entry.get(key) is not None:
            changes[attr] = _int(entry, key, where)
    for key, attr in (("devicememoryscaling", "memory_scaling"), ("devicecorescaling", "core_scaling")):
        if entry.get(key) is not None:
            changes[attr] = _number(entry, key, where)
    for key, attr in (
        ("enablenumatopology", "numa_topology"),
        ("enablegetpreferredallocation", "preferred_allocation"),
    ):
        if entry.get(key) is not None:
            changes[attr] = _bool(entry, key, where, default=False)
    if entry.get("libcudaloglevel") is not None:
        changes["lib_cuda_log_level"] = str(entry["libcudaloglevel"])
    if entry.get("operatingmode"):
        mode = str(entry["operatingmode"])
        if mode not in {m.value for m in DeviceMode}:
            raise ConfigError(f"{where}.operatingmode must be hami-core, mig or mps, got {mode!r}")
        changes["mode"] = mode
    filters = entry.get("filterdevices") or {}
    if not isinstance(filters, Mapping):
        raise ConfigError(f"{where}.filterdevices must be an object, got {filters!r}")
    uuids, indexes = filters.get("uuid") or [], filters.get("index") or []
    if not isinstance(uuids, list) or not all(isinstance(u, str) for u in uuids):
        raise ConfigError(f"{where}.filterdevices.uuid must be a list of strings, got {uuids!r}")
    if not isinstance(indexes, list) or not all(
        isinstance(i, int) and not isinstance(i, bool) for i in indexes
    ):
        raise ConfigError(f"{where}.filterdevices.index must be a list of integers, got {indexes!r}")
    changes["filter_uuids"], changes["filter_indexes"] = frozenset(uuids), frozenset(indexes)
    return _checked(replace(settings, **changes), source)


def _node_entry(overrides: Mapping[str, Any] | None, node_name: str, source: str) -> Mapping[str, Any] | None:
    if overrides is None:
        return None
    if not isinstance(overrides, Mapping):
        raise ConfigError(f"{source}: top level must be an object with 'nodeconfig', got {overrides!r}")
    entries = overrides.get("nodeconfig") or []
    if not isinstance(entries, list):
        raise ConfigError(f"{source}: nodeconfig must be a list, got {entries!r}")
    for i, entry in enumerate(entries):
        if not isinstance(entry, Mapping):
            raise ConfigError(f"{source}: nodeconfig[{i}] must be an object, got {entry!r}")
        if entry.get("name") == node_name:
            return entry
    return None


def _checked(settings: NodeSettings, source: str) -> NodeSettings:
    if settings.split_count < 1:
        raise ConfigError(f"{source}: deviceSplitCount must be at least 1, got {settings.split_count}")
    if settings.memory_scaling <= 0 or settings.core_scaling <= 0:
        raise ConfigError(
            f"{source}: device memory/core scaling must be positive, got "
            f"{settings.memory_scaling!r}/{settings.core_scaling!r}"
        )
    return settings


def _int(entry: Mapping[str, Any], key: str, where: str) -> int:
    value = entry[key]
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"{where}.{key} must be an integer, got {value!r}")
    return int(value)


def _number(entry: Mapping[str, Any], key: str, where: str) -> float:
    value = entry[key]
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ConfigError(f"{where}.{key} must be a number, got {value!r}")
    return float(value)


def _bool(entry: Mapping[str, Any], key: str, where: str, *, default: bool) -> bool:
    value = entry.get(key, default)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise ConfigError(f"{where}.{key} must be true or false, got {value!r}")
    return value
