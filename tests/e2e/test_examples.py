"""End to end, as ``make demo`` runs it: every example pod through webhook, scheduler, agent and kubelet.

The real components run as processes on loopback against the embedded apiserver; the assertions read
what they wrote: the pod annotations (through the codec), bind phases, node locks, the kubelet stand-in's
checkpoint of the device plugin's Allocate answers, and the scheduler's metrics.
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

from hami.annotations import (
    NODE_LOCK,
    POD_BIND_PHASE,
    POD_DEVICES_ALLOCATED,
    POD_DEVICES_TO_ALLOCATE,
    POD_MIG_ALLOCATIONS,
    POD_VGPU_NODE,
    decode_mig_allocations,
    decode_pod_devices,
)
from hami.core.model import Grant
from hami_testkit.cluster import load_cluster
from hami_testkit.demo_session import (
    default_examples_dir,
    final_state,
    load_examples,
    submit_all,
    wait_decided,
)
from hami_testkit.kubeapi import nodes_path
from hami_testkit.kubelet_standin import CHECKPOINT
from hami_testkit.report import card_index, describe, render
from hami_testkit.system import EmbeddedSystem

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]

CLUSTER = load_cluster()
MIG_PODS = ("mig-small", "mig-medium")
UUIDS = {node.name: node.card_uuids for node in CLUSTER.nodes}
MEMORY = {str(c["uuid"]): int(c["memory_mib"]) for node in CLUSTER.nodes for c in node.cards}
NUMA = {str(c["uuid"]): int(c.get("numa", 0)) for node in CLUSTER.nodes for c in node.cards}


def _grants(pod: dict[str, Any]) -> tuple[tuple[Grant, ...], ...]:
    return decode_pod_devices(pod["metadata"]["annotations"][POD_DEVICES_ALLOCATED])


def _single(pod: dict[str, Any]) -> Grant:
    (container,) = _grants(pod)
    (grant,) = container
    return grant


async def test_every_example_is_placed_or_explained(workdir: Path) -> None:
    async with EmbeddedSystem(CLUSTER, workdir) as system:
        names, refused = await submit_all(system, load_examples(default_examples_dir()))
        undecided = await wait_decided(system, names, refused, limit=120)
        pods = await final_state(system, names, refused)
        nodes = {n["metadata"]["name"]: n for n in await system.api.list_objects(nodes_path())}
        attempts = {n: system.scheduler.attempt(p) for n, p in pods.items() if p is not None}
        preemptions = dict(system.scheduler.preemption.preemptions)
        table = render(
            [describe(n, pods[n], refused.get(n), system.scheduler, card_index(CLUSTER)) for n in names]
        )
        async with system.session.get(f"{system.scheduler_metrics_url}/metrics") as response:
            metrics = (response.status, await response.text())
        checkpoints = {
            name: json.loads((files.kubelet_dir / CHECKPOINT).read_text())["Data"]["PodDeviceEntries"]
            for name, files in system.node_files.items()
            if (files.kubelet_dir / CHECKPOINT).exists()
        }
    assert undecided == [], table
    by_name = {n.split("/", 1)[1]: p for n, p in pods.items()}

    # refused at admission, never created
    assert list(refused) == ["default/privileged-gpu"]
    assert "container cuda is privileged" in refused["default/privileged-gpu"].message

    # cannot fit anywhere: pending, with the scheduler's reasons per node
    for name, reason in [
        ("too-much-memory", "CardInsufficientMemory"),
        ("too-many-cards", "NodeInsufficientDevice"),
        ("wants-h100", "CardTypeMismatch"),
        ("a10-enforced-only", "CardEnforcementInsufficient"),  # the A10 node has no HAMi-core
    ]:
        pod = by_name[name]
        assert not pod["spec"].get("nodeName"), name
        attempt = attempts[f"default/{name}"]
        assert attempt is not None and attempt.kind == "unschedulable", name
        assert reason in attempt.message, (name, attempt.message)
        assert pod["status"]["conditions"][0]["reason"] == "Unschedulable"

    # preempted: the urgent pod needed the first A10, which the batch pods filled; exactly the two whose
    # eviction makes room went (batch-3 stays beside it)
    assert {name: (r.preemptor, r.node) for name, r in preemptions.items()} == {
        "default/batch-1": ("default/urgent-a10", "gpu-a10"),
        "default/batch-2": ("default/urgent-a10", "gpu-a10"),
    }, table
    assert by_name["batch-1"] is None and by_name["batch-2"] is None
    gone = ("batch-1", "batch-2", "privileged-gpu")

    placed = {name: pod for name, pod in by_name.items() if pod and pod["spec"].get("nodeName")}
    assert sorted(placed) == sorted(
        n
        for n in by_name
        if n not in ("too-much-memory", "too-many-cards", "wants-h100", "a10-enforced-only", *gone)
    ), table
    running = {name: pod for name, pod in placed.items() if pod["status"].get("phase") == "Running"}
    assert set(running) == set(placed), table  # MIG pods included: the agent made their instances

    # the annotation timeline completed for every placed pod: decision, bind, agent hand-over
    for name, pod in running.items():
        annotations = pod["metadata"]["annotations"]
        assert annotations[POD_BIND_PHASE] == "success", name
        assert annotations[POD_VGPU_NODE] == pod["spec"]["nodeName"], name
        assert "NVIDIA" not in annotations.get(POD_DEVICES_TO_ALLOCATE, ""), name
        for container in _grants(pod):
            assert all(g.uuid in UUIDS[pod["spec"]["nodeName"]] for g in container), name
    for name, node in nodes.items():
        assert not (node["metadata"].get("annotations") or {}).get(NODE_LOCK), f"{name} still locked"

    # what each example documents
    shared = _single(running["a10-shared"])
    assert (running["a10-shared"]["spec"]["nodeName"], shared.memory_mib, shared.cores) == (
        "gpu-a10",
        8000,
        30,
    )
    whole = _single(running["whole-v100"])
    assert (whole.memory_mib, whole.cores) == (MEMORY[whole.uuid], 100)
    quarter = _single(running["v100-quarter"])
    assert (running["v100-quarter"]["spec"]["nodeName"], quarter.memory_mib, quarter.cores) == (
        "gpu-v100",
        8192,
        25,
    )
    assert _single(running["v100-avoid-card0"]).uuid != UUIDS["gpu-v100"][0]
    assert _single(running["a10-pinned-card1"]).uuid == UUIDS["gpu-a10"][1]
    urgent, batch = _single(running["urgent-a10"]), _single(running["batch-3"])
    assert (urgent.uuid, urgent.memory_mib, urgent.cores) == (UUIDS["gpu-a10"][0], 16000, 60)
    assert batch.uuid == UUIDS["gpu-a10"][0]
    (pair,) = _grants(running["numa-pair"])
    assert len(pair) == 2 and len({NUMA[g.uuid] for g in pair}) == 1 and len({g.uuid for g in pair}) == 2
    init, trainer, shipper = _grants(running["train-with-init"])
    assert [(g.memory_mib, g.cores) for g in init] == [(4000, 20)]
    assert [(g.memory_mib, g.cores) for g in trainer] == [(12000, 50)]
    assert shipper == ()
    (quad,) = _grants(running["nvlink-quad"])
    a100 = UUIDS["gpu-a100"]
    assert {g.uuid for g in quad} in ({*a100[:4]}, {*a100[4:]}), "not one NVLink quad"
    profiles = {}
    for name in MIG_PODS:
        assert running[name]["spec"]["nodeName"] == "gpu-mig"
        (mig,) = decode_mig_allocations(running[name]["metadata"]["annotations"][POD_MIG_ALLOCATIONS])
        profiles[name] = mig
    assert (profiles["mig-small"].profile, profiles["mig-medium"].profile) == ("1g.10gb", "3g.40gb")

    # no card is over-committed (hami-core cards: memory and cores; exclusive means alone)
    memory: dict[str, int] = defaultdict(int)
    cores: dict[str, int] = defaultdict(int)
    for pod in running.values():
        if pod["spec"]["nodeName"] == "gpu-mig":
            continue
        containers = _grants(pod)
        init_count = len(pod["spec"].get("initContainers") or [])
        for grant in {g.uuid: g for c in containers[init_count:] for g in c}.values():
            memory[grant.uuid] += grant.memory_mib
            cores[grant.uuid] += grant.cores
    assert all(memory[u] <= MEMORY[u] for u in memory), memory
    assert all(cores[u] <= 100 for u in cores), cores
    assert cores[whole.uuid] == 100

    # the device plugin's Allocate answers, as the kubelet stand-in recorded them
    entries = {(e["pod"], e["containerName"]): e for node in checkpoints.values() for e in node}
    for name, pod in running.items():
        if pod["spec"]["nodeName"] == "gpu-mig":
            continue
        names = [c["name"] for c in [*(pod["spec"].get("initContainers") or []), *pod["spec"]["containers"]]]
        for entry, grants in zip(names, _grants(pod), strict=True):
            if not grants:
                assert (name, entry) not in entries
                continue
            envs = entries[(name, entry)]["envs"]
            assert envs["NVIDIA_VISIBLE_DEVICES"].split(",") == [g.uuid for g in grants], (name, entry)
            for i, grant in enumerate(grants):
                assert envs[f"CUDA_DEVICE_MEMORY_LIMIT_{i}"] == f"{grant.memory_mib}m"

    status, text = metrics
    assert status == 200 and "# TYPE" in text

    # the table names every pod, its node and the reasons
    for name in by_name:
        assert f"default/{name}" in table
    assert "Refused" in table and "NodeInsufficientDevice" in table

    # MIG: the agent made each booked instance (sim backend), recorded it on the pod and handed out
    # only its MIG UUID; both hold their instances, which do not overlap on the card
    for name in MIG_PODS:
        mig = profiles[name]
        assert mig.mig_uuid is not None and mig.gpu_instance_id is not None, name
        assert mig.compute_instance_id is not None, name
        (container,) = [c["name"] for c in running[name]["spec"]["containers"]]
        assert entries[(name, container)]["envs"] == {"NVIDIA_VISIBLE_DEVICES": mig.mig_uuid}, name
    assert profiles["mig-small"].mig_uuid != profiles["mig-medium"].mig_uuid
    assert not profiles["mig-small"].placement.overlaps(profiles["mig-medium"].placement)
