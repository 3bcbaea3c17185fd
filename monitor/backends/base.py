"""The card-discovery interface every backend implements, and the values it returns.

Owns :class:`Card` (one physical card as the hardware reports it, before any HAMi scaling), its MIG
profiles, topology :class:`Link` s, the :class:`Backend` protocol and the backend errors. Pure: must
not import pynvml, grpc, the Kubernetes client or the codec; the registrar turns cards into the
registration the scheduler reads.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


class BackendError(RuntimeError):
    """A backend could not read the cards; the message says which card or file and why."""


class BackendUnavailable(BackendError):
    """The backend cannot start at all on this machine (no NVML library, no driver, no file)."""


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
    mig_profiles: tuple[MigProfileInfo, ...] = ()
    device_paths: tuple[str, ...] = ()  # /dev/nvidiaN nodes (informational; the runtime injects them)


@dataclass(frozen=True, slots=True, kw_only=True)
class Link:
    """A topology score between two cards (higher = faster peer-to-peer), symmetric."""

    a: str
    b: str
    score: int


class Backend(Protocol):
    """What the agent needs from the hardware. Methods are blocking: call them via ``to_thread``."""

    @property
    def name(self) -> str:
        """Short backend name for logs (``nvml``, ``sim``)."""
        ...

    def cards(self) -> tuple[Card, ...]:
        """The current cards in index order, with health. Raises :class:`BackendError` on failure.

        Health is sticky where the hardware says so (an NVML XID error stays unhealthy); the
        simulated backend reports whatever its file says now.
        """
        ...

    def links(self) -> tuple[Link, ...]:
        """Pairwise topology scores; empty when the backend knows none."""
        ...

    def close(self) -> None:
        """Release the library or files; safe to call twice."""
        ...
