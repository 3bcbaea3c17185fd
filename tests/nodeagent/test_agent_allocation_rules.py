"""The node agent's pure Allocate and kubelet rules, checked one by one against
docs/node-agent.md, "Per-node overrides", "Device plugin" and docs/protocol.md, "Allocate": which pod is a
candidate, the envs of one container, the HAMi-core mounts (with HAMi's ``CUDA_DISABLE_CONTROL`` parsing), the
kubelet device list, and per-node override precedence."""

from __future__ import annotations

from pathlib import PurePosixPath
from typing import Any

import pytest

from hami.annotations import (
    POD_BIND_PHASE,
    POD_BIND_TIME,
    POD_DEVICES_TO_ALLOCATE,
    POD_VGPU_NODE,
)
from hami.core.model import Grant
from hami.settings import DeviceConfig
from nodeagent.allocate_rules import container_envs, hook_mounts, is_candidate
from nodeagent.backends.base import Card
from nodeagent.config import NodeSettings, node_settings
from nodeagent.deviceplugin.server import kubelet_devices


def g(uuid: str, mem: int, cores: int) -> Grant:
    return Grant(uuid=uuid, memory_mib=mem, cores=cores)


# ------------------------------------------------------------------------ envs (docs/protocol.md, "Allocate")
def test_visible_devices_are_deduplicated_real_uuids_and_limits_go_by_position() -> None:
    grants = (g("GPU-b", 1000, 40), g("GPU-a", 2000, 10), g("GPU-b", 3000, 20))
    envs = container_envs(grants, {}, NodeSettings(), cache_file=None)
    assert envs["NVIDIA_VISIBLE_DEVICES"] == "GPU-b,GPU-a"  # grant order, each card once
    assert [envs[f"CUDA_DEVICE_MEMORY_LIMIT_{i}"] for i in range(3)] == ["1000m", "2000m", "3000m"]
    assert "CUDA_DEVICE_MEMORY_LIMIT_3" not in envs
    assert envs["CUDA_DEVICE_SM_LIMIT"] == "40"  # the first device's cores only
    # nothing optional without its setting
    for absent in (
        "CUDA_DEVICE_MEMORY_SHARED_CACHE",
        "CUDA_OVERSUBSCRIBE",
        "LIBCUDA_LOG_LEVEL",
        "GPU_CORE_UTILIZATION_POLICY",
        "CUDA_TASK_PRIORITY",
    ):
        assert absent not in envs


@pytest.mark.parametrize(
    ("scaling", "oversubscribe"), [(0.5, False), (1.0, False), (1.01, True), (3.0, True)]
)
def test_oversubscribe_only_when_memory_scaling_is_above_one(scaling: float, oversubscribe: bool) -> None:
    envs = container_envs((g("GPU-a", 1, 1),), {}, NodeSettings(memory_scaling=scaling), cache_file=None)
    assert envs.get("CUDA_OVERSUBSCRIBE") == ("true" if oversubscribe else None)


def test_log_level_core_policy_cache_and_priority() -> None:
    settings = NodeSettings(lib_cuda_log_level="3", device=DeviceConfig(disable_core_limit=True))
    container = {"resources": {"limits": {"nvidia.com/priority": "0"}}}
    envs = container_envs((g("GPU-a", 1, 1),), container, settings, cache_file="/usr/local/vgpu/x.cache")
    assert envs["LIBCUDA_LOG_LEVEL"] == "3"
    assert envs["GPU_CORE_UTILIZATION_POLICY"] == "disable"
    assert envs["CUDA_DEVICE_MEMORY_SHARED_CACHE"] == "/usr/local/vgpu/x.cache"
    assert envs["CUDA_TASK_PRIORITY"] == "0"


def test_mig_mode_sets_only_the_visible_devices() -> None:
    envs = container_envs(
        (g("MIG-1", 5000, 30),), {}, NodeSettings(mode="mig", memory_scaling=2.0), cache_file="/c.cache"
    )
    assert envs == {"NVIDIA_VISIBLE_DEVICES": "MIG-1"}


# ---------------------------------------------------------------------- mounts (docs/protocol.md, "Allocate")
def _mounts(container: dict[str, Any], *, licensed: bool = False) -> dict[str, tuple[str, bool]]:
    mounts = hook_mounts(
        PurePosixPath("/usr/local"),
        PurePosixPath("/usr/local/vgpu/containers/uid_c"),
        container,
        lock_dir="/tmp/vgpulock",
        licensed=licensed,
    )
    return {m.container_path: (m.host_path, m.read_only) for m in mounts}


def test_hami_core_mounts() -> None:
    assert _mounts({}) == {
        "/usr/local/vgpu/libvgpu.so": ("/usr/local/vgpu/libvgpu.so", True),
        "/usr/local/vgpu": ("/usr/local/vgpu/containers/uid_c", False),
        "/tmp/vgpulock": ("/tmp/vgpulock", False),
        "/etc/ld.so.preload": ("/usr/local/vgpu/ld.so.preload", True),
    }
    licensed = _mounts({}, licensed=True)
    assert licensed["/tmp/license"] == ("/usr/local/vgpu/license", True)
    assert licensed["/usr/bin/vgpuvalidator"] == ("/usr/local/vgpu/vgpuvalidator", True)


# HAMi parses the value with Go's strconv.ParseBool: exactly these spellings are true, nothing is trimmed
@pytest.mark.parametrize("value", ["1", "t", "T", "true", "TRUE", "True"])
def test_cuda_disable_control_true_skips_the_preload(value: str) -> None:
    assert "/etc/ld.so.preload" not in _mounts({"env": [{"name": "CUDA_DISABLE_CONTROL", "value": value}]})


@pytest.mark.parametrize("value", ["0", "false", "tRuE", " true", "yes", "on", "", None])
def test_cuda_disable_control_otherwise_keeps_the_preload(value: str | None) -> None:
    env: dict[str, Any] = {"name": "CUDA_DISABLE_CONTROL"}
    if value is not None:
        env["value"] = value
    assert "/etc/ld.so.preload" in _mounts({"env": [env]})


def test_cuda_disable_control_any_true_entry_counts() -> None:
    # HAMi skips a false entry and keeps looking, so a later true entry of the same name still counts
    env = [{"name": "CUDA_DISABLE_CONTROL", "value": "false"}, {"name": "CUDA_DISABLE_CONTROL", "value": "1"}]
    assert "/etc/ld.so.preload" not in _mounts({"env": env})


# ----------------------------------------------------------------- pending pod (docs/protocol.md, "Allocate")
def _pod(phase: str = "Pending", /, **annotations: str | None) -> dict[str, Any]:
    base: dict[str, str | None] = {
        POD_VGPU_NODE: "n1",
        POD_BIND_TIME: "1700000000",
        POD_BIND_PHASE: "allocating",
        POD_DEVICES_TO_ALLOCATE: "GPU-a,NVIDIA,1000,10:;",
    }
    base.update(annotations)
    kept = {k: v for k, v in base.items() if v is not None}
    return {"metadata": {"name": "p", "annotations": kept}, "status": {"phase": phase}}


@pytest.mark.parametrize(
    ("pod", "candidate"),
    [
        (_pod(), True),
        (_pod(**{POD_BIND_PHASE: "success"}), True),  # HAMi accepts success too (several Allocate calls)
        (_pod(**{POD_BIND_PHASE: "failed"}), False),
        (_pod(**{POD_BIND_PHASE: None}), False),
        (_pod(**{POD_BIND_TIME: None}), False),
        (_pod(**{POD_VGPU_NODE: "n2"}), False),
        (_pod(**{POD_VGPU_NODE: None}), False),
        (_pod("Running"), False),
        (_pod(**{POD_DEVICES_TO_ALLOCATE: ";;"}), False),  # nothing left (compatibility node agent #2)
        (_pod(**{POD_DEVICES_TO_ALLOCATE: "GPU-a,NVIDIA,lots,10:;"}), True),  # reported, not skipped
    ],
)
def test_pending_pod_candidates(pod: dict[str, Any], candidate: bool) -> None:
    assert is_candidate(pod, "n1") is candidate


# -------------------------------------------------------------- kubelet (docs/node-agent.md, "Device plugin")
CARDS = (
    Card(uuid="GPU-a", index=0, model="Tesla T4", memory_mib=15360, numa=1),
    Card(uuid="GPU-b", index=1, model="Tesla T4", memory_mib=15360, numa=0, healthy=False),
    Card(uuid="GPU-c", index=2, model="Tesla T4", memory_mib=15360, numa=1),
)


def test_kubelet_sees_split_replicas_without_filtered_cards_and_topology_only_when_enabled() -> None:
    settings = NodeSettings(split_count=2, filter_uuids=frozenset({"GPU-c"}))
    devices = kubelet_devices(CARDS, settings)
    assert [(d.ID, d.health) for d in devices] == [
        ("GPU-a-0", "Healthy"),
        ("GPU-a-1", "Healthy"),
        ("GPU-b-0", "Unhealthy"),
        ("GPU-b-1", "Unhealthy"),
    ]
    assert not any(d.HasField("topology") for d in devices)
    settings = NodeSettings(split_count=1, numa_topology=True, filter_indexes=frozenset({0}))
    numa = kubelet_devices(CARDS, settings)
    assert [(d.ID, d.topology.nodes[0].ID) for d in numa] == [("GPU-b-0", 0), ("GPU-c-0", 1)]


# ---------------------------------------------------------- config (docs/node-agent.md, "Per-node overrides")
YAML = {
    "nvidia": {
        "deviceSplitCount": 10,
        "deviceMemoryScaling": 1.5,
        "deviceCoreScaling": 1,
        "preConfiguredDeviceMemory": 122880,
        "libCudaLogLevel": 1,
        "enableNumaTopology": True,
    }
}


def test_every_node_override_replaces_the_device_config_value() -> None:
    entry = {
        "name": "n1",
        "devicesplitcount": 4,
        "devicememoryscaling": 1,
        "devicecorescaling": 2,
        "preconfigureddevicememory": 0,  # explicit values win, zero included (HAMi's pointers)
        "libcudaloglevel": "4",
        "enablenumatopology": False,
    }
    mine = node_settings(YAML, {"nodeconfig": [entry]}, "n1")
    assert (
        mine.split_count,
        mine.memory_scaling,
        mine.core_scaling,
        mine.preconfigured_memory,
        mine.lib_cuda_log_level,
        mine.numa_topology,
    ) == (4, 1.0, 2.0, 0, "4", False)


def test_absent_or_null_override_keys_keep_the_device_config_value() -> None:
    entry = {"name": "n1", "devicesplitcount": None, "libcudaloglevel": None, "operatingmode": ""}
    mine = node_settings(YAML, {"nodeconfig": [entry]}, "n1")
    assert (
        mine.split_count,
        mine.memory_scaling,
        mine.core_scaling,
        mine.preconfigured_memory,
        mine.lib_cuda_log_level,
        mine.numa_topology,
        mine.mode,
        mine.preferred_allocation,
    ) == (10, 1.5, 1.0, 122880, "1", True, "hami-core", False)
