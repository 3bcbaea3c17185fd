"""The scheduler's edge of the reason codes: which code excludes a node, metric labels, advice.

Owns :func:`registration_rejection` (an unreadable node registration -> the exclusion's code, the
codec's error as its detail), the metric label of each code (:func:`label`: HAMi's word, the
node-level texts with spaces written in CamelCase, ``node unregistered`` -> ``NodeUnregistered`` for
every exclusion, so a label can never take an unbounded set of values) and ``advice``, which turns the
most common label of a failed filter into one sentence for the ``FilteringFailed`` Event. Reads the
codes of :class:`~hami.core.rejection.Rejection`; never parses a text. Pure: must not import the
Kubernetes client or aiohttp.
"""

from __future__ import annotations

import functools
from collections import Counter
from collections.abc import Iterable, Mapping

from hami.annotations import NO_GPU, NODE_PAIR_SCORES, AnnotationError
from hami.core.rejection import Reason, Rejection, node_rejection


def label(reason: Reason) -> str:
    """The metric label of a reason code (``Device type not found`` -> ``DeviceTypeNotFound``)."""
    return "".join(part[:1].upper() + part[1:] for part in reason.text.split())


#: Every value the rejection label can take, in HAMi's order (the order also breaks ties in ``advice``).
VOCABULARY: tuple[str, ...] = tuple(dict.fromkeys(label(reason) for reason in Reason))

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
    "CardNotHealth": "the cards are unhealthy: check the driver and the hami-node-agent log on these nodes",
    "CardCordoned": "the cards are cordoned (hami.io/device-cordon on the node)",
    "CardEnforcementInsufficient": "the cards' enforcement is below the level required (the scheduler's "
    "--require-enforcement or the pod's hami.io/require-enforcement): install HAMi-core on these nodes "
    "(hami doctor names them) or require less",
    "NumaNotFit": "the pod asks for all its cards on one NUMA node (numa-bind) and no node has enough there",
    "ExclusiveDeviceAllocateConflict": "a card is held exclusively (100% of its cores) or the pod "
    "wants one alone: wait for it, or ask for fewer cores",
    "ResourceQuotaNotFit": "the namespace's GPU ResourceQuota is used up: raise it or free GPU pods",
    "CardComputeUnitsExhausted": "the cards have no compute units left: wait for GPU pods to finish",
    "CardMigTopologyInfeasible": "no free MIG placement fits the asked profile: wait for MIG pods to "
    "finish or ask for a smaller slice",
    "NodeUnregistered": "the node agent (hami-node-agent) has not registered usable cards there: check that "
    "it runs on these nodes and its log",
    "NodeUsageUnavailable": "the scheduler cannot read the nodes' usage yet: retry shortly",
    "DeviceTypeNotFound": "the pod asks for a device type no node offers",
}


def registration_rejection(node: str, error: AnnotationError) -> Rejection:
    """The exclusion of a node whose annotations ``read_node`` refused, with the error as its detail."""
    if error.key == NODE_PAIR_SCORES:
        code = Reason.PAIR_SCORES_MALFORMED
    elif error.text is None:
        code = Reason.REGISTRATION_MISSING
    elif error.reason == NO_GPU:
        code = Reason.NO_GPU_REGISTERED
    else:
        code = Reason.REGISTRATION_MALFORMED
    return node_rejection(node, code, detail=str(error))


def rejection_words(rejection: Rejection) -> frozenset[str]:
    """The labels of one rejected node (card reasons counted once, whatever the card count)."""
    return _words(tuple(rejection.reasons))


@functools.lru_cache(maxsize=1024)
def _words(reasons: tuple[Reason, ...]) -> frozenset[str]:
    # once per set of reasons, not once per node of every /filter (a few kinds recur over 1,000 nodes)
    return frozenset(label(reason) for reason in reasons)


def advice(words: Iterable[frozenset[str]]) -> str:
    """What to do about the reason most nodes share (empty when none has a known remedy)."""
    counts = Counter(word for node in words for word in node if word in _HINTS)
    if not counts:
        return ""
    order = {word: position for position, word in enumerate(VOCABULARY)}
    top = min(counts, key=lambda word: (-counts[word], order[word]))
    return f"{top}: {_HINTS[top]}"
