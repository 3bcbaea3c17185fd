"""The kubelet stand-in: plugin registration, ListAndWatch capacity, Allocate per container, pod status.

A small fake device plugin (the project's generated gRPC stubs) registers with the stand-in over the
real unix sockets; pods and nodes live in the embedded apiserver.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import grpc
import kmock
import pytest

from hami.kube.client import load_api_client
from hami.kubeletapi import api_pb2, api_pb2_grpc
from hami_testkit.kubeapi import nodes_path, pods_path
from hami_testkit.kubelet_standin import CHECKPOINT, NodeKubelet
from tests.eventually import eventually

DEVICES = [f"GPU-{card}-{i}" for card in ("a", "b") for i in range(3)]


class FakePlugin(api_pb2_grpc.DevicePluginServicer):  # type: ignore[misc]
    def __init__(self) -> None:
        self.allocations: list[list[str]] = []
        self.preferred: list[tuple[list[str], int]] = []
        self.fail = ""

    async def ListAndWatch(self, request: Any, context: Any) -> AsyncIterator[Any]:  # the gRPC name
        yield api_pb2.ListAndWatchResponse(devices=[api_pb2.Device(ID=i, health="Healthy") for i in DEVICES])
        await asyncio.Event().wait()

    async def GetPreferredAllocation(self, request: Any, context: Any) -> Any:
        ask = request.container_requests[0]
        self.preferred.append((list(ask.available_deviceIDs), ask.allocation_size))
        chosen = list(ask.available_deviceIDs)[
            -ask.allocation_size :
        ]  # the last ones: visibly not the default
        return api_pb2.PreferredAllocationResponse(
            container_responses=[api_pb2.ContainerPreferredAllocationResponse(deviceIDs=chosen)]
        )

    async def Allocate(self, request: Any, context: Any) -> Any:
        if self.fail:
            await context.abort(grpc.StatusCode.UNKNOWN, self.fail)
        ids = list(request.container_requests[0].devices_ids)
        self.allocations.append(ids)
        envs = {"NVIDIA_VISIBLE_DEVICES": ",".join(sorted({i.rsplit("-", 1)[0] for i in ids}))}
        return api_pb2.AllocateResponse(container_responses=[api_pb2.ContainerAllocateResponse(envs=envs)])


@pytest.fixture
def short_dir() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="kl-", dir="/tmp"))  # unix socket paths must stay short
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
async def kubelet(
    apiserver: kmock.KubernetesEmulator, kubeconfig: Path, short_dir: Path
) -> AsyncIterator[tuple[NodeKubelet, FakePlugin]]:
    node = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n1"}, "status": {"allocatable": {}}}
    await apiserver.post(nodes_path(), json=node)
    api = load_api_client(str(kubeconfig), request_timeout=5.0)
    standin = NodeKubelet(api, "n1", short_dir, plugin_wait=2.0)
    await standin.start()
    plugin = FakePlugin()
    server = grpc.aio.server()
    api_pb2_grpc.add_DevicePluginServicer_to_server(plugin, server)
    server.add_insecure_port(f"unix://{short_dir / 'fake.sock'}")
    await server.start()
    async with grpc.aio.insecure_channel(f"unix://{short_dir / 'kubelet.sock'}") as channel:
        options = api_pb2.DevicePluginOptions(get_preferred_allocation_available=True)
        request = api_pb2.RegisterRequest(
            version="v1beta1", endpoint="fake.sock", resource_name="nvidia.com/gpu", options=options
        )
        await api_pb2_grpc.RegistrationStub(channel).Register(request)
    yield standin, plugin
    await standin.stop()
    await server.stop(grace=None)
    api.close()


def _gpu(name: str, count: int) -> dict[str, Any]:
    # gpumem is no device-plugin resource: kubelet leaves it to the scheduler and allocates only gpu
    limits = {"nvidia.com/gpu": str(count), "nvidia.com/gpumem": "1000"}
    return {"name": name, "image": "x", "resources": {"limits": limits}}


async def _bound_pod(apiserver: kmock.KubernetesEmulator, name: str, init: int, app: int) -> dict[str, Any]:
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "default", "uid": f"uid-{name}"},
        "spec": {
            "nodeName": "n1",
            "initContainers": [_gpu("init", init)],
            "containers": [_gpu("main", app), {"name": "sidecar", "image": "y"}],
        },
        "status": {"phase": "Pending"},
    }
    await apiserver.post(pods_path("default"), json=pod)
    return pod


async def _phase(apiserver: kmock.KubernetesEmulator, name: str) -> dict[str, Any]:
    async def probe() -> dict[str, Any] | None:
        status = (await (await apiserver.get(pods_path("default", name))).json()).get("status") or {}
        return status if status.get("phase") in ("Running", "Failed") else None

    return await eventually(probe, f"{name} to be admitted or failed", within=10)


async def test_registration_publishes_capacity(
    apiserver: kmock.KubernetesEmulator, kubelet: tuple[NodeKubelet, FakePlugin]
) -> None:
    async def published() -> dict[str, Any] | None:
        status = (await (await apiserver.get(nodes_path("n1"))).json())["status"]
        return status if status["allocatable"].get("nvidia.com/gpu") == "6" else None

    status = await eventually(published, "n1's allocatable", within=10)
    assert status["capacity"]["nvidia.com/gpu"] == "6"


async def test_each_gpu_container_gets_an_allocate_with_its_count(
    apiserver: kmock.KubernetesEmulator, kubelet: tuple[NodeKubelet, FakePlugin], short_dir: Path
) -> None:
    standin, plugin = kubelet
    standin.observe("ADDED", await _bound_pod(apiserver, "p1", init=1, app=2))
    status = await _phase(apiserver, "p1")
    assert status["phase"] == "Running"
    assert [s["name"] for s in status["containerStatuses"]] == ["main", "sidecar"]
    # init first, then app; the preferred (last) free IDs were used; no ID handed out twice
    assert plugin.allocations == [["GPU-b-2"], ["GPU-b-0", "GPU-b-1"]]
    assert [size for _, size in plugin.preferred] == [1, 2]
    assert "GPU-b-2" not in plugin.preferred[1][0]
    checkpoint = json.loads((short_dir / CHECKPOINT).read_text())["Data"]["PodDeviceEntries"]
    assert [
        (e["containerName"], e["deviceIDs"], e["envs"]["NVIDIA_VISIBLE_DEVICES"]) for e in checkpoint
    ] == [
        ("init", ["GPU-b-2"], "GPU-b"),
        ("main", ["GPU-b-0", "GPU-b-1"], "GPU-b"),
    ]
    # the pod goes away: its devices are free again
    standin.observe("DELETED", await (await apiserver.get(pods_path("default", "p1"))).json())
    assert json.loads((short_dir / CHECKPOINT).read_text())["Data"]["PodDeviceEntries"] == []


async def test_too_few_free_devices_fail_admission(
    apiserver: kmock.KubernetesEmulator, kubelet: tuple[NodeKubelet, FakePlugin]
) -> None:
    standin, _ = kubelet
    standin.observe("ADDED", await _bound_pod(apiserver, "p1", init=1, app=6))
    status = await _phase(apiserver, "p1")
    assert status["phase"] == "Failed"
    assert status["reason"] == "UnexpectedAdmissionError"
    assert "Requested: 6, Available: 5" in status["message"]  # the init container holds one of the six


async def test_an_allocate_error_fails_the_pod_like_kubelet(
    apiserver: kmock.KubernetesEmulator, kubelet: tuple[NodeKubelet, FakePlugin]
) -> None:
    standin, plugin = kubelet
    plugin.fail = "no pending pod on node n1"
    standin.observe("ADDED", await _bound_pod(apiserver, "p1", init=0, app=1))
    status = await _phase(apiserver, "p1")
    assert status["phase"] == "Failed"
    assert status["reason"] == "UnexpectedAdmissionError"
    assert "no pending pod on node n1" in status["message"]
    assert standin.assigned == {}


async def test_a_finished_pod_frees_its_devices(
    apiserver: kmock.KubernetesEmulator, kubelet: tuple[NodeKubelet, FakePlugin], short_dir: Path
) -> None:
    """A Job's pod that Succeeded (the workload stand-in writes it so) holds no device IDs any more, as
    kubelet's device manager frees a terminated pod's devices: six IDs serve two six-ID pods in turn."""
    standin, _ = kubelet
    standin.observe("ADDED", await _bound_pod(apiserver, "p1", init=0, app=6))
    assert (await _phase(apiserver, "p1"))["phase"] == "Running"
    done = await (
        await apiserver.patch(pods_path("default", "p1"), json={"status": {"phase": "Succeeded"}})
    ).json()
    standin.observe("MODIFIED", done)
    assert json.loads((short_dir / CHECKPOINT).read_text())["Data"]["PodDeviceEntries"] == []
    standin.observe("ADDED", await _bound_pod(apiserver, "p2", init=0, app=6))
    assert (await _phase(apiserver, "p2"))["phase"] == "Running"
