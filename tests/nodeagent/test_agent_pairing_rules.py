"""The pure rules behind Allocate's pairing (``nodeagent.pairing``) and hand-out checks
(``nodeagent.handout``), one by one on pod dicts built with the codec: who is a suspect, what a suspect
matches, which one ``pair`` picks, and every hand-out rule with its message."""

from __future__ import annotations

import datetime
from typing import Any

import pytest

from hami.annotations import (
    POD_BIND_PHASE,
    POD_DEVICES_TO_ALLOCATE,
    BindPhase,
    allocation_annotations,
    bind_annotations,
    encode_pod_devices,
)
from hami.core.model import Device, Grant, PodDevices
from nodeagent.handout import card_problem, container_problem, handout_problem
from nodeagent.pairing import Suspect, ambiguity, pair, requested, suspects

NOW = datetime.datetime(2026, 3, 1, 12, 0, tzinfo=datetime.UTC)
REGISTERED = {
    u: Device(uuid=u, count=10, memory_mib=16000, cores=100, type="NVIDIA-T4", mode="hami-core")
    for u in ("GPU-a", "GPU-b")
}


def g(uuid: str, mem: int = 1000, cores: int = 10, type: str = "NVIDIA") -> Grant:
    return Grant(uuid=uuid, type=type, memory_mib=mem, cores=cores)


def gpu(name: str, count: Any = 1, *, key: str = "limits") -> dict[str, Any]:
    return {"name": name, "resources": {key: {"nvidia.com/gpu": count}}}


def pod(
    name: str,
    devices: PodDevices | None = None,
    *,
    containers: list[dict[str, Any]] | None = None,
    init: list[dict[str, Any]] | None = None,
    phase: str = "Pending",
    node: str = "n1",
    scheduler: str = "hami-scheduler",
    bound_at: datetime.datetime = NOW,
    bind_phase: BindPhase | None = BindPhase.ALLOCATING,
    status: dict[str, Any] | None = None,
) -> dict[str, Any]:
    annotations: dict[str, str] = {}
    if devices is not None:
        annotations.update(allocation_annotations(node="n1", devices=devices, now=bound_at))
    if bind_phase is not None:
        annotations.update(bind_annotations(bind_phase, now=bound_at))
    spec: dict[str, Any] = {
        "nodeName": node,
        "schedulerName": scheduler,
        "containers": containers or [gpu("main", len(devices[0]) if devices else 1)],
    }
    if init:
        spec["initContainers"] = init
    return {
        "metadata": {"name": name, "namespace": "ns", "uid": f"uid-{name}", "annotations": annotations},
        "spec": spec,
        "status": {"phase": phase, **(status or {})},
    }


def found(*pods: dict[str, Any], refused: tuple[str, ...] = ()) -> tuple[Suspect, ...]:
    return suspects(
        pods,
        node="n1",
        scheduler="hami-scheduler",
        resource="nvidia.com/gpu",
        registered=REGISTERED,
        mode="hami-core",
        refused=refused,
    )


def names(suspects: tuple[Suspect, ...]) -> list[str]:
    return [s.name for s in suspects]


# ------------------------------------------------------------------------------------------ requested
def test_requested_counts_follow_kubelets_container_order_and_skip_zero() -> None:
    spec = {
        "spec": {
            "initContainers": [gpu("setup", "2")],
            "containers": [gpu("a", 0), {"name": "b"}, gpu("c", "1", key="requests"), gpu("d", "1e3")],
        }
    }
    # "1e3" is read as the scheduler reads it (hami.core.requests.card_count): 1000 cards
    assert requested(spec, "nvidia.com/gpu") == (2, 1, 1000)


# ------------------------------------------------------------------------------------------ suspects
def test_who_kubelet_may_be_admitting() -> None:
    started = {"initContainerStatuses": [{"name": "setup"}]}
    served = pod("served", ((g("GPU-a"),),), bind_phase=BindPhase.SUCCESS)
    served["metadata"]["annotations"][POD_DEVICES_TO_ALLOCATE] = ";"
    pods = [
        pod("waiting", ((g("GPU-a"),),)),
        pod("running", ((g("GPU-a"),),), phase="Running"),
        pod("elsewhere", ((g("GPU-a"),),), node="n2"),
        pod("started", ((g("GPU-a"),),), status=started),
        pod("refused", ((g("GPU-a"),),)),
        served,
        pod("no-gpu", containers=[{"name": "main"}], bind_phase=None),
        pod("foreign", scheduler="default-scheduler", bind_phase=None),
        pod("given-up", ((g("GPU-b"),),), bind_phase=BindPhase.FAILED),
    ]
    result = found(*pods, refused=("uid-refused",))
    assert sorted(names(result)) == ["ns/foreign", "ns/given-up", "ns/waiting"]
    problems = {s.name: s.problem for s in result}
    assert problems["ns/waiting"] is None
    assert "'default-scheduler'" in (problems["ns/foreign"] or "")
    assert f"{POD_BIND_PHASE}=failed" in (problems["ns/given-up"] or "")


def test_suspects_come_in_bind_order() -> None:
    later = NOW + datetime.timedelta(seconds=5)
    result = found(
        pod("b", ((g("GPU-a"),),), bound_at=later), pod("a", ((g("GPU-b"),),)), pod("z", bind_phase=None)
    )
    assert names(result) == ["ns/a", "ns/b", "ns/z"]  # a pod without a bind time comes last


# ------------------------------------------------------------------------------------------ matching
def test_a_trusted_pod_matches_on_its_next_waiting_entries() -> None:
    (x,) = found(
        pod(
            "x",
            ((g("GPU-a"),), (), (g("GPU-a"), g("GPU-b"))),
            containers=[gpu("a"), {"name": "b"}, gpu("c", 2)],
        )
    )
    assert x.matches([1]) and x.matches([1, 2])
    assert not x.matches([2]) and not x.matches([1, 1]) and not x.matches([1, 2, 1])


def test_an_untrusted_pod_also_matches_on_what_its_containers_ask_for() -> None:
    forged = pod("x", ((g("GPU-a"),),))
    forged["metadata"]["annotations"][POD_DEVICES_TO_ALLOCATE] = encode_pod_devices(
        ((g("GPU-a"), g("GPU-b")),)
    )
    (x,) = found(forged)
    assert x.problem is not None and x.matches([1]) and x.matches([2]) and not x.matches([3])
    broken = pod("b", ((g("GPU-a"),),))
    broken["metadata"]["annotations"][POD_DEVICES_TO_ALLOCATE] = "GPU-a,NVIDIA,lots,1:;"
    (b,) = found(broken)
    assert b.waiting is None and b.matches([5])  # nothing readable: it may be anything


# ------------------------------------------------------------------------------------------ pair
def test_pair_picks_the_only_pod_matching_or_not() -> None:
    (x,) = found(pod("x", ((g("GPU-a"),),)))
    assert pair([x], [3]).chosen is x  # the only pod kubelet can be admitting: its mismatch is reported
    assert pair([], [1]).chosen is None and pair([], [1]).candidates == ()


def test_pair_prefers_the_pod_in_the_middle_of_its_containers() -> None:
    midway = pod("m", ((g("GPU-a"),), (g("GPU-b"),)), containers=[gpu("one"), gpu("two")])
    midway["metadata"]["annotations"][POD_DEVICES_TO_ALLOCATE] = encode_pod_devices(((), (g("GPU-b"),)))
    result = found(pod("other", ((g("GPU-a"),),)), midway)
    assert {s.name: s.midway for s in result} == {"ns/m": True, "ns/other": False}
    chosen = pair(result, [1]).chosen
    assert chosen is not None and chosen.name == "ns/m"


def test_pair_serves_identical_grants_in_bind_order_and_fails_closed_otherwise() -> None:
    later = NOW + datetime.timedelta(seconds=5)
    same = found(pod("q", ((g("GPU-a"),),), bound_at=later), pod("p", ((g("GPU-a"),),)))
    assert pair(same, [1]).chosen is same[0] and same[0].name == "ns/p"
    different = found(pod("q", ((g("GPU-b"),),), bound_at=later), pod("p", ((g("GPU-a"),),)))
    assert pair(different, [1]).chosen is None and names(pair(different, [1]).candidates) == ["ns/p", "ns/q"]
    with_rival = found(pod("p", ((g("GPU-a"),),)), pod("q", ((g("GPU-a"),),), bind_phase=BindPhase.FAILED))
    assert pair(with_rival, [1]).chosen is None  # the rival's real cards are unknown


def test_pair_with_nothing_matching_names_every_pod_waiting() -> None:
    result = found(pod("p", ((g("GPU-a"),),)), pod("q", ((g("GPU-b"),),)))
    pairing = pair(result, [2])
    assert pairing.chosen is None and names(pairing.candidates) == ["ns/p", "ns/q"]
    text = ambiguity("n1", [2], pairing.candidates)
    assert text.startswith("kubelet asked node n1 for 2 cards and matches none of the pods waiting here: ")
    assert "ns/p (next container main: 1 card)" in text and "No card was handed out" in text


# ------------------------------------------------------------------------------------------ hand-out
@pytest.mark.parametrize(
    ("devices", "message"),
    [
        (((g("GPU-a", -1),),), "grants -1 MiB"),
        (((g("GPU-a", 1000, 101),),), "grants 101% cores of card 'GPU-a', which registers 100%"),
        (((g("GPU-a", type="AMD"),),), "as type 'AMD', not NVIDIA"),
        (((), (g("GPU-a"), g("GPU-a"))), "entry 1 names card 'GPU-a' twice"),
        (((g(""),),), "names '', which is not a card of node n1 (GPU-a, GPU-b)"),
    ],
)
def test_card_rules(devices: PodDevices, message: str) -> None:
    assert message in (card_problem(devices, node="n1", registered=REGISTERED, mode="hami-core") or "")


def test_a_card_registered_in_another_mode_is_refused() -> None:
    registered = {
        "GPU-a": Device(uuid="GPU-a", count=7, memory_mib=40000, cores=100, type="NVIDIA-A100", mode="mig")
    }
    problem = card_problem(((g("GPU-a"),),), node="n1", registered=registered, mode="hami-core")
    assert problem == "card 'GPU-a' is registered in mig mode, the node runs hami-core"


def test_handout_rules_in_order() -> None:
    def problem(p: dict[str, Any]) -> str | None:
        return handout_problem(
            p,
            node="n1",
            scheduler="hami-scheduler",
            registered=REGISTERED,
            mode="hami-core",
            resource="nvidia.com/gpu",
        )

    assert problem(pod("ok", ((g("GPU-a"),),))) is None
    assert "bound to node 'n2'" in (problem(pod("x", ((g("GPU-a"),),), node="n2")) or "")
    unnamed = pod("x", ((g("GPU-a"),),))
    del unnamed["spec"]["schedulerName"]
    assert "names scheduler None" in (problem(unnamed) or "")
    blank = pod("x", ((g("GPU-a"),),))
    blank["metadata"]["annotations"][POD_DEVICES_TO_ALLOCATE] = ";"
    assert problem(blank) is None  # all served: nothing left to check against


@pytest.mark.parametrize(
    ("containers", "message"),
    [
        ([{"name": "main"}], "entry 0 gives container 'main' 1 card(s), but it asks kubelet for none"),
        ([gpu("main", 2)], "entry 0 gives container 'main' 1 card(s), but it asks kubelet for 2"),
        ([gpu("main", "1.5")], "but it asks kubelet for an unreadable count (nvidia.com/gpu)"),
    ],
)
def test_each_waiting_entry_belongs_to_a_container_asking_for_that_many_cards(
    containers: list[dict[str, Any]], message: str
) -> None:
    problem = container_problem(
        pod("x", ((g("GPU-a"),),), containers=containers), ((g("GPU-a"),),), "nvidia.com/gpu"
    )
    assert message in (problem or "")
    assert container_problem(pod("x", ((g("GPU-a"),),)), ((g("GPU-a"),),), "nvidia.com/gpu") is None
    requests = [gpu("main", 1, key="requests")]  # requests alone count as the scheduler reads them
    assert (
        container_problem(pod("x", ((g("GPU-a"),),), containers=requests), ((g("GPU-a"),),), "nvidia.com/gpu")
        is None
    )
