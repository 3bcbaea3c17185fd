"""Whether and how a pod counts against its cards in the scheduler's live view (spec-scheduler §6).

Owns :class:`PodRecord` (what one pod holds on one node), :func:`pod_record` (a pod object -> its
record, or None when it holds no card) and :func:`allocating_until` (the allocating horizon). A pod
counts iff it carries ``hami.io/vgpu-node`` and a readable ``hami.io/vgpu-devices-allocated`` and is
not Succeeded/Failed, except three kinds that hold no card on their ``vgpu-node``: an unbound pod
whose bind failed (``bind-phase=failed``), a pod bound to another node, and (the caller's check,
with its own time) an unbound pod whose ``bind-phase=allocating`` began longer than the horizon ago.
Init containers drop out once all of them exited 0. Pure apart from logging the pods it skips: no
clock, no I/O; must not import the Kubernetes client or aiohttp.
"""

from __future__ import annotations

import datetime
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from hami.annotations import (
    POD_BIND_PHASE,
    POD_BIND_TIME,
    POD_DEVICES_ALLOCATED,
    POD_VGPU_NODE,
    AnnotationError,
    decode_pod_devices,
    decode_unix_time,
    read_pod_mig_allocations,
)
from hami.core.usage import PodUsage, pod_usage

logger = logging.getLogger(__name__)

PodKey = tuple[str, str]  # (namespace, name): uids are not guaranteed by every API server
#: How long an unbound ``bind-phase=allocating`` counts by default: 2 x kube-scheduler's 30 s bind timeout.
ALLOCATING_HORIZON = datetime.timedelta(seconds=60)
_LONG_AGO = datetime.datetime.min.replace(tzinfo=datetime.UTC)


@dataclass(frozen=True, slots=True, kw_only=True)
class PodRecord:
    """What one pod holds on one node, and the annotation text it came from."""

    node: str
    usage: PodUsage
    allocated: str


def _annotations(obj: Mapping[str, Any]) -> Mapping[str, str]:
    return (obj.get("metadata") or {}).get("annotations") or {}


def init_containers_done(pod: Mapping[str, Any]) -> bool:
    """All init containers exited 0 (``status.initContainerStatuses`` non-empty, each terminated 0)."""
    statuses = (pod.get("status") or {}).get("initContainerStatuses") or []
    return bool(statuses) and all(
        ((s.get("state") or {}).get("terminated") or {}).get("exitCode", -1) == 0 for s in statuses
    )


def allocating_until(
    pod: Mapping[str, Any], horizon: datetime.timedelta = ALLOCATING_HORIZON
) -> datetime.datetime | None:
    """When an unbound pod's in-flight bind stops counting: ``hami.io/bind-time`` + ``horizon`` for a
    pod with no ``spec.nodeName`` and ``bind-phase=allocating`` (a time long past when the bind time
    is missing or unreadable: a bind always writes both); None when the rule does not apply (bound
    pods, other phases). Pure: the caller compares it with its own ``now``."""
    if (pod.get("spec") or {}).get("nodeName"):
        return None
    annotations = _annotations(pod)
    if annotations.get(POD_BIND_PHASE) != "allocating":
        return None
    text = annotations.get(POD_BIND_TIME)
    if text is None:
        return _LONG_AGO
    try:
        return decode_unix_time(text) + horizon
    except (AnnotationError, OverflowError):
        return _LONG_AGO


def pod_record(key: PodKey, pod: Mapping[str, Any], *, init_done: bool) -> PodRecord | None:
    """What ``pod`` holds (``init_done``: its init containers already dropped out), or None."""
    annotations = _annotations(pod)
    node = annotations.get(POD_VGPU_NODE)
    text = annotations.get(POD_DEVICES_ALLOCATED)
    if not node or text is None:
        return None
    status = pod.get("status") or {}
    spec = pod.get("spec") or {}
    if status.get("phase") in ("Succeeded", "Failed"):
        return None
    if annotations.get(POD_BIND_PHASE) == "failed" and not spec.get("nodeName"):
        return None
    if spec.get("nodeName") and spec["nodeName"] != node:
        logger.warning(
            "pod %s/%s not counted: bound to %s, but its grant names %s", *key, spec["nodeName"], node
        )
        return None
    try:
        devices = decode_pod_devices(text)
    except AnnotationError as exc:
        logger.warning("pod %s/%s not counted: %s", key[0], key[1], exc)
        return None
    try:
        mig = read_pod_mig_allocations(pod)
    except AnnotationError as exc:
        logger.warning("pod %s/%s: %s (its MIG cards fail closed)", key[0], key[1], exc)
        mig = ()
    init_count = len(spec.get("initContainers") or [])
    usage = pod_usage(devices, init_count, init_done=init_done, mig=mig)
    return PodRecord(node=node, usage=usage, allocated=text)
