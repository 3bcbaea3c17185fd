"""parse_container: every rule of docs/protocol.md, "Requests", one table row each, plus the problems users
see."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hami.core.model import ContainerRequest
from hami.core.requests import Bounds, ParsedContainer, parse_container, whole_number
from hami.settings import DeviceConfig, ResourceNames

GPU, MEM, PCT, CORES = (
    "nvidia.com/gpu",
    "nvidia.com/gpumem",
    "nvidia.com/gpumem-percentage",
    "nvidia.com/gpucores",
)
DEFAULT = DeviceConfig()


def req(nums: int, *, mem: int = 0, pct: int = 101, cores: int = 0) -> ContainerRequest:
    return ContainerRequest(nums=nums, type="NVIDIA", memory_mib=mem, percentage=pct, cores=cores)


def parse(limits: dict[str, str], requests: dict[str, str] | None = None, **config: Any) -> ParsedContainer:
    return parse_container("train", limits, requests or {}, replace(DEFAULT, **config))


@pytest.mark.parametrize(
    ("limits", "requests", "config", "expected"),
    [
        # 1. count: absent or not a plain integer -> no request
        ({}, {}, {}, None),
        ({MEM: "1000"}, {}, {}, None),  # memory without count: nothing (the webhook injects the count)
        ({GPU: "1.5"}, {}, {}, None),
        ({GPU: "1000m"}, {}, {}, None),  # whole value, but not a plain integer for Go
        ({GPU: "0"}, {}, {}, None),  # nums 0 asks for nothing
        ({GPU: "-1"}, {}, {}, None),
        ({GPU: "2"}, {}, {}, req(2, pct=100)),  # no memory, no default -> whole card (pct 100)
        ({GPU: "1k"}, {}, {}, req(1000, pct=100)),
        # limits before requests, requests only when absent from limits
        ({}, {GPU: "1", MEM: "2000"}, {}, req(1, mem=2000)),
        ({GPU: "1", MEM: "3000"}, {MEM: "2000"}, {}, req(1, mem=3000)),
        ({GPU: "2"}, {GPU: "1", CORES: "30"}, {}, req(2, pct=100, cores=30)),
        # 2. memory: plain integer in [0, MaxInt32 / factor], else the WHOLE request is empty
        ({GPU: "1", MEM: "1024"}, {}, {}, req(1, mem=1024)),
        ({GPU: "1", MEM: "2147483647"}, {}, {}, req(1, mem=2147483647)),
        ({GPU: "1", MEM: "2147483648"}, {}, {}, None),
        ({GPU: "1", MEM: "16Gi"}, {}, {}, None),  # 17179869184 > MaxInt32
        ({GPU: "1", MEM: "16.0Gi"}, {}, {}, None),  # not a plain integer
        ({GPU: "1", MEM: "1.5"}, {}, {}, None),
        ({GPU: "1", MEM: "-1"}, {}, {}, None),
        ({GPU: "1", MEM: "lots"}, {}, {}, None),
        ({GPU: "1", MEM: "2k"}, {}, {}, req(1, mem=2000)),
        # memoryFactor multiplies, and shrinks the accepted range: MaxInt32 // 1024 = 2097151
        ({GPU: "1", MEM: "2"}, {}, {"memory_factor": 1024}, req(1, mem=2048)),
        ({GPU: "1", MEM: "2097151"}, {}, {"memory_factor": 1024}, req(1, mem=2097151 * 1024)),
        ({GPU: "1", MEM: "2097152"}, {}, {"memory_factor": 1024}, None),
        ({GPU: "1", MEM: "5"}, {}, {"memory_factor": 0}, req(1, mem=5)),  # unset factor = 1
        # gpumem 0 counts as "no memory": default rules apply
        ({GPU: "1", MEM: "0"}, {}, {}, req(1, pct=100)),
        ({GPU: "1", MEM: "0"}, {}, {"default_memory": 500}, req(1, mem=500)),
        # 3. percentage: 101 = not given; >100 clamps to 100 before 32-bit narrowing; <=0 ignored
        ({GPU: "1", PCT: "50"}, {}, {}, req(1, pct=50)),
        ({GPU: "1", PCT: "100"}, {}, {}, req(1, pct=100)),
        ({GPU: "1", PCT: "101"}, {}, {}, req(1, pct=100)),
        ({GPU: "1", PCT: "4294967346"}, {}, {}, req(1, pct=100)),  # would wrap to 50 if narrowed first
        ({GPU: "1", PCT: "0"}, {}, {}, req(1, pct=100)),  # 0 -> sentinel -> default whole card
        ({GPU: "1", PCT: "-5"}, {}, {"default_memory": 700}, req(1, mem=700)),
        ({GPU: "1", PCT: "half"}, {}, {}, req(1, pct=100)),  # not an integer: ignored
        ({GPU: "1", PCT: "50.5"}, {}, {"default_memory": 700}, req(1, mem=700)),
        # memory wins over percentage: both kept, Fit uses memreq
        ({GPU: "1", MEM: "1000", PCT: "50"}, {}, {}, req(1, mem=1000, pct=50)),
        # 4. default memory: only when neither memory nor percentage was given
        ({GPU: "1"}, {}, {"default_memory": 3000}, req(1, mem=3000)),
        ({GPU: "1", PCT: "30"}, {}, {"default_memory": 3000}, req(1, pct=30)),
        ({GPU: "1"}, {}, {"default_memory": 3000, "memory_factor": 2}, req(1, mem=3000)),  # no factor
        # 5. cores: default, replaced by a plain integer; not clamped here
        ({GPU: "1"}, {}, {"default_cores": 25}, req(1, pct=100, cores=25)),
        ({GPU: "1", CORES: "30"}, {}, {"default_cores": 25}, req(1, pct=100, cores=30)),
        ({GPU: "1", CORES: "0"}, {}, {"default_cores": 25}, req(1, pct=100, cores=0)),
        ({GPU: "1", CORES: "150"}, {}, {}, req(1, pct=100, cores=150)),
        ({GPU: "1", CORES: "0.5"}, {}, {"default_cores": 25}, req(1, pct=100, cores=25)),
        ({GPU: "1", CORES: "many"}, {}, {"default_cores": 25}, req(1, pct=100, cores=25)),
        ({GPU: "1", CORES: "4294967296"}, {}, {"default_cores": 25}, req(1, pct=100, cores=25)),
    ],
)
def test_request_rules(
    limits: dict[str, str],
    requests: dict[str, str],
    config: dict[str, int],
    expected: ContainerRequest | None,
) -> None:
    assert parse(limits, requests, **config).request == expected


def test_resource_names_come_from_the_device_config() -> None:
    names = ResourceNames(count="x/gpu", memory="x/mem", memory_percentage="x/pct", cores="x/cores")
    config = replace(DEFAULT, resources=names)
    parsed = parse_container("c", {"x/gpu": "2", "x/mem": "100", "x/cores": "10"}, {}, config)
    assert parsed.request == req(2, mem=100, cores=10)
    assert parse_container("c", {GPU: "1"}, {}, config).request is None


@pytest.mark.parametrize(
    ("limits", "field", "message"),
    [
        ({GPU: "1.5"}, GPU, 'gpu "1.5" is not a whole number'),
        ({GPU: "two"}, GPU, 'gpu "two" is not a quantity'),
        ({GPU: "-1"}, GPU, 'gpu "-1" must not be negative'),
        (
            {GPU: "1", MEM: "16Gi"},
            MEM,
            'gpumem "16Gi" is 17179869184 MiB, more than',
        ),
        (
            {GPU: "1", MEM: "16.0Gi"},
            MEM,
            'gpumem "16.0Gi" is not a whole number of MiB',
        ),
        ({GPU: "1", MEM: "-1"}, MEM, 'gpumem "-1" must not be negative'),
        (
            {GPU: "1", PCT: "150"},
            PCT,
            'gpumem-percentage "150" must be between 0 and 100',
        ),
        (
            {GPU: "1", PCT: "-1"},
            PCT,
            'gpumem-percentage "-1" must be between 0 and 100',
        ),
        ({GPU: "1", PCT: "x"}, PCT, 'gpumem-percentage "x" is not a quantity'),
        (
            {GPU: "1", CORES: "0.5"},
            CORES,
            'gpucores "0.5" is not a whole number',
        ),
        (
            {GPU: "1", CORES: "-10"},
            CORES,
            'gpucores "-10" must not be negative',
        ),
        (
            {GPU: "1", CORES: "4294967296"},
            CORES,
            'gpucores "4294967296" is out of range',
        ),
        ({MEM: "16Gi"}, MEM, "more than the maximum 2147483647 MiB"),  # reported even before a count exists
    ],
)
def test_problems_name_the_container_the_field_and_the_text(
    limits: dict[str, str], field: str, message: str
) -> None:
    problems = parse(limits).problems
    assert len(problems) == 1
    (problem,) = problems
    assert problem.container == "train"
    assert problem.field == field
    assert problem.value == limits[field]
    assert problem.message.startswith(f'container "train": {field} "{limits[field]}" ')
    assert message in problem.message


@pytest.mark.parametrize(
    "limits",
    [{}, {GPU: "1"}, {GPU: "1", MEM: "1000", PCT: "100", CORES: "150"}, {GPU: "0"}, {GPU: "1", PCT: "0"}],
)
def test_valid_values_raise_no_problem(limits: dict[str, str]) -> None:
    assert parse(limits).problems == ()


def test_problems_for_several_fields_are_all_reported() -> None:
    parsed = parse({GPU: "1", MEM: "16Gi", CORES: "x"})
    assert [p.field for p in parsed.problems] == [MEM, CORES]
    assert parsed.request is None
    assert parsed.name == "train"


@given(
    st.integers(min_value=1, max_value=2**40),
    st.integers(min_value=1, max_value=2**31 - 1),
    st.integers(min_value=0, max_value=100),
)
def test_well_formed_requests_parse_as_written(nums: int, mem: int, cores: int) -> None:
    parsed = parse({GPU: str(nums), MEM: str(mem), CORES: str(cores)})
    assert parsed.request == req(nums, mem=mem, cores=cores)
    assert parsed.problems == ()


@given(st.integers(min_value=-(2**62), max_value=2**62))
def test_percentage_always_ends_in_1_to_100_or_the_default(value: int) -> None:
    request = parse({GPU: "1", PCT: str(value)}).request
    assert request is not None
    expected = 100 if value > 100 or value <= 0 else value  # <=0 -> sentinel -> default whole card
    assert request.percentage == expected


# ------------------------------------------------------------------ admission bounds (the webhook's)
#: The bounds the webhook refuses beyond (HAMi clamps cores > 100 in Fit and ignores a percentage <= 0).
BOUNDS = Bounds(max_cards=16)


@pytest.mark.parametrize(
    ("limits", "field", "kind", "message"),
    [
        ({GPU: "17"}, GPU, "too_many_cards", 'nvidia.com/gpu "17" asks for more than 16 cards'),
        (
            {GPU: "1", CORES: "150"},
            CORES,
            "value",
            'nvidia.com/gpucores "150" must be between 0 and 100 (percent of a card)',
        ),
        (
            {GPU: "1", PCT: "0"},
            PCT,
            "value",
            'nvidia.com/gpumem-percentage "0" must be between 1 and 100 (percent of a card\'s memory)',
        ),
    ],
)
def test_bounds_refuse_what_hami_would_clamp_or_ignore(
    limits: dict[str, str], field: str, kind: str, message: str
) -> None:
    parsed = parse_container("train", limits, {}, DEFAULT, bounds=BOUNDS)
    (problem,) = parsed.problems
    assert (problem.field, problem.kind, problem.value) == (field, kind, limits[field])
    assert problem.message == f'container "train": {message}'
    # the request is still HAMi's reading: the bounds judge, they never change what is booked
    assert parsed.request == parse(limits).request
    assert parse(limits).problems == ()  # without bounds (the scheduler's reading): no problem


@pytest.mark.parametrize(
    "limits",
    [
        {GPU: "16", CORES: "100", PCT: "100"},
        {GPU: "1", CORES: "0", PCT: "1"},
        {GPU: "0"},
        {MEM: "1000"},  # no count: the webhook defaults it
    ],
)
def test_values_within_the_bounds_raise_no_problem(limits: dict[str, str]) -> None:
    assert parse_container("train", limits, {}, DEFAULT, bounds=BOUNDS).problems == ()


@pytest.mark.parametrize(
    ("limits", "field", "why"),
    [
        ({GPU: "-1"}, GPU, "must not be negative"),  # not also "more than 16 cards" or a range
        ({GPU: "1", CORES: "-5"}, CORES, "must not be negative"),
        ({GPU: "1", CORES: "4294967296"}, CORES, "is out of range"),
        ({GPU: "1", PCT: "101"}, PCT, "must be between 0 and 100"),
        ({GPU: "1", PCT: "-3"}, PCT, "must be between 0 and 100"),
    ],
)
def test_one_problem_per_value_the_bound_never_repeats_it(
    limits: dict[str, str], field: str, why: str
) -> None:
    (problem,) = parse_container("train", limits, {}, DEFAULT, bounds=BOUNDS).problems
    assert problem.field == field
    assert problem.message.endswith(f'"{limits[field]}" {why}')


def test_bounds_take_the_configured_card_limit_and_resource_names() -> None:
    names = ResourceNames(count="example.com/gpu", cores="example.com/cores")
    config = replace(DEFAULT, resources=names)
    parsed = parse_container("t", {"example.com/gpu": "5"}, {}, config, bounds=Bounds(max_cards=4))
    assert [p.message for p in parsed.problems] == [
        'container "t": example.com/gpu "5" asks for more than 4 cards'
    ]
    parsed = parse_container(
        "t", {"example.com/gpu": "1", "example.com/cores": "101"}, {}, config, bounds=BOUNDS
    )
    assert [p.message for p in parsed.problems] == [
        'container "t": example.com/cores "101" must be between 0 and 100 (percent of a card)'
    ]


@pytest.mark.parametrize(
    ("text", "expected"), [("100", 100), ("0", 0), ("-3", -3), ("0.5", None), ("lots", None), (None, None)]
)
def test_whole_number_reads_a_plain_integer_or_nothing(text: str | None, expected: int | None) -> None:
    assert whole_number(text) == expected
