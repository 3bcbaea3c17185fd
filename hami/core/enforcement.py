"""What holds a container to its slice on a card, and how strongly: enforcement kinds and levels.

Owns :class:`Enforcement` (the kind the node agent reports per card in ``hami.io/node-enforcement``:
``hami-core``, ``mps``, ``mps-namespaced``, ``mig``, ``none``), :class:`Level` (their order, what a pod or
the cluster may require) and the one mapping between them, :func:`level_of`:

- ``none``: nothing holds the container to its memory and core limits (a card without HAMi-core, a node
  whose agent wrote no or an unreadable annotation, a node HAMi's agent registered);
- ``cooperative``: ``hami-core`` and ``mps``: the limits are set in the container's own environment
  (a preloaded library, the MPS client's variables), so a tenant who edits its environment can lift them;
- ``isolated``: ``mig`` and ``mps-namespaced``: the limits are held outside the container (the MIG
  hardware partition; the MPS control daemon of a namespace, which the node agent reports only for a
  card in ``EXCLUSIVE_PROCESS`` compute mode, where no process can leave MPS for the bare card).

A card meets a requirement when its level is at least the required one (docs/scheduler.md,
"Enforcement"). Pure: stdlib only; must not import a Kubernetes client, aiohttp, kopf, grpc, pynvml,
``logging``, ``os`` or ``time``.
"""

from __future__ import annotations

from enum import IntEnum, StrEnum


class Enforcement(StrEnum):
    """What holds a container to its slice on a card (docs/annotations.md)."""

    HAMI_CORE = "hami-core"
    MPS = "mps"
    MPS_NAMESPACED = "mps-namespaced"
    MIG = "mig"
    NONE = "none"


class Level(IntEnum):
    """How strongly a card's enforcement holds a container to its slice, weakest first."""

    NONE = 0
    COOPERATIVE = 1
    ISOLATED = 2

    @property
    def word(self) -> str:
        """The level as written in flags and annotations: ``none``, ``cooperative``, ``isolated``."""
        return self.name.lower()


_LEVELS: dict[Enforcement, Level] = {
    Enforcement.NONE: Level.NONE,
    Enforcement.HAMI_CORE: Level.COOPERATIVE,
    Enforcement.MPS: Level.COOPERATIVE,
    Enforcement.MPS_NAMESPACED: Level.ISOLATED,
    Enforcement.MIG: Level.ISOLATED,
}

#: The words :func:`parse_level` accepts, weakest first.
LEVEL_WORDS: tuple[str, ...] = tuple(level.word for level in Level)


def level_of(kind: Enforcement) -> Level:
    """The level a card with enforcement ``kind`` provides."""
    return _LEVELS[kind]


def parse_level(text: str) -> Level | None:
    """``none``/``cooperative``/``isolated`` (surrounding whitespace ignored, exact case) -> the level;
    None for anything else (the caller names its field in the error)."""
    word = text.strip()
    for level in Level:
        if level.word == word:
            return level
    return None
