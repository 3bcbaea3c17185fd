"""Whether a pod still holds cards, and on which node: the one rule behind every count of used cards.

Owns :func:`holding` (a raw pod -> :class:`Holding`: the node it holds cards on, or :class:`Why` it
holds none), :func:`init_containers_done` (when init containers give their cards back) and
:func:`allocating_until` (how long an unbound pod's bind in flight keeps its cards). Three callers
share it: the scheduler's live view (``hami.scheduler.podrecords``), the node agent's exporter
(``nodeagent.grants``) and the agent's MIG reclaim (``nodeagent.mig``).

The rule (docs/protocol.md, "Usage"):

1. a ``Succeeded`` or ``Failed`` pod holds nothing (its containers are gone). Every other phase
   (Pending, Running, Unknown, none) may hold, pods being deleted included: their containers run
   until they stop.
2. the pod holds the cards its grant names on its ``hami.io/vgpu-node`` annotation, and only with a
   ``hami.io/vgpu-devices-allocated`` annotation (what it holds is decoded by the caller; one it
   cannot read counts nowhere there, logged). The label of the same key is not consulted: the scheduler
   writes it together with the annotation, for HAMi's tools to select by; a label without the
   annotation is no grant.
3. it holds none when it is bound (``spec.nodeName``) to another node than its grant names, or unbound
   with ``hami.io/bind-phase=failed`` (the bind gave up; no kubelet will run it there).
4. an unbound pod with ``bind-phase=allocating`` holds until :func:`allocating_until` (its bind is in
   flight; past the horizon it is the leftover of a crash). Only the scheduler sees unbound pods (the
   agent lists the pods bound to its node), so only it applies the horizon, with its own clock.
5. init containers stop holding once all of them exited 0 (:func:`init_containers_done`); whoever
   keeps a view remembers that (sticky: a restarted pod's init statuses never re-inflate it).

The callers differ in one named parameter, ``grant_required``:

* the scheduler (True) counts what it granted: a pod's grant is the only record of its cards it has.
* the exporter (True) must report exactly what the scheduler counts for the node's cards
  (``hami_node_card_memory_allocated_bytes`` equals the scheduler's gauge), so it applies the same rule
  to the pods bound to its node.
* the MIG reclaim (False) protects physical instances: a MIG instance a pod records is in use while
  that pod's containers may run, whatever its grant annotations say now (removed or rewritten by
  hand), so every pod bound to the node that is not finished holds what it records there. Wrongly
  destroying an instance kills a running container; wrongly keeping one only fails an Allocate.

Reads the raw pod through ``hami.objects``' checked accessors (a field of the wrong JSON type reads as
absent; nothing here raises on a hostile object). Pure: ``hami.objects``, the codec and the stdlib only
(no clock: callers pass their own time to compare with :func:`allocating_until`); must not import the
Kubernetes client, ``logging``, ``os`` or ``time``.
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from hami import objects
from hami.annotations.errors import AnnotationError
from hami.annotations.keys import POD_BIND_PHASE, POD_BIND_TIME, POD_DEVICES_ALLOCATED, POD_VGPU_NODE
from hami.annotations.pod import decode_unix_time

#: How long an unbound ``bind-phase=allocating`` counts by default: 2 x kube-scheduler's 30 s bind timeout.
ALLOCATING_HORIZON = datetime.timedelta(seconds=60)
_LONG_AGO = datetime.datetime.min.replace(tzinfo=datetime.UTC)


class Why(StrEnum):
    """Why a pod holds cards where :func:`holding` says, or none."""

    HOLDS = "holds"
    FINISHED = "finished"  # Succeeded or Failed
    NO_GRANT = "no grant"  # no hami.io/vgpu-node or hami.io/vgpu-devices-allocated annotation
    BOUND_ELSEWHERE = "bound elsewhere"  # spec.nodeName is not the node the grant names
    BIND_FAILED = "bind failed"  # unbound and bind-phase=failed
    NOT_BOUND = "not bound"  # grant_required=False: only a bound pod can be using an instance


@dataclass(frozen=True, slots=True, kw_only=True)
class Holding:
    """Where a pod holds cards (``node``; None: nowhere) and why."""

    node: str | None
    why: Why

    @property
    def holds(self) -> bool:
        return self.node is not None


def holding(pod: Mapping[str, Any], *, grant_required: bool = True) -> Holding:
    """Where ``pod`` holds cards now (the module's rules 1-3; rule 4's horizon is the caller's).

    ``grant_required``: True (scheduler, exporter) = the cards its grant names, on the grant's node;
    False (MIG reclaim) = whatever it records, on the node it is bound to, grant or not.
    """
    if objects.finished(pod):  # its containers no longer hold their cards (docs/protocol.md, "Usage")
        return Holding(node=None, why=Why.FINISHED)
    bound = objects.node_name(pod) or None
    if not grant_required:
        return Holding(node=bound, why=Why.HOLDS if bound else Why.NOT_BOUND)
    annotations = objects.annotations(pod)
    granted = annotations.get(POD_VGPU_NODE) or None
    if granted is None or POD_DEVICES_ALLOCATED not in annotations:
        return Holding(node=None, why=Why.NO_GRANT)
    if bound is not None and bound != granted:
        return Holding(node=None, why=Why.BOUND_ELSEWHERE)
    if bound is None and annotations.get(POD_BIND_PHASE) == "failed":
        return Holding(node=None, why=Why.BIND_FAILED)
    return Holding(node=granted, why=Why.HOLDS)


def init_containers_done(pod: Mapping[str, Any]) -> bool:
    """All init containers exited 0: ``status.initContainerStatuses`` non-empty, each terminated with
    exit code 0 (an integer; anything else, a missing code included, is not done)."""
    statuses = objects.status(pod).get("initContainerStatuses")
    if not isinstance(statuses, list) or not statuses:
        return False
    for entry in statuses:
        state = entry.get("state") if isinstance(entry, Mapping) else None
        terminated = state.get("terminated") if isinstance(state, Mapping) else None
        code = terminated.get("exitCode") if isinstance(terminated, Mapping) else None
        if type(code) is not int or code != 0:
            return False
    return True


def allocating_until(
    pod: Mapping[str, Any], horizon: datetime.timedelta = ALLOCATING_HORIZON
) -> datetime.datetime | None:
    """When an unbound pod's in-flight bind stops counting: ``hami.io/bind-time`` + ``horizon`` for a
    pod with no ``spec.nodeName`` and ``bind-phase=allocating`` (a time long past when the bind time
    is missing or unreadable: a bind always writes both); None when the rule does not apply (bound
    pods, other phases). The caller compares it with its own ``now``."""
    if objects.node_name(pod):
        return None
    annotations = objects.annotations(pod)
    if annotations.get(POD_BIND_PHASE) != "allocating":
        return None
    text = annotations.get(POD_BIND_TIME)
    if text is None:
        return _LONG_AGO
    try:
        return decode_unix_time(text) + horizon
    except (AnnotationError, OverflowError):
        return _LONG_AGO
