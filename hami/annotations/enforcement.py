"""The enforcement annotations: the node's ``hami.io/node-enforcement`` (which in-container enforcement
the node agent found for each registered card), the pod's ``hami.io/vgpu-enforcement`` (the enforcement
of each card the scheduler granted it, written at bind) and ``hami.io/require-enforcement`` (the least
level a pod's cards must have, set by its owner).

Format of the two card lists: ``<uuid>:<kind>`` per card, comma separated (the node's in registration
order, the pod's in grant order, each card once); ``kind`` is one of :class:`Enforcement` (``hami-core``,
``mps``, ``mps-namespaced``, ``mig``, ``none``); an empty value is no card. Example:
``GPU-a:hami-core,GPU-b:none``. The decoder is strict: an unknown kind, an empty or repeated UUID, a UUID
with whitespace or a missing ``:`` raise :class:`AnnotationError` naming the key and the text.
:func:`read_card_enforcement` is the lenient read the scheduler's view uses: a card the node does not
list, or every card of a node whose annotation is missing or unreadable, is ``none`` (the error is
returned for the caller to report). The requirement is one :class:`~hami.core.enforcement.Level` word
(``none``, ``cooperative``, ``isolated``); blank is no requirement, anything else unreadable raises.
Pure: ``hami.core`` and the codec's own modules only.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from hami.annotations.errors import AnnotationError
from hami.annotations.keys import NODE_ENFORCEMENT, POD_REQUIRE_ENFORCEMENT, POD_VGPU_ENFORCEMENT
from hami.annotations.limits import check_length
from hami.core.enforcement import LEVEL_WORDS, Enforcement, Level, parse_level

#: A card UUID as registered: visible ASCII without the separators (no whitespace, no control character,
#: nothing a terminal would act on where ``hami doctor`` prints it).
_UUID = re.compile(r"[!-+\--9;-~]+")

__all__ = [
    "Enforcement",
    "decode_node_enforcement",
    "decode_pod_enforcement",
    "decode_require_enforcement",
    "encode_node_enforcement",
    "encode_pod_enforcement",
    "read_card_enforcement",
]


def encode_node_enforcement(cards: Mapping[str, Enforcement]) -> str:
    """``uuid:kind`` per card, in the mapping's order. Raises ValueError on a UUID the decoder refuses."""
    return _encode(NODE_ENFORCEMENT, cards)


def decode_node_enforcement(text: str) -> dict[str, Enforcement]:
    """Card UUID -> enforcement, in the annotation's order; the empty text is no card."""
    return _decode(NODE_ENFORCEMENT, text)


def encode_pod_enforcement(cards: Mapping[str, Enforcement]) -> str:
    """``hami.io/vgpu-enforcement``: ``uuid:kind`` per granted card, in the mapping's order."""
    return _encode(POD_VGPU_ENFORCEMENT, cards)


def decode_pod_enforcement(text: str) -> dict[str, Enforcement]:
    """``hami.io/vgpu-enforcement`` -> card UUID -> enforcement; the empty text is no card."""
    return _decode(POD_VGPU_ENFORCEMENT, text)


def read_card_enforcement(
    annotations: Mapping[str, str],
) -> tuple[dict[str, Enforcement], AnnotationError | None]:
    """The node's cards' enforcement as the scheduler counts it: what ``hami.io/node-enforcement``
    lists; nothing (every card ``none``) when it is missing or unreadable, with the codec's error
    when unreadable (the node's own input: the caller reports it, never fails on it)."""
    text = annotations.get(NODE_ENFORCEMENT)
    if text is None:
        return {}, None
    try:
        return decode_node_enforcement(text), None
    except AnnotationError as exc:
        return {}, exc


def decode_require_enforcement(text: str | None) -> Level | None:
    """``hami.io/require-enforcement``: the level word; None when absent or blank (no requirement of
    the pod's own). Anything else raises :class:`AnnotationError` naming the key and the accepted words
    (the webhook refuses the pod, the scheduler answers the error: never read as no requirement)."""
    if text is None or not text.strip():
        return None
    check_length(POD_REQUIRE_ENFORCEMENT, text)
    level = parse_level(text)
    if level is None:
        accepted = ", ".join(LEVEL_WORDS)
        reason = f"unknown enforcement level; expected {accepted}"
        raise AnnotationError(POD_REQUIRE_ENFORCEMENT, text, reason)
    return level


def _encode(key: str, cards: Mapping[str, Enforcement]) -> str:
    for uuid in cards:
        if _UUID.fullmatch(uuid) is None:
            raise ValueError(f"card UUID {uuid!r} cannot be written in {key}")
    return ",".join(f"{uuid}:{Enforcement(kind).value}" for uuid, kind in cards.items())


def _decode(key: str, text: str) -> dict[str, Enforcement]:
    check_length(key, text)
    found: dict[str, Enforcement] = {}
    if text == "":
        return found
    kinds = ", ".join(k.value for k in Enforcement)
    for item in text.split(","):
        uuid, colon, kind = item.partition(":")
        if not colon:
            raise AnnotationError(key, text, f"entry {item!r} is not <uuid>:<kind>")
        if _UUID.fullmatch(uuid) is None:
            raise AnnotationError(key, text, f"entry {item!r} has no valid card UUID")
        if uuid in found:
            raise AnnotationError(key, text, f"card {uuid} is listed twice")
        try:
            found[uuid] = Enforcement(kind)
        except ValueError:
            reason = f"card {uuid}: unknown enforcement {kind!r} (one of {kinds})"
            raise AnnotationError(key, text, reason) from None
    return found
