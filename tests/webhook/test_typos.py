"""Typos refused at admission: look-alike resource names and annotation keys in HAMi's namespaces, and a
card count of 0 next to memory or cores. Through the pure decision (:func:`webhook.mutation.plan`);
``webhook_cases.REFUSALS`` carries the same cases through the HTTPS webhook."""

from __future__ import annotations

from typing import Any

import cel
import pytest

from hami.settings import DeviceConfig, ResourceNames
from webhook.config import MutationSettings
from webhook.mutation import REFUSAL_REASONS, Admit, Refuse, plan
from webhook.registration import match_expression
from webhook.typos import did_you_mean

from .webhook_cases import CORES, GPU, MEM, PCT, ctr, make_pod

DEFAULT = MutationSettings()


def refused(pod: dict[str, Any], settings: MutationSettings = DEFAULT) -> Refuse:
    decision = plan(pod, settings)
    assert isinstance(decision, Refuse), decision
    assert decision.reason in REFUSAL_REASONS
    return decision


# ----------------------------------------------------------------------------------- resource names
@pytest.mark.parametrize(
    ("typed", "meant"),
    [
        ("nvidia.com/gpumemory", MEM),
        ("nvidia.com/gpu-memory", MEM),
        ("nvidia.com/gpumem-percent", PCT),
        ("nvidia.com/gpucore", CORES),
        ("nvidia.com/gpus", GPU),
        ("nvidia.com/vgpu", GPU),
        ("nvidia.com/prority", "nvidia.com/priority"),
        ("hami.io/gpumem", MEM),  # HAMi's own namespace: the name exists, in nvidia.com/
    ],
)
def test_a_look_alike_resource_is_refused_with_a_did_you_mean(typed: str, meant: str) -> None:
    # next to a real card request (the "gpumemory got a whole card") and alone (never routed)
    for limits in ({GPU: "1", typed: "4000"}, {typed: "4000"}):
        decision = refused(make_pod(ctr("train", limits=limits)))
        assert decision.message == f'container "train": unknown resource {typed}; did you mean {meant}?'
        assert decision.code == 422 and decision.reason == "unknown_resource"


def test_a_typo_in_requests_or_an_init_container_counts_too() -> None:
    pod = make_pod(
        {"name": "app", "resources": {"requests": {"nvidia.com/gpumemory": "10"}}},
        init=(ctr("warm", limits={"nvidia.com/gpucore": "10"}),),
    )
    assert refused(pod).message == (
        'container "warm": unknown resource nvidia.com/gpucore; did you mean nvidia.com/gpucores?; '
        'container "app": unknown resource nvidia.com/gpumemory; did you mean nvidia.com/gpumem?'
    )


def test_an_unknown_hami_io_resource_names_what_exists() -> None:
    decision = refused(make_pod(ctr("train", limits={GPU: "1", "hami.io/slots": "2"})))
    assert decision.message == (
        'container "train": unknown resource hami.io/slots; the resources HAMi serves are nvidia.com/gpu, '
        "nvidia.com/gpumem, nvidia.com/gpumem-percentage, nvidia.com/gpucores, nvidia.com/priority"
    )


@pytest.mark.parametrize(
    "other",
    [
        "nvidia.com/mig-1g.10gb",  # NVIDIA's device plugin, MIG mixed strategy
        "nvidia.com/mig-3g.40gb.shared",
        "nvidia.com/gpu.shared",  # NVIDIA's time-slicing with renameByDefault
        "nvidia.com/hostdev",  # NVIDIA network operator (SR-IOV), often next to GPUs
        "nvidia.com/GA102GL_A10",  # KubeVirt's GPU passthrough plugin
        "example.com/gpumemory",  # another vendor's namespace is not ours to judge
        "cpu",
    ],
)
def test_other_device_plugins_resources_pass(other: str) -> None:
    assert isinstance(plan(make_pod(ctr(limits={GPU: "1", MEM: "1000", other: "1"})), DEFAULT), Admit)
    assert plan(make_pod(ctr(limits={other: "1"})), DEFAULT) == Admit(
        notes=("no container asks for a managed resource",)
    )


def test_configured_names_are_the_ones_checked() -> None:
    names = ResourceNames(
        count="hami.io/vgpu", memory="hami.io/vmem", memory_percentage="", cores="hami.io/vcores"
    )
    settings = MutationSettings(device=DeviceConfig(resources=names))
    assert isinstance(
        plan(make_pod(ctr(limits={"hami.io/vgpu": "1", "hami.io/vmem": "10"})), settings), Admit
    )
    decision = refused(make_pod(ctr("t", limits={"hami.io/vgpu": "1", "hami.io/vmemory": "10"})), settings)
    assert decision.message == 'container "t": unknown resource hami.io/vmemory; did you mean hami.io/vmem?'
    # with HAMi's names configured away, nvidia.com/ is NVIDIA's device plugin's: not judged
    for theirs in ({GPU: "1"}, {"hami.io/vgpu": "1", MEM: "10"}):
        assert isinstance(plan(make_pod(ctr(limits=theirs)), settings), Admit)


def test_pods_we_do_not_route_are_not_judged() -> None:
    typo = {GPU: "1", "nvidia.com/gpumemory": "4000"}
    assert isinstance(plan(make_pod(ctr(limits=typo), schedulerName="volcano"), DEFAULT), Admit)
    ignored = make_pod(ctr(limits=typo), labels={"hami.io/webhook": "ignore"})
    assert isinstance(plan(ignored, DEFAULT), Admit)


# ----------------------------------------------------------------------------------- annotation keys
@pytest.mark.parametrize(
    ("typed", "meant"),
    [
        ("nvidia.com/use-gpu-type", "nvidia.com/use-gputype"),
        ("nvidia.com/use-gpuuid", "nvidia.com/use-gpuuuid"),
        ("nvidia.com/nouse-gpu-type", "nvidia.com/nouse-gputype"),
        ("nvidia.com/numa_bind", "nvidia.com/numa-bind"),
        ("hami.io/gpu-schedule-policy", "hami.io/gpu-scheduler-policy"),
        ("hami.io/use-gputype", "nvidia.com/use-gputype"),
        ("nvidia.com/node-scheduler-policy", "hami.io/node-scheduler-policy"),
    ],
)
def test_a_look_alike_annotation_key_is_refused_with_a_did_you_mean(typed: str, meant: str) -> None:
    decision = refused(make_pod(ctr(limits={GPU: "1"}), annotations={typed: "A100"}))
    assert decision.message == f"annotation {typed} is not one HAMi reads; did you mean {meant}?"
    assert decision.code == 422 and decision.reason == "unknown_annotation"


def test_an_unknown_annotation_key_with_no_look_alike_lists_the_keys() -> None:
    decision = refused(make_pod(ctr(limits={GPU: "1"}), annotations={"hami.io/owner": "team-a"}))
    assert decision.message.startswith("annotation hami.io/owner is not one HAMi reads; the pod annotations ")
    assert (
        "nvidia.com/use-gputype" in decision.message and "hami.io/device-scoring-weights" in decision.message
    )


def test_the_webhook_label_as_an_annotation_is_pointed_at_labels() -> None:
    decision = refused(make_pod(ctr(limits={GPU: "1"}), annotations={"hami.io/webhook": "ignore"}))
    assert (
        decision.message
        == "annotation hami.io/webhook is a label, not an annotation; set it under metadata.labels"
    )


def test_known_and_foreign_annotations_pass() -> None:
    annotations = {
        "nvidia.com/use-gputype": "A100",
        "nvidia.com/vgpu-mode": "hami-core",
        "hami.io/gpu-scheduler-policy": "spread",
        "hami.io/use-xpu-uuid": "x",  # HAMi's steering keys of other vendors' devices
        "hami.io/no-use-Ascend910B2-uuid": "y",
        "example.com/use-gpu-type": "z",
        "kubectl.kubernetes.io/last-applied-configuration": "{}",
    }
    assert isinstance(plan(make_pod(ctr(limits={GPU: "1"}), annotations=annotations), DEFAULT), Admit)


def test_annotations_of_a_pod_without_cards_are_not_judged() -> None:
    pod = make_pod(ctr(limits={"cpu": "1"}), annotations={"nvidia.com/use-gpu-type": "A100"})
    assert plan(pod, DEFAULT) == Admit(notes=("no container asks for a managed resource",))


# ----------------------------------------------------------------------------------- zero cards
@pytest.mark.parametrize("other", [MEM, CORES, PCT])
def test_zero_cards_with_memory_or_cores_is_refused(other: str) -> None:
    decision = refused(make_pod(ctr("train", limits={GPU: "0", other: "10"})))
    assert decision.message == (
        f'container "train": {GPU} "0" with {other} "10" asks for a share of no card; '
        f"ask for 1 or more cards, or remove {other}"
    )
    assert decision.code == 422 and decision.reason == "zero_cards"


def test_zero_cards_alone_or_with_zero_shares_is_no_gpu() -> None:
    for limits in ({GPU: "0"}, {GPU: "0", MEM: "0"}):
        assert isinstance(plan(make_pod(ctr(limits=limits)), DEFAULT), Admit)


# ----------------------------------------------------------------------------------- did_you_mean
def test_did_you_mean_compares_names_within_their_namespace_part() -> None:
    ours = ("nvidia.com/gpu", "nvidia.com/gpumem", "nvidia.com/gpucores")
    assert did_you_mean("nvidia.com/gpumemory", ours) == "nvidia.com/gpumem"
    assert did_you_mean("hami.io/gpucore", ours) == "nvidia.com/gpucores"
    assert did_you_mean("nvidia.com/hostdev", ours) is None
    assert did_you_mean("nvidia.com/memory", ours) is None


# ----------------------------------------------------------------------------------- routing (CEL)
EXPRESSION = match_expression(ResourceNames(), "hami-scheduler")


@pytest.mark.parametrize(
    ("limits", "sent"),
    [
        ({"nvidia.com/gpumemory": "4000"}, True),
        ({"nvidia.com/gpumem-percent": "50"}, True),
        ({"hami.io/gpu": "1"}, True),
        ({"nvidia.com/mig-1g.10gb": "1"}, False),
        ({"nvidia.com/gpu.shared": "1"}, False),
        ({"nvidia.com/priority": "1"}, False),
        ({"example.com/gpumemory": "1"}, False),
        ({"cpu": "1"}, False),
    ],
)
def test_typo_pods_are_sent_to_the_webhook(limits: dict[str, str], sent: bool) -> None:
    assert cel.evaluate(EXPRESSION, {"object": make_pod(ctr(limits=limits))}) is sent
    in_requests = make_pod({"name": "a", "resources": {"requests": limits}})
    assert cel.evaluate(EXPRESSION, {"object": in_requests}) is sent
    ignored = make_pod(ctr(limits=limits), labels={"hami.io/webhook": "ignore"})
    assert cel.evaluate(EXPRESSION, {"object": ignored}) is False
