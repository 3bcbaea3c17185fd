"""The node agent's Events on the pod it allocates, on the embedded API server: ``AllocationSucceeded``
once every container is served, ``AllocationFailed`` with the cause and what to do, and an Event that
cannot be written neither fails nor delays the allocation."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

import kmock
import pytest

from hami.annotations import POD_BIND_PHASE
from hami.core.model import PodDevices
from hami_testkit.restapi import Response  # kmock.Response (exported, not in its __all__)
from nodeagent.allocate_call import Allocator
from nodeagent.allocate_rules import AllocationError
from nodeagent.inventory import Inventory

from .agent_helpers import (
    EVENTS,
    POD,
    annotations_of,
    card,
    create_node,
    events,
    foreign_pod,
    g,
    placed,
    sim_inventory,
)


async def bound(k: kmock.KubernetesEmulator, api: Any, devices: PodDevices, names: list[str]) -> None:
    """Pod ``p`` as the scheduler's bind leaves it, with containers ``names``."""
    await placed(k, api, "p", devices, containers=[{"name": n, "image": "x"} for n in names])


@pytest.fixture
async def inventory(apiserver: kmock.KubernetesEmulator, tmp_path: Path) -> Inventory:
    await create_node(apiserver, "n1")
    return await sim_inventory(tmp_path, [card("GPU-a"), card("GPU-b")])


async def test_success_is_recorded_once_the_last_container_is_served(
    apiserver: kmock.KubernetesEmulator, api: Any, allocator: Allocator
) -> None:
    devices = (
        (g("GPU-a", 3000, 30),),
        (g("GPU-a", 1000, 0), g("GPU-b", 2000, 50)),
    )
    await bound(apiserver, api, devices, ["train", "sidecar"])
    await allocator.allocate([["GPU-a-0"]])
    await allocator.events.drain()
    assert events(apiserver, "AllocationSucceeded") == []  # one container still to come
    await allocator.allocate([["GPU-a-1", "GPU-b-0"]])
    await allocator.events.drain()
    (event,) = events(apiserver, "AllocationSucceeded")
    assert event["type"] == "Normal"
    assert event["message"] == (
        "GPUs allocated on node n1: train: GPU-a (3000 MiB, 30% cores); "
        "sidecar: GPU-a (1000 MiB, 0% cores), GPU-b (2000 MiB, 50% cores)"
    )
    assert event["involvedObject"] == {
        "apiVersion": "v1",
        "kind": "Pod",
        "name": "p",
        "namespace": "default",
        "uid": "uid-p",
    }
    assert event["metadata"]["namespace"] == "default"
    assert (
        event["source"] == {"component": "hami-node-agent"}
        and event["reportingComponent"] == "hami-node-agent"
    )
    assert events(apiserver, "AllocationFailed") == []


async def test_a_failure_says_what_failed_and_what_to_do(
    apiserver: kmock.KubernetesEmulator, api: Any, allocator: Allocator
) -> None:
    await bound(apiserver, api, ((g("GPU-a"),),), ["c"])
    with pytest.raises(AllocationError):
        await allocator.allocate([["GPU-a-0", "GPU-b-0"]])  # kubelet asks for 2 cards, the pod got 1
    await allocator.events.drain()
    (event,) = events(apiserver, "AllocationFailed")
    assert event["type"] == "Warning" and event["source"] == {"component": "hami-node-agent"}
    assert event["involvedObject"]["name"] == "p"
    assert event["message"] == (
        "GPU allocation on node n1 failed: pod default/p on node n1: device number not matched for "
        "container c: kubelet asked for 2, hami.io/vgpu-devices-to-allocate holds 1. The pod is marked "
        "hami.io/bind-phase=failed, its node lock is released and kubelet rejects it "
        "(UnexpectedAdmissionError). If it happens again, read the hami-node-agent log on node n1; then "
        "delete the pod so it is scheduled again (a Deployment, Job or StatefulSet recreates it)."
    )
    assert events(apiserver, "AllocationSucceeded") == []


async def test_an_edited_annotation_gets_its_own_advice(
    apiserver: kmock.KubernetesEmulator, api: Any, allocator: Allocator
) -> None:
    await bound(apiserver, api, ((g("GPU-a"),),), ["c"])
    await apiserver.patch(
        POD + "p",
        json={"metadata": {"annotations": {"hami.io/vgpu-devices-to-allocate": "GPU-a,NVIDIA,x,1:;"}}},
    )
    with pytest.raises(AllocationError):
        await allocator.allocate([["GPU-a-0"]])
    await allocator.events.drain()
    (event,) = events(apiserver, "AllocationFailed")
    assert '"GPU-a,NVIDIA,x,1:;"' in event["message"]
    assert (
        "annotations must not be changed after scheduling: do not edit them by hand; then delete"
        in event["message"]
    )


async def test_an_event_that_cannot_be_written_does_not_fail_the_allocation(
    apiserver: kmock.KubernetesEmulator, api: Any, allocator: Allocator, caplog: pytest.LogCaptureFixture
) -> None:
    (apiserver**10)["post", EVENTS] << 500
    await bound(apiserver, api, ((g("GPU-a"),),), ["c"])
    (answer,) = await allocator.allocate([["GPU-a-0"]])
    assert answer.uuids == ("GPU-a",)
    with caplog.at_level(logging.WARNING, logger="nodeagent.podevents"):
        await allocator.events.drain()
    assert (await annotations_of(apiserver, POD + "p"))[POD_BIND_PHASE] == "success"
    assert len(apiserver["post", EVENTS]) == 1  # tried once, failed, dropped
    assert "could not record the AllocationSucceeded event of pod p: 500" in caplog.text


async def test_a_hanging_event_write_does_not_delay_the_answer(
    apiserver: kmock.KubernetesEmulator, api: Any, allocator: Allocator
) -> None:
    release = asyncio.Event()

    async def hang(_: kmock.Request) -> Response:
        await release.wait()
        return Response(status=201)

    (apiserver**10)["post", EVENTS] << hang
    await bound(apiserver, api, ((g("GPU-a"),),), ["c"])
    try:
        await asyncio.wait_for(allocator.allocate([["GPU-a-0"]]), timeout=5)
        assert len(allocator.events) == 1  # answered while the Event is still being written
    finally:
        release.set()
    await allocator.events.drain()
    assert len(allocator.events) == 0


async def test_an_ambiguous_call_warns_every_candidate_and_marks_none(
    apiserver: kmock.KubernetesEmulator, api: Any, allocator: Allocator
) -> None:
    await bound(apiserver, api, ((g("GPU-a"),),), ["c"])
    await foreign_pod(apiserver, container="c")
    with pytest.raises(AllocationError):
        await allocator.allocate([["GPU-b-0"]])
    await allocator.events.drain()
    warned = events(apiserver, "AllocationAmbiguous")
    assert sorted(e["involvedObject"]["name"] for e in warned) == ["f", "p"]
    assert {e["type"] for e in warned} == {"Warning"}
    assert warned[0]["message"] == (
        "kubelet asked node n1 for 1 card and may be any of: default/p (next container c: 1 card); "
        "default/f (asks for 1 card; it names scheduler 'default-scheduler', not 'hami-scheduler': the node "
        "agent serves only pods hami-scheduler placed). No card was handed out: kubelet rejects the pod it "
        "is admitting (UnexpectedAdmissionError) and the others are served when kubelet admits them"
    )
    assert events(apiserver, "AllocationFailed") == []
    assert (await annotations_of(apiserver, POD + "p"))[POD_BIND_PHASE] == "allocating"


async def test_a_refused_pod_of_another_scheduler_is_told_nothing_was_written(
    apiserver: kmock.KubernetesEmulator, api: Any, allocator: Allocator
) -> None:
    await foreign_pod(apiserver, container="c")
    with pytest.raises(AllocationError):
        await allocator.allocate([["GPU-b-0"]])
    await allocator.events.drain()
    (event,) = events(apiserver, "AllocationFailed")
    assert event["message"].startswith(
        "GPU allocation on node n1 failed: pod default/f on node n1 gets no card: it names scheduler "
        "'default-scheduler', not 'hami-scheduler': the node agent serves only pods hami-scheduler placed. "
        "Kubelet rejects the pod (UnexpectedAdmissionError). The node agent hands out only what the HAMi "
        "scheduler granted"
    )
