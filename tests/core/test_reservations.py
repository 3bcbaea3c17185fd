"""Nominated pods hold their cards (issue 13): the pure rule, in tables.

Every node is built from empty 1000 MiB cards plus the occupants' usage (``apply_usage``), so the
state and the occupants always agree. A nominee's cards are always where the allocation core puts it
(``fit_node``) on the node as the case describes it, so each case also checks that.
"""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from hami.core.allocate import Policy, fit_node
from hami.core.model import Allocation, DeviceState, NodeState, PodRequest
from hami.core.reservations import (
    Nominee,
    Occupant,
    Reservation,
    held_against,
    reserve,
    with_reservations,
)
from hami.core.usage import CardUsage, PodUsage, apply_usage

from .builders import make_cards, make_container, make_request, node_state

POLICY = Policy()


def occupant(*cards: str, mem: int, prio: int = 0, leaving: bool = False) -> Occupant:
    usage = PodUsage(cards=tuple(CardUsage(uuid=c, slots=1, memory=mem, cores=0) for c in sorted(cards)))
    return Occupant(priority=prio, usage=usage, leaving=leaving)


def node_of(cards: Sequence[DeviceState], occupants: Sequence[Occupant] = ()) -> NodeState:
    node = node_state(cards=tuple(cards))
    for o in occupants:
        node = apply_usage(node, o.usage)
    return node


def nominee(name: str, prio: int, nums: int = 1, mem: int = 600, **request: object) -> Nominee:
    pod = make_request(make_container(nums, mem=mem), name=name, **request)  # type: ignore[arg-type]
    return Nominee(key=("default", name), priority=prio, request=pod)


def cards_of(reservation: Reservation) -> dict[str, int]:
    return {c.uuid: c.memory for c in reservation.usage.cards}


def placed(request: PodRequest, node: NodeState) -> dict[str, int]:
    decision = fit_node(request, node, POLICY)
    assert isinstance(decision, Allocation), decision
    return {g.uuid: g.memory_mib for grants in decision.devices for g in grants}


def test_a_nominee_holds_where_the_core_places_it() -> None:
    node = node_of(make_cards(2, memory=1000))
    urgent = nominee("urgent", 100)
    (found,) = reserve(node, [urgent], [], POLICY)
    assert found.key == ("default", "urgent") and found.priority == 100
    assert cards_of(found) == placed(urgent.request, node) and sum(cards_of(found).values()) == 600


def test_a_nominee_that_fits_nowhere_holds_nothing() -> None:
    node = node_of(make_cards(2, memory=1000))
    too_many = nominee("many", 100, nums=3)
    too_big = nominee("big", 100, mem=1001)
    assert reserve(node, [too_many, too_big], [], POLICY) == ()


def test_cards_of_pods_being_deleted_count_as_free_for_the_nominee() -> None:
    # kube-scheduler deleted the victim on GPU-0; the nominee needs both cards: it holds both.
    victim = occupant("GPU-0", mem=1000, prio=1, leaving=True)
    node = node_of(make_cards(2, memory=1000), [victim])
    (found,) = reserve(node, [nominee("urgent", 100, nums=2)], [victim], POLICY)
    assert cards_of(found) == {"GPU-0": 600, "GPU-1": 600}


def test_a_leaving_pod_is_assumed_gone_whatever_its_priority() -> None:
    leaving = occupant("GPU-0", mem=1000, prio=1000, leaving=True)
    node = node_of(make_cards(1, memory=1000), [leaving])
    (found,) = reserve(node, [nominee("urgent", 100)], [leaving], POLICY)
    assert cards_of(found) == {"GPU-0": 600}


@pytest.mark.parametrize(
    ("prio", "holds"),
    [(1, True), (99, True), (100, False), (101, False)],
    ids=["far-lower", "just-lower", "equal", "higher"],
)
def test_pods_not_yet_deleted_are_assumed_gone_only_when_the_nominee_outranks_them(
    prio: int, holds: bool
) -> None:
    # asynchronous preemption: the nomination may show before the victims' deletions
    staying = occupant("GPU-0", mem=1000, prio=prio)
    node = node_of(make_cards(2, memory=1000), [staying])
    found = reserve(node, [nominee("urgent", 100, nums=2)], [staying], POLICY)
    assert bool(found) is holds
    if holds:
        assert cards_of(found[0]) == {"GPU-0": 600, "GPU-1": 600}


def test_leaving_pods_are_preferred_to_pods_merely_outranked() -> None:
    # GPU-0 is being freed (a victim), GPU-1 holds a lower pod that stays: the nominee's card is
    # GPU-0, where it will land, not the card the core would pick with both pods assumed gone (GPU-1).
    victim = occupant("GPU-0", mem=900, prio=1, leaving=True)
    staying = occupant("GPU-1", mem=500, prio=1)
    node = node_of(make_cards(2, memory=1000), [victim, staying])
    (found,) = reserve(node, [nominee("urgent", 100)], [victim, staying], POLICY)
    assert cards_of(found) == {"GPU-0": 600}


def test_an_occupant_the_caller_does_not_list_is_never_assumed_gone() -> None:
    unknown = occupant("GPU-0", mem=1000, prio=0)
    node = node_of(make_cards(1, memory=1000), [unknown])
    assert reserve(node, [nominee("urgent", 100)], [], POLICY) == ()


def test_nominees_are_placed_highest_priority_first_each_around_the_earlier_ones() -> None:
    node = node_of(make_cards(2, memory=1000))
    nominees = [nominee("b-low", 50), nominee("top", 200), nominee("a-low", 50)]
    found = reserve(node, nominees, [], POLICY)
    assert [r.key[1] for r in found] == ["top", "a-low"]  # b-low no longer fits beside them
    assert set(cards_of(found[0])) != set(cards_of(found[1]))
    # the same answer whatever order the nominees come in
    assert reserve(node, list(reversed(nominees)), [], POLICY) == found


def test_a_later_nominee_cannot_displace_an_earlier_ones_cards() -> None:
    # the top nominee holds GPU-0's room; a lower one that outranks the occupant may assume the
    # occupant gone, never the reservation before it
    lower_pod = occupant("GPU-1", mem=1000, prio=0)
    node = node_of(make_cards(2, memory=1000), [lower_pod])
    found = reserve(node, [nominee("top", 200), nominee("next", 100)], [lower_pod], POLICY)
    assert [(r.key[1], cards_of(r)) for r in found] == [("top", {"GPU-0": 600}), ("next", {"GPU-1": 600})]


@pytest.mark.parametrize(
    ("priority", "key", "held"),
    [
        (0, None, ["top", "mid"]),
        (100, None, ["top", "mid"]),  # equal priority is held off (kube-scheduler's >=)
        (101, None, ["top"]),
        (200, ("default", "top"), []),  # never against itself
        (300, None, []),
    ],
)
def test_held_against_counts_nominees_of_equal_or_higher_priority(
    priority: int, key: tuple[str, str] | None, held: list[str]
) -> None:
    node = node_of(make_cards(2, memory=1000))
    found = reserve(node, [nominee("top", 200), nominee("mid", 100)], [], POLICY)
    assert [r.key[1] for r in held_against(found, priority, key)] == held


def test_reserved_cards_count_as_used_for_the_pods_held_off() -> None:
    node = node_of(make_cards(2, memory=1000))
    found = reserve(node, [nominee("urgent", 100, nums=2)], [], POLICY)
    taken = with_reservations(node, held_against(found, 0))
    assert [(c.used, c.used_mem) for c in taken.devices] == [(1, 600), (1, 600)]
    low = make_request(make_container(1, mem=500))
    rejected = fit_node(low, taken, POLICY)
    assert not isinstance(rejected, Allocation)
    assert rejected.message == "2/2 CardInsufficientMemory" and rejected.resolvable
    assert isinstance(fit_node(make_request(make_container(1, mem=400)), taken, POLICY), Allocation)
    assert with_reservations(node, ()) is node
