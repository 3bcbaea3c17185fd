"""Domain values of the allocation core: cards, their usage, requests, grants, allocations.

Owns the frozen dataclasses every other layer speaks in; :class:`Reason` and :class:`Rejection` live in
:mod:`hami.core.rejection` and are re-exported here. Pure: stdlib only; must not import a
Kubernetes client, aiohttp, kopf, grpc, pynvml, ``logging``, ``os`` or ``time``.

Units: memory in MiB, cores in percent of a card's SMs (100 = whole card), a "slot" is one share of a
card (a card registered with ``count`` 10 has 10 slots).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from operator import itemgetter

from hami.core.enforcement import Enforcement, Level, level_of
from hami.core.gocompat import f32
from hami.core.rejection import Reason as Reason
from hami.core.rejection import Rejection as Rejection

#: Request type every NVIDIA container request carries (HAMi's ``NvidiaGPUDevice``).
NVIDIA = "NVIDIA"
#: Percentage sentinel meaning "no memory percentage was given" (docs/protocol.md, "Requests").
PERCENT_NOT_GIVEN = 101


class DeviceMode(StrEnum):
    """How a card is shared (docs/protocol.md, "Card modes")."""

    HAMI_CORE = "hami-core"
    MIG = "mig"
    MPS = "mps"


# ---------------------------------------------------------------------------------------------- cards


@dataclass(frozen=True, slots=True, kw_only=True)
class MigPlacement:
    """A MIG instance position on a card: half-open slice range ``[start, start + size)``."""

    start: int
    size: int

    def overlaps(self, other: MigPlacement) -> bool:
        return self.start < other.start + other.size and other.start < self.start + self.size


@dataclass(frozen=True, slots=True, kw_only=True)
class MigProfile:
    """A MIG profile a card supports (registration JSON ``migProfiles[]``)."""

    name: str
    memory_mib: int
    cores: int
    slice_count: int
    placements: tuple[MigPlacement, ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class Device:
    """One physical card as the node agent registers it (``hami.io/node-nvidia-register``)."""

    uuid: str
    index: int = 0
    count: int  # slots: how many containers may share the card (deviceSplitCount)
    memory_mib: int  # devmem: registered memory, already scaled by deviceMemoryScaling
    cores: int  # devcore: registered cores, 100 x deviceCoreScaling
    type: str  # model name, e.g. "NVIDIA A100-SXM4-80GB"
    numa: int = 0
    mode: str = ""  # DeviceMode value; empty when the registration omitted it
    health: bool = False
    mig_profiles: tuple[MigProfile, ...] = ()
    #: what holds a container to its slice here (``hami.io/node-enforcement``); none when not reported
    enforcement: Enforcement = Enforcement.NONE

    @property
    def level(self) -> Level:
        """The enforcement level this card provides (:func:`~hami.core.enforcement.level_of`)."""
        return level_of(self.enforcement)


@dataclass(frozen=True, slots=True, kw_only=True)
class MigReservation:
    """A MIG instance booked on a card: which profile and where."""

    profile: str
    placement: MigPlacement


@dataclass(frozen=True, slots=True, kw_only=True)
class DeviceState:
    """A card with what is already used on it (docs/protocol.md, "Usage").

    ``inconsistencies`` counts the tracked pods whose MIG bookkeeping disagrees with this card
    (docs/protocol.md, "Usage": a MIG entry without a reservation, a reservation on a non-MIG card). It is a
    count, not a flag, so that removing a pod exactly undoes adding it; the card fails closed while it is
    non-zero.
    """

    device: Device
    used: int = 0  # slots in use
    used_mem: int = 0
    used_cores: int = 0
    inconsistencies: int = 0
    reservations: tuple[MigReservation, ...] = ()

    @property
    def healthy(self) -> bool:
        """Fit check 1: the agent reports the card healthy and usage accounting found it consistent."""
        return self.device.health and self.inconsistencies == 0

    @property
    def free_mem(self) -> int:
        return self.device.memory_mib - self.used_mem

    @property
    def free_cores(self) -> int:
        return self.device.cores - self.used_cores


def is_vendor_card(device: Device, request_type: str = NVIDIA) -> bool:
    """The type pre-filter (docs/protocol.md, "Registration"): the card type contains the request type,
    case-insensitively."""
    return request_type.lower() in device.type.lower()


_VENDOR = NVIDIA.lower()

#: ``(free_mem, free_cores, used, total_cores, total_mem, uuid, type lower-cased, mode, numa)``.
OpenCard = tuple[int, int, int, int, int, str, str, str, int]


@dataclass(frozen=True, slots=True, kw_only=True)
class CardGroup:
    """The open cards of one node sharing a lower-cased card type, a mode and a NUMA node, free memory
    descending: a type/mode filter (check 3) is decided once per group, not once per card."""

    type: str
    mode: str
    numa: int
    cards: tuple[OpenCard, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class NodeSummary:
    """Per-node figures derived once whenever a :class:`NodeState` is built (so O(cards) per pod event).

    They let :func:`hami.core.allocate.allocate` decide most nodes without running Fit:
    ``open_cards`` lists ``(free_mem, free_cores, used, total_cores, total_mem, uuid, lower-cased
    type, mode, numa)`` of every card a plain request could use (healthy, not cordoned, NVIDIA-typed,
    not MIG, a free slot), sorted by free memory descending (registration order on ties); ``kinds``
    are their distinct (type, mode), first seen first; ``groups`` splits them by (type, mode, NUMA
    node) when there is more than one kind; ``by_numa`` by NUMA node (NUMA ascending, each free memory
    descending); ``uuids`` are their uuids; ``min_level``/``max_level`` the weakest and strongest
    enforcement among them; ``score`` is the HAMi node score of the usage (docs/protocol.md, "Scoring").
    """

    score: float
    vendor_cards: int  # cards passing the NVIDIA type pre-filter (NodeInsufficientDevice)
    vendor: tuple[int, ...] = ()  # their positions in the node's devices
    has_mig: bool  # some vendor card is in MIG mode: plain fast checks do not apply
    open_cards: tuple[OpenCard, ...]
    max_free_cores: int
    groups: tuple[CardGroup, ...] = ()  # empty with fewer than two kinds
    kinds: tuple[tuple[str, str], ...] = ()
    by_numa: tuple[tuple[OpenCard, ...], ...] = ()
    uuids: frozenset[str] = frozenset()
    #: the weakest and strongest enforcement level among the open cards (NONE, NONE without any)
    min_level: Level = Level.NONE
    max_level: Level = Level.NONE


def summarize(devices: tuple[DeviceState, ...], cordoned: frozenset[str]) -> NodeSummary:
    """Derive the :class:`NodeSummary` of a card list.

    Node score (docs/protocol.md, "Scoring"), worked example: two cards of 10 slots / 100 cores / 1000 MiB,
    one holding one task of 30 cores and 200 MiB -> 10 x (1/20 + 30/200 + 200/2000) = 10 x 0.3 = 3.0.
    """
    used = count = ucores = tcores = umem = tmem = 0
    vendor: list[int] = []
    has_mig = False
    open_cards: list[OpenCard] = []
    kinds: set[Enforcement] = set()
    for position, state in enumerate(devices):
        dev = state.device
        slots, memory, cores = state.used, state.used_mem, state.used_cores
        used += slots
        count += dev.count
        ucores += cores
        tcores += dev.cores
        umem += memory
        tmem += dev.memory_mib
        card_type = dev.type.lower()
        if _VENDOR not in card_type:  # is_vendor_card, the type lower-cased once
            continue
        vendor.append(position)
        if dev.mode == DeviceMode.MIG:
            has_mig = True
        elif dev.health and not state.inconsistencies and slots < dev.count and dev.uuid not in cordoned:
            kinds.add(dev.enforcement)
            open_cards.append(
                (
                    dev.memory_mib - memory,
                    dev.cores - cores,
                    slots,
                    dev.cores,
                    dev.memory_mib,
                    dev.uuid,
                    card_type,
                    dev.mode,
                    dev.numa,
                )
            )
    score = 0.0
    if count and tcores and tmem:
        # Go: float32(used)/float32(total) per dimension, summed, times the weight 10 (all float32).
        terms = (
            f32(f32(used) / f32(count)),
            f32(f32(ucores) / f32(tcores)),
            f32(f32(umem) / f32(tmem)),
        )
        score = f32(10 * f32(f32(terms[0] + terms[1]) + terms[2]))
    return _summary(score, vendor, has_mig, open_cards, {level_of(kind) for kind in kinds})


def _summary(
    score: float, vendor: list[int], has_mig: bool, open_cards: list[OpenCard], levels: set[Level]
) -> NodeSummary:
    open_cards.sort(key=_FREE_MEM, reverse=True)  # stable: registration order on ties
    ordered = tuple(open_cards)
    numas = {card[8] for card in ordered}
    by_numa: tuple[tuple[OpenCard, ...], ...] = (ordered,)
    if len(numas) > 1:
        by_numa = tuple(tuple(c for c in ordered if c[8] == numa) for numa in sorted(numas))
    kinds = tuple(dict.fromkeys([(card[6], card[7]) for card in ordered]))
    groups: tuple[CardGroup, ...] = ()
    if len(kinds) > 1:  # with one kind a type filter keeps all or nothing: no groups needed
        grouped: dict[tuple[int, str, str], list[OpenCard]] = {}
        for card in ordered:
            grouped.setdefault((card[8], card[6], card[7]), []).append(card)
        groups = tuple(
            CardGroup(type=card_type, mode=mode, numa=numa, cards=tuple(cards))
            for (numa, card_type, mode), cards in sorted(grouped.items(), key=_group_numa)
        )
    return NodeSummary(
        score=score,
        vendor_cards=len(vendor),
        vendor=tuple(vendor),
        has_mig=has_mig,
        open_cards=ordered,
        max_free_cores=max([c[1] for c in ordered], default=-1),
        groups=groups,
        kinds=kinds,
        by_numa=by_numa if ordered else (),
        uuids=frozenset([c[5] for c in ordered]),
        min_level=min(levels, default=Level.NONE),
        max_level=max(levels, default=Level.NONE),
    )


_FREE_MEM = itemgetter(0)


def _group_numa(item: tuple[tuple[int, str, str], list[OpenCard]]) -> int:
    return item[0][0]


@dataclass(frozen=True, slots=True, kw_only=True)
class NodeState:
    """Everything the core needs to know about one node to place a pod on it.

    ``devices`` keep registration order. ``pair_scores[a][b]`` is the topology score between two
    card uuids (docs/protocol.md, "Topology"). ``cordoned`` holds the uuids of ``hami.io/device-cordon``.
    ``positions`` (uuid -> index in ``devices``) and ``summary`` are derived at construction.
    """

    name: str
    devices: tuple[DeviceState, ...]
    pair_scores: Mapping[str, Mapping[str, int]] = field(default_factory=dict)
    cordoned: frozenset[str] = frozenset()
    positions: Mapping[str, int] = field(init=False, repr=False, compare=False)
    summary: NodeSummary = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        positions: dict[str, int] = {}
        for i, state in enumerate(self.devices):
            positions.setdefault(state.device.uuid, i)
        object.__setattr__(self, "positions", positions)
        object.__setattr__(self, "summary", summarize(self.devices, self.cordoned))


@dataclass(frozen=True, slots=True, kw_only=True)
class NamespaceQuota:
    """A namespace's device quota (docs/protocol.md, "Quotas"), passed into the core as data.

    ``memory_limit`` / ``cores_limit`` come from ResourceQuota ``limits.<gpumem>`` / ``limits.<gpucores>``
    (``None`` = not set; the memory limit already multiplied by ``memoryFactor`` when > 1); the used
    amounts are the collapsed usage (docs/protocol.md, "Usage") of the namespace's tracked pods, kept by the
    caller.
    """

    memory_limit: int | None = None
    cores_limit: int | None = None
    memory_used: int = 0
    cores_used: int = 0

    @property
    def limited(self) -> bool:
        return self.memory_limit is not None or self.cores_limit is not None

    def allows(self, memory: int, cores: int) -> bool:
        """``used + request > limit`` fails, equality passes; an unset limit never fails."""
        if self.memory_limit is not None and self.memory_used + memory > self.memory_limit:
            return False
        return not (self.cores_limit is not None and self.cores_used + cores > self.cores_limit)


# ------------------------------------------------------------------------------------------ requests


@dataclass(frozen=True, slots=True, kw_only=True)
class ContainerRequest:
    """One container's device request (docs/protocol.md, "Requests").

    Exactly one memory form holds for a real request: ``memory_mib > 0`` with ``percentage == 101``
    (absolute MiB), or ``memory_mib == 0`` with ``1 <= percentage <= 100``.
    """

    nums: int
    type: str = NVIDIA
    memory_mib: int = 0
    percentage: int = PERCENT_NOT_GIVEN
    cores: int = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class ScoringWeights:
    """``hami.io/device-scoring-weights`` (docs/protocol.md, "Scoring"); defaults 1, 1, 1."""

    slot: int = 1
    core: int = 1
    memory: int = 1


@dataclass(frozen=True, slots=True, kw_only=True)
class PodRequest:
    """A pod's device requests plus the pod annotations that steer placement.

    ``containers`` holds one entry per container, init containers first (``init_count`` of them),
    then app containers; ``None`` for a container without a device request. List-valued annotations
    are already split, trimmed and stripped of empty entries; an empty tuple means "no constraint".
    """

    namespace: str
    name: str
    uid: str = ""
    containers: tuple[ContainerRequest | None, ...]
    init_count: int = 0
    use_types: tuple[str, ...] = ()
    nouse_types: tuple[str, ...] = ()
    use_uuids: tuple[str, ...] = ()
    nouse_uuids: tuple[str, ...] = ()
    numa_bind: bool = False
    vgpu_mode: str | None = None  # nvidia.com/vgpu-mode; None when the annotation is absent
    gpu_policy: str | None = None  # hami.io/gpu-scheduler-policy raw value; None -> global default
    node_policy: str | None = None  # hami.io/node-scheduler-policy; None -> global default
    weights: ScoringWeights = ScoringWeights()
    #: hami.io/require-enforcement: the pod's own floor; the cluster's (Policy) applies as well
    enforcement: Level = Level.NONE

    @property
    def has_devices(self) -> bool:
        return any(c is not None and c.nums > 0 for c in self.containers)


# ------------------------------------------------------------------------------------------- results


@dataclass(frozen=True, slots=True, kw_only=True)
class Grant:
    """One card given to one container: an entry of ``hami.io/vgpu-devices-allocated``."""

    uuid: str
    type: str = NVIDIA
    memory_mib: int
    cores: int


#: Grants per container, init containers first; an empty tuple for a container without devices.
PodDevices = tuple[tuple[Grant, ...], ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class MigAllocation:
    """One entry of ``hami.io/vgpu-mig-allocations`` (docs/protocol.md, "MIG").

    ``container_index``/``device_index`` index into the per-container grant lists. The node agent
    adds the three instance fields (all or none) once the instance exists.
    """

    container_index: int
    device_index: int
    gpu_uuid: str
    profile: str
    placement: MigPlacement
    mig_uuid: str | None = None
    gpu_instance_id: int | None = None
    compute_instance_id: int | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Allocation:
    """A pod fits a node: the grants per container, MIG bookings and the node score."""

    node: str
    devices: PodDevices
    mig: tuple[MigAllocation, ...] = ()
    score: float = 0.0


Decision = Allocation | Rejection
