"""Fit of one container on one node (docs/protocol.md, "Fit", "Several cards"): check order, walk order,
failure text."""

from __future__ import annotations

import pytest

from hami.core.allocate import Policy, fit_node
from hami.core.model import Allocation, ContainerRequest, NodeState, PodRequest, Rejection

from .builders import make_card, make_cards, make_container, make_request, node_state

SPREAD = Policy()


def fit(node: NodeState, request: PodRequest, policy: Policy = SPREAD) -> Allocation | Rejection:
    return fit_node(request, node, policy)


def one(container: ContainerRequest, **steering: object) -> PodRequest:
    return make_request(container, **steering)  # type: ignore[arg-type]


def uuids(decision: Allocation | Rejection) -> list[str]:
    assert isinstance(decision, Allocation), decision
    return [g.uuid for g in decision.devices[-1]]


def message(decision: Allocation | Rejection) -> str:
    assert isinstance(decision, Rejection), decision
    return decision.message


# ------------------------------------------------------------------------------------- walk order


def test_identical_idle_cards_last_registered_is_used_first() -> None:
    # Spread sorts by score descending; equal scores keep registration order; Fit walks from the end.
    assert uuids(fit(node_state(cards=make_cards(3)), one(make_container(mem=100)))) == ["GPU-2"]


def test_spread_prefers_the_least_used_card() -> None:
    # Scores (type NVIDIA: request counted): GPU-0 idle, GPU-1 has 1 task of 500 MiB -> GPU-0 lowest.
    cards = (make_card("GPU-0", index=0), make_card("GPU-1", index=1, used=1, used_mem=500))
    assert uuids(fit(node_state(cards=cards), one(make_container(mem=100)))) == ["GPU-0"]


def test_binpack_prefers_the_most_used_card() -> None:
    cards = (make_card("GPU-0", index=0, used=1, used_mem=500), make_card("GPU-1", index=1))
    decision = fit(node_state(cards=cards), one(make_container(mem=100)), Policy(gpu_policy="binpack"))
    assert uuids(decision) == ["GPU-0"]


def test_multi_card_picks_distinct_cards_in_walk_order() -> None:
    assert uuids(fit(node_state(cards=make_cards(4)), one(make_container(3, mem=100)))) == [
        "GPU-3",
        "GPU-2",
        "GPU-1",
    ]


# ---------------------------------------------------------------------------------- single checks

CASES: list[tuple[str, tuple[object, ...], ContainerRequest, dict[str, object], str]] = [
    ("not healthy", (make_card(health=False),), make_container(mem=1), {}, "1/1 CardNotHealth"),
    (
        "mig inconsistency is unhealthy",
        (make_card(inconsistencies=1),),
        make_container(mem=1),
        {},
        "1/1 CardNotHealth",
    ),
    (
        "use type not in card type",
        (make_card(),),
        make_container(mem=1),
        {"use_types": ("V100",)},
        "1/1 CardTypeMismatch",
    ),
    (
        "nouse type substring",
        (make_card(type="NVIDIA A100"),),
        make_container(mem=1),
        {"nouse_types": ("a10",)},
        "1/1 CardTypeMismatch",
    ),
    (
        "vgpu-mode excludes mode",
        (make_card(mode="hami-core"),),
        make_container(mem=1),
        {"vgpu_mode": "mig"},
        "1/1 CardTypeMismatch",
    ),
    (
        "use uuid",
        (make_card("GPU-0"),),
        make_container(mem=1),
        {"use_uuids": ("GPU-1",)},
        "1/1 CardUuidMismatch",
    ),
    (
        "nouse uuid",
        (make_card("GPU-0"),),
        make_container(mem=1),
        {"nouse_uuids": ("GPU-0",)},
        "1/1 CardUuidMismatch",
    ),
    (
        "slots exhausted",
        (make_card(count=2, used=2),),
        make_container(mem=1),
        {},
        "1/1 CardTimeSlicingExhausted",
    ),
    (
        "mutex",
        (make_card(used=1),),
        make_container(mem=1),
        {"gpu_policy": "mutex"},
        "1/1 ExclusiveDeviceAllocateConflict",
    ),
    ("memory", (make_card(used=1, used_mem=900),), make_container(mem=101), {}, "1/1 CardInsufficientMemory"),
    (
        "memory percent",
        (make_card(used=1, used_mem=1),),
        make_container(pct=100),
        {},
        "1/1 CardInsufficientMemory",
    ),
    (
        "cores",
        (make_card(used=1, used_cores=80),),
        make_container(mem=1, cores=21),
        {},
        "1/1 CardInsufficientCore",
    ),
    (
        "exclusive needs an empty card, even a 0-core task blocks it",
        (make_card(used=1),),
        make_container(mem=1, cores=100),
        {},
        "1/1 ExclusiveDeviceAllocateConflict",
    ),
    (
        "0-core task cannot join a fully cored card",
        (make_card(used=1, used_cores=100),),
        make_container(mem=1, cores=0),
        {},
        "1/1 CardComputeUnitsExhausted",
    ),
]


@pytest.mark.parametrize(
    ("cards", "container", "steering", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_each_check_reports_its_reason(
    cards: tuple[object, ...], container: ContainerRequest, steering: dict[str, object], expected: str
) -> None:
    decision = fit(node_state(cards=cards), one(container, **steering))  # type: ignore[arg-type]
    assert message(decision) == expected


def test_request_type_other_than_nvidia_is_an_unknown_device_type() -> None:
    decision = fit(node_state(cards=make_cards(1)), one(make_container(mem=1, type="AMD")))
    assert message(decision) == "Device type not found"
    assert isinstance(decision, Rejection) and not decision.resolvable


# Each row: a card that fails two checks; the earlier check of docs/protocol.md, "Fit" must be the reported
# one.
ORDER = [
    ("health before cordon", make_card("GPU-0", health=False), {}, "CardNotHealth"),
    ("cordon before type", make_card("GPU-C", type="NVIDIA T4"), {"use_types": ("A100",)}, "CardCordoned"),
    (
        "type before uuid",
        make_card("GPU-0", type="NVIDIA T4"),
        {"use_types": ("A100",), "nouse_uuids": ("GPU-0",)},
        "CardTypeMismatch",
    ),
    (
        "uuid before slots",
        make_card("GPU-0", count=1, used=1),
        {"nouse_uuids": ("GPU-0",)},
        "CardUuidMismatch",
    ),
    ("slots before mutex", make_card(count=1, used=1), {"gpu_policy": "mutex"}, "CardTimeSlicingExhausted"),
    (
        "mutex before memory",
        make_card(used=1, used_mem=1000),
        {"gpu_policy": "mutex"},
        "ExclusiveDeviceAllocateConflict",
    ),
    ("memory before cores", make_card(used=1, used_mem=1000, used_cores=100), {}, "CardInsufficientMemory"),
]


@pytest.mark.parametrize(("card", "steering", "reason"), [o[1:] for o in ORDER], ids=[o[0] for o in ORDER])
def test_check_order(card: object, steering: dict[str, object], reason: str) -> None:
    node = node_state(cards=(card,), cordoned=frozenset({"GPU-C"}))  # type: ignore[arg-type]
    decision = fit(node, one(make_container(mem=10, cores=10), **steering))
    assert message(decision) == f"1/1 {reason}"


def test_cores_before_exclusive_and_exclusive_before_compute_exhausted() -> None:
    # 100 cores on a card with 10 cores used: check 12 (cores) fires before 13 (exclusive).
    node = node_state(cards=(make_card(used=1, used_cores=10),))
    assert message(fit(node, one(make_container(mem=1, cores=100)))) == "1/1 CardInsufficientCore"


def test_cores_above_100_are_clamped_to_100() -> None:
    # 150 % would fail check 12 on an idle 100-core card; clamped to 100 it fits and is granted 100.
    decision = fit(node_state(cards=make_cards(1)), one(make_container(mem=1, cores=150)))
    assert isinstance(decision, Allocation)
    assert decision.devices[0][0].cores == 100


def test_exclusive_rule_needs_totalcore_exactly_100() -> None:
    # deviceCoreScaling 2: a 200-core card; a 100-core request may share it with a running task.
    node = node_state(cards=(make_card(cores=200, used=1, used_cores=50),))
    assert isinstance(fit(node, one(make_container(mem=1, cores=100))), Allocation)


def test_zero_core_task_may_join_when_cores_are_left() -> None:
    node = node_state(cards=(make_card(used=1, used_cores=99),))
    assert isinstance(fit(node, one(make_container(mem=1, cores=0))), Allocation)


def test_percentage_resolves_against_each_card() -> None:
    # 50 % of a 1000 MiB card = 500 MiB; of a 3000 MiB card = 1500 MiB.
    cards = (make_card("GPU-0", index=0, memory=1000), make_card("GPU-1", index=1, memory=3000))
    decision = fit(node_state(cards=cards), one(make_container(2, pct=50)))
    assert isinstance(decision, Allocation)
    assert {g.uuid: g.memory_mib for g in decision.devices[0]} == {"GPU-0": 500, "GPU-1": 1500}


def test_memory_mib_wins_over_percentage() -> None:
    decision = fit(node_state(cards=make_cards(1)), one(make_container(mem=300, pct=50)))
    assert isinstance(decision, Allocation)
    assert decision.devices[0][0].memory_mib == 300


def test_type_substring_is_case_insensitive_and_loose() -> None:
    # use-gputype "a10" admits "NVIDIA A100" (substring), "t4" does not.
    node = node_state(cards=(make_card(type="NVIDIA A100"),))
    assert isinstance(fit(node, one(make_container(mem=1), use_types=("t4", "a10"))), Allocation)
    assert message(fit(node, one(make_container(mem=1), use_types=("t4",)))) == "1/1 CardTypeMismatch"


def test_vgpu_mode_matches_card_mode_as_substring() -> None:
    node = node_state(cards=(make_card(mode="mps"),))
    assert isinstance(fit(node, one(make_container(mem=1), vgpu_mode="hami-core,mps")), Allocation)


def test_cordoned_card_reports_cordoned() -> None:
    node = node_state(cards=make_cards(2), cordoned=frozenset({"GPU-1"}))
    assert uuids(fit(node, one(make_container(mem=1)))) == ["GPU-0"]
    assert message(fit(node, one(make_container(2, mem=1)))) == (
        "1/2 AllocatedCardsInsufficientRequest, 1/2 CardCordoned"
    )


# ------------------------------------------------------------------------------ failure text


def test_spec_example_reason_text_with_ten_cards() -> None:
    # 10 cards; request 500 MiB, 50 % cores, nouse-gpuuuid for 3 of them.
    #   1 card with 60 % cores used (CardInsufficientCore), 2 with 600 MiB used (CardInsufficientMemory),
    #   3 uuid-excluded (CardUuidMismatch), 4 with all 10 slots taken (CardTimeSlicingExhausted).
    cards = [make_card("c0", index=0, used=1, used_cores=60)]
    cards += [make_card(f"m{i}", index=1 + i, used=1, used_mem=600) for i in range(2)]
    cards += [make_card(f"u{i}", index=3 + i) for i in range(3)]
    cards += [make_card(f"s{i}", index=6 + i, used=10) for i in range(4)]
    request = one(make_container(mem=500, cores=50), nouse_uuids=("u0", "u1", "u2"))
    assert message(fit(node_state(cards=cards), request)) == (
        "1/10 CardInsufficientCore, 2/10 CardInsufficientMemory, 3/10 CardUuidMismatch, "
        "4/10 CardTimeSlicingExhausted"
    )


def test_allocated_cards_insufficient_request_replaces_and_partial_picks_are_kept() -> None:
    # nums 3 on 2 cards fails before Fit (NodeInsufficientDevice); on 3 cards with one full: the
    # two picks are reported as "2/3 AllocatedCardsInsufficientRequest" next to the real reason.
    cards = (make_card("GPU-0", index=0, used=10), *make_cards(3)[1:])
    assert message(fit(node_state(cards=cards), one(make_container(3, mem=1)))) == (
        "1/3 CardTimeSlicingExhausted, 2/3 AllocatedCardsInsufficientRequest"
    )


def test_reason_items_sort_as_strings() -> None:
    # 12 cards: 10 full (slots), 2 cordoned -> "10/12 ..." sorts before "2/12 ...".
    cards = make_cards(12, count=1, used=1)
    node = node_state(cards=cards[:10] + make_cards(12)[10:], cordoned=frozenset({"GPU-10", "GPU-11"}))
    assert (
        message(fit(node, one(make_container(mem=1)))) == "10/12 CardTimeSlicingExhausted, 2/12 CardCordoned"
    )


def test_too_many_cards_requested_is_node_insufficient_device() -> None:
    decision = fit(node_state(cards=make_cards(2)), one(make_container(3, mem=1)))
    assert message(decision) == "NodeInsufficientDevice"
    assert isinstance(decision, Rejection) and not decision.resolvable


def test_type_prefilter_sets_the_denominator() -> None:
    # Only cards whose type contains "nvidia" are handed to Fit: 1 of 2 here.
    cards = (make_card("GPU-0", index=0, used=10), make_card("AMD-0", index=1, type="AMD MI100"))
    assert message(fit(node_state(cards=cards), one(make_container(mem=1)))) == "1/1 CardTimeSlicingExhausted"


# ------------------------------------------------------------------------------------------- NUMA


def numa_cards(*numas: int, **kwargs: object) -> tuple[object, ...]:
    return tuple(make_card(f"GPU-{i}", index=i, numa=n, **kwargs) for i, n in enumerate(numas))  # type: ignore[arg-type]


def test_numa_bind_takes_all_cards_from_one_numa_node() -> None:
    # Sorted with numa-bind (spread): NUMA ascending -> [0,1 | 2,3]; walk from the end: GPU-3, GPU-2.
    node = node_state(cards=numa_cards(0, 0, 1, 1))  # type: ignore[arg-type]
    assert uuids(fit(node, one(make_container(2, mem=1), numa_bind=True))) == ["GPU-3", "GPU-2"]


def test_numa_group_reset_discards_picks_and_counts_numa_not_fit() -> None:
    # NUMA 1 has one free card and one full; NUMA 0 has two free. Sorted (numa asc, score desc):
    # [GPU-0, GPU-1, GPU-3, GPU-2]. Walk: GPU-2 picked, GPU-3 full, GPU-1 (numa0): reset, the pick is
    # discarded; GPU-1, GPU-0 picked.
    cards = (*numa_cards(0, 0, 1)[:3], make_card("GPU-3", index=3, numa=1, used=10))
    decision = fit(node_state(cards=cards), one(make_container(2, mem=1), numa_bind=True))  # type: ignore[arg-type]
    assert uuids(decision) == ["GPU-1", "GPU-0"]


def test_numa_bind_fails_when_no_group_is_big_enough() -> None:
    # 1 card per NUMA node, nums 2: walk numa1 pick, numa0 reset (+1 NumaNotFit), pick -> 1 picked.
    node = node_state(cards=numa_cards(0, 1))  # type: ignore[arg-type]
    assert message(fit(node, one(make_container(2, mem=1), numa_bind=True))) == (
        "1/2 AllocatedCardsInsufficientRequest, 1/2 NumaNotFit"
    )


def test_numa_reset_happens_before_the_uuid_check() -> None:
    # numa1 card picked, then the numa0 card is uuid-excluded yet still resets the group: the pick is lost.
    node = node_state(cards=numa_cards(0, 1))  # type: ignore[arg-type]
    decision = fit(node, one(make_container(1, mem=1), numa_bind=True, nouse_uuids=("GPU-0",)))
    assert uuids(decision) == ["GPU-1"]  # nums 1 succeeds at GPU-1 before reaching GPU-0
    decision = fit(node, one(make_container(2, mem=1), numa_bind=True, nouse_uuids=("GPU-0",)))
    assert message(decision) == "1/2 CardUuidMismatch, 1/2 NumaNotFit"


def test_without_numa_bind_cards_come_from_any_numa() -> None:
    node = node_state(cards=numa_cards(0, 1))  # type: ignore[arg-type]
    assert sorted(uuids(fit(node, one(make_container(2, mem=1))))) == ["GPU-0", "GPU-1"]
