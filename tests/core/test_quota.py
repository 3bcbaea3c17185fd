"""Namespace quota inside Fit (spec-scheduler §14)."""

from __future__ import annotations

from hami.core.allocate import Policy, fit_node
from hami.core.model import Allocation, NamespaceQuota, Rejection

from .builders import make_cards, make_container, make_node, make_request


def quota(**kwargs: int) -> dict[str, NamespaceQuota]:
    return {"default": NamespaceQuota(**kwargs)}


def test_spec_example_partial_pick_then_quota() -> None:
    # 4 cards, nums 2 x 1000 MiB, limit 1000: the first card fits (0 + 1000 <= 1000), each next card would
    # make 2000 -> 3/4 ResourceQuotaNotFit, and the one pick -> 1/4 AllocatedCardsInsufficientRequest.
    decision = fit_node(
        make_request(make_container(2, mem=1000)),
        make_node(cards=make_cards(4)),
        Policy(),
        quotas=quota(memory_limit=1000),
    )
    assert isinstance(decision, Rejection)
    assert decision.message == "1/4 AllocatedCardsInsufficientRequest, 3/4 ResourceQuotaNotFit"


def test_equality_passes_and_used_counts() -> None:
    node = make_node(cards=make_cards(1))
    request = make_request(make_container(mem=1000, cores=30))
    assert isinstance(
        fit_node(request, node, Policy(), quotas=quota(memory_limit=3000, memory_used=2000)), Allocation
    )
    assert isinstance(
        fit_node(request, node, Policy(), quotas=quota(memory_limit=3000, memory_used=2001)), Rejection
    )
    assert isinstance(fit_node(request, node, Policy(), quotas=quota(cores_limit=30)), Allocation)
    assert isinstance(fit_node(request, node, Policy(), quotas=quota(cores_limit=29)), Rejection)


def test_zero_limit_blocks_and_other_namespaces_are_free() -> None:
    node = make_node(cards=make_cards(1))
    request = make_request(make_container(mem=1))
    assert isinstance(fit_node(request, node, Policy(), quotas=quota(memory_limit=0)), Rejection)
    other = {"elsewhere": NamespaceQuota(memory_limit=0)}
    assert isinstance(fit_node(request, node, Policy(), quotas=other), Allocation)


def test_percentage_resolved_per_card_counts() -> None:
    # 50 % of a 1000 MiB card = 500 MiB against a 400 MiB limit.
    decision = fit_node(
        make_request(make_container(pct=50)),
        make_node(cards=make_cards(1)),
        Policy(),
        quotas=quota(memory_limit=400),
    )
    assert isinstance(decision, Rejection) and decision.message == "1/1 ResourceQuotaNotFit"


def test_init_containers_collapse_to_their_peak_in_quota() -> None:
    # init 5000 MiB then app 4000 MiB on the single card: collapsed max(5000, 4000) = 5000 <= 6000 passes;
    # summing would be 9000 and fail. Two app containers of 4000 do sum: 8000 > 6000 fails.
    node = make_node(cards=make_cards(1, memory=20000))
    init_app = make_request(make_container(mem=5000), make_container(mem=4000), init_count=1)
    assert isinstance(fit_node(init_app, node, Policy(), quotas=quota(memory_limit=6000)), Allocation)
    two_apps = make_request(make_container(mem=4000), make_container(mem=4000))
    decision = fit_node(two_apps, node, Policy(), quotas=quota(memory_limit=6000))
    assert isinstance(decision, Rejection) and decision.message == "1/1 ResourceQuotaNotFit"


def test_quota_rejection_is_resolvable_when_usage_could_go_away() -> None:
    node = make_node(cards=make_cards(1))
    request = make_request(make_container(mem=1000))
    busy = fit_node(request, node, Policy(), quotas=quota(memory_limit=1000, memory_used=500))
    assert isinstance(busy, Rejection) and busy.resolvable
    never = fit_node(request, node, Policy(), quotas=quota(memory_limit=999))
    assert isinstance(never, Rejection) and not never.resolvable
