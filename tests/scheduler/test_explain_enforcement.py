"""``hami explain`` and enforcement: the level a pending pod requires and where it comes from, each
node's cards by enforcement, a node below the level with ``CardEnforcementInsufficient`` (never fits as
asked), the hint when the pod's own annotation is what blocks, and a placed pod's granted enforcement."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import kmock

from hami.annotations import (
    NODE_ENFORCEMENT,
    NODE_REGISTER,
    POD_REQUIRE_ENFORCEMENT,
    POD_VGPU_ENFORCEMENT,
    allocation_annotations,
    encode_node_devices,
)
from hami.commands.explain import explain
from hami.core.allocate import Policy
from hami.core.enforcement import Level
from hami.core.model import Device, Grant
from hami.kube.client import load_api_client
from hami.settings import DeviceConfig

from .test_explain import NOW, pod


def node(name: str, kinds: list[str] | None) -> dict[str, Any]:
    cards = [
        Device(uuid=f"GPU-{name}-{i}", count=10, memory_mib=8000, cores=100, type="NVIDIA A10", health=True)
        for i in range(len(kinds or ["none", "none"]))
    ]
    annotations = {NODE_REGISTER: encode_node_devices(cards)}
    if kinds is not None:
        annotations[NODE_ENFORCEMENT] = ",".join(f"{c.uuid}:{k}" for c, k in zip(cards, kinds, strict=True))
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "annotations": annotations}}


async def run(kubeconfig: Path, name: str, policy: Policy) -> tuple[int, str]:
    out = io.StringIO()
    code = await explain(load_api_client(str(kubeconfig)), "default", name, DeviceConfig(), policy, out=out)
    return code, out.getvalue()


async def test_a_pending_pod_shows_its_requirement_and_each_nodes_enforcement(
    apiserver: kmock.KubernetesEmulator, kubeconfig: Path
) -> None:
    await apiserver.post("/api/v1/nodes", json=node("bare", None))
    await apiserver.post("/api/v1/nodes", json=node("mixed", ["hami-core", "none"]))
    await apiserver.post("/api/v1/nodes", json=node("safe", ["hami-core", "hami-core"]))
    wants = pod("strict", {"nvidia.com/gpu": "2"}, {POD_REQUIRE_ENFORCEMENT: "cooperative"})
    await apiserver.post("/api/v1/namespaces/default/pods", json=wants)
    code, text = await run(kubeconfig, "strict", Policy())
    assert code == 0
    assert "enforcement required: cooperative (the pod's hami.io/require-enforcement)" in text
    assert "3 nodes, 1 fit: safe" in text
    assert "bare   2/2 CardEnforcementInsufficient  (never fits this pod as asked)" in text
    assert "mixed  1/2 AllocatedCardsInsufficientRequest, 1/2 CardEnforcementInsufficient" in text
    assert "- fits without the hami.io/require-enforcement annotation" in text
    assert (
        "enforcement per node:\n  bare   none x2\n  mixed  hami-core x1, none x1\n  safe   hami-core x2\n"
        in text
    )


async def test_the_cluster_floor_is_named_and_gives_no_hint(
    apiserver: kmock.KubernetesEmulator, kubeconfig: Path
) -> None:
    await apiserver.post("/api/v1/nodes", json=node("bare", ["none", "none"]))
    await apiserver.post("/api/v1/namespaces/default/pods", json=pod("plain", {"nvidia.com/gpu": "1"}))
    code, text = await run(kubeconfig, "plain", Policy(enforcement=Level.COOPERATIVE))
    assert code == 1
    assert "enforcement required: cooperative (the cluster's --require-enforcement)" in text
    assert "bare  2/2 CardEnforcementInsufficient  (never fits this pod as asked)" in text
    assert "require-enforcement annotation" not in text  # the pod cannot lower the floor
    code, text = await run(kubeconfig, "plain", Policy())
    assert code == 0 and "enforcement required: none (any card" in text


async def test_a_placed_pod_shows_its_cards_enforcement(
    apiserver: kmock.KubernetesEmulator, kubeconfig: Path
) -> None:
    await apiserver.post("/api/v1/nodes", json=node("bare", None))
    held = allocation_annotations(
        node="bare", devices=((Grant(uuid="GPU-bare-0", memory_mib=1000, cores=20),),), now=NOW
    )
    recorded = {**held, POD_VGPU_ENFORCEMENT: "GPU-bare-0:none"}
    await apiserver.post(
        "/api/v1/namespaces/default/pods", json=pod("placed", {"nvidia.com/gpu": "1"}, recorded)
    )
    await apiserver.post("/api/v1/namespaces/default/pods", json=pod("older", {"nvidia.com/gpu": "1"}, held))
    code, text = await run(kubeconfig, "placed", Policy())
    assert code == 0
    assert "enforcement: GPU-bare-0 none; GPU-bare-0 without enforcement: its limits are not held" in text
    code, text = await run(kubeconfig, "older", Policy())
    assert "enforcement: not recorded (no hami.io/vgpu-enforcement" in text
