"""Scoring and ordering (docs/protocol.md, "Scoring"): card score, weights, GPU policies, node score."""

from __future__ import annotations

import pytest

from hami.core.allocate import Policy, fit_node, priorities
from hami.core.gocompat import f32
from hami.core.model import Allocation, DeviceState, PodRequest, ScoringWeights
from hami.core.score import card_score, demote_busy, node_priority, node_score

from .builders import make_card, make_cards, make_container, make_request, node_state


def chosen(cards: tuple[DeviceState, ...], request: PodRequest, policy: Policy | None = None) -> list[str]:
    decision = fit_node(request, node_state(cards=cards), policy or Policy())
    assert isinstance(decision, Allocation), decision
    return [g.uuid for g in decision.devices[-1]]


def test_card_score_worked_example() -> None:
    # 10 slots / 100 cores / 1000 MiB, 2 tasks, 40 cores, 500 MiB used; request 30 cores, 25 %:
    # n=1, c=30, m=1000*25//100=250 -> 10 x (3/10 + 70/100 + 750/1000) = 10 x 1.75 = 17.5
    card = make_card(used=2, used_cores=40, used_mem=500)
    assert card_score(card, make_container(pct=25, cores=30), ScoringWeights()) == pytest.approx(
        17.5, rel=1e-6
    )


def test_card_score_ignores_requests_of_another_type() -> None:
    # Production quirk: card type is the model name, the request says NVIDIA -> usage only: 10 x (0.2+0.4+0.5)
    card = make_card(type="NVIDIA A100", used=2, used_cores=40, used_mem=500)
    assert card_score(card, make_container(pct=25, cores=30), ScoringWeights()) == pytest.approx(
        11.0, rel=1e-6
    )


def test_card_score_weights_and_zero_totals() -> None:
    card = make_card(used=2, used_cores=40, used_mem=500)
    # slot=0, core=0, memory=2: 10 x 2 x (0+500)/1000 = 10  (request of 0 MiB, type NVIDIA counts n,c only)
    weights = ScoringWeights(slot=0, core=0, memory=2)
    assert card_score(card, make_container(), weights) == pytest.approx(10.0)
    assert card_score(make_card(count=0), make_container(), ScoringWeights()) == 0.0


def test_float32_ties_keep_registration_order() -> None:
    # Memory ratios 1/3 and 11184811/2^25 differ in float64 but are the same float32 number, so the two
    # cards tie and the last registered (B) is tried first. Float64 would rank A lower and pick A (spread).
    a = make_card("A", index=0, type="NVIDIA-X", memory=3, used=1, used_mem=1)
    b = make_card("B", index=1, type="NVIDIA-X", memory=2**25, used=1, used_mem=11184811)
    assert f32(1 / 3) == f32(11184811 / 2**25) and 1 / 3 != 11184811 / 2**25
    assert chosen((a, b), make_request(make_container())) == ["B"]


def test_weights_annotation_changes_the_choice() -> None:
    # A: 5 of 10 slots used, no memory; B: 1 slot, 900 of 1000 MiB. Spread tries the lowest score first.
    # default: A = 10 x (0.5 + 0 + 0) = 5, B = 10 x (0.1 + 0 + 0.9) = 10 -> A.
    # slot=1, core=1, memory=0: A = 5, B = 1 -> B.
    cards = (
        make_card("A", index=0, type="NVIDIA-X", used=5),
        make_card("B", index=1, type="NVIDIA-X", used=1, used_mem=900),
    )
    assert chosen(cards, make_request(make_container(mem=10))) == ["A"]
    weights = ScoringWeights(slot=1, core=1, memory=0)
    assert chosen(cards, make_request(make_container(mem=10), weights=weights)) == ["B"]


def test_binpack_and_spread_break_score_ties_by_numa() -> None:
    # Idle cards tie; list order puts lower NUMA first, so the walk (from the end) tries NUMA 1 first
    # even though it is registered first. Pure registration order would have picked GPU-1.
    cards = (make_card("GPU-0", index=0, numa=1), make_card("GPU-1", index=1, numa=0))
    assert chosen(cards, make_request(make_container(mem=1))) == ["GPU-0"]
    assert chosen(cards, make_request(make_container(mem=1), gpu_policy="binpack")) == ["GPU-0"]


def test_numa_bind_makes_numa_primary() -> None:
    # GPU-0 numa 0 busy, GPU-1 numa 1 idle. spread + numa-bind: (numa asc, score desc) -> [GPU-0, GPU-1]
    # -> GPU-1 tried first.
    cards = (make_card("GPU-0", index=0, numa=0, used=1, used_mem=100), make_card("GPU-1", index=1, numa=1))
    assert chosen(cards, make_request(make_container(mem=1), numa_bind=True)) == ["GPU-1"]
    # Spread without numa-bind prefers the idle card as well, so flip usage to tell the rules apart:
    cards = (make_card("GPU-0", index=0, numa=0), make_card("GPU-1", index=1, numa=1, used=1, used_mem=100))
    assert chosen(cards, make_request(make_container(mem=1))) == ["GPU-0"]  # spread: least used
    assert chosen(cards, make_request(make_container(mem=1), numa_bind=True)) == ["GPU-1"]  # NUMA first
    assert chosen(cards, make_request(make_container(mem=1), numa_bind=True, gpu_policy="binpack")) == [
        "GPU-0"
    ]


def test_mutex_orders_by_used_only() -> None:
    # Both idle (used 0); GPU-1 has stale memory usage so spread would avoid it. Mutex ignores the score:
    # tie -> registration order -> the last registered (GPU-1) is tried first.
    cards = (make_card("GPU-0", index=0), make_card("GPU-1", index=1, used_mem=500))
    assert chosen(cards, make_request(make_container(mem=1))) == ["GPU-0"]
    assert chosen(cards, make_request(make_container(mem=1), gpu_policy="mutex")) == ["GPU-1"]
    # HAMi's comparator tests the single "mutex" value before numa-bind: NUMA does not become primary and
    # the score is still ignored (numa-bind ordering would sort by score and try GPU-0 first).
    assert chosen(cards, make_request(make_container(mem=1), gpu_policy="mutex", numa_bind=True)) == ["GPU-1"]


def test_chain_full_tie_breaks_by_card_index() -> None:
    # Registered index 1 then index 0. Single "spread": stable -> last registered (index 0) first.
    # Chain "numa": full tie -> index ascending -> [idx0, idx1] -> idx1 (first registered) tried first.
    cards = (make_card("first", index=1), make_card("second", index=0))
    assert chosen(cards, make_request(make_container(mem=1))) == ["second"]
    assert chosen(cards, make_request(make_container(mem=1), gpu_policy="numa")) == ["first"]
    assert chosen(cards, make_request(make_container(mem=1), gpu_policy="spread,mutex")) == ["first"]


def test_chain_keys_in_written_order() -> None:
    # GPU-0 numa 1 idle, GPU-1 numa 0 busy. "numa,binpack": NUMA ascending first -> [GPU-1, GPU-0] ->
    # GPU-0 tried first. "binpack,numa": score ascending -> [GPU-0 (idle), GPU-1] -> GPU-1.
    cards = (make_card("GPU-0", index=0, numa=1), make_card("GPU-1", index=1, numa=0, used=1, used_mem=100))
    assert chosen(cards, make_request(make_container(mem=1), gpu_policy="numa,binpack")) == ["GPU-0"]
    assert chosen(cards, make_request(make_container(mem=1), gpu_policy="binpack,numa")) == ["GPU-1"]
    # numa-bind moves numa to the front of "binpack,numa"
    assert chosen(cards, make_request(make_container(mem=1), gpu_policy="binpack,numa", numa_bind=True)) == [
        "GPU-0"
    ]


def test_unknown_single_policy_behaves_as_spread() -> None:
    cards = (make_card("GPU-0", index=0, used=1, used_mem=500), make_card("GPU-1", index=1))
    assert chosen(cards, make_request(make_container(mem=1), gpu_policy="whatever")) == ["GPU-1"]
    assert chosen(cards, make_request(make_container(mem=1), gpu_policy="topology-aware")) == ["GPU-1"]


# ----------------------------------------------------------------------------------------- node score


def node_3() -> object:
    # 1 card, 1/10 slots, 10/100 cores, 100/1000 MiB -> 10 x (0.1 + 0.1 + 0.1) = 3.0
    return node_state("node1", (make_card(used=1, used_cores=10, used_mem=100),))


def node_8() -> object:
    # 3/10 slots, 30/100 cores, 200/1000 MiB -> 10 x (0.3 + 0.3 + 0.2) = 8.0
    return node_state("node2", (make_card(used=3, used_cores=30, used_mem=200),))


def test_node_score_examples() -> None:
    assert node_score(node_3()) == pytest.approx(3.0, rel=1e-6)  # type: ignore[arg-type]
    assert node_score(node_8()) == pytest.approx(8.0, rel=1e-6)  # type: ignore[arg-type]
    assert node_score(node_state(cards=make_cards(2, count=0))) == 0.0


def test_node_score_counts_every_card_even_other_vendors() -> None:
    # one idle NVIDIA card + one busy AMD card: 10 x (5/20 + 50/200 + 500/2000) = 7.5
    cards = (
        make_card("GPU-0", index=0),
        make_card("AMD-0", index=1, type="AMD", used=5, used_cores=50, used_mem=500),
    )
    assert node_score(node_state(cards=cards)) == pytest.approx(7.5, rel=1e-6)


@pytest.mark.parametrize(
    ("cluster", "pod", "winner"),
    [
        ("binpack", None, "node2"),
        ("spread", None, "node1"),
        ("binpack", "spread", "node1"),
        ("spread", "binpack", "node2"),
    ],
)
def test_node_policy_ranks_fuller_or_emptier_nodes_first(cluster: str, pod: str | None, winner: str) -> None:
    # the ranking /prioritize answers: node1 scores 3.0, node2 8.0 -> binpack 1 and 3, spread 9 and 7
    request = make_request(make_container(mem=10), node_policy=pod)
    ranks = priorities(request, [node_3(), node_8()], Policy(node_policy=cluster))  # type: ignore[list-item]
    assert max(ranks, key=lambda name: ranks[name]) == winner
    assert ranks == ({"node1": 1, "node2": 3} if (pod or cluster) == "binpack" else {"node1": 9, "node2": 7})


def test_node_priority_maps_the_node_score_onto_zero_to_ten() -> None:
    assert [node_priority(score, "binpack") for score in (0.0, 1.4, 1.5, 4.6, 15.0, 30.0, 45.0)] == [
        0, 0, 0, 2, 5, 10, 10,  # round(score / 3), clamped
    ]  # fmt: skip
    assert [node_priority(score, "spread") for score in (0.0, 15.0, 30.0)] == [10, 5, 0]
    assert node_priority(30.0, "anything else") == 10  # binpack is the default


def test_node_score_is_the_usage_before_the_pod() -> None:
    decision = fit_node(make_request(make_container(mem=500, cores=50)), node_3(), Policy())  # type: ignore[arg-type]
    assert isinstance(decision, Allocation) and decision.score == pytest.approx(3.0, rel=1e-6)


def test_equal_scores_rank_equal() -> None:
    nodes = [node_state(n, make_cards(1)) for n in ("b", "c", "a")]
    for node_policy in ("binpack", "spread"):
        ranks = priorities(make_request(make_container(mem=1)), nodes, Policy(node_policy=node_policy))
        assert list(ranks) == ["b", "c", "a"] and len(set(ranks.values())) == 1


@pytest.mark.parametrize(
    ("scores", "busy", "expected", "demoted"),
    [
        ({"a": 4, "b": 0, "c": 2}, {"a"}, {"a": 0, "b": 1, "c": 2}, 1),  # the free ones above, in order
        ({"a": 10, "b": 0, "c": 0}, {"a", "b"}, {"a": 0, "b": 0, "c": 1}, 2),
        ({"a": 4, "b": 0}, {"a", "b"}, {"a": 4, "b": 0}, 0),  # every node busy: unchanged
        ({"a": 4, "b": 0}, set(), {"a": 4, "b": 0}, 0),  # none busy: unchanged
        ({"a": 4, "b": 0}, {"ghost"}, {"a": 4, "b": 0}, 0),  # a busy name not ranked: nothing
        ({"a": 4, "b": 0}, {"a", "ghost"}, {"a": 0, "b": 1}, 1),
    ],
)
def test_demote_busy_ranks_busy_nodes_below_every_free_one(
    scores: dict[str, int], busy: set[str], expected: dict[str, int], demoted: int
) -> None:
    assert demote_busy(scores, busy) == demoted
    assert scores == expected
