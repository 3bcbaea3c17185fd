"""Which pod an Allocate is for (issue 12, cases 2 and 4): kubelet's request names no pod, so the agent
pairs it with the pod whose next container's grant matches it, and fails closed when several pods could
be the one kubelet is admitting and would get different cards.

Each test plays kubelet through the real gRPC device plugin on the embedded API server: pods annotated by
the codec as bind leaves them, the node lock taken with ``hami.kube``, and kubelet's verdict on a rejected
pod (``status.phase=Failed``) written as kubelet writes it."""

from __future__ import annotations

import datetime
from pathlib import Path
from typing import Any

import kmock
import pytest

from hami.annotations import (
    POD_BIND_PHASE,
    POD_DEVICES_TO_ALLOCATE,
    BindPhase,
    decode_node_lock,
    encode_pod_devices,
)
from hami.core.model import Grant
from hami.kubeletapi import api_pb2
from nodeagent.allocate_call import Allocator
from nodeagent.inventory import Inventory

from .agent_helpers import (
    NOW,
    POD,
    annotations_of,
    bind_phase,
    card,
    create_node,
    events,
    foreign_pod,
    g,
    gpu,
    node_lock,
    placed,
    refused,
    sim_inventory,
    visible,
)


async def init_only(k: kmock.KubernetesEmulator, api: Any, cards: tuple[Grant, ...]) -> None:
    """Pod "i": its init container asks for ``cards``, its app container for none; bound without the
    node lock (HAMi locks only for pods whose app containers ask for cards)."""
    await placed(
        k,
        api,
        "i",
        (cards, ()),
        lock=False,
        init_containers=[gpu("setup", len(cards))],
        containers=[{"name": "main", "image": "x"}],
    )


async def rejected(k: kmock.KubernetesEmulator, name: str) -> None:
    """Kubelet's verdict on the pod whose Allocate failed."""
    await k.patch(
        POD + name + "/status", json={"status": {"phase": "Failed", "reason": "UnexpectedAdmissionError"}}
    )


@pytest.fixture
async def inventory(apiserver: kmock.KubernetesEmulator, tmp_path: Path) -> Inventory:
    await create_node(apiserver, "n1")
    return await sim_inventory(tmp_path, [card("GPU-a"), card("GPU-b"), card("GPU-c")])


# ------------------------------------------------------------------------------- case 4: init-only
async def test_an_init_container_does_not_get_the_lock_owners_card(
    apiserver: kmock.KubernetesEmulator, api: Any, allocator: Allocator, stub: Any
) -> None:
    # "i" asks for a card in its init container only and was bound without the lock (HAMi's rule); "p"
    # holds the lock. Kubelet admits "i" first: its init container must not get p's card.
    await init_only(apiserver, api, (g("GPU-a"),))
    await placed(apiserver, api, "p", ((g("GPU-b"),),), lock=True)
    message = await refused(stub, "GPU-c-0")
    assert "default/i" in message and "default/p" in message and "1 card" in message
    # nothing is consumed or marked: kubelet rejects the pod it was admitting, the other waits
    assert [await bind_phase(apiserver, name) for name in ("i", "p")] == ["allocating", "allocating"]
    assert decode_node_lock(await node_lock(apiserver) or "").name == "p"
    await allocator.events.drain()
    assert sorted(e["involvedObject"]["name"] for e in events(apiserver, "AllocationAmbiguous")) == ["i", "p"]
    assert all(e["type"] == "Warning" for e in events(apiserver, "AllocationAmbiguous"))

    await rejected(apiserver, "i")  # kubelet's verdict on the pod it was admitting
    assert await visible(stub, "GPU-c-0") == "GPU-b"  # now only p can be the one
    assert await bind_phase(apiserver, "p") == "success" and await node_lock(apiserver) is None


async def test_the_pod_whose_next_container_matches_is_served_not_the_lock_owner(
    apiserver: kmock.KubernetesEmulator, api: Any, allocator: Allocator, stub: Any
) -> None:
    # the init container asks for two cards, the lock owner for one: kubelet's two IDs can only be i's
    await init_only(apiserver, api, (g("GPU-a"), g("GPU-c")))
    await placed(apiserver, api, "p", ((g("GPU-b"),),), lock=True)
    assert await visible(stub, "GPU-a-0", "GPU-a-1") == "GPU-a,GPU-c"
    assert await bind_phase(apiserver, "i") == "success"
    stored = await annotations_of(apiserver, POD + "p")  # the lock owner is untouched and still served next
    assert (
        stored[POD_BIND_PHASE] == "allocating" and stored[POD_DEVICES_TO_ALLOCATE] == "GPU-b,NVIDIA,1000,10:;"
    )
    assert decode_node_lock(await node_lock(apiserver) or "").name == "p"
    assert await visible(stub, "GPU-b-0") == "GPU-b"


# ------------------------------------------------------------------------------- case 2: lost answers
async def test_a_bound_pod_marked_failed_is_not_served_the_lock_owners_grant(
    apiserver: kmock.KubernetesEmulator, api: Any, allocator: Allocator, stub: Any
) -> None:
    # the scheduler lost the Binding's answer, wrote failed for "a" and released the lock; "b" took it.
    # The Binding had been applied: kubelet admits "a", and must not get b's card.
    await placed(apiserver, api, "a", ((g("GPU-a"),),), phase=BindPhase.FAILED, lock=False)
    await placed(apiserver, api, "b", ((g("GPU-b"),),), lock=True)
    message = await refused(stub, "GPU-c-0")
    assert "default/a" in message and "default/b" in message
    assert await bind_phase(apiserver, "b") == "allocating"
    assert decode_node_lock(await node_lock(apiserver) or "").name == "b"

    await rejected(apiserver, "a")
    assert await visible(stub, "GPU-c-0") == "GPU-b"


async def test_a_waiting_gpu_pod_of_another_scheduler_makes_the_call_ambiguous(
    apiserver: kmock.KubernetesEmulator, api: Any, allocator: Allocator, stub: Any
) -> None:
    # a pod bound here by someone else, asking for nvidia.com/gpu: kubelet may be admitting it
    await foreign_pod(apiserver)
    await placed(apiserver, api, "b", ((g("GPU-b"),),), lock=True)
    message = await refused(stub, "GPU-a-0")
    assert "default/f" in message and "default-scheduler" in message
    await rejected(apiserver, "f")
    assert await visible(stub, "GPU-a-0") == "GPU-b"


async def test_a_lone_pod_of_another_scheduler_is_refused_by_name(
    apiserver: kmock.KubernetesEmulator, api: Any, allocator: Allocator, stub: Any
) -> None:
    await foreign_pod(apiserver)
    message = await refused(stub, "GPU-a-0")
    assert "default/f" in message and "'default-scheduler'" in message
    await allocator.events.drain()
    (event,) = events(apiserver, "AllocationFailed")
    assert event["involvedObject"]["name"] == "f"
    assert POD_BIND_PHASE not in await annotations_of(apiserver, POD + "f")  # not ours: nothing written


async def test_a_pod_cannot_hide_by_rewriting_its_card_count(
    apiserver: kmock.KubernetesEmulator, api: Any, allocator: Allocator, stub: Any
) -> None:
    # "x" asks for one card but rewrote to-allocate to two, so that only the lock owner "b" would seem to
    # match kubelet's one-card call made while admitting x
    await placed(apiserver, api, "x", ((g("GPU-a"),),), lock=False)
    forged = {POD_DEVICES_TO_ALLOCATE: encode_pod_devices(((g("GPU-a"), g("GPU-c")),))}
    await apiserver.patch(POD + "x", json={"metadata": {"annotations": forged}})
    await placed(apiserver, api, "b", ((g("GPU-b"),),), lock=True)
    message = await refused(stub, "GPU-a-0")
    assert "default/x" in message and "default/b" in message
    assert await bind_phase(apiserver, "b") == "allocating"


# ------------------------------------------------------------------------------- what disambiguates
async def test_the_pod_in_the_middle_of_its_containers_is_served_next(
    apiserver: kmock.KubernetesEmulator, api: Any, allocator: Allocator, stub: Any
) -> None:
    # kubelet admits one pod's containers back to back: "x" had its first container served, so the next
    # call is for its second one, even though "y" holds the lock (x's lock expired and y took it over)
    containers = [gpu("one"), gpu("two")]
    await placed(apiserver, api, "x", ((g("GPU-a"),), (g("GPU-c"),)), containers=containers, lock=False)
    served = {POD_DEVICES_TO_ALLOCATE: encode_pod_devices(((), (g("GPU-c"),)))}
    await apiserver.patch(POD + "x", json={"metadata": {"annotations": served}})
    await placed(apiserver, api, "y", ((g("GPU-b"),),), lock=True)
    assert await visible(stub, "GPU-a-0") == "GPU-c"
    assert await bind_phase(apiserver, "x") == "success"
    assert await bind_phase(apiserver, "y") == "allocating"


async def test_pods_that_would_get_the_same_cards_are_served_in_bind_order(
    apiserver: kmock.KubernetesEmulator, api: Any, allocator: Allocator, stub: Any
) -> None:
    later = NOW + datetime.timedelta(seconds=30)
    await placed(apiserver, api, "q", ((g("GPU-a"),),), lock=True, bound_at=later)
    await placed(apiserver, api, "p", ((g("GPU-a"),),), bound_at=NOW, lock=False)
    assert await visible(stub, "GPU-a-0") == "GPU-a"
    assert (await bind_phase(apiserver, "p"), await bind_phase(apiserver, "q")) == ("success", "allocating")
    assert await visible(stub, "GPU-a-1") == "GPU-a"
    assert await bind_phase(apiserver, "q") == "success" and await node_lock(apiserver) is None


async def test_pods_kubelet_already_admitted_are_not_candidates(
    apiserver: kmock.KubernetesEmulator, api: Any, allocator: Allocator, stub: Any
) -> None:
    # kubelet writes container statuses only after admitting a pod: such a pod is not being admitted
    started = {"containerStatuses": [{"name": "main", "state": {"waiting": {"reason": "ContainerCreating"}}}]}
    await foreign_pod(apiserver, "r", status=started)
    await placed(apiserver, api, "b", ((g("GPU-b"),),), lock=True)
    assert await visible(stub, "GPU-a-0") == "GPU-b"


async def test_a_pod_this_agent_refused_no_longer_counts(
    apiserver: kmock.KubernetesEmulator, api: Any, allocator: Allocator, stub: Any
) -> None:
    # "x" rewrote its to-allocate: refused by name; kubelet has not reported it Failed yet when "b" comes
    await placed(apiserver, api, "x", ((g("GPU-a"),),), lock=False)
    forged = {POD_DEVICES_TO_ALLOCATE: encode_pod_devices(((g("GPU-b"),),))}
    await apiserver.patch(POD + "x", json={"metadata": {"annotations": forged}})
    message = await refused(stub, "GPU-a-0")
    assert "default/x" in message and await bind_phase(apiserver, "x") == "failed"
    await placed(apiserver, api, "b", ((g("GPU-b"),),), lock=True)
    assert await visible(stub, "GPU-a-0") == "GPU-b"


async def test_no_hint_is_given_for_an_ambiguous_call(
    apiserver: kmock.KubernetesEmulator, api: Any, allocator: Allocator, stub: Any
) -> None:
    await placed(apiserver, api, "p", ((g("GPU-c"),),), lock=False)
    await placed(apiserver, api, "q", ((g("GPU-b"),),), lock=True)
    request = api_pb2.PreferredAllocationRequest(
        container_requests=[
            api_pb2.ContainerPreferredAllocationRequest(
                available_deviceIDs=["GPU-a-0", "GPU-b-0", "GPU-c-0"], allocation_size=1
            )
        ]
    )
    answer = await stub.GetPreferredAllocation(request, timeout=10)
    assert list(answer.container_responses[0].deviceIDs) == ["GPU-a-0"]  # kubelet's own order
