"""Hostile annotation values: every decoder lets only :class:`AnnotationError` escape (or nothing at all,
for the lenient ones), whatever the text: arbitrary text, numbers of thousands of digits (Python's
int-from-str limit), JSON nested thousands deep (the json module's RecursionError), huge exponents,
Unicode digits and oversized values. The bounds are documented in ``hami.annotations.limits``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from functools import partial
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hami.annotations import (
    NODE_DEVICE_CORDON,
    NODE_LOCK,
    NODE_PAIR_SCORES,
    NODE_REGISTER,
    POD_BIND_PHASE,
    POD_BIND_TIME,
    POD_DEVICES_ALLOCATED,
    POD_DEVICES_TO_ALLOCATE,
    POD_GPU_POLICY,
    POD_MIG_ALLOCATIONS,
    POD_NODE_POLICY,
    POD_NUMA_BIND,
    POD_SCORING_WEIGHTS,
    POD_VGPU_NODE,
    AnnotationError,
    HandshakeKind,
    decode_bind_phase,
    decode_cordon,
    decode_handshake,
    decode_mig_allocations,
    decode_node_devices,
    decode_node_devices_legacy,
    decode_node_lock,
    decode_numa_bind,
    decode_pair_scores,
    decode_pod_devices,
    decode_scoring_weights,
    decode_unix_time,
    pod_annotation_problems,
    read_bind_phase,
    read_bind_time,
    read_node,
    read_pod_devices,
    read_pod_mig_allocations,
    read_pod_request,
    read_pod_to_allocate,
    read_vgpu_node,
)
from hami.annotations.limits import MAX_JSON_DEPTH, MAX_JSON_INT_DIGITS, MAX_VALUE_LENGTH, load_json
from hami.annotations.podrequest import decode_gpu_policy, decode_node_policy
from hami.settings import DeviceConfig

CONFIG = DeviceConfig()
HOSTILE = settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large]
)

# ------------------------------------------------------------------------------------ hostile pieces

#: More digits than Python's int-from-str limit (4,300), as plain, signed and zero-padded numbers.
huge_digits = st.integers(min_value=4_301, max_value=9_000).flatmap(
    lambda n: st.sampled_from(["7" * n, "-" + "9" * n, "0" * n + "1", "1" + "0" * n])
)
#: Unicode decimal digits other than ASCII (Arabic-Indic, full-width, Devanagari, ...).
unicode_digits = st.text(
    alphabet=st.characters(categories=["Nd"], exclude_characters="0123456789"), min_size=1
)
#: Decimal exponents far beyond any quantity or integer.
huge_exponent = st.sampled_from(["1e10000000", "1E-10000000", "9e" + "9" * 5000, "1e4300", ".5e99999999"])
numbers = st.one_of(huge_digits, unicode_digits, huge_exponent, st.integers().map(str))


@st.composite
def deep_json(draw: st.DrawFn) -> str:
    """``[[[...]]]``, ``{"a":{"a":...}}`` or a mix, nested far beyond any real annotation."""
    depth = draw(st.integers(min_value=MAX_JSON_DEPTH + 1, max_value=60_000))
    shape = draw(st.sampled_from(["array", "object", "mixed"]))
    if shape == "array":
        return "[" * depth + "]" * depth
    if shape == "object":
        return '{"a":' * depth + "1" + "}" * depth
    return '[{"a":' * (depth // 2) + "null" + "}]" * (depth // 2)


def fill(templates: list[str], piece: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
    """Templates with every ``{}`` replaced by a hostile piece."""
    return st.tuples(st.sampled_from(templates), piece).map(lambda t: t[0].replace("{}", t[1]))


hostile_piece = st.one_of(numbers, deep_json(), st.text(max_size=40))
anything = st.one_of(st.text(), hostile_piece, st.just("x" * (MAX_VALUE_LENGTH + 1)))

REGISTER_JSON = [
    "{}",
    "[{}]",
    '[{"id":"GPU-0","count":{}}]',
    '[{"id":"GPU-0","devmem":{},"devcore":100}]',
    '[{"id":"GPU-0","index":{}}]',
    '[{"id":"GPU-0","count":10,"migProfiles":{}}]',
    '[{"id":"GPU-0","count":10,"migProfiles":[{"name":"1g.10gb","placements":{}}]}]',
    '[{"id":"GPU-0","count":10,"future":{}}]',
]
REGISTER_LEGACY = [
    "{}",
    "GPU-0,{},1000,100,NVIDIA,0,true:",
    "GPU-0,10,{},100,NVIDIA,0,true:",
    "GPU-0,10,1000,{},NVIDIA,0,true:",
    "GPU-0,10,1000,100,NVIDIA,{},true:",
    "GPU-0,10,1000,100,NVIDIA,0,{}:",
    "GPU-0,10,1000,100,NVIDIA,0,true,{},hami-core:",
]
SCORES = ["{}", '[{"uuid":"GPU-0","score":{}}]', '[{"uuid":"GPU-0","score":{"GPU-1":{}}}]']
DEVICES = ["{}", "GPU-0,NVIDIA,{},30:;", "GPU-0,NVIDIA,1000,{}:;", ";GPU-0,NVIDIA,{},{}:;;"]
MIG = [
    "{}",
    "[{}]",
    '[{"containerIndex":{},"deviceIndex":0,"gpuUUID":"g","profile":"1g","placement":{"start":0,"size":1}}]',
    '[{"containerIndex":0,"deviceIndex":0,"gpuUUID":"g","profile":"1g","placement":{}}]',
    '[{"containerIndex":0,"deviceIndex":0,"gpuUUID":"g","profile":"1g","placement":{"start":{},"size":1}}]',
]
WEIGHTS = ["{}", "slot={},core=1,memory=1", "slot=1,core={},memory={}", "slot=1,core=1,{}=1"]
LOCK = ["{}", "{},ns,pod", "2024-05-01T10:00:00.{}Z,ns,pod", "2024-05-01T10:00:00{},ns,pod"]
TIME = ["{}", "+{}", "-{}"]
HANDSHAKE = ["{}", "Requesting_{}", "Reported {}", "Deleted_{}", "Requesting_2024-05-01 10:00:00.{}"]


def only_annotation_errors(decode: Callable[[str], Any], text: str, *keys: str) -> None:
    """Run ``decode``; an AnnotationError naming one of ``keys`` with a reason is the documented
    refusal, anything else escaping fails the test."""
    try:
        decode(text)
    except AnnotationError as exc:
        assert exc.key in keys
        assert exc.reason


# -------------------------------------------------------------------------- one test per decoder


@HOSTILE
@given(text=st.one_of(anything, fill(REGISTER_JSON, hostile_piece), fill(REGISTER_LEGACY, hostile_piece)))
def test_registration_refuses_hostile_text_with_annotation_error(text: str) -> None:
    only_annotation_errors(decode_node_devices, text, NODE_REGISTER)


@HOSTILE
@given(text=st.one_of(anything, fill(REGISTER_LEGACY, hostile_piece)))
def test_legacy_registration_refuses_hostile_text_with_annotation_error(text: str) -> None:
    only_annotation_errors(decode_node_devices_legacy, text, NODE_REGISTER)


@HOSTILE
@given(text=st.one_of(anything, fill(SCORES, hostile_piece)))
def test_pair_scores_refuse_hostile_text_with_annotation_error(text: str) -> None:
    only_annotation_errors(decode_pair_scores, text, NODE_PAIR_SCORES)


@HOSTILE
@given(text=st.one_of(anything, fill(REGISTER_JSON + REGISTER_LEGACY + SCORES, hostile_piece)))
def test_read_node_refuses_hostile_annotations_with_annotation_error(text: str) -> None:
    valid = '[{"id":"GPU-0","count":10,"devmem":1000,"devcore":100}]'
    for key in (NODE_REGISTER, NODE_PAIR_SCORES, NODE_DEVICE_CORDON):

        def read(value: str, key: str = key) -> object:
            # the hostile text as the registration, or beside a valid registration
            return read_node("n1", {NODE_REGISTER: valid, key: value})

        only_annotation_errors(read, text, NODE_REGISTER, NODE_PAIR_SCORES)


@HOSTILE
@given(text=anything)
def test_cordon_never_raises(text: str) -> None:
    assert isinstance(decode_cordon(text), frozenset)


@HOSTILE
@given(text=st.one_of(anything, fill(DEVICES, hostile_piece)))
def test_pod_devices_refuse_hostile_text_with_annotation_error(text: str) -> None:
    for key in (POD_DEVICES_ALLOCATED, POD_DEVICES_TO_ALLOCATE):
        try:
            decode_pod_devices(text, key=key)
        except AnnotationError as exc:
            assert exc.key == key


@HOSTILE
@given(text=st.one_of(anything, fill(TIME, hostile_piece)))
def test_unix_time_refuses_hostile_text_with_annotation_error(text: str) -> None:
    only_annotation_errors(decode_unix_time, text, POD_BIND_TIME)


@HOSTILE
@given(text=anything)
def test_bind_phase_refuses_hostile_text_with_annotation_error(text: str) -> None:
    only_annotation_errors(decode_bind_phase, text, POD_BIND_PHASE)


@HOSTILE
@given(text=st.one_of(anything, fill(LOCK, hostile_piece)))
def test_node_lock_refuses_hostile_text_with_annotation_error(text: str) -> None:
    only_annotation_errors(decode_node_lock, text, NODE_LOCK)


@HOSTILE
@given(text=st.one_of(anything, fill(HANDSHAKE, hostile_piece)))
def test_handshake_never_raises(text: str) -> None:
    handshake = decode_handshake(text)
    assert handshake.kind in HandshakeKind


@HOSTILE
@given(text=st.one_of(anything, fill(MIG, hostile_piece)))
def test_mig_allocations_refuse_hostile_text_with_annotation_error(text: str) -> None:
    try:
        decode_mig_allocations(text)
    except AnnotationError as exc:
        assert exc.key == POD_MIG_ALLOCATIONS


@HOSTILE
@given(text=st.one_of(anything, fill(WEIGHTS, hostile_piece)))
def test_scoring_weights_refuse_hostile_text_with_annotation_error(text: str) -> None:
    only_annotation_errors(decode_scoring_weights, text, POD_SCORING_WEIGHTS)


@HOSTILE
@given(text=anything)
def test_steering_annotations_refuse_hostile_text_with_annotation_error(text: str) -> None:
    assert decode_numa_bind(text) in (True, False)  # lenient: never raises
    assert decode_node_policy(text) in (None, text.strip())
    assert decode_gpu_policy(text) in (None, text.strip())
    for key, strict in (
        (POD_NUMA_BIND, decode_numa_bind),
        (POD_NODE_POLICY, decode_node_policy),
        (POD_GPU_POLICY, decode_gpu_policy),
    ):
        only_annotation_errors(partial(strict, strict=True), text, key)
    pod = {"metadata": {"annotations": {k: text for k in (POD_NUMA_BIND, POD_NODE_POLICY, POD_GPU_POLICY)}}}
    pod["metadata"]["annotations"][POD_SCORING_WEIGHTS] = text
    assert all(isinstance(problem, AnnotationError) for problem in pod_annotation_problems(pod))


@HOSTILE
@given(
    quantity=st.one_of(anything, numbers, fill(["{}", "{}Mi", "{}e3", "1e{}", "{}.5", "0.{}"], numbers)),
    text=st.one_of(anything, fill(WEIGHTS, hostile_piece)),
)
def test_pod_request_refuses_hostile_values_with_annotation_error(quantity: str, text: str) -> None:
    resources = {name: quantity for name in ("nvidia.com/gpu", "nvidia.com/gpumem", "nvidia.com/gpucores")}
    pod = {
        "metadata": {"namespace": "ml", "name": "p", "annotations": {POD_SCORING_WEIGHTS: text}},
        "spec": {"containers": [{"name": "c", "resources": {"limits": resources}}]},
    }
    try:
        read_pod_request(pod, CONFIG)
    except AnnotationError as exc:
        assert exc.key == POD_SCORING_WEIGHTS


# -------------------------------------------------------------------------------------- the bounds


@pytest.mark.parametrize(
    ("decode", "key"),
    [
        (decode_node_devices, NODE_REGISTER),
        (decode_pair_scores, NODE_PAIR_SCORES),
        (decode_mig_allocations, POD_MIG_ALLOCATIONS),
    ],
)
def test_json_nested_deeper_than_the_bound_is_refused_before_decoding(
    decode: Callable[[str], Any], key: str
) -> None:
    deep = "[" * (MAX_JSON_DEPTH + 1) + "]" * (MAX_JSON_DEPTH + 1)
    with pytest.raises(AnnotationError, match=f"nested deeper than {MAX_JSON_DEPTH}") as caught:
        decode(deep)
    assert caught.value.key == key
    # brackets inside strings are text, not nesting
    decode_pair_scores('[{"uuid":"' + "[" * 5000 + '","score":{}}]')


@pytest.mark.parametrize("digits", [MAX_JSON_INT_DIGITS + 1, MAX_JSON_INT_DIGITS + 2, 200])
def test_an_integer_literal_one_digit_past_the_bound_is_refused(digits: int) -> None:
    """The bound holds to the digit, signed or not, wherever the number sits (texts with no literal that
    long are decoded without a check per number)."""
    for number in ("9" * digits, "-" + "1" * digits):
        with pytest.raises(AnnotationError, match=f"a number of {digits} digits"):
            load_json(NODE_REGISTER, f'[{{"uuid":"GPU-0","count":{number}}}]')
    assert load_json(NODE_REGISTER, f'[{{"count":{"9" * MAX_JSON_INT_DIGITS},"uuid":"{"1" * digits}"}}]') == [
        {"count": int("9" * MAX_JSON_INT_DIGITS), "uuid": "1" * digits}
    ]
    # as deep as the bound, however many brackets its strings hold, is read
    assert load_json(NODE_REGISTER, "[" * MAX_JSON_DEPTH + '"{{"' + "]" * MAX_JSON_DEPTH) is not None


@pytest.mark.parametrize(
    "decode",
    [decode_node_devices, decode_pair_scores, decode_mig_allocations, decode_pod_devices, decode_node_lock],
)
def test_values_longer_than_the_bound_are_refused(decode: Callable[[str], Any]) -> None:
    with pytest.raises(AnnotationError, match="longer than"):
        decode("[" + " " * MAX_VALUE_LENGTH + "]")


def test_a_huge_number_is_refused_quickly_naming_the_field() -> None:
    started = time.process_time()  # CPU time: a parallel test run on the same cores does not count
    with pytest.raises(AnnotationError, match="devmem"):
        decode_node_devices_legacy(f"GPU-0,10,{'9' * 200_000},100,NVIDIA,0,true:")
    with pytest.raises(AnnotationError, match="does not fit"):
        decode_node_devices('[{"id":"GPU-0","devmem":' + "9" * 5000 + "}]")
    with pytest.raises(AnnotationError, match="memory"):
        decode_pod_devices(f"GPU-0,NVIDIA,{'1' * 200_000},30:;")
    assert time.process_time() - started < 1.0


def test_zero_padding_is_still_read_like_go() -> None:
    """Go's ParseInt accepts any number of leading zeros; the digit bound counts significant digits."""
    (device,) = decode_node_devices_legacy(f"GPU-0,{'0' * 5000}10,1000,100,NVIDIA,0,true:")
    assert device.count == 10


def test_duplicate_card_ids_refuse_the_registration() -> None:
    cards = '[{"id":"GPU-0","count":10},{"id":"GPU-1","count":10},{"id":"GPU-0","count":10}]'
    with pytest.raises(AnnotationError, match="duplicate card id 'GPU-0'") as caught:
        decode_node_devices(cards)
    assert caught.value.key == NODE_REGISTER
    legacy = "GPU-0,10,1000,100,NVIDIA,0,true:GPU-0,10,1000,100,NVIDIA,0,true:"
    with pytest.raises(AnnotationError, match="duplicate card id 'GPU-0'"):
        decode_node_devices_legacy(legacy)
    with pytest.raises(AnnotationError, match="GPU-0"):
        read_node("n1", {NODE_REGISTER: cards})


# ------------------------------------------------------------------------- hostile object shapes

#: Any JSON value: what a test server, a manifest file or a hostile request may hold where a well-formed
#: object has metadata, annotations, a spec, containers or resources.
any_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=8,
)
SHAPE_PLACES = (
    "metadata",
    "annotations",
    "an annotation",
    "name",
    "spec",
    "containers",
    "container",
    "resources",
)


def hostile_shape(place: str, value: Any) -> dict[str, Any]:
    """A well-formed GPU pod with ``value`` put at ``place``."""
    annotations: dict[str, Any] = {POD_DEVICES_ALLOCATED: "GPU-0,NVIDIA,1000,30:;", POD_NUMA_BIND: "true"}
    container: dict[str, Any] = {"name": "c", "resources": {"limits": {"nvidia.com/gpu": "1"}}}
    pod: dict[str, Any] = {
        "metadata": {"namespace": "ml", "name": "p", "annotations": annotations},
        "spec": {"containers": [container]},
    }
    if place in ("metadata", "spec"):
        pod[place] = value
    elif place == "annotations":
        pod["metadata"]["annotations"] = value
    elif place == "an annotation":
        for key in (POD_DEVICES_ALLOCATED, POD_NUMA_BIND, POD_BIND_PHASE, POD_BIND_TIME, POD_MIG_ALLOCATIONS):
            annotations[key] = value
        annotations[POD_DEVICES_TO_ALLOCATE] = value
    elif place == "name":
        pod["metadata"]["name"] = value
    elif place == "containers":
        pod["spec"]["containers"] = value
    elif place == "container":
        pod["spec"]["containers"] = [value]
    else:
        container["resources"] = value
    return pod


@pytest.mark.parametrize(
    "pod",
    [
        {"metadata": "p", "spec": {"containers": [{"name": "c"}]}},
        {"metadata": ["p"], "spec": {"containers": [{"name": "c"}]}},
        {"metadata": {"name": "p"}, "spec": "containers"},
        {"metadata": {"name": "p"}, "spec": ["containers"]},
    ],
    ids=["metadata-text", "metadata-list", "spec-text", "spec-list"],
)
def test_pod_request_reads_a_metadata_or_spec_that_is_not_an_object_as_absent(pod: dict[str, Any]) -> None:
    request = read_pod_request(pod, CONFIG)
    assert request.containers in ((), (None,))
    assert (request.namespace, request.uid) == ("", "")


def test_annotation_values_that_are_not_text_read_as_absent() -> None:
    # kube-apiserver stores only strings; a test server or a hand-built dict may hold a number
    pod = {
        "metadata": {
            "annotations": {
                POD_DEVICES_ALLOCATED: 5,
                POD_NUMA_BIND: 1,
                POD_VGPU_NODE: ["n1"],
                POD_BIND_PHASE: 0,
            }
        }
    }
    assert read_pod_devices(pod) is None
    assert read_vgpu_node(pod) is None
    assert read_bind_phase(pod) is None
    assert pod_annotation_problems(pod) == ()
    assert read_pod_request(pod, CONFIG).numa_bind is False


@HOSTILE
@given(place=st.sampled_from(SHAPE_PLACES), value=any_json)
def test_whole_pod_readers_let_only_annotation_errors_escape_whatever_the_shape(
    place: str, value: Any
) -> None:
    pod = hostile_shape(place, value)
    readers: list[Callable[[Any], Any]] = [
        partial(read_pod_request, config=CONFIG),
        pod_annotation_problems,
        read_pod_devices,
        read_pod_to_allocate,
        read_pod_mig_allocations,
        read_bind_phase,
        read_bind_time,
        read_vgpu_node,
    ]
    for read in readers:
        try:
            read(pod)
        except AnnotationError as exc:
            assert exc.reason
