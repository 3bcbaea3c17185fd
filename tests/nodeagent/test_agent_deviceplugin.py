"""The kubelet device plugin over real gRPC on unix sockets: an in-test fake kubelet Registration server,
our plugin served by the kubelet runner, and a real client playing kubelet (Register, ListAndWatch with a
card turning unhealthy, kubelet restarts, GetPreferredAllocation)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from hami.kubeletapi import api_pb2, api_pb2_grpc
from nodeagent.allocate_call import Allocator
from nodeagent.backends.simulated import SimBackend
from nodeagent.config import NodeSettings
from nodeagent.deviceplugin.kubelet import KubeletRunner
from nodeagent.deviceplugin.server import DevicePluginService, physical_uuid, preferred_ids
from nodeagent.inventory import Inventory
from tests.builders import NO_API
from tests.eventually import eventually

from .agent_helpers import card, write_cards


class FakeKubelet(api_pb2_grpc.RegistrationServicer):  # type: ignore[misc]
    """kubelet's Registration service: records each request."""

    def __init__(self) -> None:
        self.requests: list[Any] = []
        self.arrived = asyncio.Event()

    async def Register(self, request: Any, context: Any) -> Any:
        self.requests.append(request)
        self.arrived.set()
        return api_pb2.Empty()


async def start_kubelet(directory: Path) -> tuple[grpc.aio.Server, FakeKubelet]:
    fake = FakeKubelet()
    server = grpc.aio.server()
    api_pb2_grpc.add_RegistrationServicer_to_server(fake, server)
    server.add_insecure_port(f"unix://{directory / 'kubelet.sock'}")
    await server.start()
    return server, fake


async def stop_kubelet(server: grpc.aio.Server, directory: Path) -> None:
    await server.stop(grace=None)
    (directory / "kubelet.sock").unlink(missing_ok=True)


@pytest.fixture
async def inventory(tmp_path: Path) -> Inventory:
    write_cards(tmp_path / "cards.yaml", [card("GPU-a"), card("GPU-b", numa=1)])
    inv = Inventory(SimBackend(tmp_path / "cards.yaml"))
    await inv.refresh()
    return inv


@pytest.fixture
async def runner(sock_dir: Path, inventory: Inventory) -> AsyncIterator[KubeletRunner]:
    settings = NodeSettings(split_count=3, numa_topology=True)
    allocator = Allocator(api=NO_API, node_name="n1", settings=settings)  # Allocate is not called here
    service = DevicePluginService(inventory=inventory, settings=settings, allocator=allocator)
    runner = KubeletRunner(
        service=service, kubelet_dir=sock_dir, resource_name="nvidia.com/gpu", retry=0.05, watch_interval=0.05
    )
    task = asyncio.create_task(runner.run())
    yield runner
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    assert not runner.socket_path.exists()  # stopping removes our socket


async def _wait(event: asyncio.Event) -> None:
    await asyncio.wait_for(event.wait(), timeout=10)


async def test_register_list_and_watch_and_an_unhealthy_card(
    sock_dir: Path, runner: KubeletRunner, inventory: Inventory, tmp_path: Path
) -> None:
    server, kubelet = await start_kubelet(sock_dir)
    try:
        await _wait(kubelet.arrived)
        (request,) = kubelet.requests
        assert (request.version, request.endpoint, request.resource_name) == (
            "v1beta1",
            "nvidia-gpu.sock",
            "nvidia.com/gpu",
        )
        assert request.options.get_preferred_allocation_available is False
        async with grpc.aio.insecure_channel(f"unix://{runner.socket_path}") as channel:
            stub = api_pb2_grpc.DevicePluginStub(channel)
            options = await stub.GetDevicePluginOptions(api_pb2.Empty(), timeout=5)
            assert options.get_preferred_allocation_available and not options.pre_start_required
            stream = stub.ListAndWatch(api_pb2.Empty())
            first = await asyncio.wait_for(stream.read(), timeout=5)
            assert [d.ID for d in first.devices] == [
                "GPU-a-0",
                "GPU-a-1",
                "GPU-a-2",
                "GPU-b-0",
                "GPU-b-1",
                "GPU-b-2",
            ]
            assert {d.health for d in first.devices} == {"Healthy"}
            assert [d.topology.nodes[0].ID for d in first.devices] == [0, 0, 0, 1, 1, 1]

            write_cards(tmp_path / "cards.yaml", [card("GPU-a"), card("GPU-b", numa=1, healthy=False)])
            await inventory.refresh()  # what the health poll does every few seconds
            second = await asyncio.wait_for(stream.read(), timeout=5)
            health = {d.ID: d.health for d in second.devices}
            assert health["GPU-a-0"] == "Healthy" and health["GPU-b-2"] == "Unhealthy"
            assert [h for h in health.values()].count("Unhealthy") == 3
            stream.cancel()
    finally:
        await stop_kubelet(server, sock_dir)


async def test_waits_for_kubelet_and_registers_again_after_a_kubelet_restart(
    sock_dir: Path, runner: KubeletRunner
) -> None:
    await _wait(runner.serving)  # kubelet is absent: we serve and keep trying, never exit
    assert runner.registrations == 0
    server, first = await start_kubelet(sock_dir)
    await _wait(first.arrived)
    await stop_kubelet(server, sock_dir)
    runner.socket_path.unlink(missing_ok=True)  # a starting kubelet wipes the plugin sockets
    server, second = await start_kubelet(sock_dir)
    try:
        await _wait(second.arrived)
        # the runner may notice the wipe before or after kubelet is back: either way it ends up
        # serving its socket and registered with the new kubelet
        await eventually(
            lambda: runner.registered.is_set() and runner.socket_path.exists(),
            "registered again, socket back",
        )
        assert len(first.requests) == 1 and second.requests[-1].endpoint == "nvidia-gpu.sock"
        async with grpc.aio.insecure_channel(f"unix://{runner.socket_path}") as channel:
            stream = api_pb2_grpc.DevicePluginStub(channel).ListAndWatch(api_pb2.Empty())
            assert len((await asyncio.wait_for(stream.read(), timeout=5)).devices) == 6
            stream.cancel()
        # kubelet's answer to the first Register may be cut off by its stop: counted or not
        assert len(second.requests) <= runner.registrations <= len(first.requests) + len(second.requests)
    finally:
        await stop_kubelet(server, sock_dir)


def test_preferred_ids_follow_the_pod_then_spread_over_cards() -> None:
    available = ["GPU-a-0", "GPU-a-1", "GPU-b-0", "GPU-b-1", "GPU-c-0"]
    assert physical_uuid("GPU-1234-abcd-7") == "GPU-1234-abcd"
    assert preferred_ids(available, [], 2, ["GPU-c", "GPU-b"]) == ["GPU-c-0", "GPU-b-0"]
    assert preferred_ids(available, ["GPU-a-1"], 3, []) == ["GPU-a-1", "GPU-b-0", "GPU-c-0"]
    assert preferred_ids(available, [], 4, []) == ["GPU-a-0", "GPU-b-0", "GPU-c-0", "GPU-a-1"]
