"""What a pod holds in the scheduler's live view (docs/protocol.md, "Usage").

Owns :class:`PodRecord` (what one pod holds on one node) and :func:`pod_record` (a pod object -> its
record, or None when it holds no card), with :class:`PodMeta` (who it is, as preemption needs it: uid,
``spec.priority`` and when it started, both read by the one rule in :mod:`hami.objects`, the node it is
bound to, whether it is being deleted; read once per pod event by :func:`pod_meta`). Whether and where a
pod holds cards is the shared rule ``hami.annotations.holding`` (grant required); this module decodes
what it holds, with the init containers dropped once the caller saw them all exit 0, and logs the pods
it leaves out. Pure apart from logging: no clock, no I/O; must not import the Kubernetes client or
aiohttp.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from hami import objects
from hami.annotations import (
    POD_DEVICES_ALLOCATED,
    POD_VGPU_NODE,
    AnnotationError,
    decode_pod_devices,
    pod_annotations,
    read_pod_mig_allocations,
)
from hami.annotations.holding import Why, holding
from hami.core.usage import PodUsage, pod_usage

logger = logging.getLogger(__name__)

PodKey = tuple[str, str]  # (namespace, name): uids are not guaranteed by every API server


@dataclass(frozen=True, slots=True, kw_only=True)
class PodMeta:
    """What preemption needs to know about a pod besides its cards."""

    uid: str
    priority: int = 0
    started: float = math.inf  # Unix seconds: hami.objects.start_time, not started yet -> inf ("now")
    bound: str = ""  # spec.nodeName
    deleting: bool = False
    labels: tuple[tuple[str, str], ...] = ()  # metadata.labels (PodDisruptionBudget selectors read them)


def pod_meta(pod: Mapping[str, Any]) -> PodMeta:
    """The pod's :class:`PodMeta`; unreadable fields fall back to their defaults."""
    metadata = objects.meta(pod)
    return PodMeta(
        uid=objects.uid(pod),
        priority=objects.priority(pod),
        started=objects.start_time(pod, math.inf),
        bound=objects.node_name(pod),
        deleting=bool(metadata.get("deletionTimestamp")),
        labels=tuple(sorted(objects.labels(pod).items())),
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class PodRecord:
    """What one pod holds on one node, and the annotation text it came from."""

    node: str
    usage: PodUsage
    allocated: str
    meta: PodMeta | None = field(default=None, compare=False)  # who it is (preemption); not compared


def pod_record(key: PodKey, pod: Mapping[str, Any], *, init_done: bool) -> PodRecord | None:
    """What ``pod`` holds (``init_done``: its init containers already dropped out), or None."""
    verdict = holding(pod)
    if verdict.why is Why.BOUND_ELSEWHERE:
        logger.warning(
            "pod %s/%s not counted: bound to %s, but its grant names %s",
            *key,
            objects.node_name(pod),
            pod_annotations(pod).get(POD_VGPU_NODE),
        )
    if verdict.node is None:
        return None
    node = verdict.node
    text = pod_annotations(pod)[POD_DEVICES_ALLOCATED]
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
    init_count = len(objects.init_containers(pod))
    usage = pod_usage(devices, init_count, init_done=init_done, mig=mig)
    return PodRecord(node=node, usage=usage, allocated=text, meta=pod_meta(pod))
