"""``hami explain`` reads a cluster (kmock here) and explains a pending pod per node, with the nearest fit."""

from __future__ import annotations

import asyncio
import datetime
import io
from pathlib import Path
from typing import Any

import kmock
import pytest

from hami import cli
from hami.annotations import NODE_REGISTER, allocation_annotations, encode_node_devices
from hami.commands.explain import explain
from hami.core.allocate import Policy
from hami.core.model import Device, Grant
from hami.kube.client import load_api_client
from hami.settings import DeviceConfig

NOW = datetime.datetime(2026, 11, 22, tzinfo=datetime.UTC)


def node(name: str, *cards: Device) -> dict[str, Any]:
    annotations = {NODE_REGISTER: encode_node_devices(cards)}
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "annotations": annotations}}


def card(uuid: str, memory: int, *, type: str = "NVIDIA A100-SXM4-80GB", numa: int = 0) -> Device:
    return Device(uuid=uuid, count=10, memory_mib=memory, cores=100, type=type, numa=numa, health=True)


def pod(name: str, limits: dict[str, str], annotations: dict[str, str] | None = None) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "default", "annotations": annotations or {}},
        "spec": {"containers": [{"name": "main", "image": "x", "resources": {"limits": limits}}]},
        "status": {"phase": "Pending"},
    }


@pytest.fixture
async def cluster(apiserver: kmock.KubernetesEmulator) -> kmock.KubernetesEmulator:
    await apiserver.post(
        "/api/v1/nodes", json=node("gpu-a", card("GPU-a0", 8000), card("GPU-a1", 8000, numa=1))
    )
    await apiserver.post("/api/v1/nodes", json=node("gpu-b", card("GPU-b0", 16000, type="NVIDIA A10")))
    await apiserver.post(
        "/api/v1/nodes", json={"apiVersion": "v1", "kind": "Node", "metadata": {"name": "cpu"}}
    )
    held = allocation_annotations(
        node="gpu-a", devices=((Grant(uuid="GPU-a0", memory_mib=5000, cores=20),),), now=NOW
    )
    await apiserver.post("/api/v1/namespaces/default/pods", json=pod("holder", {"nvidia.com/gpu": "1"}, held))
    return apiserver


async def run_explain(name: str, kubeconfig: Path) -> tuple[int, str]:
    out = io.StringIO()
    api = load_api_client(str(kubeconfig))
    code = await explain(api, "default", name, DeviceConfig(), Policy(), out=out)
    return code, out.getvalue()


async def test_pending_pod_is_explained_per_node_with_the_nearest_fit(
    cluster: kmock.KubernetesEmulator, kubeconfig: Path
) -> None:
    limits = {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "9000"}
    await cluster.post(
        "/api/v1/namespaces/default/pods", json=pod("big", limits, {"nvidia.com/use-gputype": "A100"})
    )
    code, text = await run_explain("big", kubeconfig)
    assert code == 1
    assert "pod default/big: container #0 asks nvidia.com/gpu=1 nvidia.com/gpumem=9000" in text
    assert "3 nodes, 0 fit" in text
    # gpu-a: both A100s have 8000 MiB (one with 5000 used), so 8000 is the most that fits
    assert "gpu-a  2/2 CardInsufficientMemory" in text
    assert "- fits if the container asks gpumem <= 8000" in text
    # gpu-b has enough memory but is an A10: dropping the type preference would fit
    assert "gpu-b  1/1 CardTypeMismatch" in text
    assert "- fits without the nvidia.com/use-gputype annotation" in text
    assert "cpu    node unregistered" in text
    assert "nearest fit: node gpu-a fits if the container asks gpumem <= 8000" in text


async def test_numa_and_freeing_hints(cluster: kmock.KubernetesEmulator, kubeconfig: Path) -> None:
    # both A100s of gpu-a can take 2000 MiB (3000 and 8000 free), but they sit on NUMA 0 and 1
    limits = {"nvidia.com/gpu": "2", "nvidia.com/gpumem": "2000"}
    numa = {"nvidia.com/numa-bind": "true"}
    await cluster.post("/api/v1/namespaces/default/pods", json=pod("pair", limits, numa))
    code, text = await run_explain("pair", kubeconfig)
    assert code == 1
    assert "needs 2 cards on one NUMA node; free cards per NUMA node: 1+1" in text
    assert "fits if the container asks nvidia.com/gpu <= 1" in text
    # 2 x 4000 MiB: GPU-a0 has only 3000 free until the holder's 5000 are released
    solo = {"nvidia.com/gpu": "2", "nvidia.com/gpumem": "4000"}
    await cluster.post("/api/v1/namespaces/default/pods", json=pod("solo", solo))
    code, text = await run_explain("solo", kubeconfig)
    assert code == 1
    assert "fits when pod default/holder ends" in text


async def test_placed_pod_shows_its_cards_and_cli_reports_missing_pod(
    cluster: kmock.KubernetesEmulator, kubeconfig: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, text = await run_explain("holder", kubeconfig)
    assert code == 0
    assert "placed on node gpu-a: GPU-a0 5000 MiB 20%" in text
    # the console script runs its own event loop: keep it off the loop serving the apiserver
    code = await asyncio.to_thread(cli.main, ["explain", "default/ghost", "--kubeconfig", str(kubeconfig)])
    assert code == 2
    assert "pod default/ghost not found" in capsys.readouterr().out


async def test_nearest_fit_is_the_smallest_change(
    cluster: kmock.KubernetesEmulator, kubeconfig: Path
) -> None:
    # 12000 MiB: gpu-a fits at 8000 (gives up a third), gpu-b (A10, 16000 MiB) fits as asked
    # only without the type preference (a fixed cost of one half): gpu-a is nearer
    limits = {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "12000"}
    preference = {"nvidia.com/use-gputype": "A100"}
    await cluster.post("/api/v1/namespaces/default/pods", json=pod("wide", limits, preference))
    code, text = await run_explain("wide", kubeconfig)
    assert code == 1
    assert "nearest fit: node gpu-a fits if the container asks gpumem <= 8000" in text


async def test_the_namespace_quota_is_explained(cluster: kmock.KubernetesEmulator, kubeconfig: Path) -> None:
    # the holder (default namespace) uses 5000 MiB of a 6000 MiB quota: 2000 more would exceed it
    quota = {
        "apiVersion": "v1",
        "kind": "ResourceQuota",
        "metadata": {"name": "gpu", "namespace": "default"},
        "spec": {"hard": {"limits.nvidia.com/gpumem": "6000"}},
    }
    await cluster.post("/api/v1/namespaces/default/resourcequotas", json=quota)
    limits = {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "2000"}
    await cluster.post("/api/v1/namespaces/default/pods", json=pod("capped", limits))
    code, text = await run_explain("capped", kubeconfig)
    assert code == 1
    assert "gpu-a  2/2 ResourceQuotaNotFit" in text
    assert "gpu-b  1/1 ResourceQuotaNotFit" in text


async def test_an_unbound_allocation_past_the_horizon_is_free(
    cluster: kmock.KubernetesEmulator, kubeconfig: Path
) -> None:
    # a bind wrote this grant on gpu-b in 2000 and never bound the pod: no bind is in flight for it
    long_ago = datetime.datetime(2000, 1, 1, tzinfo=datetime.UTC)
    left = allocation_annotations(
        node="gpu-b", devices=((Grant(uuid="GPU-b0", memory_mib=16000, cores=100),),), now=long_ago
    )
    left |= {"hami.io/bind-phase": "allocating", "hami.io/bind-time": str(int(long_ago.timestamp()))}
    await cluster.post("/api/v1/namespaces/default/pods", json=pod("leftover", {"nvidia.com/gpu": "1"}, left))
    limits = {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "10000", "nvidia.com/gpucores": "50"}
    await cluster.post("/api/v1/namespaces/default/pods", json=pod("next", limits))
    code, text = await run_explain("next", kubeconfig)
    assert code == 0, text
    assert "3 nodes, 1 fit: gpu-b" in text, text


# ----------------------------------------------------------------------------------------- preemption


def bound(
    name: str, memory: int, priority: int, node_name: str = "gpu-b", uuid: str = "GPU-b0"
) -> dict[str, Any]:
    """A pod bound to ``node_name`` holding ``memory`` MiB of ``uuid``, with ``spec.priority``."""
    held = allocation_annotations(
        node=node_name, devices=((Grant(uuid=uuid, memory_mib=memory, cores=10),),), now=NOW
    )
    body = pod(name, {"nvidia.com/gpu": "1"}, held)
    body["metadata"]["uid"] = f"uid-{name}"
    body["spec"] |= {"nodeName": node_name, "priority": priority}
    body["status"] = {"phase": "Running", "startTime": "2026-11-22T00:00:00Z"}
    return body


def urgent(name: str, priority: int, **spec: Any) -> dict[str, Any]:
    body = pod(name, {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "10000"})
    body["spec"] |= {"priority": priority, **spec}
    return body


async def test_the_cheapest_preemption_that_makes_room_is_listed(
    cluster: kmock.KubernetesEmulator, kubeconfig: Path
) -> None:
    # gpu-b's A10 (16000 MiB) holds low-1 (9000) and low-2 (5000): 2000 free. Evicting low-1 frees 11000,
    # enough for 10000; low-2 alone frees too little; gpu-a's 8000 MiB cards never hold 10000.
    for body in (bound("low-1", 9000, 10), bound("low-2", 5000, 10)):
        await cluster.post("/api/v1/namespaces/default/pods", json=body)
    await cluster.post("/api/v1/namespaces/default/pods", json=urgent("urgent", 100))
    code, text = await run_explain("urgent", kubeconfig)
    assert code == 1, text
    assert (
        "preemption: evicting default/low-1 (priority 10) on node gpu-b would make room "
        "(this pod's priority is 100; kube-scheduler preempts when no node fits)"
    ) in text, text


@pytest.mark.parametrize(
    ("priority", "spec", "says"),
    [
        (10, {}, "preemption: none would make room (no node has pods of priority below 10 whose eviction "
                 "frees enough)"),
        (100, {"preemptionPolicy": "Never"}, "preemption: not tried (preemptionPolicy: Never)"),
    ],
    ids=["no-lower-priority", "never"],
)  # fmt: skip
async def test_explain_says_when_no_preemption_helps(
    cluster: kmock.KubernetesEmulator, kubeconfig: Path, priority: int, spec: dict[str, Any], says: str
) -> None:
    for body in (bound("low-1", 9000, 10), bound("low-2", 5000, 10)):
        await cluster.post("/api/v1/namespaces/default/pods", json=body)
    await cluster.post("/api/v1/namespaces/default/pods", json=urgent("urgent", priority, **spec))
    code, text = await run_explain("urgent", kubeconfig)
    assert code == 1, text
    assert says in text, text
    assert "evicting" not in text


async def test_cards_held_for_a_nominated_pod_of_higher_priority_are_not_offered(
    cluster: kmock.KubernetesEmulator, kubeconfig: Path
) -> None:
    # kube-scheduler nominated gpu-b for "boss" (priority 100, 10000 MiB): /filter holds those cards
    # against lower-priority pods, so explain must not say a 10000 MiB pod of priority 10 fits there.
    boss = urgent("boss", 100, schedulerName="hami-scheduler")
    boss["status"] = {"phase": "Pending", "nominatedNodeName": "gpu-b"}
    await cluster.post("/api/v1/namespaces/default/pods", json=boss)
    await cluster.post(
        "/api/v1/namespaces/default/pods", json=urgent("small", 10, schedulerName="hami-scheduler")
    )
    code, text = await run_explain("small", kubeconfig)
    assert code == 1, text
    assert "3 nodes, 0 fit" in text, text
    # a pod that outranks the nominee is not held off
    await cluster.post(
        "/api/v1/namespaces/default/pods", json=urgent("chief", 200, schedulerName="hami-scheduler")
    )
    code, text = await run_explain("chief", kubeconfig)
    assert code == 0, text
    assert "3 nodes, 1 fit: gpu-b" in text, text
