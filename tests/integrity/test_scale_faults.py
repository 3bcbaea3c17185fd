"""Scale faults at test scale (issue 24; docs/scale.md, "Scale faults", b and c) on the whole embedded
system (every component a process, the node agents as fleet processes): a tenth of the agents killed and
restarted at once while pods are scheduled, and a burst of pods at one namespace with a quota. The
verdict is :func:`hami_testkit.audit.audit` over what the API server stores (its own test,
``test_audit.py``, shows it flags an injected over-commit, quota excess and lost pod). The large runs
are ``benchmarks/bench_faults.py``; the relist while binding is ``test_relist.py``.

Ten nodes of two T4 cards (15,360 MiB, 100 cores, 10 slots each).
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from hami.annotations import NODE_LOCK
from hami_testkit.audit import Audit, audit
from hami_testkit.clustergen import Shape, generate_cluster
from hami_testkit.kubeapi import nodes_path, pods_path
from hami_testkit.system import EmbeddedSystem, SystemOptions
from tests.eventually import eventually

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]

CLUSTER = generate_cluster(10, (Shape("T4", 2, 1),))


@pytest.fixture
def workdir() -> Iterator[Path]:
    """A short directory under /tmp (device-plugin unix socket paths are limited to 107 bytes)."""
    path = Path(tempfile.mkdtemp(prefix="hami-faults-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def gpu_pod(name: str, namespace: str, memory: int = 2000, cores: int = 20) -> dict[str, Any]:
    limits = {"nvidia.com/gpu": "1", "nvidia.com/gpumem": str(memory), "nvidia.com/gpucores": str(cores)}
    return {
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"containers": [{"name": "main", "image": "cuda:12", "resources": {"limits": limits}}]},
    }


async def verdict(system: EmbeddedSystem, namespace: str, names: list[str]) -> Audit:
    nodes = await system.api.list_objects(nodes_path())
    pods = await system.api.list_objects("/api/v1/pods")
    quotas = await system.api.list_objects(f"/api/v1/namespaces/{namespace}/resourcequotas")
    return audit(nodes, pods, quotas, [(namespace, n) for n in names])


def final_loss(found: Audit) -> bool:
    """A pod lost for good (gone or finished), not merely not yet looked at by kube-scheduler."""
    return any("Pending with no reason" not in line for line in found.lost)


async def test_a_tenth_of_the_agents_killed_at_once_loses_no_pod_and_overcommits_nothing(
    workdir: Path,
) -> None:
    """Ten fleet processes of one node each; 30 pods created, the first fleet (a tenth of the agents)
    killed (SIGKILL) and started again after the tenth: every pod ends Running, no card is over-committed
    and no node lock is left. Except, as kubelet does it: a pod the kubelet admits on the restarted node
    while its device plugin is down fails admission (``UnexpectedAdmissionError``; a controller would make
    a new one), and only there."""
    options = SystemOptions(fleet=True, fleets=10, log_level="WARNING")
    async with EmbeddedSystem(CLUSTER, workdir, options) as system:
        fleets = list(system.fleet_nodes())
        assert len(fleets) == 10 and all(len(nodes) == 1 for nodes in system.fleet_nodes().values())
        restarted = set(system.fleet_nodes()[fleets[0]])
        names = [f"p{i:02d}" for i in range(30)]
        for index, name in enumerate(names):
            await system.api.create(pods_path("default"), gpu_pod(name, "default"))
            if index == 9:
                await system.restart_fleet(fleets[0])

        seen: list[Audit] = []
        refused: set[str] = set()  # failed admission on the restarted node while its plugin was down

        async def settled() -> Audit | None:
            system.supervisor.check()
            system.check_standin()
            found = await verdict(system, "default", names)
            for pod in await system.api.list_objects(pods_path("default")):
                status = pod.get("status") or {}
                if (
                    status.get("phase") == "Failed"
                    and status.get("reason") == "UnexpectedAdmissionError"
                    and (pod.get("spec") or {}).get("nodeName") in restarted
                ):
                    refused.add(pod["metadata"]["name"])
            seen.append(found)
            lost = [line for line in found.lost if not any(f"/{name}:" in line for name in refused)]
            done = found.running + len(refused) == len(names)
            return found if done or any("Pending with no reason" not in line for line in lost) else None

        final = await eventually(
            settled,
            "every pod Running (or one lost)",
            within=120,
            progress=lambda: seen[-1].running if seen else 0,
        )
        unexplained = [line for line in final.lost if not any(f"/{name}:" in line for name in refused)]
        assert final.cards == final.quotas == unexplained == [], final.problems
        assert final.running == len(names) - len(refused)

        async def unlocked() -> bool | None:
            nodes = await system.api.list_objects(nodes_path())
            return (
                True
                if not any((n["metadata"].get("annotations") or {}).get(NODE_LOCK) for n in nodes)
                else None
            )

        await eventually(unlocked, "every node lock released", within=120)


async def test_a_burst_at_one_namespace_with_a_quota_overcommits_neither_quota_nor_cards(
    workdir: Path,
) -> None:
    """Namespace ``burst`` may use 5 pods' GPU memory; 40 pods are created at once: 5 Running, 35
    Pending with kube-scheduler's reason, no quota or card over-committed, none lost."""
    async with EmbeddedSystem(CLUSTER, workdir, SystemOptions(fleet=True, log_level="WARNING")) as system:
        await system.api.create("/api/v1/namespaces", {"metadata": {"name": "burst"}})
        quota = {
            "metadata": {"name": "gpu", "namespace": "burst"},
            "spec": {"hard": {"limits.nvidia.com/gpumem": str(5 * 2000)}},
        }
        await system.api.create("/api/v1/namespaces/burst/resourcequotas", quota)
        names = [f"b{i:02d}" for i in range(40)]
        await asyncio.gather(*(system.api.create(pods_path("burst"), gpu_pod(n, "burst")) for n in names))

        seen: list[Audit] = []

        async def decided() -> Audit | None:
            system.supervisor.check()
            system.check_standin()
            found = await verdict(system, "burst", names)
            seen.append(found)
            done = found.running == 5 and found.pending_with_reason == 35
            return found if done or final_loss(found) or found.quotas or found.cards else None

        final = await eventually(
            decided,
            "5 pods Running and 35 Pending with a reason",
            within=120,
            progress=lambda: (seen[-1].running, seen[-1].pending_with_reason) if seen else None,
        )
        assert final.problems == [], final.problems
        assert final.quota_use["burst"][:2] == (10000, 10000)
