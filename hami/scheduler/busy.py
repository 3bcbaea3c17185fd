"""Which candidate nodes are busy for a pod now: a bind of it there would find the node lock held.

Owns :func:`busy_nodes`, what ``/prioritize`` steers pods away from (docs/scheduler.md, "What each step
does", Prioritize; docs/compatibility.md, "Scheduler extender", item 30). A node is busy for a pod when

- a GPU bind of another pod to it is in progress in this process
  (:meth:`~hami.scheduler.coordination.BindCoordination.busy_for`): its lock may not be written yet, or
  not shown by the watch yet; or
- the node watch last showed its ``hami.io/mutex.lock`` held by another pod, not older than
  ``--node-lock-timeout`` (an expired lock is taken over by the next bind), and that pod's grant counts
  on the node in the live view (it is being allocated there), or the lock is younger than
  :data:`FRESH` (a bind elsewhere that has not written its grant yet, or whose grant the watch has not
  shown yet). A live lock of a pod that counts nowhere on the node after that (deleted, finished,
  refused by the kubelet, bound elsewhere, its bind failed: the next bind takes such a lock over at
  once, ``hami.kube.nodelock.orphan_reason``) is not busy, or a lost holder would keep its node empty
  until the lock expires; or
- its lock value names nobody (a live legacy lock: a bind cannot check a holder) or cannot be read
  (a bind fails on it, and it never expires). An empty value holds nothing; the pod's own lock is not
  busy for it.

Cost: what is held, not what is asked: the held locks and the nodes with a bind in progress are walked
(each looked up among the candidates in O(1)), never the candidates; each distinct lock value is
decoded once (a small bounded cache of short values). Must not import the Kubernetes client or aiohttp.
"""

from __future__ import annotations

import datetime
import functools
from collections.abc import Container

from hami.annotations import AnnotationError, NodeLockValue, decode_node_lock
from hami.scheduler.coordination import BindCoordination, PodKey
from hami.scheduler.snapshot import Snapshot

#: A lock value longer than this is never decoded and counts as unreadable (a real one is under 400
#: characters: a time, a namespace and a pod name; a node writing megabytes there only demotes itself).
CACHED_LENGTH = 512
#: How long a lock whose holder's grant the live view does not show counts as a bind on its way (lock
#: times have whole seconds: 1 to 2 s in fact). A bind of this process is known without it.
FRESH = datetime.timedelta(seconds=2)


def _decode(text: str) -> NodeLockValue | None:
    """``text`` as a lock value; None when unreadable."""
    try:
        return decode_node_lock(text)
    except AnnotationError:
        return None


_decoded = functools.lru_cache(maxsize=1024)(_decode)  # the values seen last, each decoded once


def lock_busy(
    text: str,
    node: str,
    pod: PodKey,
    *,
    snapshot: Snapshot,
    now: datetime.datetime,
    expiry: datetime.timedelta,
) -> bool:
    """Whether the lock annotation ``text`` (not empty) of ``node`` keeps ``pod``'s bind out at ``now``
    (aware; see the module docstring)."""
    value = _decoded(text) if len(text) <= CACHED_LENGTH else None
    if value is None:
        return True  # unreadable: a bind fails on it, and it never expires
    if value.namespace is None or value.name is None:
        return not value.expired(now, expiry)  # legacy: nobody to check
    holder = (value.namespace, value.name)
    if holder == pod or value.expired(now, expiry):
        return False
    if now - value.time < FRESH:
        return True
    record = snapshot.record(holder)
    return record is not None and record.node == node


def busy_nodes(
    candidates: Container[str],
    pod: PodKey,
    *,
    snapshot: Snapshot,
    binds: BindCoordination,
    now: datetime.datetime,
    expiry: datetime.timedelta,
) -> set[str]:
    """The nodes among ``candidates`` busy for ``pod`` (see the module docstring): ``snapshot`` the live
    view (the held locks, the holders' grants), ``binds`` this process's binds in progress, ``expiry``
    ``--node-lock-timeout``."""
    busy = {node for node in binds.locking_nodes() if node in candidates and binds.busy_for(node, pod)}
    for node, text in snapshot.held_locks().items():
        if (
            node in candidates
            and node not in busy
            and lock_busy(text, node, pod, snapshot=snapshot, now=now, expiry=expiry)
        ):
            busy.add(node)
    return busy
