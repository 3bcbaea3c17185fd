"""Topology-aware selection (docs/protocol.md, "Topology")."""

from __future__ import annotations

from hami.core.allocate import Policy, fit_node
from hami.core.model import Allocation
from hami.core.topology import select

from .builders import make_cards, make_container, make_request, node_state

# A-B 100 (NVLink), A-C 10, B-C 20, symmetric.
SCORES = {
    "A": {"B": 100, "C": 10},
    "B": {"A": 100, "C": 20},
    "C": {"A": 10, "B": 20},
}


def test_single_card_takes_the_least_connected() -> None:
    # sums: A 110, B 120, C 30 -> C
    assert select(["A", "B", "C"], 1, SCORES) == (2,)


def test_first_minimum_in_walk_order_wins() -> None:
    assert select(["X", "Y"], 1, {}) == (0,)


def test_multi_card_takes_the_best_connected_set() -> None:
    # {A,B}=100, {A,C}=10, {B,C}=20 -> {A,B}
    assert select(["A", "B", "C"], 2, SCORES) == (0, 1)


def test_direction_matters_and_missing_scores_are_zero() -> None:
    # only score[a][b] for a before b counts: C->A is 50 but A->C missing; {B,C} = 5 wins over {A,C} = 0.
    scores = {"C": {"A": 50}, "B": {"C": 5}}
    assert select(["A", "B", "C"], 2, scores) == (1, 2)


def test_negative_totals_still_choose_the_first_subset() -> None:
    assert select(["A", "B", "C"], 2, {"A": {"B": -5, "C": -5}, "B": {"C": -1}}) == (1, 2)


def test_fit_in_topology_mode_collects_every_candidate_then_selects() -> None:
    cards = make_cards(3)
    scores = {
        f"GPU-{a}": {f"GPU-{b}": (100 if {a, b} == {0, 1} else 10) for b in range(3) if b != a}
        for a in range(3)
    }
    node = node_state(cards=cards, pair_scores=scores)
    request = make_request(make_container(2, mem=1), gpu_policy="topology-aware")
    decision = fit_node(request, node, Policy())
    assert isinstance(decision, Allocation)
    # walk order GPU-2, GPU-1, GPU-0; best pair {GPU-1, GPU-0}; without topology: GPU-2, GPU-1
    assert [g.uuid for g in decision.devices[0]] == ["GPU-1", "GPU-0"]
    plain = fit_node(make_request(make_container(2, mem=1)), node, Policy())
    assert isinstance(plain, Allocation) and [g.uuid for g in plain.devices[0]] == ["GPU-2", "GPU-1"]
