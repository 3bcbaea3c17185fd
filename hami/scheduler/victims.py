"""Who holds cards on a node, as preemption needs them: identity, priority, age, and whether it may go.

Owns :class:`PodMeta` (read once per pod event by :func:`pod_meta`: uid, ``spec.priority``, when it
started, the node it is bound to, whether it is being deleted) and :func:`node_holders` (the pods
the snapshot counts on a node -> the core's :class:`~hami.core.preempt.Holder` values, each with
whether the extender may *add* it as a victim). kube-scheduler looks every victim up by uid among
the pods it has on that node and fails the whole preemption when one is missing, so only a pod
bound to that node (``spec.nodeName``), with a uid, counted as the watch shows it (no bind of ours
in flight for it) may be added; the others still count as used room, and kube-scheduler may name
them itself. Pure apart from the snapshot it reads: no I/O; must not import the Kubernetes client
or aiohttp.
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from hami import objects
from hami.core.preempt import Holder

if TYPE_CHECKING:
    from hami.scheduler.snapshot import Snapshot

#: kube-scheduler's range for ``spec.priority`` (int32).
PRIORITY_MIN, PRIORITY_MAX = -(2**31), 2**31 - 1


@dataclass(frozen=True, slots=True, kw_only=True)
class PodMeta:
    """What preemption needs to know about a pod besides its cards."""

    uid: str
    priority: int = 0
    started: float = 0.0  # Unix seconds: status.startTime, else metadata.creationTimestamp
    bound: str = ""  # spec.nodeName
    deleting: bool = False


def priority_of(pod: Mapping[str, Any]) -> int:
    """``spec.priority`` as kube-scheduler reads it: absent (or not an int32) -> 0."""
    value = objects.spec(pod).get("priority")
    if isinstance(value, int) and not isinstance(value, bool) and PRIORITY_MIN <= value <= PRIORITY_MAX:
        return value
    return 0


def _seconds(text: Any) -> float | None:
    if not isinstance(text, str) or len(text) > 64:
        return None
    try:
        stamp = datetime.datetime.fromisoformat(text)
    except ValueError:
        return None
    if stamp.tzinfo is None:
        stamp = stamp.replace(tzinfo=datetime.UTC)
    return stamp.timestamp()


def pod_meta(pod: Mapping[str, Any]) -> PodMeta:
    """The pod's :class:`PodMeta`; unreadable fields fall back to their defaults."""
    metadata = objects.meta(pod)
    started = _seconds(objects.status(pod).get("startTime"))
    if started is None:
        started = _seconds(metadata.get("creationTimestamp"))
    return PodMeta(
        uid=objects.uid(pod),
        priority=priority_of(pod),
        started=started or 0.0,
        bound=objects.node_name(pod),
        deleting=bool(metadata.get("deletionTimestamp")),
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class NodeHolders:
    """A node's holders by uid, and the uids the extender may add as victims."""

    by_uid: dict[str, Holder]
    evictable: frozenset[str]


def node_holders(snapshot: Snapshot, node: str, exclude: tuple[str, str] | None = None) -> NodeHolders:
    """The pods counted on ``node`` (``exclude``, the preemptor, left out) as core holders."""
    by_uid: dict[str, Holder] = {}
    evictable: set[str] = set()
    for key, counted, observed in snapshot.holders(node):
        meta = observed.meta if observed is not None else None
        if key == exclude or meta is None or not meta.uid:
            continue  # no uid: neither kube-scheduler nor we can name it; it stays as used room
        by_uid[meta.uid] = Holder(
            uid=meta.uid,
            namespace=key[0],
            priority=meta.priority,
            started=meta.started,
            usage=counted.usage,
        )
        same = observed is not None and (observed.node, observed.allocated) == (
            counted.node,
            counted.allocated,
        )
        if same and meta.bound == node:
            evictable.add(meta.uid)
    return NodeHolders(by_uid=by_uid, evictable=frozenset(evictable))
