"""The simulated cluster of the stress programs: its nodes and cards, its pods, its clocks and limits.

``n1`` has two cards, ``n2`` one; each card 8,000 MiB, 100 cores, 3 slots (small on purpose, so pods
compete). A pod's GPU containers follow its :class:`~.program.Shape`. The clock starts at :data:`START`;
the scheduler's node-lock timeout, allocating horizon and kube-apiserver's request timeout are the
documented defaults. Test code only.
"""

from __future__ import annotations

import datetime
import time
from dataclasses import dataclass
from typing import Any

from hami.annotations import (
    NODE_HANDSHAKE,
    NODE_REGISTER,
    HandshakeKind,
    encode_handshake,
    encode_node_devices,
)
from hami.core.model import Device
from hami.scheduler.config import SchedulerSettings
from hami.scheduler.snapshot import local_time

from .program import Shape

START = datetime.datetime(2026, 5, 1, 10, 0, 0, tzinfo=datetime.UTC)
NODES: tuple[tuple[str, int], ...] = (("n1", 2), ("n2", 1))
MEMORY, SLOTS = 8000, 3
NAMESPACE = "default"
LOCK_TIMEOUT = datetime.timedelta(minutes=5)
FINAL_ADVANCE = datetime.timedelta(hours=1)
#: The scheduler's settings: the defaults, but for the API client timeout (parked requests wait long).
SETTINGS = SchedulerSettings(node_lock_timeout=LOCK_TIMEOUT, api_timeout=120.0)
#: How long an unbound pod with ``bind-phase=allocating`` counts (the scheduler's allocating horizon:
#: twice kube-scheduler's bind timeout).
HORIZON = SETTINGS.allocating_horizon
#: How long a parked request may wait before the API server times it out unapplied (kube-scheduler's
#: bind timeout: the scheduler's horizon for unbound allocations assumes no write lands later).
WRITE_LIMIT = datetime.timedelta(seconds=SETTINGS.bind_timeout)


@dataclass
class Clock:
    """The scheduler's wall clock (moved by the program) and its monotonic ticker (real seconds plus
    every move of the clock, so a bind parked across an ``Advance`` is past its deadline)."""

    now: datetime.datetime = START

    def __call__(self) -> datetime.datetime:
        return self.now

    def ticker(self) -> float:
        return time.monotonic() + (self.now - START).total_seconds()


def cluster_nodes() -> list[dict[str, Any]]:
    handshake = encode_handshake(HandshakeKind.REQUESTING, local_time(START))
    out = []
    for name, cards in NODES:
        devices = [
            Device(
                uuid=f"GPU-{name}-{i}",
                index=i,
                count=SLOTS,
                memory_mib=MEMORY,
                cores=100,
                type="NVIDIA-Tesla V100-PCIE-32GB",
                mode="hami-core",
                health=True,
            )
            for i in range(cards)
        ]
        annotations = {NODE_REGISTER: encode_node_devices(devices), NODE_HANDSHAKE: handshake}
        out.append(
            {
                "apiVersion": "v1",
                "kind": "Node",
                "metadata": {"name": name, "annotations": annotations},
                "status": {"allocatable": {"nvidia.com/gpu": str(cards * SLOTS)}},
            }
        )
    return out


def make_pod(name: str, generation: int, shape: Shape) -> dict[str, Any]:
    limits = {
        "nvidia.com/gpu": str(shape.gpus),
        "nvidia.com/gpumem": str(shape.memory),
        "nvidia.com/gpucores": str(shape.cores),
    }

    def container(cname: str, gpu: bool) -> dict[str, Any]:
        return {"name": cname, "image": "cuda", **({"resources": {"limits": dict(limits)}} if gpu else {})}

    spec: dict[str, Any] = {"schedulerName": "hami-scheduler"}
    if shape.layout == "two":
        spec["containers"] = [container("a", True), container("b", True)]
    elif shape.layout in ("init", "mixed"):
        spec["initContainers"] = [container("init", True)]
        spec["containers"] = [container("main", shape.layout == "mixed")]
    else:
        spec["containers"] = [container("main", True)]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": NAMESPACE,
            "uid": f"uid-{name}-{generation}",
            "annotations": {},
        },
        "spec": spec,
        "status": {"phase": "Pending"},
    }


def cards_document(node: str) -> dict[str, Any]:
    """The simulated backend's card file of ``node`` (the agent's view of the same cards)."""
    cards = dict(NODES)[node]
    return {
        "cards": [
            {
                "uuid": f"GPU-{node}-{i}",
                "model": "Tesla V100-PCIE-32GB",
                "memory_mib": MEMORY,
                "numa": 0,
                "healthy": True,
            }
            for i in range(cards)
        ]
    }
