"""The node's enforcement annotation ``hami.io/node-enforcement``: which in-container enforcement the
node agent found for each registered card.

Format: ``<uuid>:<kind>`` per card, comma separated, in registration order; ``kind`` is one of
:class:`Enforcement` (``hami-core``, ``mps``, ``mps-namespaced``, ``mig``, ``none``); an empty value is
a node with no registered card. Example: ``GPU-a:hami-core,GPU-b:none``. The decoder is strict: an
unknown kind, an empty or repeated UUID, a UUID with whitespace or a missing ``:`` raise
:class:`AnnotationError` naming the key and the text.
Pure: stdlib and the codec's own modules only.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from enum import StrEnum

from hami.annotations.errors import AnnotationError
from hami.annotations.keys import NODE_ENFORCEMENT
from hami.annotations.limits import check_length

#: A card UUID as registered: visible ASCII without the separators (no whitespace, no control character,
#: nothing a terminal would act on where ``hami doctor`` prints it).
_UUID = re.compile(r"[!-+\--9;-~]+")


class Enforcement(StrEnum):
    """What holds a container to its slice on a card (docs/annotations.md)."""

    HAMI_CORE = "hami-core"
    MPS = "mps"
    MPS_NAMESPACED = "mps-namespaced"
    MIG = "mig"
    NONE = "none"


def encode_node_enforcement(cards: Mapping[str, Enforcement]) -> str:
    """``uuid:kind`` per card, in the mapping's order. Raises ValueError on a UUID the decoder refuses."""
    for uuid in cards:
        if _UUID.fullmatch(uuid) is None:
            raise ValueError(f"card UUID {uuid!r} cannot be written in {NODE_ENFORCEMENT}")
    return ",".join(f"{uuid}:{Enforcement(kind).value}" for uuid, kind in cards.items())


def decode_node_enforcement(text: str) -> dict[str, Enforcement]:
    """Card UUID -> enforcement, in the annotation's order; the empty text is no card."""
    check_length(NODE_ENFORCEMENT, text)
    found: dict[str, Enforcement] = {}
    if text == "":
        return found
    kinds = ", ".join(k.value for k in Enforcement)
    for item in text.split(","):
        uuid, colon, kind = item.partition(":")
        if not colon:
            raise AnnotationError(NODE_ENFORCEMENT, text, f"entry {item!r} is not <uuid>:<kind>")
        if _UUID.fullmatch(uuid) is None:
            raise AnnotationError(NODE_ENFORCEMENT, text, f"entry {item!r} has no valid card UUID")
        if uuid in found:
            raise AnnotationError(NODE_ENFORCEMENT, text, f"card {uuid} is listed twice")
        try:
            found[uuid] = Enforcement(kind)
        except ValueError:
            raise AnnotationError(
                NODE_ENFORCEMENT, text, f"card {uuid}: unknown enforcement {kind!r} (one of {kinds})"
            ) from None
    return found
