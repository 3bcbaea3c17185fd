"""The MPS answer for one container (nodeagent/mps/rules.py) as tables: envs, mounts, the limits a
namespace holds, what MPS cannot express, the namespace names and the split-count cap."""

from __future__ import annotations

from pathlib import PurePosixPath

import pytest

from hami.core.model import Grant
from nodeagent.allocate_rules import AllocationError
from nodeagent.mps.protocol import CardLimit
from nodeagent.mps.rules import (
    MAX_CLIENTS,
    capped_split_count,
    card_limits,
    mps_answer,
    namespace_name,
    namespace_pod,
    thread_percentage,
)

PIPE, SHM = PurePosixPath("/run/hami/mps/pipe"), PurePosixPath("/run/hami/mps/shm")
UID = "5d8f1c2e-0b1a-4c3d-9e8f-7a6b5c4d3e2f"


def g(uuid: str, mem: int = 1000, cores: int = 30) -> Grant:
    return Grant(uuid=uuid, memory_mib=mem, cores=cores)


def answer(*grants: Grant, namespaced: bool = False, core_limit: bool = True) -> dict[str, str]:
    made = mps_answer("c", grants, pipe_dir=PIPE, shm_dir=SHM, namespaced=namespaced, core_limit=core_limit)
    return dict(made.envs)


def test_per_client_answer_carries_the_limits_in_enumeration_order() -> None:
    result = mps_answer(
        "main", (g("GPU-b", 4000), g("GPU-a", 3000)), pipe_dir=PIPE, shm_dir=SHM, namespaced=False
    )
    assert result.container == "main" and result.uuids == ("GPU-b", "GPU-a")
    assert dict(result.envs) == {
        "NVIDIA_VISIBLE_DEVICES": "GPU-b,GPU-a",
        "CUDA_VISIBLE_DEVICES": "GPU-b,GPU-a",  # CUDA enumerates in this order: ordinal 0 is GPU-b
        "CUDA_MPS_PIPE_DIRECTORY": "/tmp/nvidia-mps",
        "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=4000M,1=3000M",
        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "30",
    }
    mounts = {m.container_path: (m.host_path, m.read_only) for m in result.mounts}
    assert mounts == {"/tmp/nvidia-mps": (str(PIPE), False), "/dev/shm": (str(SHM), False)}


def test_no_hami_core_env_or_mount_in_an_mps_container() -> None:
    result = mps_answer("main", (g("GPU-a"),), pipe_dir=PIPE, shm_dir=SHM, namespaced=False)
    assert not any(k.startswith(("CUDA_DEVICE_", "CUDA_OVERSUBSCRIBE", "LIBCUDA")) for k in result.envs)
    assert all("ld.so.preload" not in m.container_path and "vgpu" not in m.host_path for m in result.mounts)


def test_namespaced_answer_has_no_limit_env() -> None:
    envs = answer(g("GPU-a", 3000, 30), namespaced=True)
    assert "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT" not in envs and "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE" not in envs
    assert envs["CUDA_MPS_PIPE_DIRECTORY"] == "/tmp/nvidia-mps" and envs["NVIDIA_VISIBLE_DEVICES"] == "GPU-a"


@pytest.mark.parametrize(
    ("cores", "core_limit", "env", "namespace"),
    [
        (30, True, "30", 30),
        (0, True, None, 100),  # HAMi: gpucores 0 = no core limit
        (100, True, None, 100),  # the whole card
        (30, False, None, 100),  # disableCoreLimit
        (1, True, "1", 1),
    ],
)
def test_thread_percentage(cores: int, core_limit: bool, env: str | None, namespace: int) -> None:
    envs = answer(g("GPU-a", cores=cores), core_limit=core_limit)
    assert envs.get("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE") == env
    (limit,) = card_limits((g("GPU-a", cores=cores),), core_limit=core_limit)
    assert limit.thread_percentage == namespace


def test_differing_cores_take_the_smallest_limit() -> None:
    assert thread_percentage((g("GPU-a", cores=50), g("GPU-b", cores=20), g("GPU-c", cores=0))) == 20


def test_card_limits_in_grant_order_each_card_once() -> None:
    grants = (g("GPU-b", 4000, 20), g("GPU-a", 3000, 20), g("GPU-b", 9999, 20))
    assert card_limits(grants) == (
        CardLimit(uuid="GPU-b", memory_mib=4000, thread_percentage=20),
        CardLimit(uuid="GPU-a", memory_mib=3000, thread_percentage=20),
    )
    assert answer(*grants)["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=4000M,1=3000M"


@pytest.mark.parametrize("namespaced", [False, True])
def test_a_zero_mib_grant_is_refused(namespaced: bool) -> None:
    with pytest.raises(AllocationError, match="GPU-a is granted 0 MiB: MPS cannot limit"):
        answer(g("GPU-a", 0), namespaced=namespaced)


def test_a_uuid_a_daemon_command_cannot_carry_is_refused() -> None:
    with pytest.raises(AllocationError, match="cannot be written into an MPS command"):
        card_limits((g("GPU-a,GPU-b"),))


def test_namespace_names() -> None:
    assert namespace_name(UID, 2) == f"{UID}-2"
    assert namespace_pod(namespace_name(UID, 2)) == UID
    assert namespace_pod("default") is None and namespace_pod("hami") is None
    assert len(namespace_name(UID, 999999)) <= 63
    for bad in ("UID-UPPER", "a/b", "", "x" * 57):
        with pytest.raises(AllocationError, match="cannot name an MPS namespace"):
            namespace_name(bad, 0)


def test_split_count_capped_at_the_mps_client_limit() -> None:
    assert MAX_CLIENTS == 48
    assert [capped_split_count(n) for n in (1, 10, 48, 49, 100)] == [1, 10, 48, 48, 48]
