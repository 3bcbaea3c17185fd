"""The node agent hands out only what the scheduler granted on this node (issue 11, finding 3).

Every Allocate here goes through the real gRPC device plugin against the embedded API server, with pods
annotated by the codec. Each test builds a pod that today's hand-out would have served and checks that
Allocate now refuses it with a clear message and a Warning Event, and never answers with a card: a
foreign scheduler's pod carrying owner-written annotations (``all`` included), a card this node does not
have (unknown, filtered, a MIG instance), a ``to-allocate`` entry that differs from the scheduler's
``allocated`` record, a grant larger than the card, a card named twice, MIG bookings on a hami-core
node, and a lock owner that is bound to another node."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import grpc
import kmock
import pytest

from hami.annotations import (
    POD_BIND_PHASE,
    POD_DEVICES_ALLOCATED,
    POD_DEVICES_TO_ALLOCATE,
    POD_MIG_ALLOCATIONS,
    encode_mig_allocations,
    encode_pod_devices,
)
from hami.core.model import MigAllocation, MigPlacement, PodDevices
from nodeagent.allocate_call import Allocator
from nodeagent.config import NodeSettings
from nodeagent.inventory import Inventory

from .agent_helpers import (
    POD,
    allocate_request,
    annotations_of,
    card,
    create_node,
    events,
    g,
    gpu,
    node_lock,
    placed,
    refused,
    sim_inventory,
)


@pytest.fixture
async def inventory(apiserver: kmock.KubernetesEmulator, tmp_path: Path) -> Inventory:
    """Nodes n1 and n2; n1 has cards GPU-a and GPU-b, and GPU-f, which its node config filters out."""
    await create_node(apiserver, "n1")
    await create_node(apiserver, "n2")
    return await sim_inventory(tmp_path, [card("GPU-a"), card("GPU-b"), card("GPU-f")])


@pytest.fixture
def agent_settings() -> NodeSettings:
    return NodeSettings(filter_uuids=frozenset({"GPU-f"}))


# ------------------------------------------------------------------------------- whose pod it is
async def test_a_foreign_schedulers_pod_with_owner_written_annotations_gets_no_card(
    apiserver: kmock.KubernetesEmulator, api: Any, allocator: Allocator, stub: Any
) -> None:
    # finding 3: the owner annotated their pod (naming `all`), named another scheduler and got it bound
    await placed(apiserver, api, "p", ((g("all", 0, 0),),), scheduler="my-scheduler")
    message = await refused(stub)
    assert "default/p" in message and "'my-scheduler'" in message and "hami-scheduler" in message
    assert "NVIDIA_VISIBLE_DEVICES" not in message
    stored = await annotations_of(apiserver, POD + "p")
    assert stored[POD_BIND_PHASE] == "failed" and await node_lock(apiserver) is None
    await allocator.events.drain()
    (event,) = events(apiserver)
    assert event["type"] == "Warning" and event["involvedObject"]["name"] == "p"
    assert "'my-scheduler'" in event["message"]


async def test_a_lock_owner_bound_to_another_node_is_not_served_here(
    apiserver: kmock.KubernetesEmulator, api: Any, allocator: Allocator, stub: Any
) -> None:
    # issue 12 case 1 seen from the agent: the grant says n1, kube-scheduler bound the pod to n2
    await placed(apiserver, api, "p", ((g("GPU-a"),),), grant_node="n1", node="n2")
    message = await refused(stub, code=grpc.StatusCode.NOT_FOUND)
    assert "no pod bound to node n1 is waiting" in message
    stored = await annotations_of(apiserver, POD + "p")
    assert stored[POD_BIND_PHASE] == "allocating"  # not ours to mark: it is n2's pod
    assert stored[POD_DEVICES_TO_ALLOCATE] == "GPU-a,NVIDIA,1000,10:;"


async def test_a_grant_written_for_another_node_is_refused(
    apiserver: kmock.KubernetesEmulator, api: Any, allocator: Allocator, stub: Any
) -> None:
    # bound here (spec.nodeName n1) but the scheduler's grant is for n2: the cards are n2's
    await placed(apiserver, api, "p", ((g("GPU-a"),),), grant_node="n2", node="n1")
    message = await refused(stub)
    assert "default/p" in message and "n2" in message
    assert (await annotations_of(apiserver, POD + "p"))[POD_BIND_PHASE] == "allocating"


# ------------------------------------------------------------------------------- which cards
@pytest.mark.parametrize(
    ("uuid", "why"),
    [
        ("all", "'all'"),
        ("GPU-zzz", "'GPU-zzz'"),
        ("GPU-f", "'GPU-f'"),  # present, but filtered out by the node config: never registered
        ("MIG-5c0a4d3e-5e0c-5d3b-9f9e-0c8f0f0f0f0f", "'MIG-5c0a4d3e"),  # an instance, not a card
    ],
)
async def test_a_card_this_node_does_not_register_is_refused(
    apiserver: kmock.KubernetesEmulator, api: Any, allocator: Allocator, stub: Any, uuid: str, why: str
) -> None:
    # both annotations name it (a forged pair, e.g. written while the webhook was bypassed)
    await placed(apiserver, api, "p", ((g(uuid),),))
    message = await refused(stub)
    assert why in message and "not a card of node n1" in message and "GPU-a, GPU-b" in message
    assert (await annotations_of(apiserver, POD + "p"))[POD_BIND_PHASE] == "failed"


@pytest.mark.parametrize(
    ("to_allocate", "shown"),
    [
        (((g("GPU-b"),),), "GPU-b"),  # another pod's card
        (((g("GPU-a", 30000),),), "30000"),  # more memory
        (((g("GPU-a", 1000, 100),),), "100"),  # more cores
        (((g("GPU-a"), g("GPU-b")),), "GPU-b"),  # an extra card
    ],
)
async def test_a_to_allocate_entry_that_differs_from_the_scheduler_record_is_refused(
    apiserver: kmock.KubernetesEmulator,
    api: Any,
    allocator: Allocator,
    stub: Any,
    to_allocate: PodDevices,
    shown: str,
) -> None:
    # finding 2/3: the owner rewrote to-allocate between bind and Allocate
    await placed(apiserver, api, "p", ((g("GPU-a"),),))
    forged = {POD_DEVICES_TO_ALLOCATE: encode_pod_devices(to_allocate)}
    await apiserver.patch(POD + "p", json={"metadata": {"annotations": forged}})
    count = sum(len(c) for c in to_allocate)
    message = await refused(stub, *[f"GPU-a-{i}" for i in range(count)])
    assert POD_DEVICES_TO_ALLOCATE in message and POD_DEVICES_ALLOCATED in message and shown in message
    stored = await annotations_of(apiserver, POD + "p")
    assert stored[POD_BIND_PHASE] == "failed" and await node_lock(apiserver) is None


async def test_a_missing_scheduler_record_is_refused(
    apiserver: kmock.KubernetesEmulator, api: Any, allocator: Allocator, stub: Any
) -> None:
    await placed(apiserver, api, "p", ((g("GPU-a"),),))
    await apiserver.patch(POD + "p", json={"metadata": {"annotations": {POD_DEVICES_ALLOCATED: None}}})
    message = await refused(stub)
    assert f"no {POD_DEVICES_ALLOCATED}" in message


async def test_a_grant_larger_than_the_card_is_refused(
    apiserver: kmock.KubernetesEmulator, api: Any, allocator: Allocator, stub: Any
) -> None:
    await placed(apiserver, api, "p", ((g("GPU-a", 99999),),))  # the card registers 32768 MiB
    message = await refused(stub)
    assert "99999" in message and "32768" in message


async def test_a_card_named_twice_in_one_container_is_refused(
    apiserver: kmock.KubernetesEmulator, api: Any, allocator: Allocator, stub: Any
) -> None:
    await placed(apiserver, api, "p", ((g("GPU-a"), g("GPU-a")),))
    message = await refused(stub, "GPU-a-0", "GPU-b-0")
    assert "'GPU-a' twice" in message


async def test_entries_that_do_not_line_up_with_the_containers_are_refused(
    apiserver: kmock.KubernetesEmulator, api: Any, allocator: Allocator, stub: Any
) -> None:
    # two entries for a one-container pod: which container the first card is for cannot be told
    await placed(apiserver, api, "p", ((g("GPU-a"),), (g("GPU-b"),)))
    message = await refused(stub)
    assert "2 containers" in message and "1 container" in message


async def test_an_entry_for_a_container_that_asks_kubelet_for_no_card_is_refused(
    apiserver: kmock.KubernetesEmulator, api: Any, allocator: Allocator, stub: Any
) -> None:
    # kubelet calls Allocate only for "gpu" (1 card), but the first waiting entry is for "side", which asks
    # for none: handing it out would give gpu side's card
    containers = [gpu("side", 0), gpu("main")]
    await placed(apiserver, api, "p", ((g("GPU-b"),), (g("GPU-a"),)), containers=containers)
    message = await refused(stub)
    assert "entry 0 gives container 'side' 1 card(s), but it asks kubelet for none" in message


async def test_mig_bookings_on_a_hami_core_node_are_refused(
    apiserver: kmock.KubernetesEmulator, api: Any, allocator: Allocator, stub: Any
) -> None:
    booking = MigAllocation(
        container_index=0,
        device_index=0,
        gpu_uuid="GPU-a",
        profile="1g.5gb",
        placement=MigPlacement(start=0, size=1),
    )
    await placed(
        apiserver,
        api,
        "p",
        ((g("GPU-a"),),),
        extra={POD_MIG_ALLOCATIONS: encode_mig_allocations([booking])},
    )
    message = await refused(stub)
    assert POD_MIG_ALLOCATIONS in message and "hami-core" in message


async def test_the_scheduler_record_is_served_when_everything_matches(
    apiserver: kmock.KubernetesEmulator, api: Any, allocator: Allocator, stub: Any
) -> None:
    await placed(apiserver, api, "p", ((g("GPU-b", 32768, 100),),))  # a whole card is within bounds
    answer = await stub.Allocate(allocate_request(["GPU-a-0"]), timeout=10)
    assert dict(answer.container_responses[0].envs)["NVIDIA_VISIBLE_DEVICES"] == "GPU-b"
    assert (await annotations_of(apiserver, POD + "p"))[POD_BIND_PHASE] == "success"
