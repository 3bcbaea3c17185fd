"""Usage accounting (docs/protocol.md, "Usage"): collapse, init-done shrink, incremental apply/remove, MIG
rules."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hami.core.model import Grant, MigAllocation, MigPlacement, MigReservation
from hami.core.usage import PodUsage, apply_usage, apply_usages, pod_usage

from .builders import make_card, make_cards, mig_card, node_state


def g(uuid: str, mem: int, cores: int) -> Grant:
    return Grant(uuid=uuid, memory_mib=mem, cores=cores)


def figures(node_cards: object) -> list[tuple[str, int, int, int]]:
    return [(s.device.uuid, s.used, s.used_mem, s.used_cores) for s in node_cards]  # type: ignore[attr-defined]


def test_app_containers_sum_and_take_one_slot_each() -> None:
    usage = pod_usage(((g("A", 4000, 20),), (g("A", 1000, 10), g("B", 500, 5))), 0, init_done=False)
    assert [(c.uuid, c.slots, c.memory, c.cores) for c in usage.cards] == [
        ("A", 2, 5000, 30),
        ("B", 1, 500, 5),
    ]


def test_init_containers_contribute_their_maximum_and_one_slot() -> None:
    # init 5000/20 and 3000/50 on A -> init max 5000/50, 1 slot; app 4000/20 on A -> app 4000/20, 1 slot.
    # effective: max per field -> 5000/50, slots max(1, 1, 1) = 1.
    devices = ((g("A", 5000, 20),), (g("A", 3000, 50),), (g("A", 4000, 20),))
    usage = pod_usage(devices, 2, init_done=False)
    assert [(c.uuid, c.slots, c.memory, c.cores) for c in usage.cards] == [("A", 1, 5000, 50)]


def test_two_app_containers_outweigh_init_slots() -> None:
    devices = ((g("A", 100, 0),), (g("A", 100, 0),), (g("A", 100, 0),))
    usage = pod_usage(devices, 1, init_done=False)
    assert [(c.slots, c.memory) for c in usage.cards] == [(2, 200)]


def test_init_done_shrinks_to_app_containers() -> None:
    devices = ((g("A", 5000, 20),), (g("B", 4000, 20),))
    usage = pod_usage(devices, 1, init_done=True)
    assert [(c.uuid, c.memory) for c in usage.cards] == [("B", 4000)]


def test_cards_are_sorted_by_uuid_and_totals_sum() -> None:
    usage = pod_usage(((g("Z", 1, 2), g("A", 3, 4)),), 0, init_done=False)
    assert [c.uuid for c in usage.cards] == ["A", "Z"]
    assert (usage.memory, usage.cores) == (4, 6)


def test_apply_then_remove_restores_the_node_exactly() -> None:
    node = node_state(cards=make_cards(2))
    usage = pod_usage(((g("GPU-1", 300, 30),), (g("GPU-1", 200, 10),)), 0, init_done=False)
    added = apply_usage(node, usage)
    assert figures(added.devices) == [("GPU-0", 0, 0, 0), ("GPU-1", 2, 500, 40)]
    # the derived summary follows: node score 10 x (2/20 + 40/200 + 500/2000) = 10 x 0.55 = 5.5
    assert abs(added.summary.score - 5.5) < 1e-5
    assert apply_usage(added, usage, sign=-1) == node
    assert apply_usage(added, usage, sign=-1).summary == node.summary


def test_unknown_uuid_is_ignored() -> None:
    node = node_state(cards=make_cards(1))
    assert apply_usage(node, pod_usage(((g("nope", 1, 1),),), 0, init_done=False)) is node


def reservation(start: int, size: int = 1, profile: str = "1g.5gb") -> MigAllocation:
    return MigAllocation(
        container_index=0,
        device_index=0,
        gpu_uuid="MIG-0",
        profile=profile,
        placement=MigPlacement(start=start, size=size),
    )


def test_mig_entry_with_matching_reservation_books_it() -> None:
    node = node_state(cards=(mig_card(),))
    usage = pod_usage(((g("MIG-0", 4864, 15),),), 0, init_done=False, mig=[reservation(6)])
    card = apply_usage(node, usage).devices[0]
    assert card.healthy and card.used == 1
    assert card.reservations == (MigReservation(profile="1g.5gb", placement=MigPlacement(start=6, size=1)),)


def test_mig_entry_without_reservation_fails_closed_and_removal_heals() -> None:
    node = node_state(cards=(mig_card(),))
    usage = pod_usage(((g("MIG-0", 4864, 15),),), 0, init_done=False)
    added = apply_usage(node, usage)
    assert not added.devices[0].healthy
    assert apply_usage(added, usage, sign=-1).devices[0].healthy


def test_reservation_on_a_non_mig_card_fails_closed() -> None:
    node = node_state(cards=(make_card("MIG-0"),))
    usage = pod_usage(((g("MIG-0", 100, 0),),), 0, init_done=False, mig=[reservation(0)])
    assert not apply_usage(node, usage).devices[0].healthy


def test_two_bad_pods_need_two_removals() -> None:
    node = node_state(cards=(mig_card(),))
    usage = pod_usage(((g("MIG-0", 1, 0),),), 0, init_done=False)
    twice = apply_usage(apply_usage(node, usage), usage)
    assert not apply_usage(twice, usage, sign=-1).devices[0].healthy


def test_left_over_reservation_is_still_booked() -> None:
    # The reservation points at container 1, which has no grant: no slot, but the placement is taken.
    node = node_state(cards=(mig_card(),))
    leftover = MigAllocation(
        container_index=1,
        device_index=0,
        gpu_uuid="MIG-0",
        profile="1g.5gb",
        placement=MigPlacement(start=3, size=1),
    )
    usage = pod_usage(((),), 0, init_done=False, mig=[leftover])
    card = apply_usage(node, usage).devices[0]
    assert card.used == 0 and len(card.reservations) == 1 and card.healthy


def test_reservation_for_a_different_card_does_not_match() -> None:
    node = node_state(cards=(mig_card("MIG-0"), mig_card("MIG-1", index=1)))
    wrong = MigAllocation(
        container_index=0,
        device_index=0,
        gpu_uuid="MIG-1",
        profile="1g.5gb",
        placement=MigPlacement(start=0, size=1),
    )
    usage = pod_usage(((g("MIG-0", 4864, 15),),), 0, init_done=False, mig=[wrong])
    after = apply_usage(node, usage)
    assert not after.devices[0].healthy  # entry without its reservation
    assert after.devices[1].healthy and len(after.devices[1].reservations) == 1  # left-over, booked


# -------------------------------------------------------------------------- many changes at once

UUIDS = ("GPU-0", "GPU-1", "MIG-0", "nope")


def some_usage(draw: st.DrawFn) -> PodUsage:
    grants = draw(
        st.lists(st.tuples(st.sampled_from(UUIDS), st.integers(0, 5000), st.integers(0, 100)), max_size=3)
    )
    mig = [
        MigAllocation(
            container_index=0,
            device_index=index,
            gpu_uuid=draw(st.sampled_from(UUIDS)),
            profile="1g.5gb",
            placement=MigPlacement(start=draw(st.integers(0, 6)), size=1),
        )
        for index in range(draw(st.integers(0, 2)))
    ]
    return pod_usage((tuple(g(*grant) for grant in grants),), 0, init_done=False, mig=mig)


@st.composite
def changes(draw: st.DrawFn) -> list[tuple[PodUsage, int]]:
    """Pods added, and some of them taken off again later (as a list and its watch events bring them)."""
    usages = [some_usage(draw) for _ in range(draw(st.integers(0, 8)))]
    steps: list[tuple[PodUsage, int]] = []
    held: list[PodUsage] = []
    for usage in usages:
        steps.append((usage, 1))
        held.append(usage)
        if draw(st.booleans()):
            steps.append((held.pop(draw(st.integers(0, len(held) - 1))), -1))
    return steps


@given(changes())
def test_many_changes_at_once_give_the_node_one_by_one_gives(steps: list[tuple[PodUsage, int]]) -> None:
    node = node_state(cards=(*make_cards(2), mig_card(index=2)))
    one_by_one = node
    for usage, sign in steps:
        one_by_one = apply_usage(one_by_one, usage, sign=sign)
    at_once = apply_usages(node, steps)
    assert at_once == one_by_one
    assert at_once.summary == one_by_one.summary
    assert [card.reservations for card in at_once.devices] == [
        card.reservations for card in one_by_one.devices
    ]


def test_many_changes_refuse_a_bad_sign() -> None:
    usage = pod_usage(((g("GPU-0", 1, 1),),), 0, init_done=False)
    with pytest.raises(ValueError, match="sign"):
        apply_usages(node_state(cards=make_cards(1)), [(usage, 1), (usage, 0)])
