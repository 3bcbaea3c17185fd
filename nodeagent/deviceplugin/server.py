"""The DevicePlugin gRPC service kubelet calls: device list, preferred allocation, Allocate.

Owns the translation between kubelet's protobufs and the agent: ``deviceSplitCount`` replicas per card
with ids ``<uuid>-<i>`` (kubelet's ids mean nothing to the scheduler; the pod annotation decides the
real card), health ``Healthy``/``Unhealthy``, NUMA ``TopologyInfo`` when ``enableNumaTopology`` is on,
and Allocate answers built by :class:`nodeagent.allocate_call.Allocator`. Allocation failures become a gRPC
error kubelet shows on the pod (``UnexpectedAdmissionError``). Must not import pynvml or the
Kubernetes client.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Sequence
from typing import Any

import grpc

from hami.kubeletapi import api_pb2, api_pb2_grpc
from nodeagent.allocate_call import Allocator
from nodeagent.allocate_rules import AllocationError, PodMissing
from nodeagent.backends.base import Card
from nodeagent.config import NodeSettings
from nodeagent.inventory import Inventory

log = logging.getLogger(__name__)

HEALTHY, UNHEALTHY = "Healthy", "Unhealthy"


def replica_id(uuid: str, replica: int) -> str:
    return f"{uuid}-{replica}"


def physical_uuid(replica: str) -> str:
    """``GPU-abc-3`` → ``GPU-abc`` (the suffix after the last ``-`` is the replica number)."""
    head, _, tail = replica.rpartition("-")
    return head if head and tail.isdigit() else replica


def kubelet_devices(cards: Sequence[Card], settings: NodeSettings) -> list[api_pb2.Device]:
    """What kubelet sees: split-count replicas of every card not filtered out by the node config."""
    devices = []
    for card in cards:
        if card.uuid in settings.filter_uuids or card.index in settings.filter_indexes:
            continue
        topology = (
            api_pb2.TopologyInfo(nodes=[api_pb2.NUMANode(ID=card.numa)]) if settings.numa_topology else None
        )
        for replica in range(settings.split_count):
            devices.append(
                api_pb2.Device(
                    ID=replica_id(card.uuid, replica),
                    health=HEALTHY if card.healthy else UNHEALTHY,
                    topology=topology,
                )
            )
    return devices


def preferred_ids(
    available: Sequence[str], must: Sequence[str], size: int, wanted: Sequence[str]
) -> list[str]:
    """Pick ``size`` replica ids: ``must`` first, then one replica of each card in ``wanted`` (the pod's
    annotation), then further ids spreading over distinct cards before doubling up."""
    chosen = list(dict.fromkeys(must))[:size]
    used = {physical_uuid(i) for i in chosen}
    pool = [i for i in available if i not in chosen]
    for uuid in wanted:
        if len(chosen) >= size:
            break
        pick = next((i for i in pool if physical_uuid(i) == uuid and uuid not in used), None)
        if pick is not None:
            chosen.append(pick)
            used.add(uuid)
            pool.remove(pick)
    for distinct in (True, False):
        for candidate in list(pool):
            if len(chosen) >= size:
                return chosen
            if distinct and physical_uuid(candidate) in used:
                continue
            chosen.append(candidate)
            used.add(physical_uuid(candidate))
            pool.remove(candidate)
    return chosen


class DevicePluginService(api_pb2_grpc.DevicePluginServicer):  # type: ignore[misc]
    """One instance per agent; served again by the kubelet runner after each kubelet restart."""

    def __init__(self, *, inventory: Inventory, settings: NodeSettings, allocator: Allocator) -> None:
        self._inventory, self._settings, self._allocator = inventory, settings, allocator

    async def GetDevicePluginOptions(
        self, request: api_pb2.Empty, context: Any
    ) -> api_pb2.DevicePluginOptions:
        return api_pb2.DevicePluginOptions(pre_start_required=False, get_preferred_allocation_available=True)

    async def ListAndWatch(
        self, request: api_pb2.Empty, context: Any
    ) -> AsyncIterator[api_pb2.ListAndWatchResponse]:
        version = self._inventory.version
        while True:
            devices = kubelet_devices(self._inventory.cards, self._settings)
            unhealthy = sum(d.health == UNHEALTHY for d in devices)
            log.info("sending kubelet %d devices (%d unhealthy)", len(devices), unhealthy)
            yield api_pb2.ListAndWatchResponse(devices=devices)
            version = await self._inventory.wait_changed(version)

    async def GetPreferredAllocation(
        self, request: api_pb2.PreferredAllocationRequest, context: Any
    ) -> api_pb2.PreferredAllocationResponse:
        # the hint is the paired pod's next cards; none when the call cannot be paired (never an error)
        wanted = await self._allocator.next_uuids([c.allocation_size for c in request.container_requests])
        responses = [
            api_pb2.ContainerPreferredAllocationResponse(
                deviceIDs=preferred_ids(
                    list(c.available_deviceIDs), list(c.must_include_deviceIDs), c.allocation_size, wanted
                )
            )
            for c in request.container_requests
        ]
        return api_pb2.PreferredAllocationResponse(container_responses=responses)

    async def Allocate(self, request: api_pb2.AllocateRequest, context: Any) -> api_pb2.AllocateResponse:
        try:
            answers = await self._allocator.allocate(
                [list(c.devices_ids) for c in request.container_requests]
            )
        except PodMissing as exc:
            await context.abort(grpc.StatusCode.NOT_FOUND, str(exc))
            raise  # abort raises; this keeps type checkers aware the function ends here
        except AllocationError as exc:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(exc))
            raise
        return api_pb2.AllocateResponse(
            container_responses=[
                api_pb2.ContainerAllocateResponse(
                    envs=dict(a.envs),
                    mounts=[
                        api_pb2.Mount(
                            container_path=m.container_path, host_path=m.host_path, read_only=m.read_only
                        )
                        for m in a.mounts
                    ],
                )
                for a in answers
            ]
        )

    async def PreStartContainer(
        self, request: api_pb2.PreStartContainerRequest, context: Any
    ) -> api_pb2.PreStartContainerResponse:
        return api_pb2.PreStartContainerResponse()
