"""Why a node cannot take a pod, as data: the reason codes, the rejection, and its one rendering.

Owns :class:`Reason` (one member per HAMi reason word of docs/protocol.md, "Reasons", ours in HAMi's style for
a card below the required enforcement level (``CardEnforcementInsufficient``), and one per way a node is
excluded before Fit runs: no registration, one without cards, an unreadable one, unreadable pair
scores, an unanswered handshake, a Node of the wrong shape), :class:`Rejection` (the reasons keyed by
code, with counts; the detail of a node-level reason as data) and :func:`render`, the only place
HAMi's text is made: ``"1/2 CardInsufficientCore, 1/2 CardInsufficientMemory"`` (per-card reasons
counted out of the cards Fit saw, items sorted as strings so ``10/12`` sorts before ``2/12``),
``"NodeInsufficientDevice"``,
``"node unregistered: <detail>"``. Every exclusion reads ``node unregistered`` on the wire as in HAMi;
its code says which one it is. The edges (``/filter``'s FailedNodes, the FilteringFailed Event, bind's
error, ``hami explain``, the metric labels) render from the codes; nothing parses the text back.

Pure: stdlib only; must not import a Kubernetes client, aiohttp, kopf, grpc, pynvml, ``logging``,
``os`` or ``time``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum


class Reason(StrEnum):
    """A reason code. A HAMi word's value is the word itself (docs/protocol.md, "Reasons": spelling is part of
    the protocol); an exclusion's value is its own code. Render with :attr:`text`, never ``str()``."""

    # per card, counted: "n/N Word"
    CARD_NOT_HEALTH = "CardNotHealth"
    CARD_CORDONED = "CardCordoned"
    CARD_TYPE_MISMATCH = "CardTypeMismatch"
    CARD_ENFORCEMENT_INSUFFICIENT = "CardEnforcementInsufficient"  # ours: below the required level
    NUMA_NOT_FIT = "NumaNotFit"
    CARD_UUID_MISMATCH = "CardUuidMismatch"
    CARD_TIME_SLICING_EXHAUSTED = "CardTimeSlicingExhausted"
    EXCLUSIVE_DEVICE_ALLOCATE_CONFLICT = "ExclusiveDeviceAllocateConflict"
    RESOURCE_QUOTA_NOT_FIT = "ResourceQuotaNotFit"
    CARD_INSUFFICIENT_MEMORY = "CardInsufficientMemory"
    CARD_INSUFFICIENT_CORE = "CardInsufficientCore"
    CARD_COMPUTE_UNITS_EXHAUSTED = "CardComputeUnitsExhausted"
    CARD_MIG_TOPOLOGY_INFEASIBLE = "CardMigTopologyInfeasible"
    CARD_NOT_FOUND_CUSTOM_FILTER_RULE = "CardNotFoundCustomFilterRule"
    ALLOCATED_CARDS_INSUFFICIENT_REQUEST = "AllocatedCardsInsufficientRequest"
    # node level, HAMi's text as is
    NODE_INSUFFICIENT_DEVICE = "NodeInsufficientDevice"
    DEVICE_TYPE_NOT_FOUND = "Device type not found"
    NODE_UNREGISTERED = "node unregistered"  # the node is not in the live view at all
    NODE_USAGE_UNAVAILABLE = "node usage unavailable"
    # node exclusions: "node unregistered: <detail>" on the wire
    REGISTRATION_MISSING = "RegistrationMissing"  # no hami.io/node-nvidia-register
    NO_GPU_REGISTERED = "NoGpuRegistered"  # a registration listing no card
    REGISTRATION_MALFORMED = "RegistrationMalformed"  # an unreadable registration
    PAIR_SCORES_MALFORMED = "PairScoresMalformed"  # unreadable hami.io/node-nvidia-score
    HANDSHAKE_UNANSWERED = "HandshakeUnanswered"  # Requesting stamp too old, nothing allocatable
    NODE_MALFORMED = "NodeMalformed"  # a Node field we read of the wrong JSON type

    @property
    def text(self) -> str:
        """HAMi's wire text of this reason."""
        return Reason.NODE_UNREGISTERED.value if self in _EXCLUSIONS else self.value

    @property
    def per_card(self) -> bool:
        """Counted per card (``n/N Word``) rather than said of the whole node."""
        return self in _PER_CARD


_NODE_LEVEL = frozenset(
    {
        Reason.NODE_INSUFFICIENT_DEVICE,
        Reason.DEVICE_TYPE_NOT_FOUND,
        Reason.NODE_UNREGISTERED,
        Reason.NODE_USAGE_UNAVAILABLE,
    }
)
_EXCLUSIONS = frozenset(
    {
        Reason.REGISTRATION_MISSING,
        Reason.NO_GPU_REGISTERED,
        Reason.REGISTRATION_MALFORMED,
        Reason.PAIR_SCORES_MALFORMED,
        Reason.HANDSHAKE_UNANSWERED,
        Reason.NODE_MALFORMED,
    }
)
_PER_CARD = frozenset(Reason) - _NODE_LEVEL - _EXCLUSIONS


def render(reasons: Mapping[Reason, int], total: int, detail: str = "") -> str:
    """HAMi's text for a rejection: per-card reasons counted out of ``total``, sorted as strings; a
    node-level reason as its text, followed by ``: detail`` when there is one."""
    counted = []
    for reason, count in reasons.items():
        if not reason.per_card:
            return f"{reason.text}: {detail}" if detail else reason.text
        counted.append(f"{count}/{total} {reason.text}")
    return ", ".join(sorted(counted))


@dataclass(frozen=True, slots=True, kw_only=True)
class Rejection:
    """A pod does not fit a node, and why.

    ``reasons`` maps a per-card reason to how many cards failed with it, ``total`` being the number of
    cards handed to Fit (the denominator of ``"2/8 CardInsufficientMemory"``); a node-level reason
    (too few cards, an exclusion) is the only key, with count 1 and ``total`` 0, and ``detail`` says
    what it is about (the registration's error, the unanswered handshake). ``resolvable`` is False when
    the node could never fit this pod whatever other pods do (too few cards, type or uuid mismatch, an
    exclusion...), so preemption need not try. ``message`` is the exact HAMi text for ``FailedNodes``.
    """

    node: str
    reasons: Mapping[Reason, int]
    total: int = 0
    detail: str = ""
    resolvable: bool = False

    @property
    def message(self) -> str:
        return render(self.reasons, self.total, self.detail)


def node_rejection(node: str, reason: Reason, *, detail: str = "") -> Rejection:
    """A node-level rejection (``NodeInsufficientDevice``, an exclusion, ...): never resolvable."""
    return Rejection(node=node, reasons={reason: 1}, detail=detail)
