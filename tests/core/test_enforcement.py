"""Enforcement levels in the core: a card below the required level is excluded by Fit with
``CardEnforcementInsufficient`` (counted per card), the cluster's floor applies to every pod and a pod
may raise it, never lower it; the precheck's verdict stays equal to the full Fit."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from hami.core import precheck
from hami.core.allocate import Policy, allocate, fit_node
from hami.core.enforcement import LEVEL_WORDS, Enforcement, Level, level_of, parse_level
from hami.core.model import Allocation, DeviceState, NodeState, Rejection
from hami.core.rejection import Reason
from hami.core.score import parse_gpu_policy

from .builders import make_card, make_container, make_request, node_state

HAMI_CORE, NONE, MIG, MPS, MPS_NS = (
    Enforcement.HAMI_CORE,
    Enforcement.NONE,
    Enforcement.MIG,
    Enforcement.MPS,
    Enforcement.MPS_NAMESPACED,
)


def node_of(*kinds: Enforcement, name: str = "n1") -> NodeState:
    return node_state(name, [make_card(f"GPU-{i}", index=i, enforcement=k) for i, k in enumerate(kinds)])


def test_levels_are_ordered_and_every_kind_has_one() -> None:
    assert Level.NONE < Level.COOPERATIVE < Level.ISOLATED
    assert LEVEL_WORDS == ("none", "cooperative", "isolated")
    assert {kind: level_of(kind) for kind in Enforcement} == {
        NONE: Level.NONE,
        HAMI_CORE: Level.COOPERATIVE,
        MPS: Level.COOPERATIVE,
        MPS_NS: Level.ISOLATED,
        MIG: Level.ISOLATED,
    }
    assert parse_level(" isolated ") is Level.ISOLATED
    for bad in ("", "Cooperative", "hami-core", "2", "none,isolated", "isolated\x00"):
        assert parse_level(bad) is None, bad


def test_without_a_requirement_a_card_without_enforcement_fits_as_in_hami() -> None:
    assert isinstance(fit_node(make_request(make_container(mem=10)), node_of(NONE), Policy()), Allocation)


def test_fit_excludes_cards_below_the_pods_level_with_a_counted_reason() -> None:
    request = make_request(make_container(2, mem=10), enforcement=Level.COOPERATIVE)
    decision = fit_node(request, node_of(NONE, HAMI_CORE, NONE), Policy())
    assert isinstance(decision, Rejection)
    assert decision.reasons == {
        Reason.CARD_ENFORCEMENT_INSUFFICIENT: 2,
        Reason.ALLOCATED_CARDS_INSUFFICIENT_REQUEST: 1,
    }
    assert decision.message == "1/3 AllocatedCardsInsufficientRequest, 2/3 CardEnforcementInsufficient"
    assert not decision.resolvable  # no pod leaving gives a card enforcement
    one = fit_node(
        make_request(make_container(mem=10), enforcement=Level.COOPERATIVE), node_of(NONE), Policy()
    )
    assert isinstance(one, Rejection) and one.message == "1/1 CardEnforcementInsufficient"


def test_the_granted_cards_are_those_at_or_above_the_level() -> None:
    request = make_request(make_container(2, mem=10), enforcement=Level.COOPERATIVE)
    decision = fit_node(request, node_of(NONE, HAMI_CORE, MIG, NONE), Policy())
    assert isinstance(decision, Allocation)
    assert sorted(g.uuid for g in decision.devices[0]) == ["GPU-1", "GPU-2"]
    isolated = make_request(make_container(mem=10), enforcement=Level.ISOLATED)
    for kinds, fits in (((HAMI_CORE, MPS), False), ((HAMI_CORE, MPS_NS), True)):
        assert isinstance(fit_node(isolated, node_of(*kinds), Policy()), Allocation) is fits, kinds


def test_the_cluster_floor_applies_and_a_pod_cannot_lower_it() -> None:
    floor = Policy(enforcement=Level.COOPERATIVE)
    for pod_level in (Level.NONE, Level.COOPERATIVE):
        request = make_request(make_container(mem=10), enforcement=pod_level)
        decision = fit_node(request, node_of(NONE), floor)
        assert isinstance(decision, Rejection), pod_level
        assert decision.reasons == {Reason.CARD_ENFORCEMENT_INSUFFICIENT: 1}
        decisions = allocate(request, [node_of(NONE), node_of(HAMI_CORE, name="n2")], floor)
        assert decisions.fitting == ("n2",)
        assert decisions.rejections()["n1"].message == "1/1 CardEnforcementInsufficient"
    raised = make_request(make_container(mem=10), enforcement=Level.ISOLATED)
    assert isinstance(fit_node(raised, node_of(HAMI_CORE), floor), Rejection)  # the pod raises it


def test_other_reasons_come_first_and_a_failing_card_counts_once() -> None:
    request = make_request(make_container(mem=10), enforcement=Level.COOPERATIVE)
    node = node_state("n1", [make_card("GPU-0", health=False), make_card("GPU-1", index=1, type="AMD")])
    decision = fit_node(request, node, Policy())
    assert isinstance(decision, Rejection)
    assert decision.reasons == {Reason.CARD_NOT_HEALTH: 1}  # the AMD card is not a vendor card


KINDS = st.sampled_from(list(Enforcement))


@settings(max_examples=300)
@given(
    cards=st.lists(
        st.tuples(KINDS, st.integers(0, 1), st.integers(0, 900), st.booleans(), st.booleans()),
        min_size=1,
        max_size=5,
    ),
    nums=st.integers(1, 3),
    mem=st.integers(1, 900),
    pod_level=st.sampled_from(list(Level)),
    floor=st.sampled_from(list(Level)),
    numa_bind=st.booleans(),
    policy=st.sampled_from(["spread", "binpack", "mutex"]),
)
def test_the_precheck_verdict_equals_fit_under_a_requirement(
    cards: list[tuple[Enforcement, int, int, bool, bool]],
    nums: int,
    mem: int,
    pod_level: Level,
    floor: Level,
    numa_bind: bool,
    policy: str,
) -> None:
    node = node_state(
        "n1",
        [
            make_card(
                f"GPU-{i}", index=i, enforcement=kind, numa=numa, used_mem=used, used=int(used > 0), health=ok
            )
            for i, (kind, numa, used, ok, _) in enumerate(cards)
        ],
        cordoned=frozenset(f"GPU-{i}" for i, card in enumerate(cards) if card[4]),
    )
    request = make_request(make_container(nums, mem=mem), enforcement=pod_level, numa_bind=numa_bind)
    rules = Policy(gpu_policy=policy, enforcement=floor)
    full = fit_node(request, node, rules)
    decisions = allocate(request, [node], rules)
    assert decisions.fits("n1") is isinstance(full, Allocation)
    if not isinstance(full, Allocation):
        assert decisions["n1"] == full  # the same reasons, counts and resolvable
    plan = precheck.plan(replace(request, enforcement=max(pod_level, floor)), parse_gpu_policy(policy), None)
    assert plan is not None
    verdict = precheck.verdict(plan, node.summary)
    assert verdict is None or verdict is isinstance(full, Allocation)
    empty = replace(node, devices=tuple(DeviceState(device=state.device) for state in node.devices))
    idle = precheck.idle_verdict(plan, node)
    assert idle is None or idle is isinstance(fit_node(request, empty, rules), Allocation)
