"""Dynamic MIG through Allocate, end to end: a MIG-mode node with simulated A100s, pods annotated exactly
as the scheduler's bind writes them (codec: allocation + bind annotations with MIG bookings, node lock
taken with hami.kube), our device plugin on a unix socket, a real gRPC client playing kubelet and the
embedded API server holding Node and Pods."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import kmock
import pytest

from hami.annotations import (
    POD_BIND_PHASE,
    POD_DEVICES_TO_ALLOCATE,
    POD_MIG_ALLOCATIONS,
    decode_mig_allocations,
    decode_node_lock,
    encode_mig_allocations,
)
from hami.core.model import DeviceMode, Grant, MigAllocation, MigPlacement, PodDevices
from hami.settings import DeviceConfig
from nodeagent.backends.base import MigInstance
from nodeagent.backends.simulated import SimBackend
from nodeagent.config import NodeSettings

from .agent_helpers import (
    POD,
    allocate_request,
    annotations_of,
    card,
    create_node,
    create_pod,
    make_allocator,
    node_lock,
    placed,
    plugin_stub,
    refused,
    sim_inventory,
    visible,
)

MIG_UUID = re.compile(r"^MIG-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")
#: NVIDIA A100-SXM4-40GB GPU-instance profiles (placements in memory slices, 8 per card).
A100_PROFILES: list[dict[str, Any]] = [
    {"name": "1g.5gb", "memory_mib": 4864, "cores": 15, "slice_count": 1, "instance_count": 7,
     "placements": [{"start": s, "size": 1} for s in range(7)]},
    {"name": "2g.10gb", "memory_mib": 9984, "cores": 29, "slice_count": 2, "instance_count": 3,
     "placements": [{"start": s, "size": 2} for s in (0, 2, 4)]},
    {"name": "3g.20gb", "memory_mib": 19968, "cores": 43, "slice_count": 3, "instance_count": 2,
     "placements": [{"start": s, "size": 4} for s in (0, 4)]},
    {"name": "7g.40gb", "memory_mib": 40192, "cores": 100, "slice_count": 7, "instance_count": 1,
     "placements": [{"start": 0, "size": 8}]},
]  # fmt: skip
MEMORY = {
    **{p["name"]: (p["memory_mib"], p["cores"]) for p in A100_PROFILES},
    "4g.20gb": (19968, 58),  # a real A100 profile these simulated cards do not offer
}


@dataclass
class Plugin:
    stub: Any
    backend: SimBackend
    hook: Path


@dataclass(frozen=True)
class Book:
    """One MIG device the scheduler booked: card, profile, slice start."""

    uuid: str
    profile: str
    start: int


def bookings(containers: Sequence[Sequence[Book]]) -> tuple[PodDevices, tuple[MigAllocation, ...]]:
    """What Filter/bind write for these bookings: grants with the profile's memory/cores, and
    ``hami.io/vgpu-mig-allocations`` entries indexed by (container, device)."""
    devices: list[tuple[Grant, ...]] = []
    migs: list[MigAllocation] = []
    for c, books in enumerate(containers):
        devices.append(tuple(Grant(uuid=b.uuid, memory_mib=MEMORY[b.profile][0], cores=MEMORY[b.profile][1])
                             for b in books))  # fmt: skip
        for d, b in enumerate(books):
            size = 8 if b.profile.startswith("7g") else 4 if b.profile.startswith("3g") else int(b.profile[0])
            migs.append(
                MigAllocation(
                    container_index=c,
                    device_index=d,
                    gpu_uuid=b.uuid,
                    profile=b.profile,
                    placement=MigPlacement(start=b.start, size=size),
                )
            )
    return tuple(devices), tuple(migs)


async def bound_pod(
    k: kmock.KubernetesEmulator,
    api: Any,
    name: str,
    books: Sequence[Sequence[Book]],
    *,
    mig: bool = True,
    **kw: Any,
) -> tuple[MigAllocation, ...]:
    """A pod as bind leaves it on n1 with these MIG bookings (``mig=False``: without the reservations);
    one container ``c<i>`` per entry unless ``containers`` are given."""
    devices, migs = bookings(books)
    kw.setdefault("containers", [{"name": f"c{i}", "image": "x"} for i in range(len(books))])
    await placed(k, api, name, devices, mig=migs if mig else (), **kw)
    return migs


def record_of(instance: MigInstance, start: int, size: int) -> MigAllocation:
    """The ``hami.io/vgpu-mig-allocations`` entry of a pod (container 0, device 0) that uses ``instance``."""
    return MigAllocation(
        container_index=0,
        device_index=0,
        gpu_uuid="GPU-m",
        profile=instance.profile,
        placement=MigPlacement(start=start, size=size),
        mig_uuid=instance.mig_uuid,
        gpu_instance_id=instance.gpu_instance_id,
        compute_instance_id=instance.compute_instance_id,
    )


@asynccontextmanager
async def serve(
    api: Any, sock_dir: Path, tmp_path: Path, *, mig_backend: bool = True
) -> AsyncIterator[Plugin]:
    """The device plugin of a MIG-mode node with two A100-40GB cards, served on a unix socket."""
    model: dict[str, Any] = {"model": "NVIDIA A100-SXM4-40GB", "mig": A100_PROFILES}
    inventory = await sim_inventory(
        tmp_path, [card("GPU-m", memory=40960, **model), card("GPU-n", memory=40960, **model)]
    )
    backend = inventory.backend
    assert isinstance(backend, SimBackend)
    # the cards register only with an allowlist naming their profiles (Allocate serves registered cards)
    allowlist = {"A100-SXM4-40GB": tuple(MEMORY)}
    settings = NodeSettings(
        mode=DeviceMode.MIG.value, split_count=7, device=DeviceConfig(mig_profile_allowlist=allowlist)
    )
    allocator = make_allocator(api, tmp_path, inventory, settings, backend=backend if mig_backend else None)
    async with plugin_stub(allocator, inventory, settings, sock_dir) as stub:
        yield Plugin(stub=stub, backend=backend, hook=tmp_path / "hook")


@pytest.fixture
async def plugin(
    apiserver: kmock.KubernetesEmulator, api: Any, sock_dir: Path, tmp_path: Path
) -> AsyncIterator[Plugin]:
    await create_node(apiserver, "n1")
    async with serve(api, sock_dir, tmp_path) as plugin:
        yield plugin


async def recorded(k: kmock.KubernetesEmulator, name: str) -> tuple[MigAllocation, ...]:
    return decode_mig_allocations((await annotations_of(k, POD + name))[POD_MIG_ALLOCATIONS])


def placements(backend: SimBackend, uuid: str) -> list[tuple[str, int, int, str | None]]:
    return [(i.profile, i.start, i.size, i.mig_uuid) for i in backend.mig_instances(uuid)]


# ------------------------------------------------------------------------------------------ success
async def test_mig_pod_gets_its_exact_instance_recorded_then_success_and_unlock(
    apiserver: kmock.KubernetesEmulator, api: Any, plugin: Plugin
) -> None:
    await bound_pod(apiserver, api, "p", [[Book("GPU-m", "3g.20gb", 4)]])
    response = await plugin.stub.Allocate(allocate_request(["GPU-m-0"]), timeout=10)
    (answer,) = response.container_responses
    envs = dict(answer.envs)
    assert MIG_UUID.match(envs["NVIDIA_VISIBLE_DEVICES"]), envs
    assert set(envs) == {"NVIDIA_VISIBLE_DEVICES"}  # no HAMi-core memory/SM limits, no shared cache
    assert list(answer.mounts) == []  # nor HAMi-core mounts, though --hook-path is set
    (instance,) = plugin.backend.mig_instances("GPU-m")
    assert (instance.profile, instance.start, instance.size) == ("3g.20gb", 4, 4)
    assert instance.mig_uuid == envs["NVIDIA_VISIBLE_DEVICES"]
    (entry,) = await recorded(apiserver, "p")
    assert (entry.container_index, entry.device_index, entry.gpu_uuid, entry.profile) == (
        0,
        0,
        "GPU-m",
        "3g.20gb",
    )
    assert (entry.mig_uuid, entry.gpu_instance_id, entry.compute_instance_id) == (
        instance.mig_uuid,
        instance.gpu_instance_id,
        instance.compute_instance_id,
    )
    stored = await annotations_of(apiserver, POD + "p")
    assert stored[POD_DEVICES_TO_ALLOCATE] == ";" and stored[POD_BIND_PHASE] == "success"
    assert await node_lock(apiserver) is None
    assert plugin.backend.mig_instances("GPU-n") == ()


async def test_second_pod_on_the_same_card_gets_a_separate_non_overlapping_instance(
    apiserver: kmock.KubernetesEmulator, api: Any, plugin: Plugin
) -> None:
    await bound_pod(apiserver, api, "first", [[Book("GPU-m", "3g.20gb", 4)]])
    first = await plugin.stub.Allocate(allocate_request(["GPU-m-0"]), timeout=10)
    await bound_pod(apiserver, api, "second", [[Book("GPU-m", "2g.10gb", 0)]])
    second = await plugin.stub.Allocate(allocate_request(["GPU-m-1"]), timeout=10)
    one = dict(first.container_responses[0].envs)["NVIDIA_VISIBLE_DEVICES"]
    two = dict(second.container_responses[0].envs)["NVIDIA_VISIBLE_DEVICES"]
    assert one != two and MIG_UUID.match(two)
    assert sorted(placements(plugin.backend, "GPU-m")) == [("2g.10gb", 0, 2, two), ("3g.20gb", 4, 4, one)]
    assert (await recorded(apiserver, "first"))[0].mig_uuid == one  # the first pod's record is untouched
    assert (await recorded(apiserver, "second"))[0].mig_uuid == two
    assert (await annotations_of(apiserver, POD + "second"))[POD_BIND_PHASE] == "success"


async def test_containers_are_served_one_by_one_and_each_records_only_its_own_entries(
    apiserver: kmock.KubernetesEmulator, api: Any, plugin: Plugin
) -> None:
    await bound_pod(
        apiserver,
        api,
        "p",
        [[], [Book("GPU-m", "1g.5gb", 6), Book("GPU-n", "1g.5gb", 6)], [Book("GPU-m", "1g.5gb", 5)]],
        init_containers=[{"name": "init", "image": "x"}],
        containers=[{"name": "two", "image": "x"}, {"name": "one", "image": "x"}],
    )
    first = await plugin.stub.Allocate(allocate_request(["GPU-m-0", "GPU-n-0"]), timeout=10)
    m, n = dict(first.container_responses[0].envs)["NVIDIA_VISIBLE_DEVICES"].split(",")
    entries = await recorded(apiserver, "p")
    assert [(e.container_index, e.device_index, e.mig_uuid) for e in entries] == [
        (1, 0, m),
        (1, 1, n),
        (2, 0, None),
    ]
    stored = await annotations_of(apiserver, POD + "p")
    assert (
        stored[POD_BIND_PHASE] == "allocating"
        and decode_node_lock(await node_lock(apiserver) or "").name == "p"
    )

    second = await plugin.stub.Allocate(allocate_request(["GPU-m-3"]), timeout=10)
    last = dict(second.container_responses[0].envs)["NVIDIA_VISIBLE_DEVICES"]
    assert [e.mig_uuid for e in await recorded(apiserver, "p")] == [m, n, last]
    assert sorted(placements(plugin.backend, "GPU-m")) == [("1g.5gb", 5, 1, last), ("1g.5gb", 6, 1, m)]
    assert placements(plugin.backend, "GPU-n") == [("1g.5gb", 6, 1, n)]
    assert (await annotations_of(apiserver, POD + "p"))[POD_BIND_PHASE] == "success"
    assert await node_lock(apiserver) is None


async def test_a_spare_instance_with_the_same_profile_and_placement_is_reused(
    apiserver: kmock.KubernetesEmulator, api: Any, plugin: Plugin
) -> None:
    spare = plugin.backend.create_mig_instance("GPU-m", "3g.20gb", 0, 4)  # e.g. a deleted pod's
    await bound_pod(apiserver, api, "p", [[Book("GPU-m", "3g.20gb", 0)]])
    response = await plugin.stub.Allocate(allocate_request(["GPU-m-0"]), timeout=10)
    assert dict(response.container_responses[0].envs)["NVIDIA_VISIBLE_DEVICES"] == spare.mig_uuid
    assert plugin.backend.mig_instances("GPU-m") == (spare,)
    assert (await recorded(apiserver, "p"))[0].gpu_instance_id == spare.gpu_instance_id


async def test_left_overs_of_finished_or_deleted_pods_are_destroyed_when_their_slices_are_needed(
    apiserver: kmock.KubernetesEmulator, api: Any, plugin: Plugin
) -> None:
    finished = plugin.backend.create_mig_instance("GPU-m", "3g.20gb", 4, 4)
    gone = plugin.backend.create_mig_instance("GPU-m", "2g.10gb", 2, 2)  # nobody records it
    elsewhere = plugin.backend.create_mig_instance("GPU-m", "1g.5gb", 0, 1)  # spare, but not in the way
    record = record_of(finished, 4, 4)
    await create_pod(
        apiserver,
        "done",
        containers=[{"name": "c", "image": "x"}],
        node="n1",
        phase="Succeeded",
        annotations={POD_MIG_ALLOCATIONS: encode_mig_allocations([record])},
    )
    await bound_pod(apiserver, api, "p", [[Book("GPU-m", "2g.10gb", 4)]])
    response = await plugin.stub.Allocate(allocate_request(["GPU-m-0"]), timeout=10)
    new = dict(response.container_responses[0].envs)["NVIDIA_VISIBLE_DEVICES"]
    assert new not in (finished.mig_uuid, gone.mig_uuid)
    assert sorted(placements(plugin.backend, "GPU-m")) == [
        ("1g.5gb", 0, 1, elsewhere.mig_uuid),  # spare instances not in the way are kept
        ("2g.10gb", 2, 2, gone.mig_uuid),
        ("2g.10gb", 4, 2, new),
    ]
    await bound_pod(apiserver, api, "q", [[Book("GPU-m", "3g.20gb", 0)]])
    await plugin.stub.Allocate(allocate_request(["GPU-m-1"]), timeout=10)
    assert sorted(p[:3] for p in placements(plugin.backend, "GPU-m")) == [
        ("2g.10gb", 4, 2),
        ("3g.20gb", 0, 4),
    ]


# ------------------------------------------------------------------------------------------ failures
async def assert_failed(
    k: kmock.KubernetesEmulator, stub: Any, name: str, ids: list[str], *messages: str
) -> None:
    details = await refused(stub, *ids)
    for message in messages:
        assert message in details, details
    stored = await annotations_of(k, POD + name)
    assert stored[POD_BIND_PHASE] == "failed"
    assert stored[POD_DEVICES_TO_ALLOCATE] != ";"  # nothing consumed on failure
    assert await node_lock(k) is None


async def test_a_live_pods_instance_in_the_way_fails_the_pod_and_is_left_alone(
    apiserver: kmock.KubernetesEmulator, api: Any, plugin: Plugin
) -> None:
    await bound_pod(apiserver, api, "running", [[Book("GPU-m", "3g.20gb", 4)]])
    await plugin.stub.Allocate(allocate_request(["GPU-m-0"]), timeout=10)
    before = plugin.backend.mig_instances("GPU-m")
    await bound_pod(apiserver, api, "p", [[Book("GPU-m", "2g.10gb", 4)]])  # a scheduler double booking
    await assert_failed(
        apiserver,
        plugin.stub,
        "p",
        ["GPU-m-1"],
        "pod default/p on node n1",
        "occupied by 3g.20gb",
        "default/running",
    )
    assert plugin.backend.mig_instances("GPU-m") == before
    assert (await recorded(apiserver, "p"))[0].mig_uuid is None


async def test_an_instance_stays_protected_when_its_pods_grant_annotations_are_gone(
    apiserver: kmock.KubernetesEmulator, api: Any, plugin: Plugin
) -> None:
    """The reclaim counts every unfinished pod bound here, grant or not (``grant_required=False``): a
    pod whose ``hami.io/vgpu-node`` and allocation were removed by hand still runs on its instance."""
    mine = plugin.backend.create_mig_instance("GPU-m", "3g.20gb", 4, 4)
    record = record_of(mine, 4, 4)
    await create_pod(
        apiserver,
        "stripped",  # only its MIG record is left
        containers=[{"name": "c", "image": "x"}],
        node="n1",
        phase="Running",
        scheduler=None,
        annotations={POD_MIG_ALLOCATIONS: encode_mig_allocations([record])},
    )
    await bound_pod(apiserver, api, "p", [[Book("GPU-m", "2g.10gb", 4)]])
    await assert_failed(apiserver, plugin.stub, "p", ["GPU-m-0"], "occupied by 3g.20gb", "default/stripped")
    assert plugin.backend.mig_instances("GPU-m") == (mine,)


async def test_a_recorded_instance_stays_protected_until_its_failed_pod_is_rejected(
    apiserver: kmock.KubernetesEmulator, api: Any, plugin: Plugin
) -> None:
    """The ``hami.io/vgpu-mig-allocations`` write lands but its answer is lost (500): the pod fails, yet
    its record names the instance, which stays protected while the pod may still run; once kubelet has
    rejected the pod the instance is a left-over and the next booking of its slices reclaims it."""
    (apiserver**10)["patch", kmock.resource("v1/pods")][:1] << 500
    await bound_pod(apiserver, api, "p", [[Book("GPU-m", "3g.20gb", 4)]])
    await assert_failed(apiserver, plugin.stub, "p", ["GPU-m-0"], "pod default/p", "500")
    (made,) = plugin.backend.mig_instances("GPU-m")
    assert [e.mig_uuid for e in await recorded(apiserver, "p")] == [made.mig_uuid]

    await bound_pod(apiserver, api, "q", [[Book("GPU-m", "2g.10gb", 4)]])
    await assert_failed(apiserver, plugin.stub, "q", ["GPU-m-1"], "occupied by 3g.20gb", "default/p")
    assert plugin.backend.mig_instances("GPU-m") == (made,)

    await apiserver.patch(POD + "p/status", json={"status": {"phase": "Failed"}})  # kubelet's verdict
    await bound_pod(apiserver, api, "r", [[Book("GPU-m", "2g.10gb", 4)]])
    new = await visible(plugin.stub, "GPU-m-2")
    assert placements(plugin.backend, "GPU-m") == [("2g.10gb", 4, 2, new)] and new != made.mig_uuid
    assert [e.mig_uuid for e in await recorded(apiserver, "r")] == [new]


async def test_an_entry_without_a_reservation_fails(
    apiserver: kmock.KubernetesEmulator, api: Any, plugin: Plugin
) -> None:
    await bound_pod(apiserver, api, "p", [[Book("GPU-m", "1g.5gb", 6)]], mig=False)
    await assert_failed(
        apiserver, plugin.stub, "p", ["GPU-m-0"], "container c0 device 0 (card GPU-m) has no MIG reservation",
        POD_MIG_ALLOCATIONS,
    )  # fmt: skip
    assert plugin.backend.mig_instances("GPU-m") == ()


async def test_a_backend_refusal_fails_with_its_reason(
    apiserver: kmock.KubernetesEmulator, api: Any, plugin: Plugin
) -> None:
    await bound_pod(apiserver, api, "p", [[Book("GPU-m", "4g.20gb", 0)]])  # this card offers no 4g
    await assert_failed(
        apiserver,
        plugin.stub,
        "p",
        ["GPU-m-0"],
        "MIG 4g.20gb at [0, 4) on card GPU-m",
        "offers no such profile",
    )


async def test_a_backend_without_mig_support_fails(
    apiserver: kmock.KubernetesEmulator, api: Any, sock_dir: Path, tmp_path: Path
) -> None:
    await create_node(apiserver, "n1")
    async with serve(api, sock_dir, tmp_path, mig_backend=False) as plugin:
        await bound_pod(apiserver, api, "p", [[Book("GPU-m", "1g.5gb", 6)]])
        await assert_failed(
            apiserver, plugin.stub, "p", ["GPU-m-0"], "needs a card backend that creates MIG instances"
        )
