"""HAMi's NVIDIA device config, the one configuration every component shares, and the one error for a
bad setting: nothing else lives here.

Owns :class:`ResourceNames` (the extended-resource names), :class:`DeviceConfig` (the ``nvidia:``
section of HAMi's device-config YAML with HAMi's defaults) and :func:`from_device_config`, which reads
an already parsed document; frozen dataclasses built once at each entry point and passed down. Owns
:class:`ConfigError`, which every service raises for bad configuration (a flag, an env variable, a file
or a key in one); it lives at the bottom layer so the device config, the file reader and every service's
settings share it. Reading the file is :mod:`hami.devicefile`; each service's own settings schema lives
beside it (``hami.scheduler.config``, ``webhook.config``, ``nodeagent.config``), declared with the flag
schema they share, :mod:`hami.process.flags`. Pure: stdlib only, no ``os``, no file reading.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any


@dataclass(frozen=True, slots=True, kw_only=True)
class ResourceNames:
    """The extended-resource names a pod uses to ask for card slices (docs/protocol.md, "Device config")."""

    count: str = "nvidia.com/gpu"
    memory: str = "nvidia.com/gpumem"
    memory_percentage: str = "nvidia.com/gpumem-percentage"
    cores: str = "nvidia.com/gpucores"
    priority: str = "nvidia.com/priority"

    @property
    def managed(self) -> tuple[str, ...]:
        """Every resource our scheduler manages (kube-scheduler must ignore them)."""
        return (self.count, self.memory, self.memory_percentage, self.cores)


@dataclass(frozen=True, slots=True, kw_only=True)
class DeviceConfig:
    """HAMi's ``nvidia:`` device config with its defaults (docs/protocol.md, "Device config")."""

    resources: ResourceNames = field(default_factory=ResourceNames)
    default_memory: int = 0
    default_cores: int = 0
    default_gpu_num: int = 1
    memory_factor: int = 1
    overwrite_env: bool = False
    gpu_core_policy: str = ""
    runtime_class_name: str = ""
    disable_core_limit: bool = False
    device_split_count: int = 10
    device_memory_scaling: float = 1.0
    device_core_scaling: float = 1.0
    preconfigured_device_memory: int = 0
    mig_profile_allowlist: Mapping[str, tuple[str, ...]] = field(default_factory=dict)

    @property
    def effective_memory_factor(self) -> int:
        """HAMi treats an unset (0) factor as 1."""
        return max(self.memory_factor, 1)


#: YAML key (HAMi's camelCase) -> DeviceConfig field, for the scalar knobs.
_YAML_KEYS: dict[str, str] = {
    "defaultMemory": "default_memory",
    "defaultCores": "default_cores",
    "defaultGPUNum": "default_gpu_num",
    "memoryFactor": "memory_factor",
    "overwriteEnv": "overwrite_env",
    "gpuCorePolicy": "gpu_core_policy",
    "runtimeClassName": "runtime_class_name",
    "disableCoreLimit": "disable_core_limit",
    "deviceSplitCount": "device_split_count",
    "deviceMemoryScaling": "device_memory_scaling",
    "deviceCoreScaling": "device_core_scaling",
    "preConfiguredDeviceMemory": "preconfigured_device_memory",
}
_RESOURCE_KEYS: dict[str, str] = {
    "resourceCountName": "count",
    "resourceMemoryName": "memory",
    "resourceMemoryPercentageName": "memory_percentage",
    "resourceCoreName": "cores",
    "resourcePriorityName": "priority",
}


class ConfigError(ValueError):
    """A setting is wrong: a flag, an env variable, a config file or a key in one. The message names it
    (``--listen``, ``HAMI_MANAGE_CONFIG``, ``--device-config FILE``, ``nvidia.defaultMemory``) and the
    offending text; the services print it as their one-line refusal (exit 2)."""


def from_device_config(document: Mapping[str, Any] | None) -> DeviceConfig:
    """Build a :class:`DeviceConfig` from a parsed device-config document (``{"nvidia": {...}}``).

    Unknown keys are ignored (HAMi's file carries other vendors and knobs we do not use); a known key
    with a value of the wrong type raises :class:`ConfigError` naming the key.
    """
    nvidia: Mapping[str, Any] = (document or {}).get("nvidia") or {}
    defaults = DeviceConfig()
    types = {f.name: type(getattr(defaults, f.name)) for f in fields(DeviceConfig)}
    values: dict[str, Any] = {}
    for key, attr in _YAML_KEYS.items():
        if key in nvidia and nvidia[key] is not None:
            values[attr] = _coerce(key, nvidia[key], types[attr])
    names = {attr: str(nvidia[key]) for key, attr in _RESOURCE_KEYS.items() if nvidia.get(key)}
    values["mig_profile_allowlist"] = _mig_allowlist(nvidia.get("migProfileAllowlist") or {})
    return replace(defaults, resources=replace(defaults.resources, **names), **values)


def _mig_allowlist(allow: object) -> dict[str, tuple[str, ...]]:
    """Card model -> allowed MIG profiles, from our mapping form or HAMi's list of ``{models, profiles}``
    entries (what HAMi's own device config carries); a model named by several entries gets the union."""
    if isinstance(allow, Mapping):
        return {str(k): tuple(str(p) for p in (v or ())) for k, v in allow.items()}
    if not isinstance(allow, list):
        raise ConfigError(f"nvidia.migProfileAllowlist must be a mapping or a list, got {allow!r}")
    merged: dict[str, tuple[str, ...]] = {}
    for position, entry in enumerate(allow):
        where = f"nvidia.migProfileAllowlist[{position}]"
        if not isinstance(entry, Mapping):
            raise ConfigError(f"{where} must be a mapping with models and profiles, got {entry!r}")
        models, profiles = entry.get("models"), entry.get("profiles")
        for name, value in (("models", models), ("profiles", profiles)):
            if not isinstance(value, list) or not value or not all(isinstance(v, str) for v in value):
                raise ConfigError(f"{where}.{name} must be a non-empty list of strings, got {value!r}")
        assert isinstance(models, list) and isinstance(profiles, list)  # checked above
        for model in models:
            known = merged.get(model, ())
            merged[model] = known + tuple(p for p in dict.fromkeys(profiles) if p not in known)
    return merged


def _coerce(key: str, value: Any, kind: type) -> Any:
    if kind is bool:
        if isinstance(value, bool):
            return value
        raise ConfigError(f"nvidia.{key} must be true or false, got {value!r}")
    if kind is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        raise ConfigError(f"nvidia.{key} must be an integer, got {value!r}")
    if kind is float:
        if isinstance(value, int | float) and not isinstance(value, bool):
            return float(value)
        raise ConfigError(f"nvidia.{key} must be a number, got {value!r}")
    return str(value)
