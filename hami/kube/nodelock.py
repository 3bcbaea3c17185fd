"""The per-node lock (``hami.io/mutex.lock``) that serialises bind → device-plugin Allocate on a node.

Owns acquire and release as compare-and-set JSON patches: a ``test`` op on the value just read, then
``replace``/``add``/``remove``. Any non-2xx answer to the patch means another writer got there first
(a real API server answers 422 to a failed ``test``, the embedded one 500) or the answer was lost, so
the lock is re-read and the decision made again; nothing is ever PUT. Value format and parsing belong
to the codec (``NodeLockValue``, docs/protocol.md, "Node lock"): ``<RFC3339 time>,<namespace>,<pod>``, or a
bare time (legacy).

Rules (docs/protocol.md, "Node lock", plus the takeovers of :func:`orphan_reason`): a lock older than
``expiry`` is taken over; a lock whose holder pod can never be allocated on this node — deleted, bound to
another node, Succeeded/Failed (kubelet's admission failures included), or unbound with a failed bind
recorded at or after the lock's time (``bind-phase=failed``, ``bind-time`` >= the lock's time: no
attempt has taken the lock since) or with a lock older than the bind timeout (an attempt gave up
unmarked) — is taken over at once, and the reason is reported
(:attr:`LockGrant.takeover`, one of :data:`TAKEOVER_REASONS`); the same pod re-acquiring succeeds
without a write (re-entrant), or with ``refresh`` rewrites the lock with its new time (a later
attempt of that pod re-takes it, so that its earlier failure no longer frees it); a fresh legacy lock
is busy until it expires. Busy is :class:`NodeLockBusy`, whose text ends in HAMi's ``node lock
contention``; an unreadable value is :class:`NodeLockUnreadable` instead, as HAMi returns its parse
error rather than contention: not waited for (it never changes by itself) and never taken over (nobody
can tell who holds it, or since when). Release removes the key only when this pod
owns it (or it is a legacy value, which anyone may release), and, given ``value``, only while the
lock still carries exactly that value. A caller that has just read the Node may hand it over (``read``):
the first try decides on it instead of reading it again (the compare-and-set still applies only to the
value as read; a lost race re-reads). A lock value that is not a string is unreadable too; the
holder pod is read through :mod:`hami.objects` (a field of the wrong JSON type reads as absent).
Imports ``hami.kube`` modules, :mod:`hami.objects` and the codec only.
"""

from __future__ import annotations

import datetime
import logging
from collections.abc import Mapping
from dataclasses import dataclass

from hami import objects
from hami.annotations import (
    NODE_LOCK,
    POD_BIND_PHASE,
    POD_BIND_TIME,
    AnnotationError,
    NodeLockValue,
    decode_node_lock,
    decode_unix_time,
    encode_node_lock,
)
from hami.annotations.lock import go_duration
from hami.kube.client import KubeError, NotFound
from hami.kube.nodes import annotation_cas, get_node, json_patch_node
from hami.kube.pods import get_pod, pointer
from hami.kube.protocol import KubeApi
from hami.objects import RawMeta, RawNode, RawPod

logger = logging.getLogger(__name__)

#: JSON-pointer of the lock annotation (``/`` in the key escaped as ``~1``).
LOCK_POINTER = pointer("metadata", "annotations", NODE_LOCK)
DEFAULT_EXPIRY = datetime.timedelta(minutes=5)
#: How many lost compare-and-set races to absorb before giving up.
CAS_ATTEMPTS = 5
#: Why a held lock was taken over: it expired; its holder pod is deleted, bound to another node,
#: finished (Succeeded, or Failed after running), or was rejected by the kubelet's admission.
TAKEOVER_REASONS = (
    "expired",
    "holder_deleted",
    "holder_elsewhere",
    "holder_finished",
    "holder_rejected",
    "holder_failed",
)
#: ``status.reason`` of a pod the kubelet refused to admit (phase Failed): ``UnexpectedAdmissionError``
#: (a device plugin's Allocate failed), ``OutOf<resource>``, and the node-fit predicates.
_ADMISSION_REASONS = ("UnexpectedAdmissionError", "NodeAffinity", "NodeName", "NodePorts", "Taint")


#: HAMi's ``ErrNodeLockContention`` text, which ends every busy-lock error.
CONTENTION = "node lock contention"


class NodeLockBusy(KubeError):
    """Another pod holds the node lock (HAMi's contention error): ``<message>: node lock contention``."""

    def __init__(self, node: str, message: str) -> None:
        super().__init__(0, "NodeLocked", f"{message}: {CONTENTION}")
        self.node = node

    def __str__(self) -> str:
        return self.message  # HAMi's contention text, as is


class NodeLockUnreadable(KubeError):
    """The node lock's value cannot be read (HAMi's parse error, not contention): not to be waited for
    and not to be taken over; ``value`` is the text found."""

    def __init__(self, node: str, value: str, error: AnnotationError) -> None:
        super().__init__(0, "NodeLockUnreadable", f"node {node} has an unreadable lock: {error}")
        self.node = node
        self.value = value

    def __str__(self) -> str:
        return self.message


@dataclass(frozen=True, slots=True, kw_only=True)
class LockGrant:
    """The lock a caller now holds: its ``value``; ``written`` when this call stored it (False when
    the pod already held it); ``takeover`` names why a previous holder's lock was replaced."""

    value: str
    written: bool
    takeover: str | None = None
    previous: str | None = None


def _aware(moment: datetime.datetime) -> datetime.datetime:
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=datetime.UTC)


def orphan_reason(
    holder: RawPod | None,
    node: str,
    locked_at: datetime.datetime | None = None,
    *,
    now: datetime.datetime | None = None,
    bind_timeout: datetime.timedelta | None = None,
) -> str | None:
    """Why the lock's holder pod can never be allocated on ``node`` (so its lock may be taken over at
    once), or None while it still can. ``holder`` is the pod as read, None when it does not exist;
    ``locked_at`` the lock's time. Given ``now`` and ``bind_timeout``, an unbound holder marked
    ``bind-phase=failed`` whose lock is older than the bind timeout is also taken over: every attempt
    of its bind has ended by then, so the lock was left by one that gave up without marking the pod
    again (its failure mark is older than the lock)."""
    if holder is None:
        return "holder_deleted"
    bound = objects.node_name(holder)
    if bound and bound != node:
        return "holder_elsewhere"
    annotations = objects.annotations(holder)
    if not bound and locked_at is not None and annotations.get(POD_BIND_PHASE) == "failed":
        try:
            failed_at = decode_unix_time(str(annotations.get(POD_BIND_TIME)))
        except AnnotationError:
            failed_at = None
        if failed_at is not None and failed_at >= _aware(locked_at).replace(microsecond=0):
            return "holder_failed"  # its bind gave up after taking the lock; none has taken it since
        if now is not None and bind_timeout is not None and _aware(now) - _aware(locked_at) > bind_timeout:
            return "holder_failed"  # an attempt gave up unmarked; no attempt can still own the lock
    phase = objects.pod_phase(holder)
    if phase == "Failed":
        reason = objects.status(holder).get("reason")
        reason = reason if isinstance(reason, str) else ""
        if reason.startswith("OutOf") or reason in _ADMISSION_REASONS:
            return "holder_rejected"
        return "holder_finished"
    if phase == "Succeeded":
        return "holder_finished"
    return None


def _lock_value(node: str, metadata: RawMeta) -> str | None:
    """The lock annotation as stored (None when absent; annotations that are not an object hold none).

    Raises :class:`NodeLockUnreadable` for a value that is not a string: no API server stores one,
    and reading it as absent would overwrite it."""
    annotations = metadata.get("annotations")
    current: object = annotations.get(NODE_LOCK) if isinstance(annotations, Mapping) else None
    if current is None or isinstance(current, str):
        return current
    text = repr(current)
    raise NodeLockUnreadable(node, text, AnnotationError(NODE_LOCK, text, "not a string"))


async def _holder(api: KubeApi, namespace: str, name: str) -> RawPod | None:
    try:
        return await get_pod(api, namespace, name)
    except NotFound:
        return None


async def take_node_lock(
    api: KubeApi,
    node: str,
    namespace: str,
    pod: str,
    *,
    now: datetime.datetime,
    expiry: datetime.timedelta = DEFAULT_EXPIRY,
    refresh: bool = False,
    bind_timeout: datetime.timedelta | None = None,
    read: RawNode | None = None,
) -> LockGrant:
    """Take the lock on ``node`` for ``namespace/pod`` (``refresh``: rewrite it with ``now`` when
    this pod already holds it under another value; ``bind_timeout``: see :func:`orphan_reason`;
    ``read``: the Node as the caller has just read it, decided on in the first try instead of a read).

    Raises :class:`NodeLockBusy` when a live holder has it, :class:`NodeLockUnreadable` when its value
    cannot be read, :class:`~hami.kube.client.NotFound` when the node is gone, and :class:`KubeError`
    for other API failures of the reads.
    """
    now = _aware(now)
    value = encode_node_lock(NodeLockValue(time=now, namespace=namespace, name=pod))
    busy = f"node {node} has been locked within {go_duration(expiry)}"
    for _ in range(CAS_ATTEMPTS):
        obj = read if read is not None else await get_node(api, node)
        read = None  # a retry after a lost race reads again
        metadata = objects.meta(obj)  # as stored: the compare-and-set echoes it
        current = _lock_value(node, metadata)
        takeover = None
        if current:
            try:
                held = decode_node_lock(current)
            except AnnotationError as exc:
                raise NodeLockUnreadable(node, str(current), exc) from exc
            if held.namespace == namespace and held.name == pod:
                # re-entrant (also: our own earlier patch that timed out but landed)
                if not refresh or current == value:
                    return LockGrant(value=str(current), written=current == value and refresh)
            elif now - _aware(held.time) > expiry:
                takeover = "expired"
            elif held.namespace is None or held.name is None:
                raise NodeLockBusy(node, busy)  # a fresh legacy lock has no holder to check
            else:
                holder = await _holder(api, held.namespace, held.name)
                takeover = orphan_reason(holder, node, held.time, now=now, bind_timeout=bind_timeout)
                if takeover is None:
                    raise NodeLockBusy(node, f"{busy} by {held.namespace}/{held.name}")
        try:
            await json_patch_node(api, node, annotation_cas(metadata, NODE_LOCK, current, value, fresh=True))
        except NotFound:
            raise
        except KubeError:
            continue  # lost the race (or the answer was lost): re-read and decide again
        if takeover is not None:
            logger.warning(
                "node %s: lock %r taken over for %s/%s (%s)", node, current, namespace, pod, takeover
            )
        return LockGrant(value=value, written=True, takeover=takeover, previous=current or None)
    raise NodeLockBusy(node, f"node {node}: lock changed under us {CAS_ATTEMPTS} times in a row")


async def acquire_node_lock(
    api: KubeApi,
    node: str,
    namespace: str,
    pod: str,
    *,
    now: datetime.datetime,
    expiry: datetime.timedelta = DEFAULT_EXPIRY,
) -> str:
    """:func:`take_node_lock`, returning only the lock value now stored."""
    grant = await take_node_lock(api, node, namespace, pod, now=now, expiry=expiry)
    return grant.value


async def release_node_lock(
    api: KubeApi, node: str, namespace: str, pod: str, *, value: str | None = None
) -> bool:
    """Remove the lock if ``namespace/pod`` holds it (or it is a legacy value); True when removed.

    With ``value``, only while the lock is exactly that value (the one this caller stored): a lock
    re-taken since, even by the same pod, is left alone. A lock held by another pod, an unreadable
    value, a missing lock or a missing node are left alone.
    """
    for _ in range(CAS_ATTEMPTS):
        try:
            obj = await get_node(api, node)
        except NotFound:
            return False
        metadata = objects.meta(obj)
        try:
            current = _lock_value(node, metadata)
        except NodeLockUnreadable:
            return False
        if not current or (value is not None and current != value):
            return False
        try:
            held = decode_node_lock(current)
        except AnnotationError:
            return False
        if held.namespace is not None and (held.namespace, held.name) != (namespace, pod):
            return False
        try:
            await json_patch_node(api, node, annotation_cas(metadata, NODE_LOCK, current, None, fresh=True))
        except NotFound:
            return False
        except KubeError:
            continue
        return True
    raise KubeError(0, "NodeLockRelease", f"node {node}: lock changed under us {CAS_ATTEMPTS} times in a row")
