"""Bind's consistent read: the node's pods as the API server holds them once the node lock is taken.

The live view (:mod:`hami.scheduler.snapshot`) is as fresh as the pod watch; another scheduler (a
second replica, or the old leader during a hand-over) may have granted cards on the node a moment
before this bind took its lock, and a watch a second late does not show that grant yet. A grant is
only written under the node lock, and the lock goes only after the grant's pod was bound and
allocated (or its bind was undone), so the pods bound to the node and the pods whose
``hami.io/vgpu-node`` label names it, read after the lock was taken, hold every grant written there
before: bind decides on the live view corrected by that read (docs/scheduler.md, "What each step
does", step 5).

Owns :func:`read_records` (the listed pods -> what each holds, by the same rule as the live view:
``hami.scheduler.podrecords``, the allocating horizon included) and :func:`fenced` (a node's state
with the live view's records of the listed pods replaced by the read's). Pure: no I/O, no clock of its
own; must not import the Kubernetes client or aiohttp.
"""

from __future__ import annotations

import datetime
from collections.abc import Iterable, Mapping
from typing import Any

from hami import objects
from hami.annotations.holding import allocating_until, init_containers_done
from hami.core.model import NodeState
from hami.core.usage import apply_usage
from hami.scheduler.podrecords import PodKey, PodRecord, pod_record


def read_records(
    pods: Iterable[Mapping[str, Any]], *, now: datetime.datetime, horizon: datetime.timedelta
) -> dict[PodKey, PodRecord | None]:
    """What each listed pod holds (None: nothing), as the live view would count it at ``now``: an unbound
    pod whose ``bind-phase=allocating`` began more than ``horizon`` ago holds nothing. Init containers
    count until this read shows them all exited 0 (the live view may already have dropped them: the
    read then counts more, never less)."""
    records: dict[PodKey, PodRecord | None] = {}
    for pod in pods:
        key = objects.pod_key(pod)
        record = pod_record(key, pod, init_done=init_containers_done(pod))
        until = allocating_until(pod, horizon)
        if record is not None and until is not None and until <= now:
            record = None
        records[key] = record
    return records


def fenced(
    state: NodeState,
    node: str,
    counted: Iterable[tuple[PodKey, PodRecord]],
    read: Mapping[PodKey, PodRecord | None],
    exclude: PodKey,
) -> tuple[NodeState, list[PodKey]]:
    """``state`` (node ``node`` as the live view has it, ``exclude``'s own usage already left out) with
    each pod of ``read`` counted as the read says instead of as ``counted`` (the live view's records on
    this node) says; pods the read does not name keep the live view's count. Also the pods whose count
    changed (the live view was behind on them)."""
    here = dict(counted)
    changed: list[PodKey] = []
    for key, record in read.items():
        if key == exclude:
            continue
        before = here.get(key)
        after = record if record is not None and record.node == node else None
        if before == after:
            continue
        changed.append(key)
        if before is not None:
            state = apply_usage(state, before.usage, sign=-1)
        if after is not None:
            state = apply_usage(state, after.usage)
    return state, changed
