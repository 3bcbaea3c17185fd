"""The card-discovery interface every backend implements, and the values it returns.

Owns :class:`Card` (one physical card as the hardware reports it, before any HAMi scaling, with its
compute mode: :data:`COMPUTE_MODES`), its MIG profiles, topology :class:`Link` s, the :class:`Backend`
protocol, the optional :class:`MigBackend` protocol with the :class:`MigInstance` it manages (dynamic
MIG) and the backend errors. Pure: must not import pynvml, grpc, the Kubernetes client or the codec;
the registrar turns cards into the
registration the scheduler reads.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable


class BackendError(RuntimeError):
    """A backend could not read the cards; the message says which card or file and why."""


class BackendUnavailable(BackendError):
    """The backend cannot start at all on this machine (no NVML library, no driver, no file)."""


#: A card's compute mode as the driver reports it (``nvidia-smi -c``, set by an operator; the agent never
#: changes it). Only under ``exclusive-process`` may no more than one process (the MPS server, on an MPS
#: node) hold a context on the card: under the others a process that leaves MPS runs on the card directly.
DEFAULT_COMPUTE = "default"
EXCLUSIVE_PROCESS = "exclusive-process"
COMPUTE_MODES = (DEFAULT_COMPUTE, EXCLUSIVE_PROCESS, "exclusive-thread", "prohibited", "unknown")


@dataclass(frozen=True, slots=True, kw_only=True)
class MigProfileInfo:
    """A MIG profile the card's hardware offers (NVML GPU-instance profile)."""

    name: str  # e.g. "1g.10gb"
    memory_mib: int
    cores: int  # share of the card's SMs in percent, rounded up
    slice_count: int
    instance_count: int  # how many instances of this profile fit on an empty card
    placements: tuple[tuple[int, int], ...] = ()  # (start, size) pairs


@dataclass(frozen=True, slots=True, kw_only=True)
class Card:
    """One physical card as discovered: raw hardware facts plus the backend's health verdict.

    ``memory_mib`` is ``None`` when the hardware cannot report it (unified-memory GPUs); the
    registrar then falls back to ``preConfiguredDeviceMemory``.
    """

    uuid: str
    index: int
    model: str  # NVML product name, e.g. "Tesla V100-PCIE-32GB" (no NVIDIA- prefix added here)
    memory_mib: int | None
    numa: int = 0
    healthy: bool = True
    health_reason: str = ""  # why the card is unhealthy (e.g. "XID 79"); "" when healthy or unknown
    mig_profiles: tuple[MigProfileInfo, ...] = ()
    device_paths: tuple[str, ...] = ()  # /dev/nvidiaN nodes (informational; the runtime injects them)
    compute_mode: str = DEFAULT_COMPUTE  # one of COMPUTE_MODES ("unknown": the driver would not say)


@dataclass(frozen=True, slots=True, kw_only=True)
class Link:
    """A topology score between two cards (higher = faster peer-to-peer), symmetric."""

    a: str
    b: str
    score: int


@dataclass(frozen=True, slots=True, kw_only=True)
class ProcessUsage:
    """One process using a card, as the driver reports it (``pid`` is a host PID)."""

    pid: int
    memory_bytes: int
    utilization: int | None = None  # SM utilisation of this process, 0-100; None = unknown


@dataclass(frozen=True, slots=True, kw_only=True)
class LiveUsage:
    """What a card is doing right now (the exporter's live view; never used for scheduling).

    ``None`` means the hardware cannot tell; ``processes is None`` means the backend cannot list the
    processes at all, while ``()`` means it can and there are none.
    """

    uuid: str
    memory_used_bytes: int | None = None
    utilization: int | None = None  # GPU (SM) utilisation, 0-100
    memory_utilization: int | None = None  # memory-controller utilisation, 0-100
    processes: tuple[ProcessUsage, ...] | None = None


class Backend(Protocol):
    """What the agent needs from the hardware. Methods are blocking: call them via ``to_thread``."""

    @property
    def name(self) -> str:
        """Short backend name for logs (``nvml``, ``sim``)."""
        ...

    def cards(self) -> tuple[Card, ...]:
        """The current cards in index order, with health. Raises :class:`BackendError` on failure.

        NVML health has hysteresis (an XID error keeps the card unhealthy until a quiet period has
        passed and a probe succeeds; ``--health-recovery``); the simulated backend reports whatever
        its file says now.
        """
        ...

    def links(self) -> tuple[Link, ...]:
        """Pairwise topology scores; empty when the backend knows none."""
        ...

    def close(self) -> None:
        """Release the library or files; safe to call twice."""
        ...


@runtime_checkable
class ReportsUsage(Protocol):
    """The optional part of a backend: live usage for the exporter. Blocking, like the rest."""

    def usage(self) -> tuple[LiveUsage, ...]:
        """Per-card live usage (cards the backend cannot measure are left out). Raises
        :class:`BackendError` on failure."""
        ...


def live_usage(backend: Backend) -> tuple[LiveUsage, ...]:
    """The backend's live usage, or nothing when it does not report any."""
    return backend.usage() if isinstance(backend, ReportsUsage) else ()


@dataclass(frozen=True, slots=True, kw_only=True)
class MigInstance:
    """One GPU instance on a MIG card and the compute instance inside it (dynamic MIG).

    ``compute_instance_id`` and ``mig_uuid`` are ``None`` for a GPU instance without a compute
    instance (left half-made by an interrupted creation): nothing can run on it.
    """

    gpu_uuid: str
    profile: str  # GPU-instance profile name, e.g. "3g.20gb"
    start: int  # placement: slices [start, start + size)
    size: int
    gpu_instance_id: int
    compute_instance_id: int | None = None
    mig_uuid: str | None = None  # "MIG-<uuid>": what NVIDIA_VISIBLE_DEVICES names

    def overlaps(self, start: int, size: int) -> bool:
        return self.start < start + size and start < self.start + self.size


@runtime_checkable
class MigBackend(Protocol):
    """A backend that can create and destroy MIG instances. Blocking: call via ``to_thread``.

    Errors (unknown card or profile, an illegal or occupied placement, a driver failure) raise
    :class:`BackendError` naming the card, profile and placement.
    """

    def mig_instances(self, gpu_uuid: str) -> tuple[MigInstance, ...]:
        """Every GPU instance on the card now, in GPU-instance id order."""
        ...

    def create_mig_instance(self, gpu_uuid: str, profile: str, start: int, size: int) -> MigInstance:
        """Create a GPU instance of ``profile`` at exactly ``[start, start + size)`` and one compute
        instance spanning it; nothing is left behind when either step fails."""
        ...

    def destroy_mig_instance(self, gpu_uuid: str, gpu_instance_id: int) -> None:
        """Destroy the GPU instance and every compute instance inside it."""
        ...
