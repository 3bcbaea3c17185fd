"""End to end: a pod parked because the only GPU node is full runs soon after its card is freed.

kube-scheduler is the stand-in with kube-scheduler's queue (docs/scheduler.md, "Waking pending pods"):
a pod the extender rejected waits in the unschedulable pool until an event its rejectors register for,
or the flush. One node, one 16 GiB card; ``holder`` takes 12000 MiB, ``waiter`` asks for 8000 MiB and
is parked. The card is then freed four ways: ``holder`` deleted, ``holder`` finished (kube-scheduler
sees both: an assigned pod's Delete), its grant released (``hami.io/vgpu-devices-allocated`` removed
while it runs: kube-scheduler sees no event for that), and the card uncordoned (a node annotation).
With the wake-up on, ``waiter`` runs each time, and after the grant release it is the wake-up's update
of ``waiter`` that moved it; with the wake-up off (``--wake-pending=false``) the same pod after the
same release waits for the flush. Each time from the freeing write to ``waiter`` Running is printed
(the numbers in docs/scheduler.md, "Waking pending pods", come from this test's output).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from hami import objects
from hami.annotations import NODE_DEVICE_CORDON, POD_DEVICES_ALLOCATED, POD_WAKE_UP, encode_cordon
from hami_testkit.cluster import parse_cluster
from hami_testkit.demo_session import submit_all, wait_decided
from hami_testkit.kubeapi import ApiError, SimApi, nodes_path, pods_path
from hami_testkit.system import SCHEDULER, EmbeddedSystem, SystemOptions
from tests.eventually import eventually

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]

NODE = "wake-0"
CARD = "GPU-0000000c-0000-4000-8000-000000000000"
CLUSTER = f"""
nodes:
  - name: {NODE}
    labels: {{gpu: "on"}}
    cards:
      - {{uuid: {CARD}, model: NVIDIA A10, memory_mib: 16384}}
"""
#: the events the stand-in's queue names (hami_testkit.scheduler_standin)
WOKEN = "UnschedulablePod/Update"
DELETED = "AssignedPod/Delete"
TIMEOUT = "UnschedulableTimeout"


def _pod(name: str, memory: int) -> dict[str, Any]:
    limits = {"nvidia.com/gpu": "1", "nvidia.com/gpumem": str(memory), "nvidia.com/gpucores": "10"}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"containers": [{"name": "c", "image": "x", "resources": {"limits": limits}}]},
    }


class Scene:
    """One embedded system and the steps every case shares."""

    def __init__(self, system: EmbeddedSystem) -> None:
        self.system = system
        self.as_scheduler = SimApi(system.session, system.url, token=system.tokens[SCHEDULER])
        self.timings: dict[str, float] = {}

    async def running(self, name: str) -> dict[str, Any]:
        async def check() -> dict[str, Any] | None:
            pod = await self.system.api.get(pods_path("default", name))
            return pod if pod and objects.pod_phase(pod) == "Running" else None

        found: dict[str, Any] = await eventually(
            check, f"{name} to run", within=60, alive=self.system.supervisor.check
        )
        return found

    async def submit(self, name: str, memory: int) -> None:
        names, refused = await submit_all(self.system, [_pod(name, memory)])
        assert refused == {}, refused
        del names

    async def parked(self, name: str) -> None:
        """Wait until ``name`` is unschedulable and parked (no event has moved it since)."""

        async def check() -> bool | None:
            pod = self.system.scheduler.pods.get(("default", name))
            return True if pod is not None and self.system.scheduler.settled(pod) else None

        await eventually(check, f"{name} to be parked", within=60, alive=self.system.supervisor.check)

    async def gone(self, name: str) -> None:
        await self.system.api.delete(pods_path("default", name))

        async def check() -> bool | None:
            return True if await self.system.api.get(pods_path("default", name)) is None else None

        await eventually(check, f"{name} to be gone", within=60, alive=self.system.supervisor.check)

    async def case(
        self, label: str, setup: Callable[[], Awaitable[None]], free: Callable[[], Awaitable[None]]
    ) -> list[str]:
        """``setup`` fills the card, ``waiter`` is parked, ``free`` frees it: the events that moved
        ``waiter`` (the time from the freeing write to Running goes to :attr:`timings`)."""
        await setup()
        await self.submit("waiter", 8000)
        await self.parked("waiter")
        loop = asyncio.get_running_loop()
        start = loop.time()
        await free()
        pod = await self.running("waiter")
        self.timings[label] = loop.time() - start
        moved = self.system.scheduler.requeued_by(pod)
        await self.gone("waiter")
        return moved

    # ------------------------------------------------------------------------------- the freeings

    async def hold(self) -> None:
        await self.submit("holder", 12000)
        await self.running("holder")

    async def delete_holder(self) -> None:
        await self.system.api.delete(pods_path("default", "holder"))

    async def finish_holder(self) -> None:
        path = pods_path("default", "holder", "status")
        await self.system.api.merge_patch(path, {"status": {"phase": "Succeeded"}})

    async def release_grant(self) -> None:
        patch = {"metadata": {"annotations": {POD_DEVICES_ALLOCATED: None}}}
        await self.as_scheduler.merge_patch(pods_path("default", "holder"), patch)

    async def cordon(self) -> None:
        patch = {"metadata": {"annotations": {NODE_DEVICE_CORDON: encode_cordon([CARD])}}}
        await self.system.api.merge_patch(nodes_path(NODE), patch)

    async def uncordon(self) -> None:
        patch = {"metadata": {"annotations": {NODE_DEVICE_CORDON: None}}}
        await self.system.api.merge_patch(nodes_path(NODE), patch)


async def test_a_parked_pod_runs_soon_after_cards_are_freed_each_way(workdir: Path) -> None:
    options = SystemOptions(flush_after=3600.0)  # the flush never comes within the test
    async with EmbeddedSystem(parse_cluster(CLUSTER, source="wakeup"), workdir, options) as system:
        scene = Scene(system)
        deleted = await scene.case("deleted", scene.hold, scene.delete_holder)
        finished = await scene.case("finished", scene.hold, scene.finish_holder)
        await scene.gone("holder")
        released = await scene.case("grant released", scene.hold, scene.release_grant)
        await scene.gone("holder")
        uncordoned = await scene.case("uncordoned", scene.cordon, scene.uncordon)
        # the pod's owner cannot touch the wake annotation (HAMi's annotations are HAMi's alone)
        await scene.submit("owner", 100)
        with pytest.raises(ApiError) as refused:
            patch = {"metadata": {"annotations": {POD_WAKE_UP: "999"}}}
            await system.api.merge_patch(pods_path("default", "owner"), patch)
        assert await wait_decided(system, ["default/owner"], {}, limit=60) == []
    print("freed -> waiter Running (s):", {k: round(v, 2) for k, v in scene.timings.items()})
    # kube-scheduler sees a deleted and a finished pod itself (an assigned pod's Delete)
    assert DELETED in deleted and DELETED in finished
    # a released grant is seen by no informer: the wake-up's update of the pod moved it
    assert released and released[-1] == WOKEN, released
    # an uncordon is a node annotation: the Extender rejector registers it (or the wake-up came first)
    assert uncordoned and uncordoned[-1] in (WOKEN, "Node/UpdateNodeAnnotation"), uncordoned
    assert TIMEOUT not in deleted + finished + released + uncordoned
    assert refused.value.status in (403, 422), refused.value


async def test_without_the_wake_up_a_released_grant_waits_for_the_flush(workdir: Path) -> None:
    options = SystemOptions(flush_after=8.0, scheduler_args=("--wake-pending=false",))
    async with EmbeddedSystem(parse_cluster(CLUSTER, source="wakeup-off"), workdir, options) as system:
        scene = Scene(system)
        released = await scene.case("grant released, no wake-up", scene.hold, scene.release_grant)
    print("freed -> waiter Running (s):", {k: round(v, 2) for k, v in scene.timings.items()})
    assert released == [TIMEOUT], released
