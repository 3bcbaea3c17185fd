"""Node registration (JSON and legacy colon form), pair scores, cordon, read_node
(docs/annotations.md, "Node annotations")."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hami.annotations import (
    MISSING_REGISTER,
    NO_GPU,
    NODE_DEVICE_CORDON,
    NODE_PAIR_SCORES,
    NODE_REGISTER,
    AnnotationError,
    decode_cordon,
    decode_node_devices,
    decode_node_devices_legacy,
    decode_pair_scores,
    encode_cordon,
    encode_node_devices,
    encode_node_devices_legacy,
    encode_pair_scores,
    read_node,
)
from hami.core.model import Device, DeviceState, MigPlacement, MigProfile

A100 = Device(
    uuid="GPU-0",
    index=0,
    count=10,
    memory_mib=40960,
    cores=100,
    type="NVIDIA A100-SXM4-40GB",
    numa=0,
    mode="hami-core",
    health=True,
)
MIG_CARD = Device(
    uuid="GPU-1",
    index=1,
    count=7,
    memory_mib=40960,
    cores=100,
    type="NVIDIA A100-SXM4-40GB",
    numa=1,
    mode="mig",
    health=True,
    mig_profiles=(
        MigProfile(
            name="1g.5gb",
            memory_mib=4864,
            cores=15,
            slice_count=1,
            placements=(MigPlacement(start=0, size=1), MigPlacement(start=6, size=1)),
        ),
    ),
)


def test_json_golden_omits_zero_false_and_empty_keys() -> None:
    assert encode_node_devices([A100]) == (
        '[{"id":"GPU-0","count":10,"devmem":40960,"devcore":100,"type":"NVIDIA A100-SXM4-40GB",'
        '"mode":"hami-core","health":true}]'
    )
    bare = Device(uuid="GPU-9", count=0, memory_mib=0, cores=0, type="")
    assert encode_node_devices([bare]) == '[{"id":"GPU-9"}]'
    assert encode_node_devices([MIG_CARD]) == (
        '[{"id":"GPU-1","index":1,"count":7,"devmem":40960,"devcore":100,"type":"NVIDIA A100-SXM4-40GB",'
        '"numa":1,"mode":"mig","migProfiles":[{"name":"1g.5gb","memoryMB":4864,"core":15,"sliceCount":1,'
        '"placements":[{"start":0,"size":1},{"start":6,"size":1}]}],"health":true}]'
    )


def test_json_missing_keys_read_as_zero_and_unknown_keys_are_ignored() -> None:
    text = '[{"id":"GPU-0","devmem":1024,"future":{"x":1},"customInfo":null},{"ID":"GPU-1","Health":true}]'
    assert decode_node_devices(text) == (
        Device(uuid="GPU-0", count=0, memory_mib=1024, cores=0, type=""),
        Device(
            uuid="GPU-1", count=0, memory_mib=0, cores=0, type="", health=True
        ),  # key case ignored, like Go
    )


def test_json_duplicate_keys_in_any_case_the_later_one_wins_like_go() -> None:
    # Go assigns keys in document order, matching a field exactly or case-insensitively alike
    card = '"count":1,"devmem":1,"devcore":1,"type":"NVIDIA"'
    assert decode_node_devices(f'[{{"id":"GPU-0","ID":"GPU-1",{card}}}]')[0].uuid == "GPU-1"
    assert decode_node_devices(f'[{{"ID":"GPU-1","id":"GPU-0",{card}}}]')[0].uuid == "GPU-0"


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("[]", NO_GPU),
        ("null", NO_GPU),
        ("[{", "invalid JSON"),
        ('{"id":"GPU-0"}', "the registration must be an array, got object"),
        ("[1]", "card 0: a card must be an object"),
        ('[{"count":1}]', "card 0: 'id' is missing or empty"),
        ('[{"id":"a","count":"10"}]', "card 0: 'count' must be an integer, got string '10'"),
        ('[{"id":"a","devmem":1.5}]', "'devmem' must be an integer, got number 1.5"),
        ('[{"id":"a","devmem":4294967296}]', "'devmem' 4294967296 does not fit in 32 bits"),
        ('[{"id":"a","index":-1}]', "'index' must be at least 0, got -1"),
        ('[{"id":"a","health":"true"}]', "'health' must be true or false"),
        ('[{"id":"a","count":true}]', "'count' must be an integer, got boolean"),
        ('[{"id":"a"},{"id":"b","type":7}]', "card 1: 'type' must be a string, got number 7"),
        ('[{"id":"a","migProfiles":[{"memoryMB":1}]}]', "'name' is missing or empty"),
        ('[{"id":"a","migProfiles":{}}]', "'migProfiles' must be an array"),
    ],
)
def test_json_errors_name_the_key_and_the_text(text: str, reason: str) -> None:
    with pytest.raises(AnnotationError) as caught:
        decode_node_devices(text)
    assert (caught.value.key, caught.value.text) == (NODE_REGISTER, text)
    assert reason in caught.value.reason
    assert NODE_REGISTER in str(caught.value)


_text = st.text(st.characters(codec="utf-8"), max_size=10)
_nonneg32 = st.integers(min_value=0, max_value=2**31 - 1)
_placement = st.builds(MigPlacement, start=_nonneg32, size=_nonneg32)
_profile = st.builds(
    MigProfile,
    name=_text.filter(bool),
    memory_mib=_nonneg32,
    cores=_nonneg32,
    slice_count=_nonneg32,
    placements=st.lists(_placement, max_size=3).map(tuple),
)
_device = st.builds(
    Device,
    uuid=_text.filter(bool),
    index=st.integers(min_value=0, max_value=2**40),
    count=_nonneg32,
    memory_mib=_nonneg32,
    cores=_nonneg32,
    type=_text,
    numa=st.integers(min_value=-(2**40), max_value=2**40),
    mode=_text,
    health=st.booleans(),
    mig_profiles=st.lists(_profile, max_size=2).map(tuple),
)


@given(st.lists(_device, min_size=1, max_size=5, unique_by=lambda d: d.uuid))
def test_json_round_trip(devices: list[Device]) -> None:
    assert decode_node_devices(encode_node_devices(devices)) == tuple(devices)


# ------------------------------------------------------------------------------------- legacy colon form


def test_legacy_seven_and_nine_field_forms() -> None:
    seven = "GPU-0,10,32768,100,NVIDIA-Tesla V100,0,true:GPU-1,10,32768,100,NVIDIA-Tesla V100,1,false:"
    assert decode_node_devices(seven) == (
        Device(
            uuid="GPU-0",
            index=0,
            count=10,
            memory_mib=32768,
            cores=100,
            type="NVIDIA-Tesla V100",
            numa=0,
            mode="hami-core",
            health=True,
        ),
        Device(
            uuid="GPU-1",
            index=0,
            count=10,
            memory_mib=32768,
            cores=100,
            type="NVIDIA-Tesla V100",
            numa=1,
            mode="hami-core",
            health=False,
        ),
    )
    nine = "GPU-0,10,32768,100,NVIDIA-Tesla V100,0,1,3,mig:"
    assert decode_node_devices(nine) == (
        Device(
            uuid="GPU-0",
            index=3,
            count=10,
            memory_mib=32768,
            cores=100,
            type="NVIDIA-Tesla V100",
            numa=0,
            mode="mig",
            health=True,
        ),
    )
    assert (
        encode_node_devices_legacy(decode_node_devices(nine))
        == "GPU-0,10,32768,100,NVIDIA-Tesla V100,0,true,3,mig:"
    )


@pytest.mark.parametrize("text", [":", "::", "GPU-0,10,1,100,NVIDIA,0,true::"])
def test_legacy_empty_segments_are_skipped(text: str) -> None:
    assert len(decode_node_devices_legacy(text)) == text.count(",") // 6


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("GPU-0,10,1,100,NVIDIA,0,true", "node annotation missing device separator"),
        ("", "node annotation missing device separator"),
        ("GPU-0:", 'malformed node annotation segment: "GPU-0"'),
        ("GPU-0,10,1,100,NVIDIA,0:", "unexpected field count 6 in node annotation"),
        ("GPU-0,10,1,100,NVIDIA,0,true,3:", "unexpected field count 8 in node annotation"),
        (
            "GPU-0,x,1,100,NVIDIA,0,true:",
            'invalid count field: strconv.ParseInt: parsing "x": invalid syntax',
        ),
        (
            "GPU-0,10,1.5,100,NVIDIA,0,true:",
            'invalid devmem field: strconv.ParseInt: parsing "1.5": invalid syntax',
        ),
        ("GPU-0,10,1,99999999999,NVIDIA,0,true:", 'parsing "99999999999": value out of range'),
        ("GPU-0,10,1,100,NVIDIA,n,true:", 'invalid numa field: strconv.ParseInt: parsing "n"'),
        (
            "GPU-0,10,1,100,NVIDIA,0,yes:",
            'invalid health field: strconv.ParseBool: parsing "yes": invalid syntax',
        ),
        ("GPU-0,10,1,100,NVIDIA,0,true,i,mig:", 'invalid index field: strconv.ParseInt: parsing "i"'),
        ("GPU-0,10,1,100,NVIDIA,0,true,-1,mig:", "index field must not be negative: -1"),
    ],
)
def test_legacy_errors_use_hamis_texts(text: str, reason: str) -> None:
    with pytest.raises(AnnotationError) as caught:
        decode_node_devices_legacy(text)
    assert (caught.value.key, caught.value.text) == (NODE_REGISTER, text)
    assert reason in caught.value.reason


_field = st.text(st.characters(blacklist_characters=",:", codec="utf-8"), max_size=10)


@given(
    st.lists(
        st.builds(
            Device,
            uuid=_field.filter(bool),
            index=st.integers(0, 2**31),
            count=_nonneg32,
            memory_mib=_nonneg32,
            cores=_nonneg32,
            type=_field,
            numa=_nonneg32,
            mode=_field,
            health=st.booleans(),
        ),
        min_size=1,
        max_size=4,
        unique_by=lambda d: d.uuid,
    )
)
def test_legacy_round_trip(devices: list[Device]) -> None:
    assert decode_node_devices_legacy(encode_node_devices_legacy(devices)) == tuple(devices)


# ------------------------------------------------------------------------------- pair scores and cordon


def test_pair_scores_golden_and_round_trip() -> None:
    text = '[{"uuid":"GPU-0","score":{"GPU-1":100}}]'
    assert decode_pair_scores(text) == {"GPU-0": {"GPU-1": 100}}
    assert encode_pair_scores({"GPU-0": {"GPU-1": 100}}) == text
    assert decode_pair_scores("null") == {}
    assert decode_pair_scores('[{"uuid":"GPU-0"}]') == {"GPU-0": {}}


@given(st.dictionaries(_text.filter(bool), st.dictionaries(_text, st.integers(-(2**40), 2**40), max_size=3)))
def test_pair_scores_round_trip(scores: dict[str, dict[str, int]]) -> None:
    assert decode_pair_scores(encode_pair_scores(scores)) == scores


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("[{", "invalid JSON"),
        ('{"uuid":"a"}', "must be an array"),
        ('[{"score":{}}]', "'uuid' is missing"),
        ('[{"uuid":"a","score":[]}]', "entry 0: 'score' must be an object, got array"),
        ('[{"uuid":"a","score":{"b":"1"}}]', "entry 0: score for 'b' must be an integer, got string"),
        ('[{"uuid":"a"},{"uuid":"a"}]', "entry 1: duplicate uuid 'a'"),
    ],
)
def test_pair_score_errors(text: str, reason: str) -> None:
    with pytest.raises(AnnotationError) as caught:
        decode_pair_scores(text)
    assert (caught.value.key, caught.value.text) == (NODE_PAIR_SCORES, text)
    assert reason in caught.value.reason


def test_cordon_list_is_trimmed_and_blank_means_none() -> None:
    assert decode_cordon(" GPU-0 , ,GPU-1,") == frozenset({"GPU-0", "GPU-1"})
    assert decode_cordon("   ") == frozenset()
    assert decode_cordon(None) == frozenset()
    assert encode_cordon(["GPU-1", "GPU-0", "GPU-1"]) == "GPU-0,GPU-1"


# ----------------------------------------------------------------------------------------------- node


def test_read_node_builds_zero_usage_state_with_scores_and_cordon() -> None:
    annotations = {
        NODE_REGISTER: encode_node_devices([A100, MIG_CARD]),
        NODE_PAIR_SCORES: '[{"uuid":"GPU-0","score":{"GPU-1":60}},{"uuid":"GPU-1","score":{"GPU-0":60}}]',
        NODE_DEVICE_CORDON: "GPU-1",
        "unrelated": "x",
    }
    node = read_node("node-a", annotations)
    assert node.name == "node-a"
    assert node.devices == (DeviceState(device=A100), DeviceState(device=MIG_CARD))
    assert all(d.used == d.used_mem == d.used_cores == 0 and d.healthy for d in node.devices)
    assert node.pair_scores == {"GPU-0": {"GPU-1": 60}, "GPU-1": {"GPU-0": 60}}
    assert node.cordoned == frozenset({"GPU-1"})
    bare = read_node("node-b", {NODE_REGISTER: encode_node_devices([A100])})
    assert (bare.pair_scores, bare.cordoned) == ({}, frozenset())


def test_read_node_without_registration_uses_hamis_message() -> None:
    with pytest.raises(AnnotationError) as caught:
        read_node("node-a", {})
    assert (caught.value.key, caught.value.text) == (NODE_REGISTER, None)
    assert caught.value.reason == MISSING_REGISTER == "annos not found hami.io/node-nvidia-register"
    assert str(caught.value) == f"{NODE_REGISTER} (missing): {MISSING_REGISTER}"


def test_read_node_fails_whole_node_on_bad_pair_scores() -> None:
    annotations = {NODE_REGISTER: encode_node_devices([A100]), NODE_PAIR_SCORES: "not json"}
    with pytest.raises(AnnotationError) as caught:
        read_node("node-a", annotations)
    assert caught.value.key == NODE_PAIR_SCORES


def test_long_texts_are_shortened_in_messages_but_kept_whole() -> None:
    text = json.dumps([{"id": f"GPU-{i}", "count": "bad"} for i in range(100)])
    with pytest.raises(AnnotationError) as caught:
        decode_node_devices(text)
    assert caught.value.text == text
    assert len(str(caught.value)) < 500
