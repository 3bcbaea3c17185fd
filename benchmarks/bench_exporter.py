"""How long one ``/metrics`` scrape of the node exporter takes (collect + text encoding, no HTTP).

Node: 8 cards (split 10) with live usage, N tracked pods spread round-robin over the cards, one
container and one card each, one driver process per container resolved through a fake ``/proc``;
legacy names on (the most series). 80 pods is a full node, 400 a stress row. Target: a full node
well under 50 ms per scrape, so a 15 s scrape interval costs the agent nothing noticeable.
"""

from __future__ import annotations

import asyncio
import hashlib
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from prometheus_client import CollectorRegistry, generate_latest

from benchmarks.table import Table, summary
from hami.annotations import POD_DEVICES_ALLOCATED, POD_VGPU_NODE, encode_pod_devices
from hami.core.model import Grant
from nodeagent.backends.simulated import SimBackend
from nodeagent.cgroups import ProcessOwners
from nodeagent.config import NodeSettings
from nodeagent.exporter import NodeCollector
from nodeagent.grants import PodGrants, read_pod_grants
from nodeagent.inventory import Inventory

NODE = "bench-node"
CARDS = 8
SIZES = ((8, 300), (80, 200), (400, 50))  # (pods, repetitions)


@dataclass(frozen=True)
class FixedPods:
    pods: tuple[PodGrants, ...]


def _pod(i: int) -> tuple[dict[str, Any], str, str]:
    uid = str(uuid.uuid5(uuid.NAMESPACE_DNS, f"pod-{i}"))
    cid = hashlib.sha256(f"pod-{i}".encode()).hexdigest()
    devices = ((Grant(uuid=f"GPU-{i % CARDS}", memory_mib=2000, cores=10),),)
    pod = {
        "metadata": {
            "name": f"pod-{i}",
            "namespace": "bench",
            "uid": uid,
            "labels": {POD_VGPU_NODE: NODE},
            "annotations": {POD_VGPU_NODE: NODE, POD_DEVICES_ALLOCATED: encode_pod_devices(devices)},
        },
        "spec": {"nodeName": NODE, "containers": [{"name": "main"}]},
        "status": {
            "phase": "Running",
            "containerStatuses": [{"name": "main", "containerID": f"containerd://{cid}"}],
        },
    }
    return pod, uid, cid


def scrape_times(pods: int, repetitions: int, root: Path) -> list[float]:
    proc = root / f"proc-{pods}"
    grants: list[PodGrants] = []
    processes: dict[int, list[dict[str, int]]] = {c: [] for c in range(CARDS)}
    for i in range(pods):
        pod, uid, cid = _pod(i)
        found = read_pod_grants(pod)
        assert found is not None
        grants.append(found)
        pid = 1000 + i
        (proc / str(pid)).mkdir(parents=True)
        (proc / str(pid) / "cgroup").write_text(f"0::/kubepods/burstable/pod{uid}/{cid}\n")
        processes[i % CARDS].append({"pid": pid, "used_memory_mib": 500, "utilization": 5})
    cards = [
        {
            "uuid": f"GPU-{c}",
            "memory_mib": 81920,
            "used_memory_mib": 4000,
            "utilization": 40,
            "processes": processes[c],
        }
        for c in range(CARDS)
    ]
    path = root / f"cards-{pods}.yaml"
    path.write_text(yaml.safe_dump({"cards": cards}))
    inventory = Inventory(SimBackend(path))
    asyncio.run(inventory.refresh())
    registry = CollectorRegistry()
    registry.register(
        NodeCollector(
            node_name=NODE,
            inventory=inventory,
            settings=NodeSettings(),
            grants=FixedPods(pods=tuple(grants)),
            owners=ProcessOwners(proc),
            legacy=True,
        )
    )
    samples = []
    for _ in range(repetitions):
        start = time.perf_counter()
        body = generate_latest(registry)
        samples.append(time.perf_counter() - start)
    assert f'pod="pod-{pods - 1}"'.encode() in body
    return samples


def run() -> list[Table]:
    table = Table(
        title=f"node exporter: one scrape (collect + encode), {CARDS} cards, 1 grant + 1 process per pod",
        columns=("pods", "median ms", "p99 ms", "max ms"),
    )
    with tempfile.TemporaryDirectory(prefix="bench-exporter-") as root:
        for pods, repetitions in SIZES:
            table.rows.append((str(pods), *summary(scrape_times(pods, repetitions, Path(root)))))
    return [table]
