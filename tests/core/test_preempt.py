"""Device-aware preemption (issue 13): which lower-priority pods to evict so a pod fits on specific cards.

Every node is built from empty cards plus the holders' usage (``apply_usage``), so the state and the
holders always agree. Expected victims are worked out by hand in each case; the property test at the
end compares the search with a brute force over every subset, judged by the core's own Fit.
"""

from __future__ import annotations

import random
from collections.abc import Hashable, Sequence
from dataclasses import replace
from itertools import combinations

from hypothesis import given, settings
from hypothesis import strategies as st

from hami.core.allocate import Policy, fit_node
from hami.core.model import (
    Allocation,
    DeviceState,
    MigPlacement,
    MigReservation,
    NamespaceQuota,
    NodeState,
    PodRequest,
)
from hami.core.preempt import Holder, Preemption, cost, preempt_node
from hami.core.usage import CardUsage, PodUsage, apply_usage
from hami.core.victimsearch import CardMemo

from .builders import make_card, make_cards, make_container, make_request, mig_card, node_state

PREEMPTOR = 100  # the preempting pod's priority in every case


def hold(
    uid: str,
    *cards: str,
    mem: int = 0,
    cores: int = 0,
    prio: int = 0,
    started: float = 0.0,
    pdb: bool = False,
    ns: str = "default",
    mig: MigReservation | None = None,
) -> Holder:
    """A pod holding ``mem``/``cores`` and one slot on each of ``cards`` (default GPU-0)."""
    usage = PodUsage(
        cards=tuple(
            CardUsage(uuid=c, slots=1, memory=mem, cores=cores, reservations=(mig,) if mig else ())
            for c in sorted(cards or ("GPU-0",))
        )
    )
    return Holder(uid=uid, namespace=ns, priority=prio, started=started, violates_pdb=pdb, usage=usage)


def node_of(cards: Sequence[DeviceState], holders: Sequence[Holder], **kwargs: object) -> NodeState:
    node = node_state(cards=tuple(cards), **kwargs)  # type: ignore[arg-type]
    for holder in holders:
        node = apply_usage(node, holder.usage)
    return node


def victims(found: Preemption | None) -> list[str]:
    assert found is not None, "expected a preemption, got None (node dropped)"
    return sorted(h.uid for h in found.added)


def run(
    request: PodRequest, cards: Sequence[DeviceState], holders: Sequence[Holder], **kwargs: object
) -> Preemption | None:
    node = node_of(cards, holders)
    return preempt_node(request, PREEMPTOR, node, holders, Policy(), **kwargs)  # type: ignore[arg-type]


def lands_on(found: Preemption | None) -> list[str]:
    assert found is not None
    return [g.uuid for c in found.allocation.devices for g in c]


# ------------------------------------------------------------------------------------------ basics


def test_full_node_evicts_exactly_the_one_pod_that_frees_enough() -> None:
    # GPU-0: a 800 + b 200 (full); GPU-1: c 500 + d 500 (full). The pod asks 700 MiB: only a frees
    # enough on its own (c or d free 500); the minimal set is {a}.
    holders = [
        hold("a", "GPU-0", mem=800, prio=1),
        hold("b", "GPU-0", mem=200, prio=1),
        hold("c", "GPU-1", mem=500, prio=1),
        hold("d", "GPU-1", mem=500, prio=1),
    ]
    found = run(make_request(make_container(mem=700)), make_cards(2), holders)
    assert victims(found) == ["a"]
    assert found is not None and found.exact and lands_on(found) == ["GPU-0"]


def test_two_pods_on_one_card_when_no_single_pod_frees_enough() -> None:
    # Each card holds two 500 MiB pods; 700 MiB needs both pods of one card, never one from each.
    holders = [
        hold("a", "GPU-0", mem=500, prio=3),
        hold("b", "GPU-0", mem=500, prio=3),
        hold("c", "GPU-1", mem=500, prio=2),
        hold("d", "GPU-1", mem=500, prio=1),
    ]
    found = run(make_request(make_container(mem=700)), make_cards(2), holders)
    assert victims(found) == ["c", "d"]  # GPU-1's pods have the lower priorities
    assert lands_on(found) == ["GPU-1"]


def test_a_pod_that_already_fits_needs_no_victim() -> None:
    holders = [hold("a", "GPU-0", mem=300, prio=1)]
    found = run(make_request(make_container(mem=700)), make_cards(1), holders)
    assert found is not None and found.added == ()


def test_slots_and_cores_are_freed_too() -> None:
    # Slots: a 2-slot card holding two tiny pods refuses a third until one goes.
    holders = [hold("a", mem=10, prio=2), hold("b", mem=10, prio=1)]
    assert victims(run(make_request(make_container(mem=10)), make_cards(1, count=2), holders)) == ["b"]
    # Cores: 80 + 20 cores used; the pod asks 30 cores: only evicting the 80-core pod frees enough.
    holders = [hold("a", cores=80, prio=2), hold("b", cores=20, prio=1)]
    assert victims(run(make_request(make_container(cores=30)), make_cards(1), holders)) == ["a"]


def test_an_exclusive_request_needs_the_whole_card() -> None:
    # gpucores 100 needs used == 0 (docs/protocol.md, "Fit" check 13): every pod on the card goes.
    holders = [hold("a", "GPU-0", mem=10, prio=1), hold("b", "GPU-0", mem=10, prio=1)]
    found = run(make_request(make_container(cores=100)), make_cards(1), holders)
    assert victims(found) == ["a", "b"]


# ---------------------------------------------------------------------------------------- priority


def test_equal_and_higher_priority_pods_are_never_chosen() -> None:
    # GPU-0 would need only x (one victim), but x has the preemptor's priority; GPU-1 needs two.
    holders = [
        hold("x", "GPU-0", mem=1000, prio=PREEMPTOR),
        hold("y", "GPU-1", mem=500, prio=1),
        hold("z", "GPU-1", mem=500, prio=2),
    ]
    assert victims(run(make_request(make_container(mem=700)), make_cards(2), holders)) == ["y", "z"]
    holders[0] = hold("x", "GPU-0", mem=1000, prio=PREEMPTOR + 1)
    assert victims(run(make_request(make_container(mem=700)), make_cards(2), holders)) == ["y", "z"]


def test_only_higher_priority_pods_in_the_way_drops_the_node() -> None:
    holders = [hold("x", "GPU-0", mem=1000, prio=PREEMPTOR), hold("y", "GPU-1", mem=900, prio=500)]
    assert run(make_request(make_container(mem=700)), make_cards(2), holders) is None


def test_a_required_victim_of_equal_priority_drops_the_node() -> None:
    holders = [hold("a", mem=1000, prio=PREEMPTOR)]
    assert run(make_request(make_container(mem=700)), make_cards(1), holders, required=holders) is None


def test_required_victims_are_taken_off_first_and_not_repeated() -> None:
    # kube-scheduler already evicts b (for its own reasons): its 500 MiB come free, so only 200 more
    # are needed on GPU-0 and c (prio 1, 300 MiB) is cheaper than a (prio 2).
    holders = [
        hold("a", "GPU-0", mem=200, prio=2),
        hold("b", "GPU-0", mem=500, prio=1),
        hold("c", "GPU-0", mem=300, prio=1),
    ]
    found = run(make_request(make_container(mem=700)), make_cards(1), holders, required=[holders[1]])
    assert victims(found) == ["c"]


# ------------------------------------------------------------------------------ card constraints


def test_type_steering_picks_the_pods_on_the_wanted_card() -> None:
    # The T4's pod is cheaper (prio 1), but the pod asks for an A100: the A100's pod goes.
    cards = [make_card("GPU-0", type="NVIDIA A100"), make_card("GPU-1", index=1, type="NVIDIA T4")]
    holders = [hold("a100", "GPU-0", mem=900, prio=5), hold("t4", "GPU-1", mem=900, prio=1)]
    found = run(make_request(make_container(mem=700), use_types=("A100",)), cards, holders)
    assert victims(found) == ["a100"] and lands_on(found) == ["GPU-0"]
    found = run(make_request(make_container(mem=700), nouse_types=("T4",)), cards, holders)
    assert victims(found) == ["a100"]


def test_uuid_steering_picks_the_pods_on_the_named_card() -> None:
    holders = [
        hold("p0", "GPU-0", mem=900, prio=1),
        hold("p1", "GPU-1", mem=900, prio=9),
        hold("p2", "GPU-2", mem=900, prio=5),
    ]
    found = run(make_request(make_container(mem=700), use_uuids=("GPU-1",)), make_cards(3), holders)
    assert victims(found) == ["p1"] and lands_on(found) == ["GPU-1"]
    found = run(make_request(make_container(mem=700), nouse_uuids=("GPU-0",)), make_cards(3), holders)
    assert victims(found) == ["p2"]


def test_pods_on_cards_the_pod_cannot_use_are_left_alone() -> None:
    # GPU-1 is cordoned and unhealthy cards never count: only GPU-0's pod may go.
    cards = [make_card("GPU-0"), make_card("GPU-1", index=1), make_card("GPU-2", index=2, health=False)]
    holders = [
        hold("a", "GPU-0", mem=900, prio=9),
        hold("b", "GPU-1", mem=900, prio=1),
        hold("c", "GPU-2", mem=900, prio=1),
    ]
    node = node_of(cards, holders, cordoned=frozenset({"GPU-1"}))
    found = preempt_node(make_request(make_container(mem=700)), PREEMPTOR, node, holders, Policy())
    assert victims(found) == ["a"]


def test_a_card_too_small_even_when_empty_drops_the_node() -> None:
    holders = [hold("a", mem=500, prio=1)]
    assert run(make_request(make_container(mem=1500)), make_cards(1), holders) is None


def test_multi_card_pod_frees_the_cheapest_cards() -> None:
    # Three full cards; the pod asks 2 cards of 600 MiB: the two lowest-priority pods go.
    holders = [
        hold("a", "GPU-0", mem=1000, prio=7),
        hold("b", "GPU-1", mem=1000, prio=2),
        hold("c", "GPU-2", mem=1000, prio=3),
    ]
    found = run(make_request(make_container(2, mem=600)), make_cards(3), holders)
    assert victims(found) == ["b", "c"] and sorted(lands_on(found)) == ["GPU-1", "GPU-2"]


def test_one_pod_holding_two_cards_frees_both() -> None:
    # wide holds GPU-0 and GPU-1; each of the other cards has its own pod. One victim frees 2 cards.
    holders = [
        hold("wide", "GPU-0", "GPU-1", mem=1000, prio=5),
        hold("n2", "GPU-2", mem=1000, prio=1),
        hold("n3", "GPU-3", mem=1000, prio=1),
    ]
    found = run(make_request(make_container(2, mem=600)), make_cards(4), holders)
    assert victims(found) == ["wide"] and sorted(lands_on(found)) == ["GPU-0", "GPU-1"]


def test_numa_binding_keeps_the_victims_on_one_numa_node() -> None:
    # NUMA 0: GPU-0 (a, prio 1), GPU-1 (b, prio 9); NUMA 1: GPU-2 (c, prio 2), GPU-3 (d, prio 8).
    # Unbound, the two cheapest cards are GPU-0 and GPU-2; with numa-bind both cards must share a NUMA
    # node, and {c, d} (highest 8) beats {a, b} (highest 9).
    cards = [make_card(f"GPU-{i}", index=i, numa=i // 2) for i in range(4)]
    holders = [
        hold("a", "GPU-0", mem=1000, prio=1),
        hold("b", "GPU-1", mem=1000, prio=9),
        hold("c", "GPU-2", mem=1000, prio=2),
        hold("d", "GPU-3", mem=1000, prio=8),
    ]
    assert victims(run(make_request(make_container(2, mem=600)), cards, holders)) == ["a", "c"]
    found = run(make_request(make_container(2, mem=600), numa_bind=True), cards, holders)
    assert victims(found) == ["c", "d"] and sorted(lands_on(found)) == ["GPU-2", "GPU-3"]


def test_mig_placements_decide_which_instances_go() -> None:
    # 2g at [0,2) (g0), 2g at [2,4) (g1), 3g at [4,8) (g3). A 3g needs [0,4) or [4,8) free.
    def mig(uid: str, profile: str, start: int, size: int, mem: int, prio: int) -> Holder:
        placement = MigPlacement(start=start, size=size)
        return hold(
            uid, "MIG-0", mem=mem, prio=prio, mig=MigReservation(profile=profile, placement=placement)
        )

    holders = [
        mig("g0", "2g.10gb", 0, 2, 9856, 1),
        mig("g1", "2g.10gb", 2, 2, 9856, 1),
        mig("g3", "3g.20gb", 4, 4, 19968, 5),
    ]
    request = make_request(make_container(mem=15000))
    found = run(request, [mig_card()], holders)
    assert victims(found) == ["g3"]  # one victim beats two, whatever their priorities
    assert found is not None and [m.placement.start for m in found.allocation.mig] == [4]
    holders[2] = mig("g3", "3g.20gb", 4, 4, 19968, PREEMPTOR)
    found = run(request, [mig_card()], holders)
    assert victims(found) == ["g0", "g1"]
    assert found is not None and [m.placement.start for m in found.allocation.mig] == [0]


def test_namespace_quota_frees_with_pods_of_the_same_namespace() -> None:
    # team's quota is used up (1000 of 1000 MiB) by q (GPU-1). The pod (team, 500 MiB) fits GPU-0's
    # free memory, but only evicting q frees quota, even though q sits on another card.
    holders = [hold("q", "GPU-1", mem=1000, prio=5, ns="team"), hold("x", "GPU-0", mem=400, prio=1)]
    quotas = {"team": NamespaceQuota(memory_limit=1000, memory_used=1000)}
    request = make_request(make_container(mem=500), namespace="team")
    found = run(request, make_cards(2), holders, quotas=quotas)
    assert victims(found) == ["q"]
    # Pods of other namespaces never free quota: with q protected, nothing works.
    holders[0] = hold("q", "GPU-1", mem=1000, prio=PREEMPTOR, ns="team")
    assert run(request, make_cards(2), holders, quotas=quotas) is None


# -------------------------------------------------------------------------------------- tie rules


def test_fewest_victims_before_lowest_priorities() -> None:
    # GPU-0: one pod of priority 50; GPU-1: two pods of priority 1.
    holders = [
        hold("big", "GPU-0", mem=1000, prio=50),
        hold("s1", "GPU-1", mem=500, prio=1),
        hold("s2", "GPU-1", mem=500, prio=1),
    ]
    assert victims(run(make_request(make_container(mem=700)), make_cards(2), holders)) == ["big"]


def test_lowest_highest_priority_then_the_next() -> None:
    # Two-pod sets (5, 1) on GPU-0 and (4, 4) on GPU-1: the highest victim priority decides (4 < 5).
    holders = [
        hold("a5", "GPU-0", mem=500, prio=5),
        hold("a1", "GPU-0", mem=500, prio=1),
        hold("b4", "GPU-1", mem=500, prio=4),
        hold("c4", "GPU-1", mem=500, prio=4),
    ]
    assert victims(run(make_request(make_container(mem=700)), make_cards(2), holders)) == ["b4", "c4"]


def test_fewest_pdb_violations_then_youngest_then_uid() -> None:
    def three(**overrides: Holder) -> list[Holder]:
        base = {
            "p": hold("p", "GPU-0", mem=1000, prio=1, started=300, pdb=True),
            "q": hold("q", "GPU-1", mem=1000, prio=1, started=100),
            "r": hold("r", "GPU-2", mem=1000, prio=1, started=200),
        }
        base.update(overrides)
        return list(base.values())

    request = make_request(make_container(mem=700))
    # p is the youngest but its eviction violates a PDB: r (younger than q) goes.
    assert victims(run(request, make_cards(3), three())) == ["r"]
    # without the PDB, the youngest (p) goes
    assert victims(
        run(request, make_cards(3), three(p=hold("p", "GPU-0", mem=1000, prio=1, started=300)))
    ) == ["p"]
    # equal in everything: the smaller uid
    same = three(
        p=hold("p", "GPU-0", mem=1000, prio=1, started=100, pdb=True),
        r=hold("r", "GPU-2", mem=1000, prio=1, started=100),
    )
    assert victims(run(request, make_cards(3), same)) == ["q"]


def test_answer_does_not_depend_on_the_order_of_holders() -> None:
    holders = [hold(f"p{i}", f"GPU-{i % 4}", mem=250, prio=i % 3, started=i) for i in range(16)]
    request = make_request(make_container(2, mem=600))
    expected = run(request, make_cards(4), holders)
    for seed in range(5):
        shuffled = holders[:]
        random.Random(seed).shuffle(shuffled)
        again = run(request, make_cards(4), shuffled)
        assert again == expected


# --------------------------------------------------------------------------------- greedy fallback


def test_greedy_fallback_still_answers_a_set_that_fits() -> None:
    # A budget too small for the exact search: the greedy pass answers, marked inexact, and its set
    # fits and is irreducible (giving back any one victim breaks the fit).
    holders = [hold(f"p{i}", f"GPU-{i % 4}", mem=250, prio=i % 5, started=i) for i in range(16)]
    request = make_request(make_container(2, mem=600))
    node = node_of(make_cards(4), holders)
    found = preempt_node(request, PREEMPTOR, node, holders, Policy(), budget=3)
    assert found is not None and not found.exact
    chosen = {h.uid for h in found.added}
    assert isinstance(fit_node(request, without(node, holders, chosen), Policy()), Allocation)
    for uid in chosen:
        assert not isinstance(fit_node(request, without(node, holders, chosen - {uid}), Policy()), Allocation)
    exact = preempt_node(request, PREEMPTOR, node, holders, Policy())
    assert exact is not None and exact.exact and len(exact.added) <= len(found.added)


def without(node: NodeState, holders: Sequence[Holder], uids: set[str]) -> NodeState:
    for holder in holders:
        if holder.uid in uids:
            node = apply_usage(node, holder.usage, sign=-1)
    return node


# ---------------------------------------------------------------------------- property: brute force


@st.composite
def nodes(draw: st.DrawFn, prefix: str = "") -> tuple[NodeState, list[Holder]]:
    """1..3 cards (3 slots, 1000 MiB, 100 cores; A100 or T4; NUMA 0/1) and the pods that fit them."""
    cards = [
        make_card(
            f"GPU-{prefix}{i}",
            index=i,
            count=3,
            numa=draw(st.integers(0, 1)),
            type=draw(st.sampled_from(["NVIDIA A100", "NVIDIA T4"])),
        )
        for i in range(draw(st.integers(1, 3)))
    ]
    node, counted = node_of(cards, []), list[Holder]()
    for i in range(draw(st.integers(0, 6))):
        on = draw(
            st.lists(st.sampled_from([c.device.uuid for c in cards]), min_size=1, max_size=2, unique=True)
        )
        holder = hold(
            f"p{prefix}{i}",
            *on,
            mem=draw(st.sampled_from([100, 300, 500])),
            cores=draw(st.sampled_from([0, 30, 60])),
            prio=draw(st.sampled_from([1, 2, PREEMPTOR])),
            started=draw(st.sampled_from([1.0, 2.0])),
            pdb=draw(st.booleans()),
            ns=draw(st.sampled_from(["default", "team"])),
        )
        trial = apply_usage(node, holder.usage)  # only the pods that fit the cards count
        if all(s.used <= s.device.count and s.free_mem >= 0 and s.free_cores >= 0 for s in trial.devices):
            node, counted = trial, [*counted, holder]
    return node, counted


@st.composite
def requests(draw: st.DrawFn) -> PodRequest:
    """1 or 2 containers (the first may be an init container) with type, NUMA and GPU-policy steering."""
    containers = [
        make_container(
            draw(st.integers(1, 2)),
            mem=draw(st.sampled_from([200, 600])),
            cores=draw(st.sampled_from([0, 50, 100])),
        )
        for _ in range(draw(st.integers(1, 2)))
    ]
    return make_request(
        *containers,
        init_count=draw(st.integers(0, len(containers) - 1)),
        numa_bind=draw(st.booleans()),
        namespace=draw(st.sampled_from(["default", "team"])),
        use_types=draw(st.sampled_from([(), ("A100",)])),
        gpu_policy=draw(st.sampled_from([None, "binpack", "mutex", "topology-aware"])),
    )


def brute_force(
    request: PodRequest, node: NodeState, holders: list[Holder], quota: NamespaceQuota | None
) -> tuple[Holder, ...] | None:
    """The cheapest set of lower-priority pods whose removal makes the core's Fit place the pod."""
    best: tuple[Holder, ...] | None = None
    eligible = [h for h in holders if h.priority < PREEMPTOR]
    for size in range(len(eligible) + 1):
        for combo in combinations(eligible, size):
            quotas = {}
            if quota is not None:
                freed = [h.usage for h in combo if h.namespace == request.namespace]
                quotas[request.namespace] = replace(
                    quota,
                    memory_used=quota.memory_used - sum(u.memory for u in freed),
                    cores_used=quota.cores_used - sum(u.cores for u in freed),
                )
            state = without(node, holders, {h.uid for h in combo})
            fits = isinstance(fit_node(request, state, Policy(), quotas=quotas), Allocation)
            if fits and (best is None or cost(combo) < cost(best)):
                best = combo
    return best


def check(found: Preemption | None, best: tuple[Holder, ...] | None) -> None:
    if best is None:
        assert found is None
        return
    assert found is not None
    assert all(h.priority < PREEMPTOR for h in found.added)
    if found.exact:
        assert cost(found.added) == cost(best)


@settings(max_examples=300, deadline=None, derandomize=True)
@given(requests(), nodes(), st.sampled_from([None, 600, 1000, 1500]))
def test_search_matches_a_brute_force_over_every_subset(
    request: PodRequest, scenario: tuple[NodeState, list[Holder]], limit: int | None
) -> None:
    node, holders = scenario
    quota = None
    if limit is not None:  # the namespace's quota, used by its pods on this node
        used = sum(h.usage.memory for h in holders if h.namespace == request.namespace)
        quota = NamespaceQuota(memory_limit=limit, memory_used=used)
    quotas = {request.namespace: quota} if quota is not None else None
    found = preempt_node(request, PREEMPTOR, node, holders, Policy(), quotas=quotas)
    check(found, brute_force(request, node, holders, quota))


@settings(max_examples=150, deadline=None, derandomize=True)
@given(requests(), st.tuples(nodes("a"), nodes("b"), nodes("c")))
def test_one_memo_shared_by_several_nodes_changes_no_answer(
    request: PodRequest, scenarios: tuple[tuple[NodeState, list[Holder]], ...]
) -> None:
    memo: dict[Hashable, CardMemo] = {}
    for node, holders in scenarios:
        found = preempt_node(request, PREEMPTOR, node, holders, Policy(), memo=memo)
        check(found, brute_force(request, node, holders, None))
