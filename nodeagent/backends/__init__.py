"""Card discovery backends behind one interface: NVML (real cards) and simulated (cards from a file).

``open_backend`` is the one factory: ``nvml`` and ``auto`` load NVML (``auto`` never falls back to the
simulator: a node without a driver simply has no cards), ``sim`` reads the YAML file. The NVML module is
imported lazily so pynvml loads only where NVML is used.
"""

from __future__ import annotations

from pathlib import Path

from nodeagent.backends.base import (
    Backend,
    BackendError,
    BackendUnavailable,
    Card,
    Link,
    LiveUsage,
    MigProfileInfo,
    ProcessUsage,
    live_usage,
)

__all__ = [
    "Backend",
    "BackendError",
    "BackendUnavailable",
    "Card",
    "Link",
    "LiveUsage",
    "MigProfileInfo",
    "ProcessUsage",
    "live_usage",
    "open_backend",
]


def open_backend(
    kind: str, *, sim_devices: Path | None = None, topology: bool = False, health_recovery: float = 300.0
) -> Backend:
    """Build the backend named by ``--backend``; raises :class:`BackendUnavailable` with the reason.
    ``health_recovery`` is NVML's quiet period before an unhealthy card may come back (0 = never)."""
    if kind == "sim":
        if sim_devices is None:
            raise BackendUnavailable("--backend sim needs --sim-devices FILE (env HAMI_SIM_DEVICES)")
        from nodeagent.backends.simulated import SimBackend

        return SimBackend(sim_devices)
    if kind in ("nvml", "auto"):
        from nodeagent.backends.nvml import NvmlBackend

        return NvmlBackend(topology=topology, health_recovery=health_recovery)
    raise BackendUnavailable(f"unknown backend {kind!r}: expected auto, nvml or sim")
