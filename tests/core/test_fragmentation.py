"""The fragmentation measure and the ``fragmentation`` placement rule of the core: worked examples (cards of
1000 MiB, so 1 MiB is one milli of a card), placements that strand less scoring higher, the incremental
figures equal to recomputing a node the core really booked, and the policy through ``fit_node`` /
``priorities`` (the scheduler's bind and /prioritize)."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hami.core.allocate import Policy, fit_node, priorities
from hami.core.fragmentation import Target, TargetClass, reserves
from hami.core.fragplacement import card_scores, gradient, node_priorities, place, priority, reserved_gradient
from hami.core.model import NVIDIA, Allocation, Grant, NodeState, PodRequest
from hami.core.usage import apply_usage, pod_usage

from .builders import make_card, make_container, make_request, node_state


def cls(nums: int, pct: int = 0, weight: float = 1.0, **kwargs: object) -> TargetClass:
    """A class of ``nums`` cards of ``pct`` % memory and cores each (0 cards: CPU only)."""
    if nums == 0:
        return TargetClass(nums=0, weight=weight, **kwargs)  # type: ignore[arg-type]
    return TargetClass(nums=nums, percentage=pct, cores=pct, weight=weight, **kwargs)  # type: ignore[arg-type]


HALF = cls(1, 50)


def node_with(
    used: list[int], *, name: str = "n", count: int = 10, cordoned: frozenset[str] = frozenset()
) -> NodeState:
    """One card per entry, ``used`` MiB (and as many tenths of cores) taken by one task each (0: idle)."""
    cards = [
        make_card(f"{name}-{i}", index=i, count=count, used=int(u > 0), used_mem=u, used_cores=u // 10)
        for i, u in enumerate(used)
    ]
    return node_state(name, cards, cordoned=cordoned)


def share(pct: int, **kwargs: str) -> PodRequest:
    return make_request(make_container(pct=pct, cores=pct), **kwargs)  # type: ignore[arg-type]


def test_fragmentation_worked_example() -> None:
    node = node_with([0, 600, 1000])  # free shares 1000, 400, 0
    target = Target([cls(1, 50, 0.5), cls(2, 100, 0.3), cls(0, weight=0.2)])
    # a half fits (only the 400 card is fragment); two whole cards do not (all 1400); CPU-only: all 1400
    assert target.node(node).frag == pytest.approx(0.5 * 400 + 0.3 * 1400 + 0.2 * 1400)
    typed = Target([cls(1, 50, types=("v100",))])
    assert typed.node(node).frag == pytest.approx(1400)  # the class may not use these cards: all of it
    hungry = Target([cls(1, 50, cpu_milli=7000)])
    assert hungry.node(node, (6000, 0)).frag == pytest.approx(1400)  # too little CPU left for the class
    assert hungry.node(node, (7000, 0)).frag == pytest.approx(400)
    big = Target([cls(1, 50, cpu_milli=7000, host_memory_mib=48000)])
    assert big.node(node, (7000, 47999)).frag == pytest.approx(1400)  # too little host memory left
    assert big.node(node, (7000, 48000)).frag == pytest.approx(400)
    assert big.node(node).frag == pytest.approx(400)  # the scheduler: CPU and memory not measured


def test_a_type_holds_back_what_the_demand_restricted_to_it_needs_per_card() -> None:
    # 9 cards: 8 ModelX, 1 ModelY. Whole-card demand 0.6 anywhere, 0.3 ModelX only, 0.1 ModelY only:
    # per card on average 1/9; ModelX-only 0.3/8 per ModelX card, ModelY-only 0.1 on the one ModelY card
    gpu = [cls(1, 100), cls(1, 100, types=("modelx",)), cls(1, 100, types=("modely",))]
    held = reserves(gpu, [0.6, 0.3, 0.1], {"NVIDIA ModelX": 8, "NVIDIA ModelY": 1})
    assert held == pytest.approx({"nvidia modelx": 0.3 / 8 * 9, "nvidia modely": 0.1 * 9})
    # a class accepting both spreads over all 9 cards; unrestricted demand holds nothing; halves count half
    both = reserves([cls(1, 100), cls(1, 50, types=("model",))], [0.2, 0.8], {"ModelX": 8, "ModelY": 1})
    assert both == pytest.approx({"modelx": (0.4 / 9) / (0.6 / 9), "modely": (0.4 / 9) / (0.6 / 9)})
    # below RESERVE_FLOOR (no type's restricted demand per card reaches half the average): no reserves
    assert reserves([cls(1, 100), cls(1, 50, types=("model",))], [0.5, 0.5], {"ModelX": 8, "ModelY": 1}) == {}
    assert reserves(gpu, [0.96, 0.03, 0.01], {"NVIDIA ModelX": 8, "NVIDIA ModelY": 1}) == {}
    assert reserves(gpu, [0.6, 0.3, 0.1], {}) == {}
    assert reserves(gpu, [0.6, 0.3, 0.1], {"NVIDIA ModelZ": 4}) == {}  # nobody is held to ModelZ


def test_a_reserve_moves_a_score_only_by_the_whole_points_it_is_worth() -> None:
    """FGD's integer score puts a placement that leaves the measure unchanged at exactly 50, the bottom of
    its bucket: any positive cost, however small, drops it to 49 beside placements that do strand some
    GPU. A reserve therefore moves the score by what it changes in the exact score, rounded."""
    # FGD's measure unchanged (1100 -> 1100 with the held-back share); the reserve held 5 milli less
    assert gradient(1000, 1005) == 49  # the old score: the reserve's 5 milli cost a whole point
    assert reserved_gradient(1000, 1005, 100, 95) == 50
    # a reserve worth 200 milli of a card moves it by the 5 points those are worth
    assert reserved_gradient(1000, 1200, 300, 100) == 50 + round(100 * (1 / (1 + math.exp(0.2)) - 0.5))
    assert reserved_gradient(1000, 1200, 300, 100) == 45
    # without reserves (nothing held, or the held share unchanged) it is FGD's score
    for before, after in ((0, 0), (300, 0), (0, 200), (5000, 4321)):
        assert reserved_gradient(before, after, 0, 0) == gradient(before, after)
        assert reserved_gradient(before, after, 70, 70) == gradient(before, after)
    assert 0 <= reserved_gradient(0, 10**6, 10**6, 0) <= 99


def test_flexible_pods_leave_the_cards_that_restricted_demand_waits_for() -> None:
    """FGD counts a card its restricted classes cannot use as already lost to them, so an unrestricted
    pod prefers the model that fewer classes accept — here the one ModelY card, which the ModelY-only
    demand needs nine times more per card than the average. With the cluster's supply, the card's
    reserve makes taking it cost what it is worth to them, and the pod goes to ModelX."""
    x = node_state("x", [make_card("x-0", type="NVIDIA ModelX")])
    y = node_state("y", [make_card("y-0", type="NVIDIA ModelY")])
    classes = [cls(1, 100, 0.6), cls(1, 100, 0.3, types=("modelx",)), cls(1, 100, 0.1, types=("modely",))]
    whole = share(100)

    def best(target: Target) -> str:
        scores = {n.name: place(target, n, whole) for n in (x, y)}
        return max(scores, key=lambda name: scores[name].score)  # type: ignore[union-attr]

    assert best(Target(classes)) == "y"  # the paper's measure
    assert best(Target(classes, supply={"NVIDIA ModelX": 8, "NVIDIA ModelY": 1})) == "x"
    # a ModelY-only pod still goes to its card: the reserve lowers every one of its options alike
    typed = Target(classes, supply={"NVIDIA ModelX": 8, "NVIDIA ModelY": 1})
    only_y = make_request(make_container(pct=100, cores=100), use_types=("ModelY",))
    assert place(typed, x, only_y) is None
    found = place(typed, y, only_y)
    assert found is not None and found.cards == ((0,),)


@pytest.mark.parametrize(
    ("used", "pct", "card", "score"),
    [
        # 300 MiB free on card 1 is already fragment to the halves: a 30 % pod there removes it
        ([0, 700], 30, 1, gradient(300, 0)),
        # no fragment either way on cards 0/1: the lowest position wins the tie; card 2 would strand 200
        ([0, 200, 500], 30, 0, 50),
        # a 60 % pod: on the idle card it leaves 400 (fragment), on the 400-used card nothing
        ([0, 400], 60, 1, gradient(0, 0)),
    ],
)
def test_the_placement_that_strands_least_wins(used: list[int], pct: int, card: int, score: int) -> None:
    target = Target([HALF])
    found = place(target, node_with(used), share(pct))
    assert found is not None
    assert found.cards == ((card,),)
    assert found.score == score


def test_stranding_scores_lower_than_filling_a_fragment() -> None:
    target = Target([HALF])
    node = node_with([0, 0, 500, 700])
    scores = card_scores(target, node.devices, node.cordoned, make_container(pct=30, cores=30))
    # 0/1 keep their halves (50), 2 would strand 200 (45), 3 removes its 300 fragment (57)
    assert scores == [50, 50, gradient(0, 200), gradient(300, 0)]
    assert scores[3] > scores[0] > scores[2]


def test_cards_that_take_nothing_are_fragment_and_never_chosen() -> None:
    target = Target([HALF])
    full_slots = node_with([100, 0], count=1)  # card 0: 900 MiB free but its only slot is taken
    assert target.node(full_slots).frag == pytest.approx(900)
    found = place(target, full_slots, share(30))
    assert found is not None and found.cards == ((1,),)
    cordoned = node_with([0, 0], cordoned=frozenset({"n-0"}))
    assert target.node(cordoned).sums.g == 1000  # a cordoned card is outside the measure
    assert place(target, node_with([1000]), share(30)) is None


def test_a_multi_card_pod_takes_its_cards_one_at_a_time() -> None:
    target = Target([HALF, cls(2, 100)])
    node = node_with([0, 0, 0, 500])
    found = place(target, node, make_request(make_container(2, pct=100, cores=100)))
    assert found is not None and found.cards == ((0, 1),)  # whole cards: the lowest idle ones
    # two halves: the first fills card 3 exactly (nothing stranded), the second takes idle card 0
    halves = place(target, node, make_request(make_container(2, pct=50, cores=50)))
    assert halves is not None and halves.cards == ((3, 0),)


@settings(max_examples=60, deadline=None)
@given(
    history=st.lists(
        st.tuples(
            st.sampled_from([(1, 25), (1, 47), (1, 81), (1, 100), (2, 100), (1, 5)]), st.integers(0, 10**6)
        ),
        min_size=1,
        max_size=30,
    ),
    reserved=st.booleans(),
)
def test_predicted_after_equals_the_node_the_core_booked(
    history: list[tuple[tuple[int, int], int]], reserved: bool
) -> None:
    classes = [cls(1, 50, 0.4), cls(1, 25, 0.3), cls(2, 100, 0.2), cls(0, weight=0.1)]
    if reserved:  # a class held to these cards' type, a type of which the cluster has four cards
        classes.append(cls(1, 50, 0.3, types=(NVIDIA.lower(),)))
    target = Target(classes, supply={NVIDIA: 4, "Other": 12} if reserved else None)
    assert bool(target.reserve) == reserved
    nodes = [node_with([0] * 4, name="a"), node_with([0] * 2, name="b", count=3)]
    for (nums, pct), salt in history:
        request = make_request(make_container(nums, pct=pct, cores=pct), gpu_policy="fragmentation")
        at = salt % len(nodes)
        node = nodes[at]
        found = place(target, node, request)
        decision = fit_node(request, node, Policy(gpu_policy="fragmentation", target=target))
        if found is None:
            assert not isinstance(decision, Allocation)
            continue
        assert isinstance(decision, Allocation)
        # bind's Fit (the fragmentation card order) takes the cards the rule chose, and the node the
        # core booked has the fragmentation the rule predicted
        assert [node.positions[g.uuid] for g in decision.devices[0]] == list(found.cards[0])
        booked = apply_usage(node, pod_usage(decision.devices, 0, init_done=False))
        assert target.node(booked).frag == pytest.approx(found.after)
        nodes[at] = booked


def test_fit_node_follows_the_rule_and_falls_back_to_spread_without_a_target() -> None:
    node = node_with([0, 700, 0])
    request = share(30, gpu_policy="fragmentation")
    ruled = fit_node(request, node, Policy(target=Target([HALF])))
    assert isinstance(ruled, Allocation) and ruled.devices[0][0].uuid == "n-1"
    spread = fit_node(replace(request, gpu_policy="spread"), node, Policy())
    unknown = fit_node(request, node, Policy())
    assert isinstance(spread, Allocation) and isinstance(unknown, Allocation)
    assert unknown.devices == spread.devices  # no target: like any value HAMi does not know


def test_priorities_rank_the_node_whose_fragment_the_pod_fills() -> None:
    target = Target([HALF])
    nodes = [
        node_with([0, 0], name="idle"),
        node_with([700, 0], name="holey"),
        node_with([0, 200], name="ok"),
    ]
    request = share(30, node_policy="fragmentation")
    ranks = priorities(request, nodes, Policy(target=target))
    assert ranks == {"idle": priority(50), "holey": priority(gradient(300, 0)), "ok": priority(50)}
    assert ranks["holey"] > ranks["idle"]
    unknown = priorities(request, nodes, Policy())  # no target: like any value HAMi does not know
    assert unknown == priorities(share(30, node_policy="binpack"), nodes, Policy())


def test_a_node_is_scored_again_only_when_its_usage_changes() -> None:
    target = Target([HALF])
    node = node_with([0, 0], name="a")
    request = share(30, node_policy="fragmentation")
    first = priorities(request, [node], Policy(target=target))
    view = target.node(node)
    assert target.node(node) is view  # the same state object: the memo answers
    grant = Grant(uuid="a-0", memory_mib=700, cores=70)
    grown = apply_usage(node, pod_usage(((grant,),), 0, init_done=False))
    assert target.node(grown) is not view
    assert priorities(request, [grown], Policy(target=target)) != first


def test_a_target_needs_a_positive_weight_and_memos_stay_bounded() -> None:
    with pytest.raises(ValueError, match="positive weight"):
        Target([cls(1, 50, weight=0)])
    target = Target([HALF], memo_limit=4)
    request = share(30)
    for i in range(10):  # hostile template nodes: distinct names, distinct usages
        node = node_with([i], name=f"t{i}")
        target.node(node)
        node_priorities(target, request, [node])
    assert max(len(target._nodes), len(target._scores), len(target._cards)) <= 4
