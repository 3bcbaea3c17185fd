"""Reasons as data: every reason code renders to HAMi's exact text (docs/protocol.md, "Reasons"), rejections
are keyed by the code, node-level reasons (too few cards, exclusions) are rejections with their detail."""

from __future__ import annotations

from hami.core.allocate import Policy, fit_node
from hami.core.rejection import Reason, Rejection, node_rejection

from .builders import make_card, make_cards, make_container, make_request, node_state

#: docs/protocol.md, "Reasons", word for word: counted per card as ``n/N Word``.
HAMI_CARD_WORDS = {
    Reason.CARD_NOT_HEALTH: "CardNotHealth",
    Reason.CARD_CORDONED: "CardCordoned",
    Reason.CARD_TYPE_MISMATCH: "CardTypeMismatch",
    Reason.NUMA_NOT_FIT: "NumaNotFit",
    Reason.CARD_UUID_MISMATCH: "CardUuidMismatch",
    Reason.CARD_TIME_SLICING_EXHAUSTED: "CardTimeSlicingExhausted",
    Reason.EXCLUSIVE_DEVICE_ALLOCATE_CONFLICT: "ExclusiveDeviceAllocateConflict",
    Reason.RESOURCE_QUOTA_NOT_FIT: "ResourceQuotaNotFit",
    Reason.CARD_INSUFFICIENT_MEMORY: "CardInsufficientMemory",
    Reason.CARD_INSUFFICIENT_CORE: "CardInsufficientCore",
    Reason.CARD_COMPUTE_UNITS_EXHAUSTED: "CardComputeUnitsExhausted",
    Reason.CARD_MIG_TOPOLOGY_INFEASIBLE: "CardMigTopologyInfeasible",
    Reason.CARD_NOT_FOUND_CUSTOM_FILTER_RULE: "CardNotFoundCustomFilterRule",
    Reason.ALLOCATED_CARDS_INSUFFICIENT_REQUEST: "AllocatedCardsInsufficientRequest",
    # ours, in HAMi's style: a card below the required enforcement level (docs/scheduler.md)
    Reason.CARD_ENFORCEMENT_INSUFFICIENT: "CardEnforcementInsufficient",
}
#: Node-level strings in FailedNodes; every exclusion of a node reads HAMi's ``node unregistered``.
HAMI_NODE_TEXTS = {
    Reason.NODE_INSUFFICIENT_DEVICE: "NodeInsufficientDevice",
    Reason.DEVICE_TYPE_NOT_FOUND: "Device type not found",
    Reason.NODE_UNREGISTERED: "node unregistered",
    Reason.NODE_USAGE_UNAVAILABLE: "node usage unavailable",
    Reason.REGISTRATION_MISSING: "node unregistered",
    Reason.NO_GPU_REGISTERED: "node unregistered",
    Reason.REGISTRATION_MALFORMED: "node unregistered",
    Reason.PAIR_SCORES_MALFORMED: "node unregistered",
    Reason.HANDSHAKE_UNANSWERED: "node unregistered",
    Reason.NODE_MALFORMED: "node unregistered",
}


def test_every_reason_renders_to_hamis_exact_text() -> None:
    assert set(HAMI_CARD_WORDS) | set(HAMI_NODE_TEXTS) == set(Reason)  # no member without a pinned text
    for reason, text in {**HAMI_CARD_WORDS, **HAMI_NODE_TEXTS}.items():
        assert reason.text == text, reason
        assert reason.per_card is (reason in HAMI_CARD_WORDS), reason


def test_card_reasons_render_counted_and_sorted_as_strings() -> None:
    rejection = Rejection(
        node="n",
        reasons={Reason.CARD_INSUFFICIENT_MEMORY: 2, Reason.CARD_INSUFFICIENT_CORE: 10},
        total=12,
        resolvable=True,
    )
    assert rejection.message == "10/12 CardInsufficientCore, 2/12 CardInsufficientMemory"  # "10/" < "2/"


def test_a_node_level_reason_renders_with_its_detail() -> None:
    bare = node_rejection("n", Reason.NODE_UNREGISTERED)
    assert bare.message == "node unregistered" and bare.reasons == {Reason.NODE_UNREGISTERED: 1}
    malformed = node_rejection("n", Reason.REGISTRATION_MALFORMED, detail='hami.io/x "{": bad')
    assert malformed.message == 'node unregistered: hami.io/x "{": bad'
    assert not malformed.resolvable and malformed.total == 0


def test_fit_keys_the_rejection_by_reason_code() -> None:
    request = make_request(make_container(mem=5000))
    card = fit_node(request, node_state(cards=make_cards(2)), Policy())
    assert isinstance(card, Rejection)
    assert card.reasons == {Reason.CARD_INSUFFICIENT_MEMORY: 2} and card.total == 2
    assert all(isinstance(reason, Reason) for reason in card.reasons)
    node = fit_node(make_request(make_container(3, mem=1)), node_state(cards=(make_card(),)), Policy())
    assert isinstance(node, Rejection) and node.reasons == {Reason.NODE_INSUFFICIENT_DEVICE: 1}
    assert node.message == "NodeInsufficientDevice" and not node.resolvable
    other = fit_node(
        make_request(make_container(mem=1, type="AMD")), node_state(cards=make_cards(1)), Policy()
    )
    assert isinstance(other, Rejection) and other.reasons == {Reason.DEVICE_TYPE_NOT_FOUND: 1}
    assert other.message == "Device type not found"
