"""The pod's enforcement annotations and the node's as the scheduler reads it: ``hami.io/vgpu-enforcement``
(round trip, strict errors naming its key), ``hami.io/require-enforcement`` (level words; blank is no
requirement; anything else an error, never "no requirement") and ``read_node``'s per-card enforcement
(a card the node does not list, a missing or unreadable annotation: ``none``, never an exclusion)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hami.annotations import (
    NODE_ENFORCEMENT,
    NODE_REGISTER,
    POD_REQUIRE_ENFORCEMENT,
    POD_VGPU_ENFORCEMENT,
    AnnotationError,
    Enforcement,
    decode_pod_enforcement,
    decode_require_enforcement,
    encode_node_devices,
    encode_pod_enforcement,
    pod_annotation_problems,
    read_card_enforcement,
    read_node,
    read_pod_request,
)
from hami.core.enforcement import Level
from hami.core.model import Device
from hami.settings import DeviceConfig

UUIDS = st.text(st.characters(min_codepoint=0x21, max_codepoint=0x7E, exclude_characters=",:"), min_size=1)


@given(st.dictionaries(UUIDS, st.sampled_from(list(Enforcement)), max_size=8))
def test_pod_enforcement_round_trips(cards: dict[str, Enforcement]) -> None:
    text = encode_pod_enforcement(cards)
    decoded = decode_pod_enforcement(text)
    assert decoded == cards and list(decoded) == list(cards)


@pytest.mark.parametrize(
    "text", ["GPU-a", "GPU-a:strong", "GPU-a:none,GPU-a:mig", ":none", "GPU-a:none\nGPU-b:none", "x" * 70_000]
)
def test_pod_enforcement_errors_name_its_own_key(text: str) -> None:
    with pytest.raises(AnnotationError) as caught:
        decode_pod_enforcement(text)
    assert caught.value.key == POD_VGPU_ENFORCEMENT


@pytest.mark.parametrize(
    ("text", "level"),
    [(None, None), ("", None), ("  ", None), ("none", Level.NONE), ("cooperative", Level.COOPERATIVE),
     (" isolated ", Level.ISOLATED)],
)  # fmt: skip
def test_require_enforcement_words(text: str | None, level: Level | None) -> None:
    assert decode_require_enforcement(text) is level


@pytest.mark.parametrize(
    "text",
    [
        "Isolated",
        "strong",
        "hami-core",
        "1",
        "cooperative,isolated",
        "none\x00",
        "\u202eisolated",
        "x" * 70_000,
    ],
)
def test_an_unreadable_requirement_is_an_error_naming_the_key(text: str) -> None:
    with pytest.raises(AnnotationError) as caught:
        decode_require_enforcement(text)
    assert caught.value.key == POD_REQUIRE_ENFORCEMENT and caught.value.text == text
    if len(text) < 100:
        assert "expected none, cooperative, isolated" in str(caught.value)


def gpu_pod(annotations: dict[str, str]) -> dict[str, object]:
    return {
        "metadata": {"name": "p", "namespace": "ns", "annotations": annotations},
        "spec": {"containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]},
    }


def test_the_pod_request_carries_the_level_and_refuses_an_unreadable_one() -> None:
    config = DeviceConfig()
    assert read_pod_request(gpu_pod({}), config).enforcement is Level.NONE
    pod = gpu_pod({POD_REQUIRE_ENFORCEMENT: "isolated"})
    assert read_pod_request(pod, config).enforcement is Level.ISOLATED
    assert pod_annotation_problems(pod) == ()
    bad = gpu_pod({POD_REQUIRE_ENFORCEMENT: "strict"})
    with pytest.raises(AnnotationError) as caught:
        read_pod_request(bad, config)
    assert caught.value.key == POD_REQUIRE_ENFORCEMENT
    (problem,) = pod_annotation_problems(bad)
    assert problem.key == POD_REQUIRE_ENFORCEMENT and '"strict"' in str(problem)


def card(uuid: str) -> Device:
    return Device(uuid=uuid, count=10, memory_mib=1000, cores=100, type="NVIDIA A10", health=True)


REGISTER = encode_node_devices([card("GPU-a"), card("GPU-b")])


@pytest.mark.parametrize(
    ("text", "expected", "error"),
    [
        (None, ["none", "none"], False),
        ("GPU-a:hami-core,GPU-b:mig", ["hami-core", "mig"], False),
        ("GPU-b:hami-core", ["none", "hami-core"], False),  # a card not listed: none
        ("GPU-z:hami-core", ["none", "none"], False),  # a card not registered: ignored
        ("GPU-a:strong", ["none", "none"], True),  # unreadable: every card none, the error returned
        ("GPU-a:hami-core,GPU-a:hami-core", ["none", "none"], True),
        ("", ["none", "none"], False),
    ],
)
def test_read_node_gives_each_card_its_enforcement(
    text: str | None, expected: list[str], error: bool
) -> None:
    annotations = {NODE_REGISTER: REGISTER} | ({} if text is None else {NODE_ENFORCEMENT: text})
    node = read_node("n1", annotations)  # never raises for the enforcement
    assert [state.device.enforcement.value for state in node.devices] == expected
    _, problem = read_card_enforcement(annotations)
    assert (problem is not None) is error
    if problem is not None:
        assert problem.key == NODE_ENFORCEMENT
