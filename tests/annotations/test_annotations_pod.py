"""Pod device lists, bind phase and times: golden strings (docs/protocol.md, "Extender"), quirks, errors,
round trips."""

from __future__ import annotations

import datetime
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hami.annotations import (
    MISSING_FIELDS,
    POD_BIND_PHASE,
    POD_BIND_TIME,
    POD_DEVICES_ALLOCATED,
    POD_DEVICES_TO_ALLOCATE,
    POD_MIG_ALLOCATIONS,
    POD_VGPU_NODE,
    POD_VGPU_TIME,
    AnnotationError,
    BindPhase,
    allocation_annotations,
    allocation_done,
    bind_annotations,
    blank_container,
    decode_bind_phase,
    decode_pod_devices,
    decode_unix_time,
    encode_pod_devices,
    encode_unix_time,
    pending_container,
    read_bind_phase,
    read_bind_time,
    read_pod_devices,
    read_pod_mig_allocations,
    read_pod_to_allocate,
    read_vgpu_node,
)
from hami.core.model import Grant, MigAllocation, MigPlacement, PodDevices


def g(uuid: str, mem: int, cores: int, type_: str = "NVIDIA") -> Grant:
    return Grant(uuid=uuid, type=type_, memory_mib=mem, cores=cores)


GOLDEN: list[tuple[PodDevices, str]] = [
    (((g("device4", 1000, 20),),), "device4,NVIDIA,1000,20:;"),
    (
        ((g("UUID1", 1000, 30, "Type1"), g("UUID2", 1000, 30, "Type1")),),
        "UUID1,Type1,1000,30:UUID2,Type1,1000,30:;",
    ),
    (((g("uuid1", 1000, 30),), ()), "uuid1,NVIDIA,1000,30:;;"),
    (((), (g("uuid1", 1000, 30),)), ";uuid1,NVIDIA,1000,30:;"),
    (
        ((g("device3", 5000, 20),), (g("device3", 4000, 20),)),
        "device3,NVIDIA,5000,20:;device3,NVIDIA,4000,20:;",
    ),
    (
        ((g("GPU-abc", 3000, 30),), (g("GPU-abc", 5000, 0),)),
        "GPU-abc,NVIDIA,3000,30:;GPU-abc,NVIDIA,5000,0:;",
    ),
    (((),), ";"),
]


@pytest.mark.parametrize(("devices", "text"), GOLDEN)
def test_golden_strings_encode_byte_for_byte(devices: PodDevices, text: str) -> None:
    assert encode_pod_devices(devices) == text


@pytest.mark.parametrize(("devices", "text"), GOLDEN)
def test_golden_strings_decode_to_exactly_the_containers_written(devices: PodDevices, text: str) -> None:
    assert decode_pod_devices(text) == devices


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("", ((),)),  # HAMi: the empty string is one empty container
        ("uuid1,NVIDIA,1000,30:", ((g("uuid1", 1000, 30),),)),  # no final ';': the last part is a container
        ("a,NVIDIA,1,2:;b,NVIDIA,3,4:", ((g("a", 1, 2),), (g("b", 3, 4),))),
        (";;", ((), ())),
        ("garbage:uuid1,NVIDIA,1000,30:;", ((g("uuid1", 1000, 30),),)),  # segment without a comma ignored
        ("uuid1,NVIDIA,1000,30", ((g("uuid1", 1000, 30),),)),  # no ':' terminator needed
        ("uuid1,NVIDIA,1000,30,extra,fields:;", ((g("uuid1", 1000, 30),),)),  # extra fields ignored
        ("u,NVIDIA,-5,+7:;", ((g("u", -5, 7),),)),  # Go's ParseInt accepts a sign
        ("u,NVIDIA,2147483647,0:;", ((g("u", 2**31 - 1, 0),),)),
    ],
)
def test_decoding_quirks(text: str, expected: PodDevices) -> None:
    assert decode_pod_devices(text) == expected


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("uuid1,NVIDIA,1000:;", MISSING_FIELDS),
        ("uuid1,NVIDIA:;", MISSING_FIELDS),
        ("u,NVIDIA,lots,30:;", "memory 'lots'"),
        ("u,NVIDIA,1000,3.5:;", "cores '3.5'"),
        ("u,NVIDIA,2147483648,0:;", "memory '2147483648' of 'u,NVIDIA,2147483648,0' is not a 32-bit integer"),
        ("u,NVIDIA,0,-2147483649:;", "is not a 32-bit integer"),
        ("u,NVIDIA, 5,0:;", "memory ' 5'"),  # Go's ParseInt refuses spaces
        ("u,NVIDIA,1_000,0:;", "memory '1_000'"),  # ... and underscores, unlike Python's int()
    ],
)
@pytest.mark.parametrize("key", [POD_DEVICES_ALLOCATED, POD_DEVICES_TO_ALLOCATE])
def test_malformed_lists_name_the_key_and_the_text(text: str, reason: str, key: str) -> None:
    with pytest.raises(AnnotationError) as caught:
        decode_pod_devices(text, key=key)
    error = caught.value
    assert (error.key, error.text) == (key, text)
    assert reason in error.reason
    assert str(error).startswith(f'{key} "{text}": ')
    assert isinstance(error, ValueError)


@pytest.mark.parametrize(
    "grant",
    [
        g("a,b", 1, 1),
        g("a:b", 1, 1),
        g("a;b", 1, 1),
        g("u", 1, 1, "NV:IDIA"),
        g("u", 2**31, 1),
        g("u", 1, -(2**31) - 1),
    ],
)
def test_encoder_refuses_what_could_not_be_read_back(grant: Grant) -> None:
    with pytest.raises(ValueError, match=r"must not contain|32 bits"):
        encode_pod_devices(((grant,),))


_name = st.text(st.characters(blacklist_characters=",:;", codec="utf-8"), max_size=12)
_int32 = st.integers(min_value=-(2**31), max_value=2**31 - 1)
_grant = st.builds(Grant, uuid=_name, type=_name, memory_mib=_int32, cores=_int32)
_pod_devices = st.lists(st.lists(_grant, max_size=4).map(tuple), min_size=1, max_size=6).map(tuple)


@given(_pod_devices)
def test_round_trip_keeps_every_container(devices: PodDevices) -> None:
    text = encode_pod_devices(devices)
    assert decode_pod_devices(text) == devices
    assert text.count(";") == len(devices)


@given(_pod_devices, st.data())
def test_blanking_a_container_keeps_the_alignment(devices: PodDevices, data: st.DataObject) -> None:
    index = data.draw(st.integers(min_value=0, max_value=len(devices) - 1))
    blanked = decode_pod_devices(encode_pod_devices(blank_container(devices, index)))
    assert len(blanked) == len(devices)
    assert blanked[index] == ()
    assert all(blanked[i] == devices[i] for i in range(len(devices)) if i != index)


def test_node_agent_walk_consumes_containers_in_order() -> None:
    # init container on device3, app container on device3, then a GPU-less container
    text = "device3,NVIDIA,5000,20:;device3,NVIDIA,4000,20:;;"
    devices = decode_pod_devices(text, key=POD_DEVICES_TO_ALLOCATE)
    seen = []
    while (index := pending_container(devices)) is not None:
        seen.append((index, devices[index]))
        devices = blank_container(devices, index)
    assert seen == [(0, (g("device3", 5000, 20),)), (1, (g("device3", 4000, 20),))]
    assert allocation_done(devices)
    assert encode_pod_devices(devices) == ";;;"
    with pytest.raises(IndexError):
        blank_container(devices, 3)


# ------------------------------------------------------------------------------------- phase and times

NOW = datetime.datetime(2024, 5, 1, 10, 0, 0, tzinfo=datetime.UTC)


def test_bind_phase_values_are_the_protocol_words() -> None:
    assert [p.value for p in BindPhase] == ["allocating", "success", "failed"]
    assert decode_bind_phase("success") is BindPhase.SUCCESS
    with pytest.raises(AnnotationError) as caught:
        decode_bind_phase("Success")
    assert caught.value.key == POD_BIND_PHASE
    assert '"Success"' in str(caught.value)
    assert "allocating, success, failed" in caught.value.reason


def test_unix_time_round_trip_and_errors() -> None:
    assert encode_unix_time(NOW) == "1714557600"
    assert decode_unix_time("1714557600") == NOW
    with pytest.raises(ValueError, match="time zone"):
        encode_unix_time(NOW.replace(tzinfo=None))
    for bad in ("", "17145576OO", "1.5", "99999999999999999"):
        with pytest.raises(AnnotationError) as caught:
            decode_unix_time(bad, key=POD_VGPU_TIME)
        assert (caught.value.key, caught.value.text) == (POD_VGPU_TIME, bad)


@given(st.integers(min_value=0, max_value=253402300799))  # up to 9999-12-31T23:59:59Z
def test_unix_time_round_trips(seconds: int) -> None:
    moment = datetime.datetime.fromtimestamp(seconds, datetime.UTC)
    assert decode_unix_time(encode_unix_time(moment)) == moment


def test_scheduler_and_bind_writes_read_back() -> None:
    devices = ((g("GPU-0", 3000, 30),), ())
    mig = (
        MigAllocation(
            container_index=0,
            device_index=0,
            gpu_uuid="GPU-0",
            profile="1g.10gb",
            placement=MigPlacement(start=6, size=1),
        ),
    )
    annotations = allocation_annotations(node="node-a", devices=devices, mig=mig, now=NOW)
    assert annotations == {
        POD_VGPU_NODE: "node-a",
        POD_VGPU_TIME: "1714557600",
        POD_DEVICES_TO_ALLOCATE: "GPU-0,NVIDIA,3000,30:;;",
        POD_DEVICES_ALLOCATED: "GPU-0,NVIDIA,3000,30:;;",
        POD_MIG_ALLOCATIONS: (
            '[{"containerIndex":0,"deviceIndex":0,"gpuUUID":"GPU-0","profile":"1g.10gb",'
            '"placement":{"start":6,"size":1}}]'
        ),
    }
    assert POD_MIG_ALLOCATIONS not in allocation_annotations(node="n", devices=devices, now=NOW)
    annotations |= bind_annotations(BindPhase.ALLOCATING, now=NOW)
    assert bind_annotations(BindPhase.SUCCESS) == {POD_BIND_PHASE: "success"}
    pod = {"metadata": {"name": "p", "annotations": annotations}}
    assert read_pod_devices(pod) == devices
    assert read_pod_to_allocate(pod) == devices
    assert read_pod_mig_allocations(pod) == mig
    assert read_bind_phase(pod) is BindPhase.ALLOCATING
    assert read_bind_time(pod) == NOW
    assert read_vgpu_node(pod) == "node-a"
    assert annotations[POD_BIND_TIME] == "1714557600"


def test_pods_without_annotations_read_as_absent() -> None:
    pods: list[dict[str, Any]] = [{}, {"metadata": {}}, {"metadata": {"annotations": None}}]
    for pod in pods:
        assert read_pod_devices(pod) is None
        assert read_pod_to_allocate(pod) is None
        assert read_pod_mig_allocations(pod) == ()
        assert read_bind_phase(pod) is None
        assert read_bind_time(pod) is None
        assert read_vgpu_node(pod) is None


def test_read_pod_devices_raises_naming_the_allocated_key() -> None:
    pod = {"metadata": {"annotations": {POD_DEVICES_ALLOCATED: "u,NVIDIA,1:;"}}}
    with pytest.raises(AnnotationError) as caught:
        read_pod_devices(pod)
    assert caught.value.key == POD_DEVICES_ALLOCATED
    assert caught.value.text == "u,NVIDIA,1:;"


@given(st.text(alphabet="0123456789", min_size=1, max_size=24))
def test_unsigned_memory_reads_as_the_signed_form_does(digits: str) -> None:
    """A card's memory written as plain digits (the common case, read without the general grammar) is
    the value the same digits behind a "+" give, leading zeros and the 32-bit bound included; both are
    refused alike."""

    def read(memory: str) -> int | None:
        try:
            (grants,) = decode_pod_devices(f"GPU-0,NVIDIA,{memory},30:;")
        except AnnotationError:
            return None
        return grants[0].memory_mib

    assert read(digits) == read("+" + digits)
    if len(digits.lstrip("0")) <= 9:
        assert read(digits) == int(digits)
    elif int(digits) >= 2**31:
        assert read(digits) is None
