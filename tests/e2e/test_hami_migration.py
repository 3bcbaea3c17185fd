"""End to end: our components take over a cluster HAMi ran (docs/install.md, "Migrating from HAMi").

The embedded cluster starts as HAMi left it (tests/e2e/hami_era.py): node gpu-a registered in HAMi's
JSON form, gpu-b in its legacy colon form, both with HAMi's handshake; Running pods with HAMi's
allocation annotations (two cards in one container, a GPU-less sidecar first, an init container on the
app's card, a finished pod); a stale node lock on gpu-a whose holder is gone. Then, in the order a
``helm install`` may bring them up:

1. our scheduler alone (HAMi's node agents were just removed, so HAMi's registrations are all there
   is): its live view must count exactly what the HAMi pods hold, card by card;
2. our node agents (they re-register the same cards), then a pod HAMi's scheduler bound just before it
   went away (``bind-phase=allocating``, holding gpu-b's lock as HAMi writes it): our agent must finish
   its hand-off and release the lock;
3. the webhook, and new GPU pods: a pod steered to a card the HAMi pods filled stays Pending with
   ``CardInsufficientMemory``, and of identical fill pods exactly as many land as the cards have room
   for after the HAMi pods, no card over its memory, cores or slots; a bind on gpu-a takes the dangling
   lock over; the scheduler and the node agents' exporters end up counting the same, card by card.

Expected numbers come from the fixtures' plain data, never from our codec, so a decoder that mis-reads
one of HAMi's formats fails the test (counted usage, the number placed, or the over-commit check).
"""

from __future__ import annotations

import datetime
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from hami_testkit.cluster import parse_cluster
from hami_testkit.demo_session import final_state, submit_all, wait_decided
from hami_testkit.kubeapi import SimApi, nodes_path, pods_path
from hami_testkit.system import SCHEDULER, EmbeddedSystem
from tests.e2e import hami_era
from tests.e2e.commands import run_doctor
from tests.e2e.hami_era import A0, GPU_A, GPU_B, IN_FLIGHT, NODES, RUNNING, Grant, HamiPod
from tests.eventually import eventually

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(240)]

MIB = 1024 * 1024
FILL = Grant("", 4000, 25)  # each fill pod: one card, 4000 MiB, 25 % cores
FILL_PODS = 6
LOCK = "hami.io/mutex.lock"


@dataclass(slots=True)
class Usage:
    memory: int = 0
    cores: int = 0
    slots: int = 0


@dataclass(slots=True)
class Registered:
    index: int = -1
    type: str = ""
    memory: int = 0
    cores: int = 0


@dataclass(frozen=True, slots=True)
class View:
    """Card uuid -> what the scheduler counts as used, and what it read from the registration."""

    used: dict[str, Usage]
    registered: dict[str, Registered]


def expected_usage(pods: tuple[HamiPod, ...]) -> dict[str, Usage]:
    """Card uuid -> what the pods hold, by HAMi's rule, from the fixtures' data."""
    used: dict[str, Usage] = {card.uuid: Usage() for node in NODES for card in node.cards}
    for pod in pods:
        for container in pod.holding():
            for grant in container:
                used[grant.uuid].memory += grant.memory
                used[grant.uuid].cores += grant.cores
                used[grant.uuid].slots += 1
    return used


def room(card: hami_era.Card, used: Usage) -> int:
    """How many fill pods ``card`` still takes."""
    return max(
        0,
        min(
            (card.memory - used.memory) // FILL.memory,
            (card.cores - used.cores) // FILL.cores,
            card.slots - used.slots,
        ),
    )


class HamiEraSystem(EmbeddedSystem):
    """The embedded system started on a cluster HAMi ran until now (the module docstring's order)."""

    window: View  # what our scheduler saw before our node agents registered
    written: dict[str, dict[str, str]]  # pod name -> the annotations HAMi wrote on it

    async def _start_node_side(self) -> None:
        now = hami_era.hami_now()
        hami_scheduler = SimApi(self.session, self.url, token=self.tokens[SCHEDULER])  # HAMi's writer
        for node in NODES:
            annotations = hami_era.node_annotations(node)
            if node is GPU_A:
                gone_since = now - datetime.timedelta(seconds=30)
                annotations[LOCK] = hami_era.node_lock(gone_since, *hami_era.DANGLING_HOLDER)
            await self.api.merge_patch(nodes_path(node.name), {"metadata": {"annotations": annotations}})
            # kubelet still publishes the count HAMi's device plugin registered (cards x split)
            count = str(sum(card.slots for card in node.cards))
            status = {"capacity": {self.resource: count}, "allocatable": {self.resource: count}}
            await self.api.merge_patch(nodes_path(node.name) + "/status", {"status": status})
        self.written = {}
        for pod in RUNNING:
            body = hami_era.pod_object(pod, now)
            created = await hami_scheduler.create(pods_path(pod.namespace), body)
            self.written[pod.name] = dict(created["metadata"]["annotations"])
            # a create starts Pending (as in kube-apiserver); kubelet reported the rest
            await self.api.merge_patch(
                pods_path(pod.namespace, pod.name, "status"), {"status": body["status"]}
            )
        await self.start_scheduler()
        self.window = await self.scheduler_view()
        # HAMi's device plugins are gone: kubelet has nothing to allocate until ours register
        for node in NODES:
            gone = {"status": {"allocatable": {self.resource: "0"}}}
            await self.api.merge_patch(nodes_path(node.name) + "/status", gone)
        await super()._start_node_side()
        # HAMi's last bind: the lock first, then the pod (bound, kubelet about to admit it)
        lock = hami_era.node_lock(hami_era.hami_now(), IN_FLIGHT.namespace, IN_FLIGHT.name)
        await self.api.merge_patch(nodes_path(IN_FLIGHT.node), {"metadata": {"annotations": {LOCK: lock}}})
        await hami_scheduler.create(pods_path(IN_FLIGHT.namespace), hami_era.pod_object(IN_FLIGHT, now))

    async def start_scheduler(self) -> None:
        child = self.supervisor.children.get(SCHEDULER)
        if child is None or not child.running:  # started early above; the base class starts it again
            await super().start_scheduler()

    async def _scrape(self, component: str) -> str:
        timeout = aiohttp.ClientTimeout(total=10)
        async with self.session.get(self.metrics_urls[component], timeout=timeout) as response:
            return await response.text()

    async def agents_view(self) -> dict[str, Usage]:
        """Card uuid -> what the node agents' exporters count on their cards (their /metrics)."""
        used: dict[str, Usage] = defaultdict(Usage)
        for node in NODES:
            for family in text_string_to_metric_families(await self._scrape(f"agent-{node.name}")):
                for sample in family.samples:
                    uuid = sample.labels.get("device_uuid")
                    if uuid is None:
                        continue
                    if sample.name == "hami_node_card_memory_allocated_bytes":
                        used[uuid].memory = int(sample.value) // MIB
                    elif sample.name == "hami_node_card_cores_allocated":
                        used[uuid].cores = int(sample.value)
                    elif sample.name == "hami_node_card_slots_used":
                        used[uuid].slots = int(sample.value)
        return dict(used)

    async def scheduler_view(self) -> View:
        """The cards as the scheduler's live view has them (its /metrics)."""
        text = await self._scrape(SCHEDULER)
        used: dict[str, Usage] = defaultdict(Usage)
        registered: dict[str, Registered] = defaultdict(Registered)
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                uuid = sample.labels.get("device_uuid")
                if uuid is None:
                    continue
                if sample.name == "hami_gpu_memory_allocated_bytes":
                    used[uuid].memory = int(sample.value) // MIB
                elif sample.name == "hami_gpu_core_allocated_ratio":
                    used[uuid].cores = int(sample.value)
                elif sample.name == "hami_gpu_shared_count":
                    used[uuid].slots = int(sample.value)
                elif sample.name == "hami_gpu_memory_limit_bytes":
                    registered[uuid].memory = int(sample.value) // MIB
                    registered[uuid].index = int(sample.labels["device_index"])
                    registered[uuid].type = sample.labels["device_type"]
                elif sample.name == "hami_gpu_core_limit_ratio":
                    registered[uuid].cores = int(sample.value)
        return View(used=dict(used), registered=dict(registered))


def _fill_pod(i: int) -> dict[str, Any]:
    limits = {
        "nvidia.com/gpu": "1",
        "nvidia.com/gpumem": str(FILL.memory),
        "nvidia.com/gpucores": str(FILL.cores),
    }
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": f"fill-{i}", "namespace": "default"},
        "spec": {"containers": [{"name": "c", "image": "x", "resources": {"limits": limits}}]},
    }


def _with_fill_pods(used: dict[str, Usage], pods: dict[str, Any]) -> dict[str, Usage]:
    """``used`` plus the fill pods placed (one card each, named first in their grant)."""
    total = {uuid: Usage(u.memory, u.cores, u.slots) for uuid, u in used.items()}
    for name, pod in pods.items():
        if name.startswith("default/fill-") and pod["spec"].get("nodeName"):
            uuid = pod["metadata"]["annotations"]["hami.io/vgpu-devices-allocated"].split(",", 1)[0]
            total[uuid].memory += FILL.memory
            total[uuid].cores += FILL.cores
            total[uuid].slots += 1
    return total


def _probe_pod() -> dict[str, Any]:
    """Steered to A0, which HAMi's train-0 and infer-0 filled to 24000 of 24576 MiB."""
    pod = _fill_pod(0)
    pod["metadata"] = {
        "name": "probe-a0",
        "namespace": "default",
        "annotations": {"nvidia.com/use-gpuuuid": A0},
    }
    pod["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpumem"] = "1000"
    return pod


async def test_pods_hami_placed_keep_their_cards_when_our_components_take_over(workdir: Path) -> None:
    cluster = parse_cluster(hami_era.cluster_yaml(), source="hami-era")
    cards = {card.uuid: card for node in NODES for card in node.cards}
    system = HamiEraSystem(cluster, workdir)
    async with system:
        # 1. our scheduler alone read HAMi's registrations (JSON and colon form) and HAMi's pods
        running_usage = expected_usage(RUNNING)
        registered = {u: Registered(c.index, hami_era.MODEL, c.memory, c.cores) for u, c in cards.items()}
        assert system.window.registered == registered, system.window.registered
        assert system.window.used == {uuid: running_usage[uuid] for uuid in cards}, system.window.used

        # 2. our agent finishes the hand-off HAMi's scheduler began, and releases HAMi's lock
        async def handed_over() -> dict[str, Any] | None:
            pod = await system.api.get(pods_path(IN_FLIGHT.namespace, IN_FLIGHT.name))
            node = await system.api.get(nodes_path(IN_FLIGHT.node))
            assert pod is not None and node is not None
            done = pod["status"].get("phase") == "Running" and LOCK not in node["metadata"]["annotations"]
            return pod if done else None

        inflight = await eventually(handed_over, "our agent to finish HAMi's in-flight pod", within=30)
        annotations = inflight["metadata"]["annotations"]
        assert annotations["hami.io/bind-phase"] == "success"
        assert annotations["hami.io/vgpu-devices-allocated"] == hami_era.device_list(IN_FLIGHT.grants)
        assert annotations["hami.io/vgpu-devices-to-allocate"] == ";"  # our agent blanked the one container

        # 3. new pods around the HAMi pods
        names, refused = await submit_all(system, [_probe_pod()] + [_fill_pod(i) for i in range(FILL_PODS)])
        assert refused == {}
        undecided = await wait_decided(system, names, refused, limit=120)
        assert undecided == []
        pods = await final_state(system, names, refused)
        probe_attempt = system.scheduler.attempt(pods["default/probe-a0"])
        hami_pods = {p.name: await system.api.get(pods_path(p.namespace, p.name)) for p in RUNNING}
        nodes = await system.api.list_objects(nodes_path())
        final_view = await system.scheduler_view()
        expected_final = _with_fill_pods(expected_usage((*RUNNING, IN_FLIGHT)), pods)

        async def agents_agree() -> dict[str, Usage] | None:
            view = await system.agents_view()
            return view if view == expected_final else None

        # the node agents' exporters apply the same rule to the pods bound to their node
        await eventually(agents_agree, "the node agents to count what the scheduler counts", within=20)
        code, report = await run_doctor(system.kubeconfig)

    # the HAMi pods are untouched: still there, same phase, same annotations
    for pod in RUNNING:
        stored = hami_pods[pod.name]
        assert stored is not None, pod.name
        assert stored["status"]["phase"] == pod.phase, pod.name
        assert stored["metadata"]["annotations"] == system.written[pod.name], pod.name

    # the probe: A0 is full of HAMi's pods, so it waits, with HAMi's reason for gpu-a
    assert pods["default/probe-a0"]["spec"].get("nodeName") is None
    assert probe_attempt is not None and probe_attempt.kind == "unschedulable"
    assert "CardInsufficientMemory" in probe_attempt.failed_nodes[GPU_A.name], probe_attempt.failed_nodes
    assert "CardUuidMismatch" in probe_attempt.failed_nodes[GPU_B.name], probe_attempt.failed_nodes

    # exactly as many fill pods as the cards have room for after the HAMi pods (the in-flight one included)
    held = expected_usage((*RUNNING, IN_FLIGHT))
    fits = sum(room(cards[uuid], held[uuid]) for uuid in cards)
    assert 0 < fits < FILL_PODS  # the fixtures leave room for some, not all
    placed = {n: p for n, p in pods.items() if n.startswith("default/fill-") and p["spec"].get("nodeName")}
    assert len(placed) == fits, (fits, sorted(placed))
    for name, pod in placed.items():
        assert pod["status"]["phase"] == "Running", name
        assert pod["metadata"]["annotations"]["hami.io/bind-phase"] == "success", name
    held = _with_fill_pods(held, pods)
    for uuid, card in cards.items():
        use = held[uuid]
        assert use.memory <= card.memory and use.cores <= card.cores and use.slots <= card.slots, (uuid, use)
    assert any(p["spec"]["nodeName"] == GPU_A.name for p in placed.values())  # took the dangling lock over
    assert final_view.used == {uuid: held[uuid] for uuid in cards}, final_view.used
    assert final_view.registered == registered, final_view.registered
    for node in nodes:
        assert LOCK not in node["metadata"]["annotations"], node["metadata"]["name"]
    assert code == 0, report
