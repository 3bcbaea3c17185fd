"""HAMi's filter reasons as stable words (metric labels) and the action each one asks of a person.

Owns the mapping of a rejection (the core's :class:`~hami.core.model.Rejection`, or the snapshot's
exclusion text such as ``node unregistered: handshake ...``) onto a closed vocabulary: HAMi's reason
words (spec-scheduler §19), the node-level ones with spaces written in CamelCase
(``node unregistered`` -> ``NodeUnregistered``), and ``Other`` for anything else, so a metric label
can never take an unbounded set of values. ``advice`` turns the most common word of a failed filter
into one sentence for the ``FilteringFailed`` Event. Pure: must not import the Kubernetes client or
aiohttp.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping

from hami.core.model import Reason, Rejection

OTHER = "Other"


def _word(value: str) -> str:
    return "".join(part[:1].upper() + part[1:] for part in value.split())


#: HAMi's reason text -> label value, in HAMi's order (the order also breaks ties in ``advice``).
WORDS: Mapping[str, str] = {reason.value: _word(reason.value) for reason in Reason}
#: Every value the rejection label can take.
VOCABULARY: tuple[str, ...] = (*WORDS.values(), OTHER)
#: Longest first, so a reason is never mistaken for a shorter one it starts with.
_BY_LENGTH = sorted(WORDS, key=len, reverse=True)

_HINTS: Mapping[str, str] = {
    "CardInsufficientMemory": "the cards lack free memory: ask for less GPU memory, "
    "or wait for other GPU pods to finish",
    "CardInsufficientCore": "the cards lack free cores: ask for fewer GPU cores (percent of a card), "
    "or wait for other GPU pods to finish",
    "CardTimeSlicingExhausted": "every card already serves as many containers as it may "
    "(deviceSplitCount): wait for GPU pods to finish or add cards",
    "NodeInsufficientDevice": "the pod asks for more cards per container than these nodes have: "
    "ask for fewer GPUs",
    "CardTypeMismatch": "no card has the type the pod's use-gputype/nouse-gputype annotations allow",
    "CardUuidMismatch": "no card has a UUID the pod's use-gpuuuid/nouse-gpuuuid annotations allow",
    "CardNotHealth": "the cards are unhealthy: check the driver and the hami-monitor log on these nodes",
    "CardCordoned": "the cards are cordoned (hami.io/device-cordon on the node)",
    "NumaNotFit": "the pod asks for all its cards on one NUMA node (numa-bind) and no node has enough there",
    "ExclusiveDeviceAllocateConflict": "a card is held exclusively (100% of its cores) or the pod "
    "wants one alone: wait for it, or ask for fewer cores",
    "ResourceQuotaNotFit": "the namespace's GPU ResourceQuota is used up: raise it or free GPU pods",
    "CardComputeUnitsExhausted": "the cards have no compute units left: wait for GPU pods to finish",
    "CardMigTopologyInfeasible": "no free MIG placement fits the asked profile: wait for MIG pods to "
    "finish or ask for a smaller slice",
    "NodeUnregistered": "the node agent (hami-monitor) has not registered usable cards there: check that "
    "it runs on these nodes and its log",
    "NodeUsageUnavailable": "the scheduler cannot read the nodes' usage yet: retry shortly",
    "DeviceTypeNotFound": "the pod asks for a device type no node offers",
}


def reason_word(text: str) -> str:
    """The label value of one reason text (``node unregistered: ...`` -> ``NodeUnregistered``)."""
    text = text.strip()
    for value in _BY_LENGTH:
        if text == value or text.startswith(value + ":"):
            return WORDS[value]
    return OTHER


def rejection_words(rejection: Rejection | str) -> frozenset[str]:
    """Each distinct reason of one rejected node (card reasons counted once, whatever the card count)."""
    if isinstance(rejection, str):
        return frozenset({reason_word(rejection)})
    if rejection.reasons:
        return frozenset(reason_word(reason) for reason in rejection.reasons)
    return frozenset({reason_word(rejection.message)})


def advice(words: Iterable[frozenset[str]]) -> str:
    """What to do about the reason most nodes share (empty when none has a known remedy)."""
    counts = Counter(word for node in words for word in node if word in _HINTS)
    if not counts:
        return ""
    order = {word: position for position, word in enumerate(VOCABULARY)}
    top = min(counts, key=lambda word: (-counts[word], order[word]))
    return f"{top}: {_HINTS[top]}"
