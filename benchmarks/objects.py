"""What the scheduler benchmarks build alike: a registered Node object and an extender context with no
API server behind it (the snapshot is filled directly from objects; the verbs measured make no call).

Raw JSON dicts as the watch would deliver them, annotation values through the codec.
"""

from __future__ import annotations

import datetime
import itertools
from typing import Any, cast

from hami.annotations import (
    NODE_HANDSHAKE,
    NODE_REGISTER,
    HandshakeKind,
    encode_handshake,
    encode_node_devices,
)
from hami.core.model import Device
from hami.kube.protocol import KubeApi
from hami.scheduler.config import SchedulerSettings
from hami.scheduler.context import Context
from hami.scheduler.main import build_context

#: ``api`` of a context whose verbs make no API call.
NO_API = cast(KubeApi, None)
SLOTS = 10  # deviceSplitCount: pods per card


_VERSIONS = itertools.count(1)


def new_version(pod: dict[str, Any]) -> dict[str, Any]:
    """``pod`` with a ``resourceVersion`` no earlier call gave: a new pod version, so the extender reads
    and evaluates it anew (its scheduling cycle, :mod:`hami.scheduler.cycle`, is per version) instead of
    answering a repeated request from the cycle it kept."""
    metadata = {**pod.get("metadata", {}), "resourceVersion": str(next(_VERSIONS))}
    return {**pod, "metadata": metadata}


def offline_context(settings: SchedulerSettings | None = None) -> Context:
    """The extender's context as the service builds it, without an API client."""
    return build_context(settings or SchedulerSettings(), api=NO_API)


def registered_node(
    name: str,
    now_local: datetime.datetime,
    *,
    cards: int,
    memory_mib: int,
    card_type: str,
    cards_per_numa: int | None = None,
) -> dict[str, Any]:
    """A healthy Node with ``cards`` cards of ``memory_mib`` MiB registered (``GPU-<name>-<i>``), its
    handshake asked at ``now_local`` and every slot allocatable."""
    devices = [
        Device(
            uuid=f"GPU-{name}-{i}",
            index=i,
            count=SLOTS,
            memory_mib=memory_mib,
            cores=100,
            type=card_type,
            numa=i // cards_per_numa if cards_per_numa else 0,
            mode="hami-core",
            health=True,
        )
        for i in range(cards)
    ]
    annotations = {
        NODE_REGISTER: encode_node_devices(devices),
        NODE_HANDSHAKE: encode_handshake(HandshakeKind.REQUESTING, now_local),
    }
    return {
        "metadata": {"name": name, "annotations": annotations},
        "status": {"allocatable": {"nvidia.com/gpu": str(cards * SLOTS)}},
    }
