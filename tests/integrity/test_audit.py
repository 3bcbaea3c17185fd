"""The scale faults' verdict (:func:`hami_testkit.audit.audit`) flags what it must: an over-committed card
(memory, cores, grants above the split count, a card the node never registered), an over-committed
quota, and a lost pod (gone, Failed, Pending with no reason), and nothing on a clean cluster, so the
tests and the benchmark that take it would fail on over-commit or loss."""

from __future__ import annotations

from typing import Any

from hami.annotations import NODE_REGISTER, POD_BIND_PHASE, POD_DEVICES_ALLOCATED, encode_node_devices
from hami.core.model import Device
from hami_testkit.audit import audit

CARD = Device(
    uuid="GPU-a", index=0, count=2, memory_mib=8000, cores=100, type="T4", mode="hami-core", health=True
)
NODE = {"metadata": {"name": "n1", "annotations": {NODE_REGISTER: encode_node_devices([CARD])}}}
QUOTA = {"metadata": {"name": "q", "namespace": "ns"}, "spec": {"hard": {"limits.nvidia.com/gpumem": "5000"}}}


def pod(
    name: str, memory: int, cores: int, *, uuid: str = "GPU-a", phase: str = "Running", **extra: Any
) -> Any:
    annotations = {POD_DEVICES_ALLOCATED: f"{uuid},NVIDIA,{memory},{cores}:;", **extra.pop("annotations", {})}
    return {
        "metadata": {"name": name, "namespace": "ns", "annotations": annotations},
        "spec": {"nodeName": "n1"},
        "status": {"phase": phase, **extra},
    }


def test_a_clean_cluster_passes() -> None:
    verdict = audit([NODE], [pod("a", 2000, 40), pod("b", 3000, 60)], [QUOTA], [("ns", "a"), ("ns", "b")])
    assert verdict.problems == []
    assert verdict.running == 2
    assert verdict.quota_use == {"ns": (5000, 5000, 100, None)}


def test_card_memory_cores_and_grants_over_capacity_are_flagged() -> None:
    over = audit([NODE], [pod("a", 6000, 60), pod("b", 3000, 60), pod("c", 0, 0)])
    assert any("memory 9000 > 8000" in line for line in over.cards), over.cards
    assert any("cores 120 > 100" in line for line in over.cards), over.cards
    assert any("grants 3 > split count 2" in line for line in over.cards), over.cards
    stranger = audit([NODE], [pod("a", 10, 0, uuid="GPU-z")])
    assert any("not a card n1 registered" in line for line in stranger.cards), stranger.cards


def test_finished_and_failed_binds_hold_nothing() -> None:
    pods = [pod("a", 6000, 60), pod("b", 6000, 60, phase="Succeeded")]
    pods.append(pod("c", 6000, 60, annotations={POD_BIND_PHASE: "failed"}))
    assert audit([NODE], pods).cards == []


def test_an_overcommitted_quota_is_flagged() -> None:
    verdict = audit([NODE], [pod("a", 3000, 10), pod("b", 3000, 10)], [QUOTA])
    assert verdict.quotas == ["namespace ns: GPU memory 6000 > quota 5000 MiB"]


def test_lost_pods_are_flagged_and_pending_pods_with_a_reason_are_not() -> None:
    waiting = {
        "metadata": {"name": "w", "namespace": "ns"},
        "spec": {},
        "status": {
            "phase": "Pending",
            "conditions": [{"type": "PodScheduled", "status": "False", "message": "quota"}],
        },
    }
    silent = {"metadata": {"name": "s", "namespace": "ns"}, "spec": {}, "status": {"phase": "Pending"}}
    failed = pod("f", 10, 0, phase="Failed", reason="UnexpectedAdmissionError")
    expected = [("ns", "w"), ("ns", "s"), ("ns", "f"), ("ns", "gone")]
    verdict = audit([NODE], [waiting, silent, failed], [], expected)
    assert verdict.pending_with_reason == 1
    assert verdict.pending_reasons == {"quota": 1}
    assert sorted(verdict.lost) == [
        "pod ns/f: Failed (UnexpectedAdmissionError)",
        "pod ns/gone: gone",
        "pod ns/s: Pending with no reason",
    ]
