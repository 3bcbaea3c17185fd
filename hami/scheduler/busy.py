"""Which candidate nodes are busy for a pod now: a bind of it there would find the node lock held.

Owns :func:`busy_nodes`, what ``/prioritize`` steers pods away from (docs/scheduler.md, "What each step
does", Prioritize; docs/compatibility.md, "Scheduler extender", item 30). A node is busy for a pod when

- the node watch last showed its ``hami.io/mutex.lock`` held by another pod (a legacy value, which
  names nobody, included) and not older than ``--node-lock-timeout`` (an expired lock is taken over by
  the next bind: not busy), or holding a value nobody can read (it never expires; an empty value holds
  nothing); the pod's own lock is not busy for it; or
- a GPU bind of another pod to it is in progress in this process
  (:meth:`~hami.scheduler.coordination.BindCoordination.busy_for`): its lock may not be written yet, or
  not shown by the watch yet.

Cost: what is held, not what is asked: the held locks and the nodes with a bind in progress are walked
(each looked up among the candidates in O(1)), never the candidates; each distinct lock value is
decoded once (a small bounded cache of short values). Must not import the Kubernetes client or aiohttp.
"""

from __future__ import annotations

import datetime
import functools
from collections.abc import Container, Mapping

from hami.annotations import AnnotationError, NodeLockValue, decode_node_lock
from hami.scheduler.coordination import BindCoordination, PodKey

#: A lock value longer than this is decoded every time, never kept (a real one is under 400 characters:
#: a time, a namespace and a pod name).
CACHED_LENGTH = 512


def _decode(text: str) -> NodeLockValue | None:
    """``text`` as a lock value; None when unreadable."""
    try:
        return decode_node_lock(text)
    except AnnotationError:
        return None


_decoded = functools.lru_cache(maxsize=1024)(_decode)  # the values seen last, each decoded once


def lock_busy(text: str, pod: PodKey, now: datetime.datetime, expiry: datetime.timedelta) -> bool:
    """Whether a lock annotation ``text`` (not empty) keeps ``pod``'s bind out at ``now`` (aware)."""
    value = _decoded(text) if len(text) <= CACHED_LENGTH else _decode(text)
    if value is None:
        return True  # unreadable: a bind fails on it, and it never expires
    if value.owned_by(*pod):
        return False
    return not value.expired(now, expiry)


def busy_nodes(
    candidates: Container[str],
    pod: PodKey,
    *,
    locks: Mapping[str, str],
    binds: BindCoordination,
    now: datetime.datetime,
    expiry: datetime.timedelta,
) -> set[str]:
    """The nodes among ``candidates`` busy for ``pod`` (see the module docstring): ``locks`` the held
    lock annotations by node (the watch's, ``Snapshot.held_locks``), ``binds`` this process's binds in
    progress, ``expiry`` ``--node-lock-timeout``."""
    busy = {node for node in binds.locking_nodes() if node in candidates and binds.busy_for(node, pod)}
    for node, text in locks.items():
        if node in candidates and node not in busy and lock_busy(text, pod, now, expiry):
            busy.add(node)
    return busy
