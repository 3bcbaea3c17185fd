"""Which pod a kubelet ``Allocate`` call is for, when the call names none (docs/protocol.md, "Allocate").

Owns the pairing rules of docs/node-agent.md ("Which pod an Allocate is for"). Kubelet calls Allocate
while it admits a pod, once per container asking for the resource (init containers first), with only
the number of device IDs it picked. The pods it may be admitting are the **suspects**: Pending, bound
to this node, not yet started by kubelet (no container statuses), not already refused by this agent,
and either waiting for our grant here (:func:`nodeagent.allocate_rules.is_candidate`) or asking for the
resource without one (another scheduler's pod, one marked ``failed``, a grant for another node). Each
suspect matches the call when the card counts of its next waiting entries equal kubelet's counts; a
suspect whose grant cannot be trusted matches on what its containers ask for as well, so editing an
annotation cannot hide it. Then:

1. no suspect → nothing to pair (``NOT_FOUND``); exactly one suspect → it is the pod, matching or not;
2. of the matching suspects, the one in the middle of its containers wins (kubelet admits one pod's
   containers back to back); else a single match wins; else matches that are all trusted and would get
   the very same cards are served in bind order;
3. anything else is ambiguous: no card is handed out and the message names every candidate.

Pure: must not import grpc, pynvml, the Kubernetes client, ``os`` or ``logging``.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from hami import objects
from hami.annotations import (
    POD_BIND_PHASE,
    POD_BIND_TIME,
    POD_DEVICES_TO_ALLOCATE,
    AnnotationError,
    pod_annotations,
    read_bind_time,
    read_pod_devices,
    read_pod_to_allocate,
    read_vgpu_node,
)
from hami.core.model import Device, Grant
from hami.objects import pod_key
from nodeagent.allocate_rules import container_names, is_candidate, phase_text
from nodeagent.handout import asked_count, handout_problem, whose_problem

#: Bind order of a pod without a readable bind time: after every pod with one.
_LAST = 1 << 62


def cards(count: int | None) -> str:
    return "an unknown number of cards" if count is None else f"{count} card" + ("" if count == 1 else "s")


@dataclass(frozen=True, slots=True, kw_only=True)
class Suspect:
    """A pod kubelet may be admitting now."""

    pod: Mapping[str, Any]
    name: str  # namespace/name
    order: tuple[int, str, str]  # bind order: bind time, creation time, name
    waiting: tuple[tuple[int, tuple[Grant, ...]], ...] | None  # our entries still to serve; None: unreadable
    wants: tuple[int | None, ...]  # card counts its containers ask for (None: unreadable count)
    midway: bool  # some of its entries are served already, more are waiting
    ours: bool  # it waits for our grant on this node: a failure is recorded on it
    problem: str | None  # why its grant must not be handed out; None: it may

    def matches(self, counts: Sequence[int]) -> bool:
        by_grant = self.waiting is not None and [len(g) for _, g in self.waiting[: len(counts)]] == list(
            counts
        )
        if self.problem is None:
            return by_grant
        by_spec = all(c in self.wants or None in self.wants for c in counts) and bool(self.wants)
        return by_grant or by_spec or (self.ours and self.waiting is None)

    def next_grants(self, count: int) -> tuple[tuple[Grant, ...], ...]:
        return tuple(grants for _, grants in (self.waiting or ())[:count])

    def describe(self) -> str:
        if self.waiting:
            index, grants = self.waiting[0]
            names = container_names(self.pod)
            inits = len(objects.init_containers(self.pod))
            kind = "init container" if index < inits else "container"
            what = f"next {kind} {names[index] if index < len(names) else f'#{index}'}: {cards(len(grants))}"
        else:
            what = "asks for " + ", ".join(cards(c) for c in self.wants) if self.wants else "grant unreadable"
        return f"{self.name} ({what}{'; ' + self.problem if self.problem else ''})"


@dataclass(frozen=True, slots=True, kw_only=True)
class Pairing:
    """The pod to serve (``chosen``), or the suspects the call cannot be told apart between."""

    chosen: Suspect | None = None
    candidates: tuple[Suspect, ...] = ()


def requested(pod: Mapping[str, Any], resource: str) -> tuple[int | None, ...]:
    """Card counts the containers ask for (init first), skipping containers that ask for none."""
    every = objects.containers_init_first(pod)
    return tuple(count for count in (asked_count(c, resource) for c in every) if count != 0)


def started_by_kubelet(pod: Mapping[str, Any]) -> bool:
    """Kubelet writes container statuses only once it admitted the pod."""
    status = objects.status(pod)
    return bool(status.get("containerStatuses") or status.get("initContainerStatuses"))


def _order(pod: Mapping[str, Any]) -> tuple[int, str, str]:
    try:
        bound = read_bind_time(pod)
    except AnnotationError:
        bound = None
    created = objects.meta(pod).get("creationTimestamp")
    seconds = int(bound.timestamp()) if bound is not None else _LAST
    return seconds, created if isinstance(created, str) else "", objects.name(pod)


def _served_here(pod: Mapping[str, Any], node: str) -> bool:
    """Our agent finished it: ``success`` with nothing left (kubelet may not have reported it yet)."""
    if read_vgpu_node(pod) != node or phase_text(pod) != "success":
        return False
    try:
        remaining = read_pod_to_allocate(pod)
    except AnnotationError:
        return False
    return remaining is not None and not any(remaining)


def _not_waiting(pod: Mapping[str, Any], *, node: str, scheduler: str) -> str:
    """Why a pod asking for cards has no grant of ours waiting here."""
    whose = whose_problem(pod, node=node, scheduler=scheduler)
    if whose is not None:
        return whose
    annotations = pod_annotations(pod)
    phase = annotations.get(POD_BIND_PHASE)
    if phase is None or POD_BIND_TIME not in annotations:
        return f"{scheduler} never bound it ({POD_BIND_PHASE} or {POD_BIND_TIME} missing)"
    if phase not in ("allocating", "success"):
        return f"it is marked {POD_BIND_PHASE}={phase}: its grant was given up"
    return f"its {POD_DEVICES_TO_ALLOCATE} has nothing left to hand out"


def suspects(
    pods: Sequence[Mapping[str, Any]],
    *,
    node: str,
    scheduler: str,
    resource: str,
    registered: Mapping[str, Device],
    mode: str,
    refused: Collection[str] = (),
) -> tuple[Suspect, ...]:
    """The pods kubelet may be admitting on ``node``, in bind order (``refused``: pod UIDs this agent
    already failed, which kubelet rejects)."""
    found: list[Suspect] = []
    for pod in pods:
        if (objects.pod_phase(pod) or "Pending") != "Pending" or objects.node_name(pod) != node:
            continue
        if objects.uid(pod) in refused or started_by_kubelet(pod):
            continue
        namespace, name = pod_key(pod)
        wants = requested(pod, resource)
        ours = is_candidate(pod, node)
        waiting: tuple[tuple[int, tuple[Grant, ...]], ...] | None = None
        midway = False
        if ours:
            problem = handout_problem(
                pod, node=node, scheduler=scheduler, registered=registered, mode=mode, resource=resource
            )
            try:
                remaining = read_pod_to_allocate(pod) or ()
                record = read_pod_devices(pod) or ()
            except AnnotationError:
                pass
            else:
                waiting = tuple((i, g) for i, g in enumerate(remaining) if g)
                midway = bool(waiting) and any(
                    granted and i < len(remaining) and not remaining[i] for i, granted in enumerate(record)
                )
        elif not wants or _served_here(pod, node):
            continue
        else:
            problem = _not_waiting(pod, node=node, scheduler=scheduler)
        found.append(
            Suspect(
                pod=pod,
                name=f"{namespace}/{name}",
                order=_order(pod),
                waiting=waiting,
                wants=wants,
                midway=midway,
                ours=ours,
                problem=problem,
            )
        )
    return tuple(sorted(found, key=lambda s: s.order))


def pair(found: Sequence[Suspect], counts: Sequence[int]) -> Pairing:
    """The suspect kubelet's call (``counts`` = device IDs per container) is for (module docstring)."""
    if len(found) <= 1:
        return Pairing(chosen=found[0] if found else None)
    matching = [s for s in found if s.matches(counts)]
    if not matching:
        return Pairing(candidates=tuple(found))
    midway = [s for s in matching if s.midway]
    if len(midway) == 1:
        return Pairing(chosen=midway[0])
    if len(matching) == 1:
        return Pairing(chosen=matching[0])
    if all(s.problem is None for s in matching) and len({s.next_grants(len(counts)) for s in matching}) == 1:
        return Pairing(chosen=matching[0])  # the same cards whichever it is: serve in bind order
    return Pairing(candidates=tuple(matching))


def asked(counts: Sequence[int]) -> str:
    """Kubelet's request in words: ``1 card`` or ``2 cards, then 1 card`` (one part per container)."""
    return ", then ".join(cards(c) for c in counts) or "no card"


def ambiguity(node: str, counts: Sequence[int], candidates: Sequence[Suspect]) -> str:
    """The error (and Event) text of a call that cannot be paired with one pod."""
    matching = all(s.matches(counts) for s in candidates)
    which = "may be any of" if matching else "matches none of the pods waiting here"
    return (
        f"kubelet asked node {node} for {asked(counts)} and {which}: "
        f"{'; '.join(s.describe() for s in candidates)}. No card was handed out: kubelet rejects the pod it "
        "is admitting (UnexpectedAdmissionError) and the others are served when kubelet admits them"
    )
