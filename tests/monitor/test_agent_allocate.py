"""Allocate end to end: pods annotated exactly as the scheduler's bind writes them (built with the codec,
node lock taken with hami.kube), our device plugin served over a unix socket, a real gRPC client playing
kubelet, and the embedded API server holding the Node and Pods."""

from __future__ import annotations

import asyncio
import datetime
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import kmock
import pytest
from agent_helpers import (
    allocate_request,
    annotations_of,
    asking,
    card,
    create_node,
    create_pod,
    node_lock,
    serving,
    write_cards,
)

from hami.annotations import (
    POD_BIND_PHASE,
    POD_DEVICES_ALLOCATED,
    POD_DEVICES_TO_ALLOCATE,
    BindPhase,
    allocation_annotations,
    bind_annotations,
    decode_node_lock,
)
from hami.core.model import Grant, PodDevices
from hami.kube.nodelock import acquire_node_lock
from hami.kubeletapi import api_pb2
from monitor.allocate_call import Allocator
from monitor.backends.sim import SimBackend
from monitor.config import NodeSettings
from monitor.deviceplugin.server import DevicePluginService
from monitor.inventory import Inventory

NOW = datetime.datetime(2026, 3, 1, 12, 0, tzinfo=datetime.UTC)
POD = "/api/v1/namespaces/default/pods/"


@dataclass
class Plugin:
    stub: Any
    hook: Path


async def bound_pod(
    k: kmock.KubernetesEmulator, api: Any, name: str, devices: PodDevices, *, lock: bool = True, **kw: Any
) -> None:
    """A pod after the scheduler's bind: allocation + bind annotations, the vgpu-node label, the lock."""
    annotations = allocation_annotations(node="n1", devices=devices, now=NOW)
    annotations.update(bind_annotations(BindPhase.ALLOCATING, now=NOW))
    asking(devices, kw["containers"], kw.get("init_containers"))
    await create_pod(k, name, annotations=annotations, node="n1", **kw)
    if lock:
        await acquire_node_lock(api, "n1", "default", name, now=datetime.datetime.now(datetime.UTC))


def g(uuid: str, mem: int, cores: int) -> Grant:
    return Grant(uuid=uuid, memory_mib=mem, cores=cores)


def make_service(
    api: Any, tmp_path: Path, inventory: Inventory, settings: NodeSettings
) -> DevicePluginService:
    allocator = Allocator(
        api=api,
        node_name="n1",
        settings=settings,
        hook_path=tmp_path / "hook",
        lock_dir=tmp_path / "vgpulock",
        inventory=inventory,
    )
    return DevicePluginService(inventory=inventory, settings=settings, allocator=allocator)


@pytest.fixture
async def plugin(
    apiserver: kmock.KubernetesEmulator, api: Any, sock_dir: Path, tmp_path: Path
) -> AsyncIterator[Plugin]:
    await create_node(apiserver, "n1")
    settings = NodeSettings(memory_scaling=2.0, lib_cuda_log_level="1")
    write_cards(tmp_path / "cards.yaml", [card("GPU-a"), card("GPU-b")])
    inventory = Inventory(SimBackend(tmp_path / "cards.yaml"))
    await inventory.refresh()
    async with serving(make_service(api, tmp_path, inventory, settings), sock_dir) as stub:
        yield Plugin(stub=stub, hook=tmp_path / "hook")


# ------------------------------------------------------------------------------------------ success
async def test_single_container_gets_its_cards_then_success_and_unlock(
    apiserver: kmock.KubernetesEmulator, api: Any, plugin: Plugin
) -> None:
    await bound_pod(
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
    await bound_pod(
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
    await create_pod(apiserver, "other", containers=[{"name": "c", "image": "x"}], node="n1", phase="Running")
    await acquire_node_lock(api, "n1", "default", "other", now=datetime.datetime.now(datetime.UTC))
    await bound_pod(
        apiserver, api, "p", ((g("GPU-a", 1000, 10),),), lock=False, containers=[{"name": "c", "image": "x"}]
    )
    response = await plugin.stub.Allocate(allocate_request(["GPU-a-0"]), timeout=10)
    assert dict(response.container_responses[0].envs)["NVIDIA_VISIBLE_DEVICES"] == "GPU-a"
    assert (await annotations_of(apiserver, POD + "p"))[POD_BIND_PHASE] == "success"
    assert decode_node_lock(await node_lock(apiserver) or "").name == "other"


# ------------------------------------------------------------------------------------------ failures
async def test_no_pod_waiting_is_a_not_found_error_and_changes_nothing(
    apiserver: kmock.KubernetesEmulator, api: Any, plugin: Plugin
) -> None:
    await create_pod(apiserver, "gone", containers=[{"name": "c", "image": "x"}], node="n1")
    await acquire_node_lock(api, "n1", "default", "gone", now=datetime.datetime.now(datetime.UTC))
    await apiserver.delete(POD + "gone")
    lock = await node_lock(apiserver)
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await plugin.stub.Allocate(allocate_request(["GPU-a-0"]), timeout=10)
    assert caught.value.code() == grpc.StatusCode.NOT_FOUND
    details = caught.value.details()
    assert details == "no pod bound to node n1 is waiting for its GPUs (kubelet asked for 1 card)"
    assert await node_lock(apiserver) == lock


async def test_malformed_annotation_marks_the_pod_failed_and_unlocks(
    apiserver: kmock.KubernetesEmulator, api: Any, plugin: Plugin
) -> None:
    await bound_pod(apiserver, api, "p", ((g("GPU-a", 1000, 10),),), containers=[{"name": "c", "image": "x"}])
    await apiserver.patch(
        POD + "p", json={"metadata": {"annotations": {POD_DEVICES_TO_ALLOCATE: "GPU-a,NVIDIA,lots,10:;"}}}
    )
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await plugin.stub.Allocate(allocate_request(["GPU-a-0"]), timeout=10)
    assert caught.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert POD_DEVICES_TO_ALLOCATE in caught.value.details() and "lots" in caught.value.details()
    assert (await annotations_of(apiserver, POD + "p"))[POD_BIND_PHASE] == "failed"
    assert await node_lock(apiserver) is None


async def test_device_count_mismatch_fails_without_touching_another_pods_lock(
    apiserver: kmock.KubernetesEmulator, api: Any, plugin: Plugin
) -> None:
    await create_pod(apiserver, "other", containers=[{"name": "c", "image": "x"}], node="n1", phase="Running")
    await acquire_node_lock(api, "n1", "default", "other", now=datetime.datetime.now(datetime.UTC))
    await bound_pod(
        apiserver, api, "p", ((g("GPU-a", 1000, 10),),), lock=False, containers=[{"name": "c", "image": "x"}]
    )
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await plugin.stub.Allocate(allocate_request(["GPU-a-0", "GPU-b-0"]), timeout=10)
    assert "device number not matched for container c: kubelet asked for 2" in caught.value.details()
    stored = await annotations_of(apiserver, POD + "p")
    assert stored[POD_BIND_PHASE] == "failed"
    assert stored[POD_DEVICES_TO_ALLOCATE] == "GPU-a,NVIDIA,1000,10:;"  # nothing consumed on failure
    assert decode_node_lock(await node_lock(apiserver) or "").name == "other"


async def test_preferred_allocation_follows_the_pending_pod(
    apiserver: kmock.KubernetesEmulator, api: Any, plugin: Plugin
) -> None:
    await bound_pod(apiserver, api, "p", ((g("GPU-b", 1000, 10),),), containers=[{"name": "c", "image": "x"}])
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
    # (which pod a call is for when several wait: tests/monitor/test_agent_pairing.py)
    await bound_pod(apiserver, api, "p", ((g("GPU-b", 2000, 20),),), containers=[{"name": "c", "image": "x"}])
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
    await bound_pod(
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
