"""read_pod_request: containers init-first, steering annotations (docs/protocol.md, "Steering"), scoring
weights (docs/protocol.md, "Scoring")."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hami.annotations import (
    POD_GPU_POLICY,
    POD_NODE_POLICY,
    POD_NOUSE_GPUTYPE,
    POD_NOUSE_GPUUUID,
    POD_NUMA_BIND,
    POD_SCORING_WEIGHTS,
    POD_USE_GPUTYPE,
    POD_USE_GPUUUID,
    POD_VGPU_MODE,
    AnnotationError,
    decode_numa_bind,
    decode_scoring_weights,
    encode_scoring_weights,
    parse_pod_containers,
    pod_annotation_problems,
    read_pod_request,
)
from hami.annotations.podrequest import GPU_POLICIES, NODE_POLICIES, decode_gpu_policy, decode_node_policy
from hami.core import score
from hami.core.model import ContainerRequest, ScoringWeights
from hami.settings import DeviceConfig

CONFIG = DeviceConfig()


def make_pod(
    *,
    app: list[dict[str, Any]],
    init: list[dict[str, Any]] | None = None,
    annotations: dict[str, str] | None = None,
) -> dict[str, Any]:
    return {
        "metadata": {"namespace": "ml", "name": "train", "uid": "u-1", "annotations": annotations or {}},
        "spec": {"initContainers": init or [], "containers": app},
    }


def container(
    name: str, limits: dict[str, Any] | None = None, requests: dict[str, Any] | None = None
) -> dict[str, Any]:
    return {"name": name, "resources": {"limits": limits or {}, "requests": requests or {}}}


def test_init_containers_come_first_and_gpu_less_ones_are_none() -> None:
    pod = make_pod(
        init=[container("setup", {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "1000"}), container("wait")],
        app=[container("main", {"nvidia.com/gpu": 2, "nvidia.com/gpucores": "30"}), {"name": "sidecar"}],
    )
    request = read_pod_request(pod, CONFIG)
    assert (request.namespace, request.name, request.uid, request.init_count) == ("ml", "train", "u-1", 2)
    assert request.containers == (
        ContainerRequest(nums=1, memory_mib=1000),
        None,
        ContainerRequest(nums=2, percentage=100, cores=30),  # plain number in a hand-built dict still parses
        None,
    )
    assert request.has_devices
    assert [p.name for p in parse_pod_containers(pod, CONFIG)] == ["setup", "wait", "main", "sidecar"]


def test_steering_annotations_are_split_trimmed_and_blank_means_no_constraint() -> None:
    pod = make_pod(
        app=[container("main", {"nvidia.com/gpu": "1"})],
        annotations={
            POD_USE_GPUTYPE: " A100, ,H100 ",
            POD_NOUSE_GPUTYPE: "   ",
            POD_USE_GPUUUID: "GPU-0",
            POD_NOUSE_GPUUUID: "GPU-1 ,GPU-2",
            POD_NUMA_BIND: "t",
            POD_VGPU_MODE: "hami-core",
            POD_GPU_POLICY: " binpack,numa ",
            POD_NODE_POLICY: "",
            POD_SCORING_WEIGHTS: "memory=2, slot=0 ,core=1",
        },
    )
    request = read_pod_request(pod, CONFIG)
    assert request.use_types == ("A100", "H100")
    assert request.nouse_types == ()
    assert request.use_uuids == ("GPU-0",)
    assert request.nouse_uuids == ("GPU-1", "GPU-2")
    assert request.numa_bind is True
    assert request.vgpu_mode == "hami-core"
    assert request.gpu_policy == "binpack,numa"
    assert request.node_policy is None
    assert request.weights == ScoringWeights(slot=0, core=1, memory=2)


def test_a_pod_without_annotations_or_devices() -> None:
    request = read_pod_request({"metadata": {"name": "p"}, "spec": {"containers": [{"name": "c"}]}}, CONFIG)
    assert request.containers == (None,)
    assert not request.has_devices
    assert (request.namespace, request.uid, request.vgpu_mode, request.gpu_policy) == ("", "", None, None)
    assert request.weights == ScoringWeights()
    assert request.numa_bind is False


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("1", True),
        ("t", True),
        ("T", True),
        ("TRUE", True),
        ("true", True),
        ("True", True),
        ("0", False),
        ("f", False),
        ("F", False),
        ("FALSE", False),
        ("false", False),
        ("False", False),
    ],
)
def test_numa_bind_parses_like_go(text: str, expected: bool) -> None:
    assert decode_numa_bind(text, strict=True) is expected


@pytest.mark.parametrize("text", ["yes", "tRUE", " true", "2", "", " "])
def test_numa_bind_unreadable_is_false_for_the_scheduler_and_an_error_for_the_webhook(text: str) -> None:
    assert decode_numa_bind(text) is False
    with pytest.raises(AnnotationError) as caught:
        decode_numa_bind(text, strict=True)
    assert (caught.value.key, caught.value.text) == (POD_NUMA_BIND, text)
    problems = pod_annotation_problems(make_pod(app=[], annotations={POD_NUMA_BIND: text}))
    # blank means the default (false) for admission, like every other steering annotation
    assert [p.key for p in problems] == ([POD_NUMA_BIND] if text.strip() else [])


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("slot=1,core=1", "expected slot, core, and memory weights"),
        ("slot=1,core=1,memory=1,extra=1", "expected slot, core, and memory weights"),
        ("slot=1,core=1,memory", "expected key=value entries"),
        ("slot=1,core=x,memory=1", '"core" weight must be an integer'),
        ("slot=1,core=1.5,memory=1", '"core" weight must be an integer'),
        ("slot=-1,core=1,memory=1", '"slot" weight must not be negative'),
        ("slot=1,cores=1,memory=1", 'unknown weight "cores"'),
        ("slot=1,slot=2,memory=1", 'duplicate "slot" weight'),
        ("slot=0,core=0,memory=0", "at least one weight must be positive"),
        # HAMi checks the value (integer, sign) before it looks at the key's name
        ("slot=1,core=1,mem=x", '"mem" weight must be an integer'),
        ("slot=1,core=1,mem=-1", '"mem" weight must not be negative'),
        ("slot=1,slot=x,memory=1", 'duplicate "slot" weight'),
    ],
)
def test_scoring_weight_errors_use_hamis_texts(text: str, reason: str) -> None:
    with pytest.raises(AnnotationError) as caught:
        decode_scoring_weights(text)
    assert (caught.value.key, caught.value.text, caught.value.reason) == (POD_SCORING_WEIGHTS, text, reason)
    pod = make_pod(app=[container("main", {"nvidia.com/gpu": "1"})], annotations={POD_SCORING_WEIGHTS: text})
    with pytest.raises(AnnotationError):
        read_pod_request(pod, CONFIG)
    assert [p.key for p in pod_annotation_problems(pod)] == [POD_SCORING_WEIGHTS]


def test_scoring_weights_defaults() -> None:
    assert decode_scoring_weights(None) == ScoringWeights(slot=1, core=1, memory=1)
    assert decode_scoring_weights("  ") == ScoringWeights()
    assert decode_scoring_weights("core=+3,memory=0,slot=0") == ScoringWeights(slot=0, core=3, memory=0)
    assert pod_annotation_problems(make_pod(app=[])) == ()


_weight = st.integers(min_value=0, max_value=2**40)


@given(
    st.builds(ScoringWeights, slot=_weight, core=_weight, memory=_weight).filter(
        lambda w: w.slot or w.core or w.memory
    )
)
def test_scoring_weights_round_trip(weights: ScoringWeights) -> None:
    assert decode_scoring_weights(encode_scoring_weights(weights)) == weights


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (None, None),
        ("", None),
        ("  ", None),
        ("spread", "spread"),
        (" binpack ", "binpack"),
        ("fragmentation", "fragmentation"),
    ],
)
def test_node_policy_trimmed_blank_is_the_default(text: str | None, expected: str | None) -> None:
    assert decode_node_policy(text, strict=True) == expected


@pytest.mark.parametrize("text", ["pack", "Spread", "binpack,spread", "numa"])
def test_unknown_node_policy_passes_for_the_scheduler_and_is_an_error_for_the_webhook(text: str) -> None:
    assert decode_node_policy(text) == text  # HAMi binpacks on it; the scheduler does the same
    with pytest.raises(AnnotationError) as caught:
        decode_node_policy(text, strict=True)
    assert (caught.value.key, caught.value.text) == (POD_NODE_POLICY, text)
    assert str(caught.value) == (
        f'{POD_NODE_POLICY} "{text}": unknown node policy; expected binpack, spread or fragmentation'
    )
    pod = make_pod(app=[container("main", {"nvidia.com/gpu": "1"})], annotations={POD_NODE_POLICY: text})
    assert read_pod_request(pod, CONFIG).node_policy == text
    assert [p.key for p in pod_annotation_problems(pod)] == [POD_NODE_POLICY]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (" ", None),
        ("binpack", "binpack"),
        ("spread", "spread"),
        ("mutex", "mutex"),
        ("topology-aware", "topology-aware"),
        ("numa", "numa"),
        (" binpack , numa ", "binpack , numa"),
        ("spread,numa,", "spread,numa,"),
        ("mutex,binpack,mutex", "mutex,binpack,mutex"),
        (" fragmentation ", "fragmentation"),
    ],
)
def test_gpu_policy_known_entries(text: str, expected: str | None) -> None:
    assert decode_gpu_policy(text, strict=True) == expected


@pytest.mark.parametrize(
    ("text", "unknown"),
    [
        ("binpak", 'unknown GPU policy "binpak"'),
        ("Binpack", 'unknown GPU policy "Binpack"'),
        ("binpack,topology , NUMA", 'unknown GPU policies "topology", "NUMA"'),
        (",", "names no policy"),
        ("fragmentation,numa", '"fragmentation" combined'),  # no key of a card-order chain
    ],
)
def test_unknown_gpu_policy_passes_for_the_scheduler_and_is_an_error_for_the_webhook(
    text: str, unknown: str
) -> None:
    assert decode_gpu_policy(text) == text.strip()
    with pytest.raises(AnnotationError) as caught:
        decode_gpu_policy(text, strict=True)
    assert (caught.value.key, caught.value.text) == (POD_GPU_POLICY, text)
    assert caught.value.reason == (
        f"{unknown}; expected binpack, spread, mutex, topology-aware or numa, or a comma list of them, "
        "or fragmentation alone"
    )


def test_the_accepted_gpu_policies_are_the_ones_the_scheduler_knows() -> None:
    assert set(GPU_POLICIES) == {
        score.BINPACK,
        score.SPREAD,
        score.MUTEX,
        score.TOPOLOGY,
        score.NUMA,
        score.FRAGMENTATION,
    }
    assert set(NODE_POLICIES) == {score.BINPACK, score.SPREAD, score.FRAGMENTATION}
    with pytest.raises(AnnotationError) as caught:
        decode_gpu_policy("x", strict=True)
    accepted = caught.value.reason.partition("expected ")[2]
    assert [policy for policy in GPU_POLICIES if policy not in accepted] == []


def test_every_problem_is_reported_in_spec_order_and_says_what_is_accepted() -> None:
    pod = make_pod(
        app=[container("main", {"nvidia.com/gpu": "1"})],
        annotations={
            POD_SCORING_WEIGHTS: "slot=1",
            POD_GPU_POLICY: "pack",
            POD_NODE_POLICY: "pack",
            POD_NUMA_BIND: "yes",
            POD_USE_GPUTYPE: ",,",  # lists are never wrong
        },
    )
    problems = pod_annotation_problems(pod)
    assert [(p.key, p.text) for p in problems] == [
        (POD_NUMA_BIND, "yes"),
        (POD_NODE_POLICY, "pack"),
        (POD_GPU_POLICY, "pack"),
        (POD_SCORING_WEIGHTS, "slot=1"),
    ]
    assert problems[0].reason.startswith("expected true or false")
    # the weights keep HAMi's reason and add the accepted form
    assert problems[3].reason == (
        "expected slot, core, and memory weights; accepted: slot=<n>,core=<n>,memory=<n> in any order, "
        "non-negative integers, at least one positive"
    )
