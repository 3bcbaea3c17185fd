"""MIG allocations JSON (docs/protocol.md, "MIG"): golden text, round trips, every invalid shape."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hami.annotations import (
    POD_MIG_ALLOCATIONS,
    AnnotationError,
    decode_mig_allocations,
    encode_mig_allocations,
)
from hami.core.model import MigAllocation, MigPlacement

BOOKED = MigAllocation(
    container_index=0,
    device_index=1,
    gpu_uuid="GPU-0",
    profile="3g.20gb",
    placement=MigPlacement(start=4, size=4),
)
CREATED = MigAllocation(
    container_index=1,
    device_index=0,
    gpu_uuid="GPU-0",
    profile="1g.5gb",
    placement=MigPlacement(start=3, size=1),
    mig_uuid="MIG-abc",
    gpu_instance_id=0,
    compute_instance_id=0,
)


def test_golden_text() -> None:
    text = encode_mig_allocations([BOOKED, CREATED])
    assert text == (
        '[{"containerIndex":0,"deviceIndex":1,"gpuUUID":"GPU-0","profile":"3g.20gb","placement":{"start":4,"size":4}},'
        '{"containerIndex":1,"deviceIndex":0,"gpuUUID":"GPU-0","profile":"1g.5gb","placement":{"start":3,"size":1},'
        '"migUUID":"MIG-abc","gpuInstanceID":0,"computeInstanceID":0}]'
    )
    assert decode_mig_allocations(text) == (BOOKED, CREATED)
    assert encode_mig_allocations([]) == "[]"
    assert decode_mig_allocations("null") == ()


def test_unknown_keys_ignored_and_key_case_ignored() -> None:
    text = (
        '[{"ContainerIndex":0,"deviceindex":1,"gpuUUID":"GPU-0","profile":"3g.20gb",'
        '"placement":{"Start":4,"size":4},"x":1}]'
    )
    assert decode_mig_allocations(text) == (BOOKED,)


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("[", "invalid JSON"),
        ("{}", "must be an array"),
        ("[[]]", "entry 0: an allocation must be an object"),
        (
            '[{"deviceIndex":0,"gpuUUID":"g","profile":"p","placement":{"start":0,"size":1}}]',
            "'containerIndex' is missing",
        ),
        (
            '[{"containerIndex":-1,"deviceIndex":0,"gpuUUID":"g","profile":"p","placement":{"start":0,"size":1}}]',
            "'containerIndex' must be at least 0",
        ),
        (
            '[{"containerIndex":0,"deviceIndex":0,"gpuUUID":"","profile":"p","placement":{"start":0,"size":1}}]',
            "'gpuUUID' is missing or empty",
        ),
        (
            '[{"containerIndex":0,"deviceIndex":0,"gpuUUID":"g","placement":{"start":0,"size":1}}]',
            "'profile' is missing or empty",
        ),
        (
            '[{"containerIndex":0,"deviceIndex":0,"gpuUUID":"g","profile":"p"}]',
            "'placement' must be an object",
        ),
        (
            '[{"containerIndex":0,"deviceIndex":0,"gpuUUID":"g","profile":"p","placement":{"start":0,"size":0}}]',
            "'size' must be at least 1",
        ),
        (
            '[{"containerIndex":0,"deviceIndex":0,"gpuUUID":"g","profile":"p","placement":{"start":0,"size":1},'
            '"migUUID":"m","gpuInstanceID":1}]',
            "must be given together or not at all, got only migUUID, gpuInstanceID",
        ),
        (
            '[{"containerIndex":0,"deviceIndex":0,"gpuUUID":"g","profile":"p","placement":{"start":0,"size":1}},'
            '{"containerIndex":0,"deviceIndex":0,"gpuUUID":"g","profile":"q","placement":{"start":1,"size":1}}]',
            "entry 1: duplicate containerIndex 0 / deviceIndex 0",
        ),
    ],
)
def test_invalid_allocations_name_the_key_and_the_text(text: str, reason: str) -> None:
    with pytest.raises(AnnotationError) as caught:
        decode_mig_allocations(text)
    assert (caught.value.key, caught.value.text) == (POD_MIG_ALLOCATIONS, text)
    assert reason in caught.value.reason


def test_encoder_refuses_partial_instance_fields_and_duplicates() -> None:
    partial = MigAllocation(
        container_index=0,
        device_index=0,
        gpu_uuid="g",
        profile="p",
        placement=MigPlacement(start=0, size=1),
        mig_uuid="m",
    )
    with pytest.raises(ValueError, match="all of migUUID, gpuInstanceID, computeInstanceID or none"):
        encode_mig_allocations([partial])
    with pytest.raises(ValueError, match="duplicate"):
        encode_mig_allocations([BOOKED, BOOKED])


_nonneg = st.integers(min_value=0, max_value=2**31)
_word = st.text(min_size=1, max_size=8)


@st.composite
def _allocations(draw: st.DrawFn) -> list[MigAllocation]:
    slots = draw(st.lists(st.tuples(_nonneg, _nonneg), unique=True, max_size=5))
    result = []
    for container, device in slots:
        created = draw(st.booleans())
        result.append(
            MigAllocation(
                container_index=container,
                device_index=device,
                gpu_uuid=draw(_word),
                profile=draw(_word),
                placement=MigPlacement(start=draw(_nonneg), size=draw(st.integers(1, 8))),
                mig_uuid=draw(_word) if created else None,
                gpu_instance_id=draw(_nonneg) if created else None,
                compute_instance_id=draw(_nonneg) if created else None,
            )
        )
    return result


@given(_allocations())
def test_round_trip(allocations: list[MigAllocation]) -> None:
    assert decode_mig_allocations(encode_mig_allocations(allocations)) == tuple(allocations)
