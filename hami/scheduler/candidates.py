"""The candidate nodes' states for deciding one pod: the helpers filter, prioritize, preempt and bind share.

Owns :func:`template_states` (the Node objects a request carries, without ``nodeCacheCapable``:
evaluated from their annotations alone, zero usage) and :func:`snapshot_states` (candidate names ->
the live states, the pod's own usage left out, the cards held for nominated pods it does not outrank
counted as used, and the excluded nodes as :class:`~hami.core.rejection.Rejection` s). Neither verb
module imports the other: both come here (and to :mod:`hami.scheduler.cycle` for what a scheduling
cycle keeps). Pure apart from the snapshot it reads: must not import the Kubernetes client, aiohttp,
logging, time or asyncio.
"""

from __future__ import annotations

import datetime
from typing import Any

from hami import objects
from hami.annotations import AnnotationError, read_node
from hami.core.model import NodeState, PodRequest
from hami.core.rejection import Rejection
from hami.scheduler.reasons import registration_rejection
from hami.scheduler.snapshot import Candidates, Snapshot, local_time
from hami.scheduler.wire import NodeListWire


def template_states(
    nodes: NodeListWire,
) -> tuple[list[NodeState], dict[str, Rejection], dict[str, dict[str, Any]]]:
    """Node objects from the request -> states (zero usage), exclusions, and the objects by name."""
    states: list[NodeState] = []
    excluded: dict[str, Rejection] = {}
    by_name: dict[str, dict[str, Any]] = {}
    for obj in objects.items(nodes):  # checked by hami.scheduler.wire: objects, string annotations
        name = objects.name(obj)
        by_name[name] = obj
        try:
            states.append(read_node(name, objects.annotations(obj)))
        except AnnotationError as exc:
            excluded[name] = registration_rejection(name, exc)
    return states, excluded, by_name


def live_candidates(
    snapshot: Snapshot,
    names: list[str] | tuple[str, ...],
    request: PodRequest,
    now: datetime.datetime,
    priority: int | None = None,
) -> Candidates:
    """Candidate names -> the snapshot's :class:`~hami.scheduler.snapshot.Candidates` for ``request``
    at ``now`` (without this pod's own booking; with ``priority``, the cards held for nominated pods
    it does not outrank count as used)."""
    key = (request.namespace, request.name)
    return snapshot.candidates(names, local_time(now), exclude=key, priority=priority)


def snapshot_states(
    snapshot: Snapshot,
    names: list[str],
    request: PodRequest,
    now: datetime.datetime,
    priority: int | None = None,
) -> tuple[list[NodeState], dict[str, Rejection]]:
    """:func:`live_candidates` as (states in ``names`` order, the excluded ones by name)."""
    found = live_candidates(snapshot, names, request, now, priority)
    return found.states, found.excluded
