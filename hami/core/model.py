"""Domain values of the allocation core: cards, their usage, requests, grants, allocations, rejections.

Owns the frozen dataclasses every other layer speaks in. Pure: stdlib only; must not import a
Kubernetes client, aiohttp, kopf, grpc, pynvml, ``logging``, ``os`` or ``time``.

Units: memory in MiB, cores in percent of a card's SMs (100 = whole card), a "slot" is one share of a
card (a card registered with ``count`` 10 has 10 slots).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum

#: Request type every NVIDIA container request carries (HAMi's ``NvidiaGPUDevice``).
NVIDIA = "NVIDIA"
#: Percentage sentinel meaning "no memory percentage was given" (spec-scheduler §3).
PERCENT_NOT_GIVEN = 101


class DeviceMode(StrEnum):
    """How a card is shared (spec-scheduler §10)."""

    HAMI_CORE = "hami-core"
    MIG = "mig"
    MPS = "mps"


class Reason(StrEnum):
    """HAMi's failure-reason vocabulary (spec-scheduler §19). Spelling is part of the protocol."""

    CARD_NOT_HEALTH = "CardNotHealth"
    CARD_CORDONED = "CardCordoned"
    CARD_TYPE_MISMATCH = "CardTypeMismatch"
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
    # node-level reasons (not counted per card)
    NODE_INSUFFICIENT_DEVICE = "NodeInsufficientDevice"
    DEVICE_TYPE_NOT_FOUND = "Device type not found"
    NODE_UNREGISTERED = "node unregistered"
    NODE_USAGE_UNAVAILABLE = "node usage unavailable"


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


@dataclass(frozen=True, slots=True, kw_only=True)
class MigReservation:
    """A MIG instance booked on a card: which profile and where."""

    profile: str
    placement: MigPlacement


@dataclass(frozen=True, slots=True, kw_only=True)
class DeviceState:
    """A card with what is already used on it (spec-scheduler §6)."""

    device: Device
    used: int = 0  # slots in use
    used_mem: int = 0
    used_cores: int = 0
    healthy: bool = True  # False when usage accounting found an inconsistency (fail closed, §6 MIG)
    reservations: tuple[MigReservation, ...] = ()

    @property
    def free_mem(self) -> int:
        return self.device.memory_mib - self.used_mem

    @property
    def free_cores(self) -> int:
        return self.device.cores - self.used_cores


@dataclass(frozen=True, slots=True, kw_only=True)
class NodeState:
    """Everything the core needs to know about one node to place a pod on it.

    ``devices`` keep registration order. ``pair_scores[a][b]`` is the topology score between two
    card uuids (spec-scheduler §12). ``cordoned`` holds the uuids of ``hami.io/device-cordon``.
    """

    name: str
    devices: tuple[DeviceState, ...]
    pair_scores: Mapping[str, Mapping[str, int]] = field(default_factory=dict)
    cordoned: frozenset[str] = frozenset()


# ------------------------------------------------------------------------------------------ requests


@dataclass(frozen=True, slots=True, kw_only=True)
class ContainerRequest:
    """One container's device request (spec-scheduler §3).

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
    """``hami.io/device-scoring-weights`` (spec-scheduler §11); defaults 1, 1, 1."""

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
    """One entry of ``hami.io/vgpu-mig-allocations`` (spec-scheduler §13).

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


@dataclass(frozen=True, slots=True, kw_only=True)
class Rejection:
    """A pod does not fit a node, and why.

    ``reasons`` maps a reason to how many cards failed with it; ``total`` is the number of cards
    handed to Fit (the denominator of ``"2/8 CardInsufficientMemory"``). ``message`` is the exact
    HAMi text for ``FailedNodes``. ``resolvable`` is False when the node could never fit this pod
    whatever other pods do (too few cards, type or uuid mismatch...), so preemption need not try.
    """

    node: str
    reasons: Mapping[str, int]
    total: int
    message: str
    resolvable: bool


Decision = Allocation | Rejection
