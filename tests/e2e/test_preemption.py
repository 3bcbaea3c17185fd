"""End to end: a high-priority GPU pod preempts exactly the pods whose cards it needs (embedded cluster).

One node of two 16 GiB cards, both nearly full of lower-priority pods pinned to them: card A holds
``low-a`` (7000 MiB) and ``low-b`` (5000 MiB) of class ``batch`` (100), card B ``mid`` (12000 MiB) of
class ``standard`` (500). ``urgent`` (class ``urgent``, 1000000) asks for 10000 MiB of one card. The
real webhook resolves nothing about priority (kube-apiserver's Priority plugin does, played by the
admission stand-in); kube-scheduler's DefaultPreemption is played by the scheduler stand-in, which
asks the real extender's ``/preempt``. The cheapest room: evicting ``low-a`` alone (``low-b`` alone
frees too little, ``mid`` has a higher priority). Every pod event the API server emits while this
happens is checked: no card is ever granted more memory or cores than it has.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

from hami import objects
from hami.annotations import POD_DEVICES_ALLOCATED, decode_pod_devices
from hami_testkit.admission_standin import PRIORITY_CLASSES_PATH
from hami_testkit.cluster import parse_cluster
from hami_testkit.demo_session import submit_all, wait_decided
from hami_testkit.kubeapi import pods_path
from hami_testkit.system import EmbeddedSystem
from tests.eventually import eventually

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]

MEMORY = 16384
CARD_A = "GPU-0000000a-0000-4000-8000-000000000000"
CARD_B = "GPU-0000000b-0000-4000-8000-000000000000"
CLUSTER = f"""
nodes:
  - name: preempt-0
    labels: {{gpu: "on"}}
    cards:
      - {{uuid: {CARD_A}, model: NVIDIA A10, memory_mib: {MEMORY}}}
      - {{uuid: {CARD_B}, model: NVIDIA A10, memory_mib: {MEMORY}}}
"""
CLASSES = {"batch": 100, "standard": 500, "urgent": 1_000_000}


def _pod(name: str, priority_class: str, memory: int, cores: int, card: str = "") -> dict[str, Any]:
    limits = {"nvidia.com/gpu": "1", "nvidia.com/gpumem": str(memory), "nvidia.com/gpucores": str(cores)}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": "default",
            "annotations": {"nvidia.com/use-gpuuuid": card} if card else {},
        },
        "spec": {
            "priorityClassName": priority_class,
            "containers": [{"name": "c", "image": "x", "resources": {"limits": limits}}],
        },
    }


class CardWatch:
    """Follows every pod event of the API server and checks after each one that no card is granted more
    memory or cores than it has (pods that have ended hold nothing)."""

    def __init__(self) -> None:
        self.pods: dict[tuple[str, str], dict[str, Any]] = {}
        self.events = 0
        self.peak: dict[str, tuple[int, int]] = {}
        self.over: list[str] = []

    def apply(self, kind: str, pod: dict[str, Any]) -> None:
        self.events += 1
        key = objects.pod_key(pod)
        if kind == "DELETED":
            self.pods.pop(key, None)
        else:
            self.pods[key] = pod
        memory: dict[str, int] = defaultdict(int)
        cores: dict[str, int] = defaultdict(int)
        for held in self.pods.values():
            text = objects.annotations(held).get(POD_DEVICES_ALLOCATED)
            if not text or objects.pod_phase(held) in ("Succeeded", "Failed"):
                continue
            for container in decode_pod_devices(text):
                for grant in container:
                    memory[grant.uuid] += grant.memory_mib
                    cores[grant.uuid] += grant.cores
        for card in memory:
            self.peak[card] = (
                max(self.peak.get(card, (0, 0))[0], memory[card]),
                max(self.peak.get(card, (0, 0))[1], cores[card]),
            )
            if memory[card] > MEMORY or cores[card] > 100:
                self.over.append(f"event {self.events}: {card} {memory[card]} MiB, {cores[card]}%")


async def _events_about(system: EmbeddedSystem, pod: str) -> list[dict[str, Any]]:
    events = await system.api.list_objects("/api/v1/namespaces/default/events")
    return [e for e in events if (e.get("involvedObject") or {}).get("name") == pod]


async def test_a_high_priority_pod_evicts_exactly_the_pods_that_free_its_card(workdir: Path) -> None:
    async with EmbeddedSystem(parse_cluster(CLUSTER, source="preemption"), workdir) as system:
        watch = CardWatch()

        async def follow() -> None:
            async for kind, pod in system.api.watch(pods_path()):
                watch.apply(kind, pod)

        follower = asyncio.create_task(follow())
        try:
            for name, value in CLASSES.items():
                body = {"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass",
                        "metadata": {"name": name}, "value": value}  # fmt: skip
                await system.api.create(PRIORITY_CLASSES_PATH, body)
            running = [
                _pod("low-a", "batch", 7000, 30, CARD_A),
                _pod("low-b", "batch", 5000, 30, CARD_A),
                _pod("mid", "standard", 12000, 40, CARD_B),
            ]
            names, refused = await submit_all(system, running)
            assert refused == {}
            assert await wait_decided(system, names, refused, limit=60) == []
            (urgent,) = [_pod("urgent", "urgent", 10000, 30)]
            names, refused = await submit_all(system, [urgent])
            assert refused == {}

            async def urgent_running() -> dict[str, Any] | None:
                pod = await system.api.get(pods_path("default", "urgent"))
                return pod if pod and objects.pod_phase(pod) == "Running" else None

            placed = await eventually(
                urgent_running,
                "urgent to run after preempting",
                within=30,
                progress=lambda: watch.events,
                alive=system.supervisor.check,
            )
            left = {objects.name(p) for p in await system.api.list_objects(pods_path("default"))}
            events = await _events_about(system, "low-a")
            others = [e for n in ("low-b", "mid") for e in await _events_about(system, n)]
            preemptions = dict(system.scheduler.preemption.preemptions)
            assert await wait_decided(system, ["default/urgent"], {}, limit=10) == []
        finally:
            follower.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await follower

    assert watch.over == [], watch.over
    # exactly the minimal victim went: low-a alone frees card A (low-b alone frees too little, mid is
    # worth more); urgent runs on card A, nominated there first
    assert left == {"low-b", "mid", "urgent"}
    assert list(preemptions) == ["default/low-a"]
    ((grant,),) = decode_pod_devices(objects.annotations(placed)[POD_DEVICES_ALLOCATED])
    assert (grant.uuid, grant.memory_mib, grant.cores) == (CARD_A, 10000, 30)
    assert placed["spec"]["priority"] == 1_000_000
    assert placed["status"]["nominatedNodeName"] == "preempt-0"
    # the cards were full before and never over: A held 12000 MiB, then 15000 (low-b + urgent)
    assert watch.peak[CARD_A] == (15000, 60) and watch.peak[CARD_B] == (12000, 40)
    # the victim's Event names the preemptor, as kube-scheduler's does; nobody else was preempted
    (preempted,) = [e for e in events if e["reason"] == "Preempted"]
    assert preempted["type"] == "Normal"
    assert preempted["message"] == f"Preempted by pod {objects.uid(placed)} on node preempt-0"
    assert (preempted["related"]["name"], preempted["related"]["uid"]) == ("urgent", objects.uid(placed))
    assert not [e for e in others if e["reason"] == "Preempted"]
