"""Dynamic MIG (docs/protocol.md, "MIG"): profile and placement choice, Fit revisits, booking, exemption."""

from __future__ import annotations

from hami.core.allocate import Policy, fit_node
from hami.core.mig import book_all
from hami.core.model import Allocation, MigPlacement, MigReservation, Rejection

from .builders import (
    a100_profiles,
    make_card,
    make_container,
    make_device,
    make_request,
    mig_card,
    node_state,
)

A100 = make_device("MIG-0", mode="mig", memory=40960, mig_profiles=a100_profiles())


def test_booking_example_3g_2g_1g_1g_lands_at_4_0_3_2() -> None:
    # 3g highest start first -> 4 ([4,8)); 2g lowest first -> 0 ([0,2)); 1g from 6 down: 6,5,4 overlap
    # [4,8) -> 3; next 1g -> 2.
    booked = book_all(A100, (), [19968, 9856, 4864, 4864])
    assert booked is not None
    assert [(r.profile, r.placement.start) for r in booked] == [
        ("3g.20gb", 4),
        ("2g.10gb", 0),
        ("1g.5gb", 3),
        ("1g.5gb", 2),
    ]


def test_smallest_profile_with_enough_memory_and_a_free_placement() -> None:
    booked = book_all(A100, (), [5000])  # 1g (4864) too small -> 2g.10gb at its lowest start
    assert booked == [MigReservation(profile="2g.10gb", placement=MigPlacement(start=0, size=2))]
    # when every 2g placement is taken, the next bigger profile that still fits is used
    full = tuple(
        MigReservation(profile="2g.10gb", placement=MigPlacement(start=s, size=2)) for s in (0, 2, 4)
    )
    assert book_all(A100, full, [5000]) is None  # 3g placements [0,4),[4,8) both overlap
    assert book_all(A100, full[:1], [5000]) == [
        MigReservation(profile="2g.10gb", placement=MigPlacement(start=2, size=2))
    ]


def test_fit_revisits_a_mig_card_for_several_instances() -> None:
    # nums 2 on a single MIG card: both instances come from it (1g at 6 then 5); grants carry the
    # profile's memory and cores, not the request's.
    node = node_state(cards=(mig_card(),))
    decision = fit_node(make_request(make_container(2, mem=1000, cores=5)), node, Policy())
    assert isinstance(decision, Allocation)
    assert [(g.uuid, g.memory_mib, g.cores) for g in decision.devices[0]] == [("MIG-0", 4864, 15)] * 2
    assert [(m.device_index, m.profile, m.placement.start) for m in decision.mig] == [
        (0, "1g.5gb", 6),
        (1, "1g.5gb", 5),
    ]


def test_mig_count_exemption_from_node_insufficient_device() -> None:
    node = node_state(cards=(mig_card(),))
    assert isinstance(fit_node(make_request(make_container(3, mem=1)), node, Policy()), Allocation)
    # vgpu-mode without "mig" removes the exemption
    decision = fit_node(make_request(make_container(3, mem=1), vgpu_mode="hami-core"), node, Policy())
    assert isinstance(decision, Rejection) and decision.message == "NodeInsufficientDevice"


def test_existing_reservations_make_the_topology_infeasible() -> None:
    taken = (MigReservation(profile="7g.40gb", placement=MigPlacement(start=0, size=8)),)
    node = node_state(cards=(mig_card(reservations=taken, used=1),))
    decision = fit_node(make_request(make_container(mem=1)), node, Policy())
    assert isinstance(decision, Rejection)
    assert decision.message == "1/1 CardMigTopologyInfeasible"
    assert decision.resolvable  # with the card empty the pod would fit


def test_app_containers_see_earlier_bookings_on_the_shared_copy() -> None:
    # Two app containers each asking a 3g: 4 then 0; a third small one (100 MiB: memory is still free)
    # finds no 1g placement left.
    node = node_state(cards=(mig_card(),))
    two = make_request(make_container(mem=15000), make_container(mem=15000))
    decision = fit_node(two, node, Policy())
    assert isinstance(decision, Allocation)
    assert [(m.container_index, m.placement.start) for m in decision.mig] == [(0, 4), (1, 0)]
    three = make_request(make_container(mem=15000), make_container(mem=15000), make_container(mem=100))
    rejected = fit_node(three, node, Policy())
    assert isinstance(rejected, Rejection) and rejected.message == "1/1 CardMigTopologyInfeasible"


def test_percentage_resolves_against_the_card_before_profile_choice() -> None:
    # 50 % of 40960 MiB = 20480 > 3g (19968) -> 7g.40gb
    decision = fit_node(make_request(make_container(pct=50)), node_state(cards=(mig_card(),)), Policy())
    assert isinstance(decision, Allocation)
    assert decision.mig[0].profile == "7g.40gb"


def test_hami_core_cards_are_never_revisited() -> None:
    decision = fit_node(make_request(make_container(2, mem=1)), node_state(cards=(make_card(),)), Policy())
    assert isinstance(decision, Rejection) and decision.message == "NodeInsufficientDevice"
