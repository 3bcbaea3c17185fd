"""The node agent's settings: command-line flags (each with an ``HAMI_<FLAG>`` env fallback), HAMi's
device-config YAML and the per-node JSON overrides, folded into one frozen :class:`NodeSettings`.

Owns flag parsing and the per-node config format (HAMi device-plugin ``config.json``)::

    {"nodeconfig": [{"name": "gpu-node-1", "operatingmode": "hami-core", "devicesplitcount": 4,
                     "devicememoryscaling": 1.5, "devicecorescaling": 1, "preconfigureddevicememory": 0,
                     "libcudaloglevel": 1, "enablenumatopology": true,
                     "filterdevices": {"uuid": ["GPU-..."], "index": [3]},
                     "enablegetpreferredallocation": false}]}

Only the entry whose ``name`` equals the node's name applies; its keys override the YAML. Errors name the
file, the key and the offending value. Must not import grpc, pynvml or the Kubernetes client.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import yaml

from hami.core.model import DeviceMode
from hami.process.flags import Address, env_default, env_name, parse_address, parse_bool, parse_number
from hami.settings import DeviceConfig, from_device_config


class ConfigError(ValueError):
    """A flag, env value or config file is wrong; the message names it and the offending text."""


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


@dataclass(frozen=True, slots=True, kw_only=True)
class AgentConfig:
    """Process-level knobs from flags/env (see ``docs/node-agent.md``)."""

    kubeconfig: str | None = None
    node_name: str
    backend: str = "auto"
    sim_devices: Path | None = None
    register_interval: float = 30.0
    retry_interval: float = 5.0
    refresh_interval: float = 300.0
    health_interval: float = 5.0
    health_recovery: float = 300.0  # 0 = an unhealthy card never comes back (HAMi)
    kubelet_dir: Path = Path("/var/lib/kubelet/device-plugins")
    config: Path | None = None
    device_config: Path | None = None
    hook_path: Path | None = None
    lock_dir: Path = Path("/tmp/vgpulock")  # HAMi-core's lock directory on the host (with --hook-path)
    topology_score: bool = False
    metrics_listen: Address = field(default_factory=lambda: Address(host="0.0.0.0", port=9394))
    legacy_metrics: bool = False
    scheduler_name: str = "hami-scheduler"  # Allocate serves only pods this scheduler placed
    mps_control: str = "nvidia-cuda-mps-control"  # the MPS control daemon binary (operatingmode mps)
    mps_root: Path = Path("/run/hami/mps")  # pipe/, log/, shm/ of the MPS daemon, same path on the host
    mps_protocol: int = 3  # ask for MPS protocol 3 (namespaces) where the driver has it
    mps_quit_on_stop: bool = False  # quit the daemon this agent started when it stops
    log_level: str = "INFO"


# flag -> (type, default, help); env fallback HAMI_<FLAG_IN_UPPER_SNAKE>
_FLAGS: dict[str, tuple[type, Any, str]] = {
    "kubeconfig": (str, None, "kubeconfig file (default: in-cluster, then ~/.kube/config)"),
    "node-name": (str, None, "this node's name (default: env NODE_NAME)"),
    "backend": (str, "auto", "card discovery: auto (NVML), nvml, or sim"),
    "sim-devices": (Path, None, "YAML file of simulated cards (with --backend sim)"),
    "register-interval": (str, "30.0", "seconds between registration cycles"),
    "retry-interval": (str, "5.0", "seconds before retrying a failed registration"),
    "refresh-interval": (str, "300.0", "re-patch the registration at least this often (seconds)"),
    "health-interval": (str, "5.0", "seconds between card health polls"),
    "health-recovery": (
        str,
        "300",
        "seconds without a critical XID before an unhealthy card is probed and may come back (0 = never)",
    ),
    "kubelet-dir": (Path, Path("/var/lib/kubelet/device-plugins"), "kubelet device-plugin directory"),
    "config": (Path, None, "per-node overrides (HAMi device-plugin config.json)"),
    "device-config": (Path, None, "HAMi device-config YAML (top key nvidia:)"),
    "hook-path": (
        Path,
        None,
        "HAMi HOOK_PATH on the host (e.g. /usr/local; HAMi-core in HOOK/vgpu); unset = no mounts",
    ),
    "lock-dir": (
        Path,
        Path("/tmp/vgpulock"),
        "host dir HAMi-core containers share for locks, mounted at /tmp/vgpulock (with --hook-path)",
    ),
    "topology-score": (str, "false", "register NVLink/PCIe pair scores (true/false)"),
    "metrics-listen": (str, "0.0.0.0:9394", "HOST:PORT for /metrics and /healthz"),
    "legacy-metrics": (str, "false", "also export HAMi's legacy camel-case metric names (true/false)"),
    "scheduler-name": (str, "hami-scheduler", "Allocate serves only pods with this spec.schedulerName"),
    "mps-control": (
        str,
        "nvidia-cuda-mps-control",
        "MPS control daemon binary from the host driver (operatingmode mps only)",
    ),
    "mps-root": (
        Path,
        Path("/run/hami/mps"),
        "host directory of the MPS daemon's pipe/, log/ and shm/ (mounted at the same path)",
    ),
    "mps-protocol": (str, "3", "MPS protocol to ask for: 3 (namespaces where the driver has them) or 2"),
    "mps-quit-on-stop": (str, "false", "quit the MPS daemon this agent started when the agent stops"),
    "log-level": (str, "INFO", "DEBUG, INFO, WARNING or ERROR"),
}


def build_parser(environ: Mapping[str, str]) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="hami-node-agent", description="HAMi-compatible node agent.")
    for flag, (kind, default, help_text) in _FLAGS.items():
        env = env_name(flag)
        value = env_default(flag, default, environ)
        if flag == "node-name" and value is None:
            value = environ.get("NODE_NAME")
        choices = ("auto", "nvml", "sim") if flag == "backend" else None
        parser.add_argument(
            f"--{flag}", type=kind, default=value, choices=choices, help=f"{help_text} [{env}]"
        )
    return parser


def parse_agent_config(argv: Sequence[str] | None, environ: Mapping[str, str]) -> AgentConfig:
    """Flags over env over defaults; raises :class:`ConfigError` naming the bad flag or variable."""
    args = build_parser(environ).parse_args(argv)
    if not args.node_name:
        raise ConfigError("--node-name is required (or env NODE_NAME / HAMI_NODE_NAME)")
    if args.backend not in ("auto", "nvml", "sim"):  # an env value bypasses argparse choices
        raise ConfigError(f"HAMI_BACKEND must be auto, nvml or sim, got {args.backend!r}")
    numbers = {
        name: parse_number(name.replace("_", "-"), getattr(args, name), positive=True, error=ConfigError)
        for name in ("register_interval", "retry_interval", "refresh_interval", "health_interval")
    }
    recovery = parse_number("health-recovery", args.health_recovery, error=ConfigError)
    if recovery < 0:
        raise ConfigError(f"--health-recovery must be 0 (never) or positive seconds, got {recovery!r}")
    return AgentConfig(
        kubeconfig=args.kubeconfig,
        node_name=args.node_name,
        backend=args.backend,
        sim_devices=_path(args.sim_devices),
        kubelet_dir=Path(args.kubelet_dir),
        config=_path(args.config),
        device_config=_path(args.device_config),
        hook_path=_path(args.hook_path),
        lock_dir=Path(args.lock_dir),
        topology_score=parse_bool("--topology-score", str(args.topology_score), ConfigError),
        metrics_listen=parse_address("metrics-listen", args.metrics_listen, ConfigError),
        legacy_metrics=parse_bool("--legacy-metrics", str(args.legacy_metrics), ConfigError),
        scheduler_name=_scheduler_name(args.scheduler_name),
        mps_control=_mps_control(args.mps_control),
        mps_root=_mps_root(args.mps_root),
        mps_protocol=_mps_protocol(args.mps_protocol),
        mps_quit_on_stop=parse_bool("--mps-quit-on-stop", str(args.mps_quit_on_stop), ConfigError),
        log_level=str(args.log_level).upper(),
        health_recovery=recovery,
        **numbers,
    )


def _scheduler_name(value: Any) -> str:
    name = str(value or "").strip()
    if not name:
        raise ConfigError("--scheduler-name must not be empty")
    return name


def _mps_control(value: Any) -> str:
    binary = str(value or "").strip()
    if not binary:
        raise ConfigError("--mps-control must name the MPS control daemon binary")
    return binary


def _mps_root(value: Any) -> Path:
    root = Path(str(value or ""))
    if not root.is_absolute():
        raise ConfigError(f"--mps-root must be an absolute directory, got {str(value)!r}")
    return root


def _mps_protocol(value: Any) -> int:
    text = str(value).strip()
    if text not in ("2", "3"):
        raise ConfigError(f"--mps-protocol must be 2 or 3, got {text!r}")
    return int(text)


def _path(value: Any) -> Path | None:
    return Path(value) if value not in (None, "") else None


# ------------------------------------------------------------------------------------- config files
def load_node_settings(config: AgentConfig) -> NodeSettings:
    """Read ``--device-config`` and ``--config`` and fold them for ``config.node_name``."""
    device_doc = _read(config.device_config, yaml.safe_load) if config.device_config else None
    overrides = _read(config.config, json.loads) if config.config else None
    return node_settings(device_doc, overrides, config.node_name, source=str(config.config))


def _read(path: Path, parse: Any) -> Any:
    try:
        return parse(path.read_text())
    except (OSError, ValueError, yaml.YAMLError) as exc:
        raise ConfigError(f"cannot read config file {str(path)!r}: {exc}") from exc


def node_settings(
    device_doc: Mapping[str, Any] | None,
    overrides: Mapping[str, Any] | None,
    node_name: str,
    *,
    source: str = "config.json",
) -> NodeSettings:
    """Device-config YAML (HAMi chart defaults where absent) with this node's ``nodeconfig`` entry on top."""
    try:
        device = from_device_config(device_doc)
    except ValueError as exc:
        raise ConfigError(str(exc)) from exc
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
