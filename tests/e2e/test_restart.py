"""End to end: the scheduler process is killed in the middle of a burst and started again; nothing is lost.

A burst of small pods goes to a 2-node cluster; once a third of them are bound the scheduler gets
SIGKILL (a crash: no cleanup, maybe in the middle of a bind) and is started again on the same port.
Every pod must still end up Running exactly once, with a complete hand-over (bind-phase success), no
card over its slots, memory or cores, and no node lock left behind.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import pytest

from hami.annotations import (
    NODE_LOCK,
    POD_BIND_PHASE,
    POD_DEVICES_ALLOCATED,
    POD_VGPU_NODE,
    decode_pod_devices,
)
from hami_testkit.cluster import parse_cluster
from hami_testkit.demo_session import final_state, submit_all, wait_decided
from hami_testkit.kubeapi import nodes_path
from hami_testkit.system import SCHEDULER, EmbeddedSystem
from tests.eventually import eventually

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]

CARDS = 4  # per node
PODS = 24
MEMORY = 16384


def _cluster() -> str:
    nodes = []
    for n in range(2):
        cards = ",".join(
            f"{{uuid: GPU-0000000{n}-0000-4000-8000-00000000000{c}, model: NVIDIA A10, memory_mib: {MEMORY}}}"
            for c in range(CARDS)
        )
        nodes.append(f'  - {{name: burst-{n}, labels: {{gpu: "on"}}, cards: [{cards}]}}')
    return "nodes:\n" + "\n".join(nodes) + "\n"


def _pod(i: int) -> dict[str, Any]:
    limits = {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "3000", "nvidia.com/gpucores": "20"}
    container = {"name": "c", "image": "x", "resources": {"limits": limits}}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": f"burst-{i:02d}"},
        "spec": {"containers": [container]},
    }


async def test_a_scheduler_crash_mid_burst_loses_nothing(workdir: Path) -> None:
    async with EmbeddedSystem(parse_cluster(_cluster(), source="burst"), workdir) as system:
        names, refused = await submit_all(system, [_pod(i) for i in range(PODS)])
        assert refused == {}

        def bound() -> int:
            return sum(1 for p in system.scheduler.pods.values() if p["spec"].get("nodeName"))

        await eventually(
            lambda: bound() >= PODS // 3,
            "a third of the burst to be bound",
            within=30,
            progress=bound,
            alive=system.supervisor.check,
        )
        await system.restart_scheduler(kill=True)
        assert system.supervisor.children[SCHEDULER].running
        undecided = await wait_decided(system, names, refused, limit=120)
        pods = await final_state(system, names, refused)
        nodes = await system.api.list_objects(nodes_path())
        binds = system.scheduler.calls["bind"]
    assert undecided == []
    assert binds >= PODS
    phases = Counter(p["status"]["phase"] for p in pods.values())
    assert phases == {"Running": PODS}, phases
    used_slots: Counter[str] = Counter()
    used_memory: dict[str, int] = defaultdict(int)
    used_cores: dict[str, int] = defaultdict(int)
    for name, pod in pods.items():
        annotations = pod["metadata"]["annotations"]
        assert annotations[POD_BIND_PHASE] == "success", name
        assert annotations[POD_VGPU_NODE] == pod["spec"]["nodeName"], name
        ((grant,),) = decode_pod_devices(annotations[POD_DEVICES_ALLOCATED])
        assert grant.uuid.startswith(f"GPU-0000000{pod['spec']['nodeName'][-1]}-"), (name, grant.uuid)
        used_slots[grant.uuid] += 1
        used_memory[grant.uuid] += grant.memory_mib
        used_cores[grant.uuid] += grant.cores
    assert sum(used_slots.values()) == PODS
    assert max(used_slots.values()) <= 10
    assert max(used_memory.values()) <= MEMORY
    assert max(used_cores.values()) <= 100
    for node in nodes:
        assert not (node["metadata"].get("annotations") or {}).get(NODE_LOCK), node["metadata"]["name"]
