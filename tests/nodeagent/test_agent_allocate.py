"""Allocate end to end: pods annotated exactly as the scheduler's bind writes them (built with the codec,
node lock taken with hami.kube), our device plugin served over a unix socket, a real gRPC client playing
kubelet, and the embedded API server holding the Node and Pods."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import kmock
import pytest

from hami.annotations import POD_BIND_PHASE, POD_DEVICES_ALLOCATED, POD_DEVICES_TO_ALLOCATE, decode_node_lock
from hami.kubeletapi import api_pb2
from nodeagent.config import NodeSettings

from .agent_helpers import (
    POD,
    allocate_request,
    annotations_of,
    card,
    create_node,
    create_pod,
    g,
    make_allocator,
    node_lock,
    placed,
    plugin_stub,
    refused,
    running_lock_holder,
    sim_inventory,
    take_lock,
)


async def beside_a_lock_holder(k: kmock.KubernetesEmulator, api: Any) -> None:
    """ "other" runs and holds n1's lock; "p" (one container ``c``, card GPU-a) waits without it."""
    await running_lock_holder(k, api)
    await placed(
        k, api, "p", ((g("GPU-a", 1000, 10),),), lock=False, containers=[{"name": "c", "image": "x"}]
    )


@dataclass
class Plugin:
    stub: Any
    hook: Path


@pytest.fixture
async def plugin(
    apiserver: kmock.KubernetesEmulator, api: Any, sock_dir: Path, tmp_path: Path
) -> AsyncIterator[Plugin]:
    await create_node(apiserver, "n1")
    settings = NodeSettings(memory_scaling=2.0, lib_cuda_log_level="1")
    inventory = await sim_inventory(tmp_path, [card("GPU-a"), card("GPU-b")])
    allocator = make_allocator(api, tmp_path, inventory, settings)
    async with plugin_stub(allocator, inventory, settings, sock_dir) as stub:
        yield Plugin(stub=stub, hook=tmp_path / "hook")


# ------------------------------------------------------------------------------------------ success
async def test_single_container_gets_its_cards_then_success_and_unlock(
    apiserver: kmock.KubernetesEmulator, api: Any, plugin: Plugin
) -> None:
    await placed(
        apiserver,
        api,
        "p",
        ((g("GPU-a", 3000, 30),),),
        containers=[{"name": "main", "image": "x", "resources": {"limits": {"nvidia.com/priority": "1"}}}],
    )
    assert decode_node_lock(await node_lock(apiserver) or "").name == "p"
    response = await plugin.stub.Allocate(allocate_request(["GPU-b-7"]), timeout=10)  # kubelet's pick is moot
    (answer,) = response.container_responses
    envs = dict(answer.envs)
    assert envs["NVIDIA_VISIBLE_DEVICES"] == "GPU-a"
    assert envs["CUDA_DEVICE_MEMORY_LIMIT_0"] == "3000m" and envs["CUDA_DEVICE_SM_LIMIT"] == "30"
    assert envs["CUDA_OVERSUBSCRIBE"] == "true" and envs["LIBCUDA_LOG_LEVEL"] == "1"
    assert envs["CUDA_TASK_PRIORITY"] == "1"
    assert envs["CUDA_DEVICE_MEMORY_SHARED_CACHE"].startswith(f"{plugin.hook}/vgpu/")
    mounts = {m.container_path: (m.host_path, m.read_only) for m in answer.mounts}
    container_dir = plugin.hook / "vgpu" / "containers" / "uid-p_main"
    assert mounts[f"{plugin.hook}/vgpu"] == (str(container_dir), False) and container_dir.is_dir()
    assert mounts["/etc/ld.so.preload"] == (f"{plugin.hook}/vgpu/ld.so.preload", True)
    assert mounts[f"{plugin.hook}/vgpu/libvgpu.so"][1] is True and "/tmp/license" not in mounts
    stored = await annotations_of(apiserver, POD + "p")
    assert stored[POD_DEVICES_TO_ALLOCATE] == ";"  # the only container's entry blanked
    assert stored[POD_DEVICES_ALLOCATED] == "GPU-a,NVIDIA,3000,30:;"  # the user's record is untouched
    assert stored[POD_BIND_PHASE] == "success"
    assert await node_lock(apiserver) is None


async def test_multi_container_pod_is_served_container_by_container(
    apiserver: kmock.KubernetesEmulator, api: Any, plugin: Plugin
) -> None:
    devices = ((), (g("GPU-a", 3000, 30), g("GPU-b", 4000, 30)), (), (g("GPU-b", 5000, 0),))
    await placed(
        apiserver,
        api,
        "p",
        devices,
        init_containers=[{"name": "init", "image": "x"}],
        containers=[
            {"name": "two", "image": "x"},
            {"name": "none", "image": "x"},
            {"name": "raw", "image": "x", "env": [{"name": "CUDA_DISABLE_CONTROL", "value": "true"}]},
        ],
    )
    first = await plugin.stub.Allocate(allocate_request(["GPU-a-0", "GPU-a-1"]), timeout=10)
    envs = dict(first.container_responses[0].envs)
    assert envs["NVIDIA_VISIBLE_DEVICES"] == "GPU-a,GPU-b"
    assert (envs["CUDA_DEVICE_MEMORY_LIMIT_0"], envs["CUDA_DEVICE_MEMORY_LIMIT_1"]) == ("3000m", "4000m")
    stored = await annotations_of(apiserver, POD + "p")
    assert stored[POD_DEVICES_TO_ALLOCATE] == ";;;GPU-b,NVIDIA,5000,0:;"
    assert stored[POD_BIND_PHASE] == "allocating"  # one container still to come: phase and lock stay
    assert decode_node_lock(await node_lock(apiserver) or "").name == "p"

    second = await plugin.stub.Allocate(allocate_request(["GPU-a-3"]), timeout=10)
    answer = second.container_responses[0]
    assert dict(answer.envs)["NVIDIA_VISIBLE_DEVICES"] == "GPU-b"
    assert "/etc/ld.so.preload" not in {m.container_path for m in answer.mounts}  # CUDA_DISABLE_CONTROL
    assert (plugin.hook / "vgpu" / "containers" / "uid-p_raw").is_dir()
    stored = await annotations_of(apiserver, POD + "p")
    assert stored[POD_DEVICES_TO_ALLOCATE] == ";;;;" and stored[POD_BIND_PHASE] == "success"
    assert await node_lock(apiserver) is None


async def test_a_lock_held_by_another_pod_is_left_alone(
    apiserver: kmock.KubernetesEmulator, api: Any, plugin: Plugin
) -> None:
    # "other" holds the lock but is already running; "p" is the pod kubelet admits (found by bind-phase)
    await beside_a_lock_holder(apiserver, api)
    response = await plugin.stub.Allocate(allocate_request(["GPU-a-0"]), timeout=10)
    assert dict(response.container_responses[0].envs)["NVIDIA_VISIBLE_DEVICES"] == "GPU-a"
    assert (await annotations_of(apiserver, POD + "p"))[POD_BIND_PHASE] == "success"
    assert decode_node_lock(await node_lock(apiserver) or "").name == "other"


# ------------------------------------------------------------------------------------------ failures
async def test_no_pod_waiting_is_a_not_found_error_and_changes_nothing(
    apiserver: kmock.KubernetesEmulator, api: Any, plugin: Plugin
) -> None:
    await create_pod(apiserver, "gone", containers=[{"name": "c", "image": "x"}], node="n1")
    await take_lock(api, "gone")
    await apiserver.delete(POD + "gone")
    lock = await node_lock(apiserver)
    details = await refused(plugin.stub, "GPU-a-0", code=grpc.StatusCode.NOT_FOUND)
    assert details == "no pod bound to node n1 is waiting for its GPUs (kubelet asked for 1 card)"
    assert await node_lock(apiserver) == lock


async def test_malformed_annotation_marks_the_pod_failed_and_unlocks(
    apiserver: kmock.KubernetesEmulator, api: Any, plugin: Plugin
) -> None:
    await placed(apiserver, api, "p", ((g("GPU-a", 1000, 10),),), containers=[{"name": "c", "image": "x"}])
    await apiserver.patch(
        POD + "p", json={"metadata": {"annotations": {POD_DEVICES_TO_ALLOCATE: "GPU-a,NVIDIA,lots,10:;"}}}
    )
    message = await refused(plugin.stub, "GPU-a-0")
    assert POD_DEVICES_TO_ALLOCATE in message and "lots" in message
    assert (await annotations_of(apiserver, POD + "p"))[POD_BIND_PHASE] == "failed"
    assert await node_lock(apiserver) is None


@pytest.mark.parametrize("container", ["x/../../../victim", "a/b"])
async def test_a_container_name_that_is_a_path_never_reaches_the_host(
    apiserver: kmock.KubernetesEmulator, api: Any, plugin: Plugin, container: str
) -> None:
    # HAMi-core's per-container directory is <hook>/vgpu/containers/<uid>_<container>, emptied and made
    # world-writable on every Allocate: a name with a "/" (kube-apiserver refuses one; a stand-in or a
    # hostile API server may not) must not let it wipe or open a directory elsewhere
    victim = plugin.hook / "victim"
    victim.mkdir(parents=True)
    (victim / "keep").write_text("x")
    (plugin.hook / "vgpu" / "containers" / "uid-p_x").mkdir(parents=True)  # from an earlier Allocate
    await placed(
        apiserver, api, "p", ((g("GPU-a", 1000, 10),),), containers=[{"name": container, "image": "x"}]
    )
    message = await refused(plugin.stub, "GPU-a-0")
    assert repr(container) in message and "directory" in message
    assert (victim / "keep").read_text() == "x" and victim.stat().st_mode & 0o777 != 0o777
    assert not (plugin.hook / "vgpu" / "containers" / "uid-p_a").exists()
    assert (await annotations_of(apiserver, POD + "p"))[POD_BIND_PHASE] == "failed"


async def test_device_count_mismatch_fails_without_touching_another_pods_lock(
    apiserver: kmock.KubernetesEmulator, api: Any, plugin: Plugin
) -> None:
    await beside_a_lock_holder(apiserver, api)
    message = await refused(plugin.stub, "GPU-a-0", "GPU-b-0")
    assert "device number not matched for container c: kubelet asked for 2" in message
    stored = await annotations_of(apiserver, POD + "p")
    assert stored[POD_BIND_PHASE] == "failed"
    assert stored[POD_DEVICES_TO_ALLOCATE] == "GPU-a,NVIDIA,1000,10:;"  # nothing consumed on failure
    assert decode_node_lock(await node_lock(apiserver) or "").name == "other"


async def test_preferred_allocation_follows_the_pending_pod(
    apiserver: kmock.KubernetesEmulator, api: Any, plugin: Plugin
) -> None:
    await placed(apiserver, api, "p", ((g("GPU-b", 1000, 10),),), containers=[{"name": "c", "image": "x"}])
    request = api_pb2.PreferredAllocationRequest(
        container_requests=[
            api_pb2.ContainerPreferredAllocationRequest(
                available_deviceIDs=["GPU-a-0", "GPU-a-1", "GPU-b-0"], allocation_size=1
            )
        ]
    )
    response = await plugin.stub.GetPreferredAllocation(request, timeout=10)
    assert list(response.container_responses[0].deviceIDs) == ["GPU-b-0"]


# ------------------------------------------------------------------------------------------ license
async def test_license_files_are_mounted_when_the_host_has_them(
    apiserver: kmock.KubernetesEmulator, api: Any, plugin: Plugin
) -> None:
    # (which pod a call is for when several wait: tests/nodeagent/test_agent_pairing.py)
    await placed(apiserver, api, "p", ((g("GPU-b", 2000, 20),),), containers=[{"name": "c", "image": "x"}])
    (plugin.hook / "vgpu").mkdir(parents=True)
    (plugin.hook / "vgpu" / "license").write_text("licensed")
    response = await plugin.stub.Allocate(allocate_request(["GPU-a-0"]), timeout=10)
    answer = response.container_responses[0]
    assert dict(answer.envs)["NVIDIA_VISIBLE_DEVICES"] == "GPU-b"
    mounts = {m.container_path: m.host_path for m in answer.mounts}
    assert mounts["/tmp/license"] == f"{plugin.hook}/vgpu/license"  # the license file exists on the host
    assert mounts["/usr/bin/vgpuvalidator"] == f"{plugin.hook}/vgpu/vgpuvalidator"
    assert (await annotations_of(apiserver, POD + "p"))[POD_BIND_PHASE] == "success"
    assert await node_lock(apiserver) is None  # released by its owner


async def test_concurrent_allocate_calls_are_served_one_after_the_other(
    apiserver: kmock.KubernetesEmulator, api: Any, plugin: Plugin
) -> None:
    # kubelet's request names no pod: two calls in flight must not both pop the same container entry
    await placed(
        apiserver,
        api,
        "p",
        ((g("GPU-a", 1000, 10),), (g("GPU-b", 2000, 20),)),
        containers=[{"name": "one", "image": "x"}, {"name": "two", "image": "x"}],
    )
    first, second = await asyncio.gather(
        plugin.stub.Allocate(allocate_request(["GPU-a-0"]), timeout=10),
        plugin.stub.Allocate(allocate_request(["GPU-b-0"]), timeout=10),
    )
    served = {dict(r.container_responses[0].envs)["NVIDIA_VISIBLE_DEVICES"] for r in (first, second)}
    assert served == {"GPU-a", "GPU-b"}
    stored = await annotations_of(apiserver, POD + "p")
    assert stored[POD_DEVICES_TO_ALLOCATE] == ";;" and stored[POD_BIND_PHASE] == "success"
    assert await node_lock(apiserver) is None
