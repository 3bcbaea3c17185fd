"""Namespace quotas (docs/protocol.md, "Quotas"): inside Fit, reading ResourceQuota limits, and the admission
pre-check (docs/protocol.md, "Admission", HAMi's ``fitResourceQuota``)."""

from __future__ import annotations

from typing import Any

import pytest

from hami.core.allocate import Policy, fit_node
from hami.core.model import Allocation, ContainerRequest, NamespaceQuota, Rejection
from hami.core.quota import (
    LimitsBook,
    QuotaAsk,
    QuotaKeys,
    QuotaLimits,
    admission_ask,
    over_quota,
    read_limits,
)

from .builders import make_cards, make_container, make_request, node_state


def quota(**kwargs: int) -> dict[str, NamespaceQuota]:
    return {"default": NamespaceQuota(**kwargs)}


def test_spec_example_partial_pick_then_quota() -> None:
    # 4 cards, nums 2 x 1000 MiB, limit 1000: the first card fits (0 + 1000 <= 1000), each next card would
    # make 2000 -> 3/4 ResourceQuotaNotFit, and the one pick -> 1/4 AllocatedCardsInsufficientRequest.
    decision = fit_node(
        make_request(make_container(2, mem=1000)),
        node_state(cards=make_cards(4)),
        Policy(),
        quotas=quota(memory_limit=1000),
    )
    assert isinstance(decision, Rejection)
    assert decision.message == "1/4 AllocatedCardsInsufficientRequest, 3/4 ResourceQuotaNotFit"


def test_equality_passes_and_used_counts() -> None:
    node = node_state(cards=make_cards(1))
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
    node = node_state(cards=make_cards(1))
    request = make_request(make_container(mem=1))
    assert isinstance(fit_node(request, node, Policy(), quotas=quota(memory_limit=0)), Rejection)
    other = {"elsewhere": NamespaceQuota(memory_limit=0)}
    assert isinstance(fit_node(request, node, Policy(), quotas=other), Allocation)


def test_percentage_resolved_per_card_counts() -> None:
    # 50 % of a 1000 MiB card = 500 MiB against a 400 MiB limit.
    decision = fit_node(
        make_request(make_container(pct=50)),
        node_state(cards=make_cards(1)),
        Policy(),
        quotas=quota(memory_limit=400),
    )
    assert isinstance(decision, Rejection) and decision.message == "1/1 ResourceQuotaNotFit"


def test_init_containers_collapse_to_their_peak_in_quota() -> None:
    # init 5000 MiB then app 4000 MiB on the single card: collapsed max(5000, 4000) = 5000 <= 6000 passes;
    # summing would be 9000 and fail. Two app containers of 4000 do sum: 8000 > 6000 fails.
    node = node_state(cards=make_cards(1, memory=20000))
    init_app = make_request(make_container(mem=5000), make_container(mem=4000), init_count=1)
    assert isinstance(fit_node(init_app, node, Policy(), quotas=quota(memory_limit=6000)), Allocation)
    two_apps = make_request(make_container(mem=4000), make_container(mem=4000))
    decision = fit_node(two_apps, node, Policy(), quotas=quota(memory_limit=6000))
    assert isinstance(decision, Rejection) and decision.message == "1/1 ResourceQuotaNotFit"


def test_quota_rejection_is_resolvable_when_usage_could_go_away() -> None:
    node = node_state(cards=make_cards(1))
    request = make_request(make_container(mem=1000))
    busy = fit_node(request, node, Policy(), quotas=quota(memory_limit=1000, memory_used=500))
    assert isinstance(busy, Rejection) and busy.resolvable
    never = fit_node(request, node, Policy(), quotas=quota(memory_limit=999))
    assert isinstance(never, Rejection) and not never.resolvable


# ---------------------------------------------- reading ResourceQuotas and the admission pre-check
KEYS = QuotaKeys.of("nvidia.com/gpumem", "nvidia.com/gpucores")
MEM_KEY, CORES_KEY = "limits.nvidia.com/gpumem", "limits.nvidia.com/gpucores"


@pytest.mark.parametrize(
    ("hard", "expected"),
    [
        ({MEM_KEY: "8000", CORES_KEY: "150"}, QuotaLimits(memory=8000, cores=150)),
        ({MEM_KEY: "1.5k"}, QuotaLimits(memory=1500)),  # Go's Value(): rounded up to a whole number
        ({MEM_KEY: "100m"}, QuotaLimits(memory=1)),
        ({"limits.cpu": "4", "requests.nvidia.com/gpumem": "10"}, QuotaLimits()),  # not ours
        ({MEM_KEY: "0"}, QuotaLimits(memory=0)),  # set to 0: blocks every request of that dimension
    ],
)
def test_read_limits_takes_the_two_gpu_keys(hard: dict[str, str], expected: QuotaLimits) -> None:
    assert read_limits("team", "gpu", hard, KEYS) == (expected, ())


def test_read_limits_multiplies_memory_by_the_memory_factor() -> None:
    keys = QuotaKeys.of("nvidia.com/gpumem", "nvidia.com/gpucores", memory_factor=10)
    assert read_limits("team", "gpu", {MEM_KEY: "400", CORES_KEY: "50"}, keys)[0] == QuotaLimits(
        memory=4000, cores=50
    )


def test_read_limits_leaves_out_an_unreadable_value_and_says_why() -> None:
    limits, errors = read_limits("team", "gpu", {MEM_KEY: "lots", CORES_KEY: 20}, KEYS)
    assert limits == QuotaLimits()
    memory, cores = (str(e) for e in errors)
    assert memory.startswith(
        "resourcequota team/gpu: spec.hard[limits.nvidia.com/gpumem]: 'lots' is not a quantity"
    )
    assert (
        cores == "resourcequota team/gpu: spec.hard[limits.nvidia.com/gpucores] = 20 is not a quantity string"
    )
    limits, (negative,) = read_limits("team", "gpu", {MEM_KEY: "-5", CORES_KEY: "20"}, KEYS)
    assert limits == QuotaLimits(cores=20) and "'-5' is negative" in str(negative)


@pytest.mark.parametrize(
    ("containers", "init_count", "expected"),
    [
        # app containers add up: memory x cards, cores x cards
        (
            (make_container(2, mem=3000, cores=30), make_container(1, mem=1000)),
            0,
            QuotaAsk(memory=7000, cores=60),
        ),
        # init containers run one after another: their peak; the pod asks max(app sum, init peak)
        (
            (
                make_container(1, mem=9000),
                make_container(2, mem=1000, cores=100),
                make_container(1, mem=2000),
            ),
            2,
            QuotaAsk(memory=9000, cores=200),
        ),
        # a percentage is not memory here (HAMi's memreq is 0; Fit resolves it per card)
        ((make_container(1, pct=50, cores=20),), 0, QuotaAsk(memory=0, cores=20)),
        ((None, make_container(1, mem=10)), 1, QuotaAsk(memory=10, cores=0)),  # no request: nothing
        ((), 0, QuotaAsk(memory=0, cores=0)),
    ],
)
def test_admission_ask_is_hamis_fit_resource_quota_sum(
    containers: tuple[ContainerRequest | None, ...], init_count: int, expected: QuotaAsk
) -> None:
    assert admission_ask(containers, init_count) == expected


def test_a_pod_over_its_quota_at_admission_never_fits_in_fit() -> None:
    # what Fit books (collapsed per card, then summed) is at least the admission ask: a pod refused at
    # admission is one Fit would reject on every node, whatever other pods free (not resolvable)
    request = make_request(make_container(1, mem=9000), make_container(2, mem=1000), init_count=1)
    ask = admission_ask(request.containers, request.init_count)
    assert ask == QuotaAsk(memory=9000, cores=0)
    node = node_state(cards=make_cards(2, memory=20000))
    refused = fit_node(request, node, Policy(), quotas=quota(memory_limit=ask.memory - 1))
    assert isinstance(refused, Rejection) and not refused.resolvable


def test_over_quota_names_each_quota_and_resource_in_the_units_written() -> None:
    quotas = [
        ("team/gpu", QuotaLimits(memory=8000, cores=150)),
        ("team/cores-only", QuotaLimits(cores=100)),
        ("team/roomy", QuotaLimits(memory=99999, cores=999)),
    ]
    assert over_quota(QuotaAsk(memory=10000, cores=120), quotas, KEYS) == [
        "the pod asks for 10000 of limits.nvidia.com/gpumem, more than resourcequota team/gpu allows "
        "in all (8000)",
        "the pod asks for 120 of limits.nvidia.com/gpucores, more than resourcequota team/cores-only "
        "allows in all (100)",
    ]
    factor = QuotaKeys.of("nvidia.com/gpumem", "nvidia.com/gpucores", memory_factor=10)
    (message,) = over_quota(QuotaAsk(memory=5000, cores=0), [("team/gpu", QuotaLimits(memory=4000))], factor)
    assert "asks for 500 of limits.nvidia.com/gpumem" in message and "allows in all (400)" in message


@pytest.mark.parametrize(
    ("ask", "limits", "refused"),
    [
        (QuotaAsk(memory=8000, cores=150), QuotaLimits(memory=8000, cores=150), False),  # equality passes
        (QuotaAsk(memory=8001, cores=0), QuotaLimits(memory=8000), True),
        (QuotaAsk(memory=0, cores=1), QuotaLimits(memory=0, cores=0), True),  # a 0 limit blocks
        (QuotaAsk(memory=0, cores=0), QuotaLimits(memory=0, cores=0), False),  # asking nothing passes
        (QuotaAsk(memory=10**9, cores=10**9), QuotaLimits(), False),  # no GPU limit
    ],
)
def test_over_quota_follows_fit_quota(ask: QuotaAsk, limits: QuotaLimits, refused: bool) -> None:
    assert bool(over_quota(ask, [("team/q", limits)], KEYS)) is refused


def resource_quota(name: str, namespace: str, hard: dict[str, Any]) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": namespace}, "spec": {"hard": hard}}


def test_the_limits_book_keeps_the_gpu_quotas_by_namespace() -> None:
    book = LimitsBook(KEYS)
    assert not book.synced
    errors = book.replace(
        [
            resource_quota("b", "team", {MEM_KEY: "8000"}),
            resource_quota("a", "team", {CORES_KEY: "150", MEM_KEY: "lots"}),
            resource_quota("pods-only", "team", {"pods": "10"}),  # no GPU limit: not kept
            resource_quota("gpu", "other", {MEM_KEY: "1"}),
        ]
    )
    assert book.synced and len(book) == 3
    assert [str(e).split(":")[0] for e in errors] == ["resourcequota team/a"]
    assert book.of("team") == [("team/a", QuotaLimits(cores=150)), ("team/b", QuotaLimits(memory=8000))]
    assert book.of("nowhere") == []
    assert book.event("MODIFIED", resource_quota("b", "team", {"pods": "1"})) == ()  # GPU limit removed
    assert book.event("DELETED", resource_quota("gpu", "other", {})) == ()
    assert book.of("team") == [("team/a", QuotaLimits(cores=150))] and book.of("other") == []
    book.event("ADDED", resource_quota("c", "team", {MEM_KEY: "5"}))
    book.listed([resource_quota("c", "team", {MEM_KEY: "5"})])  # a relist without "a": forgotten
    assert book.of("team") == [("team/c", QuotaLimits(memory=5))]


def test_the_limits_book_survives_hostile_objects() -> None:
    book = LimitsBook(KEYS)
    assert book.event("ADDED", {"metadata": {"name": "x", "namespace": "t"}, "spec": {"hard": ["no"]}}) == ()
    assert book.event("ADDED", {"spec": None}) == ()
    (error,) = book.event("ADDED", resource_quota("big", "t", {MEM_KEY: "1e10000000"}))
    assert "resourcequota t/big" in str(error)
    assert len(book) == 0
