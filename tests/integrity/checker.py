"""The allocation invariants, as pure functions over what the API server holds (and what kubelet saw).

Everything is decoded with the project's codec (``hami.annotations``); the sums are written here, on
purpose independently of ``hami.core.usage``. Per card, for one pod: init containers run one after
another (their largest grant counts; nothing once all of them exited 0), app containers run together
(their grants add up); slots are one per app grant, at least one for an init grant.

Rules checked by :func:`check` (each violation is one line naming its rule):

* ``bound``    pods bound to the node (``spec.nodeName``), not Succeeded/Failed, not
  ``bind-phase=failed`` (the agent never serves those): per card, memory <= registered memory,
  cores <= registered cores, slots <= split count, and a card granted with all its cores (exclusive)
  carries no other pod. Every card a bound pod holds must be a card of that node.
* ``counted``  the scheduler's documented rule (docs/scheduler.md): pods whose ``vgpu-node`` is the node,
  with a readable allocation, not Succeeded/Failed, not ``bind-phase=failed``, and either bound to it
  or unbound with a ``bind-time`` within the allocating horizon (a bind in flight): the same limits.
  Bound pods marked failed are left out here too: a Binding that lands after its bind was undone
  (answer lost, kube-apiserver applied it late) binds such a pod, which the agent then refuses.
* ``served``   what Allocate actually handed out (kubelet's record) for admitted pods that still exist
  and are not Succeeded/Failed: the same per-card limits.
* ``served-match``  an admitted pod got exactly its own ``vgpu-devices-allocated`` entries (uuids,
  memory limits, cores) for the containers served, on the node its ``vgpu-node`` names.
* ``lock``     a lock value is readable; a fresh lock (younger than ``--node-lock-timeout``) does not
  name a holder whose every container was served (the agent releases it after the last Allocate).

:func:`dead_holder` says why a fresh lock's holder can never be allocated on that node (gone,
Succeeded/Failed, bound to another node, fully served, or bind failed with no bind in flight and either
the lock older than kube-scheduler's bind timeout or the failure newer than the lock): a bind
refused because of such a lock is a violation (the world checks it when a bind is refused, and with a
probe bind at the end). :func:`card_usage` gives the per-card sums the final "no phantom usage" check
compares with the scheduler's view. Pure: imports the codec and the core's model only.
"""

from __future__ import annotations

import datetime
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from hami.annotations import (
    NODE_LOCK,
    NODE_REGISTER,
    POD_BIND_PHASE,
    AnnotationError,
    allocation_done,
    decode_node_devices,
    decode_node_lock,
    read_bind_time,
    read_pod_devices,
    read_pod_to_allocate,
    read_vgpu_node,
)
from hami.core.model import Device, Grant

TERMINAL = ("Succeeded", "Failed")
PodKey = tuple[str, str]


@dataclass(frozen=True, slots=True, kw_only=True)
class Served:
    """What kubelet got from Allocate for one container of one pod."""

    namespace: str
    name: str
    uid: str
    node: str
    index: int  # container position in annotation order (init containers first)
    init: bool
    grants: tuple[Grant, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class View:
    nodes: Sequence[Mapping[str, Any]]
    pods: Sequence[Mapping[str, Any]]
    served: Sequence[Served] = ()
    now: datetime.datetime
    lock_timeout: datetime.timedelta
    busy: frozenset[PodKey] = frozenset()  # pods with a bind or an Allocate still in flight
    horizon: datetime.timedelta = datetime.timedelta(seconds=60)  # how long an unbound allocation counts
    bind_timeout: datetime.timedelta = datetime.timedelta(seconds=30)  # kube-scheduler's, for one bind


@dataclass(slots=True)
class Use:
    slots: int = 0
    memory: int = 0
    cores: int = 0
    exclusive: bool = False  # granted all of the card's cores
    pods: list[str] = field(default_factory=list)


# ------------------------------------------------------------------------------------------ objects
def meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    return obj.get("metadata") or {}


def key_of(pod: Mapping[str, Any]) -> PodKey:
    return str(meta(pod).get("namespace") or ""), str(meta(pod).get("name") or "")


def phase_of(pod: Mapping[str, Any]) -> str:
    return str((pod.get("status") or {}).get("phase") or "Pending")


def bound_to(pod: Mapping[str, Any]) -> str | None:
    return (pod.get("spec") or {}).get("nodeName") or None


def bind_phase(pod: Mapping[str, Any]) -> str | None:
    return (meta(pod).get("annotations") or {}).get(POD_BIND_PHASE)


def init_done(pod: Mapping[str, Any]) -> bool:
    statuses = (pod.get("status") or {}).get("initContainerStatuses") or []
    return bool(statuses) and all(
        ((s.get("state") or {}).get("terminated") or {}).get("exitCode", -1) == 0 for s in statuses
    )


def init_count(pod: Mapping[str, Any]) -> int:
    return len((pod.get("spec") or {}).get("initContainers") or [])


def cards_of(node: Mapping[str, Any]) -> dict[str, Device]:
    text = (meta(node).get("annotations") or {}).get(NODE_REGISTER)
    return {d.uuid: d for d in decode_node_devices(text)} if text else {}


# -------------------------------------------------------------------------------------------- usage
def pod_cards(containers: Iterable[tuple[bool, Sequence[Grant]]], *, skip_init: bool) -> dict[str, Use]:
    """One pod's physical use per card from ``(is_init, grants)`` per container."""
    init: dict[str, Use] = {}
    app: dict[str, Use] = {}
    for is_init, grants in containers:
        if is_init and skip_init:
            continue
        for g in grants:
            if is_init:
                use = init.setdefault(g.uuid, Use(slots=1))
                use.memory, use.cores = max(use.memory, g.memory_mib), max(use.cores, g.cores)
            else:
                use = app.setdefault(g.uuid, Use())
                use.slots, use.memory, use.cores = (
                    use.slots + 1,
                    use.memory + g.memory_mib,
                    use.cores + g.cores,
                )
    out: dict[str, Use] = {}
    for uuid in init.keys() | app.keys():
        i, a = init.get(uuid, Use()), app.get(uuid, Use())
        out[uuid] = Use(
            slots=max(i.slots, a.slots), memory=max(i.memory, a.memory), cores=max(i.cores, a.cores)
        )
    return out


def card_usage(holders: Iterable[tuple[str, dict[str, Use]]], cards: Mapping[str, Device]) -> dict[str, Use]:
    """Sum per card over ``(pod label, per-card use)``; marks a card exclusive when a pod took all cores."""
    total: dict[str, Use] = {}
    for label, uses in holders:
        for uuid, use in uses.items():
            card = total.setdefault(uuid, Use())
            card.slots += use.slots
            card.memory += use.memory
            card.cores += use.cores
            device = cards.get(uuid)
            if device is not None and device.cores and use.cores >= device.cores:
                card.exclusive = True
            card.pods.append(label)
    return total


def _over(rule: str, node: str, totals: Mapping[str, Use], cards: Mapping[str, Device]) -> list[str]:
    problems = []
    for uuid, use in sorted(totals.items()):
        device = cards.get(uuid)
        if device is None:
            problems.append(
                f"[{rule}] node {node}: {', '.join(use.pods)} hold card {uuid}, not a card of {node}"
            )
            continue
        where = f"[{rule}] node {node} card {uuid} ({', '.join(use.pods)})"
        if use.memory > device.memory_mib:
            problems.append(f"{where}: memory {use.memory} > {device.memory_mib} MiB")
        if use.cores > device.cores:
            problems.append(f"{where}: cores {use.cores} > {device.cores}")
        if use.slots > device.count:
            problems.append(f"{where}: slots {use.slots} > {device.count}")
        if use.exclusive and len(use.pods) > 1:
            problems.append(f"{where}: a pod holding all cores shares the card")
    return problems


def allocated_containers(pod: Mapping[str, Any]) -> list[tuple[bool, tuple[Grant, ...]]] | None:
    """``(is_init, grants)`` per container from ``vgpu-devices-allocated`` (None when absent)."""
    devices = read_pod_devices(pod)
    if devices is None:
        return None
    inits = init_count(pod)
    return [(index < inits, grants) for index, grants in enumerate(devices)]


def bound_usage(pods: Iterable[Mapping[str, Any]], node: str) -> tuple[dict[str, dict[str, Use]], list[str]]:
    """Per pod label, the physical use of the pods bound to ``node`` that will run (rule ``bound``)."""
    holders: dict[str, dict[str, Use]] = {}
    problems: list[str] = []
    for pod in pods:
        if bound_to(pod) != node or phase_of(pod) in TERMINAL or bind_phase(pod) == "failed":
            continue
        label = "/".join(key_of(pod))
        try:
            containers = allocated_containers(pod)
        except AnnotationError as exc:
            problems.append(f"[bound] pod {label} on {node}: unreadable allocation: {exc}")
            continue
        if containers is None:
            continue
        holders[label] = pod_cards(containers, skip_init=init_done(pod))
    return holders, problems


def counted_usage(view: View, node: str) -> tuple[dict[str, dict[str, Use]], list[str]]:
    """Per pod label, the use of the pods the scheduler's rule counts on ``node`` (rule ``counted``)."""
    holders: dict[str, dict[str, Use]] = {}
    problems: list[str] = []
    for pod in view.pods:
        if read_vgpu_node(pod) != node or phase_of(pod) in TERMINAL or bind_phase(pod) == "failed":
            continue
        label = "/".join(key_of(pod))
        try:
            containers = allocated_containers(pod)
            since = read_bind_time(pod)
        except AnnotationError as exc:
            problems.append(f"[counted] pod {label}: unreadable allocation: {exc}")
            continue
        if containers is None or bound_to(pod) not in (None, node):
            continue
        if bound_to(pod) is None and (since is None or view.now - since > view.horizon):
            continue
        holders[label] = pod_cards(containers, skip_init=init_done(pod))
    return holders, problems


# -------------------------------------------------------------------------------------------- locks
def dead_holder(view: View, node: Mapping[str, Any]) -> str | None:
    """Why the holder of ``node``'s fresh lock can never be allocated there; None when it still can (or
    there is no fresh lock)."""
    text = (meta(node).get("annotations") or {}).get(NODE_LOCK)
    if not text:
        return None
    try:
        lock = decode_node_lock(text)
    except AnnotationError:
        return None
    moment = lock.time if lock.time.tzinfo else lock.time.replace(tzinfo=datetime.UTC)
    if view.now - moment > view.lock_timeout or lock.namespace is None or lock.name is None:
        return None
    name = str(meta(node).get("name"))
    holder_key = (lock.namespace, lock.name)
    holder = next((p for p in view.pods if key_of(p) == holder_key), None)
    who = f"{lock.namespace}/{lock.name}"
    if holder is None:
        return f"{who} is gone"
    if phase_of(holder) in TERMINAL:
        return f"{who} is {phase_of(holder)}"
    if bound_to(holder) not in (None, name):
        return f"{who} is bound to {bound_to(holder)}"
    if holder_key in view.busy:
        return None
    if bind_phase(holder) == "failed":
        # from the API alone a failed pod that has just taken a lock may be a new attempt (in another
        # replica) that has not written yet: the lock is dead once it is older than kube-scheduler's
        # bind timeout (that attempt is over), or older than the failure (``bind-time`` of failed)
        try:
            failed_at = read_bind_time(holder)
        except AnnotationError:
            failed_at = None
        if view.now - moment > view.bind_timeout:
            return f"{who} has bind-phase=failed, no bind in flight and a lock older than the bind timeout"
        if failed_at is not None and failed_at >= moment.replace(microsecond=0):
            return f"{who} has bind-phase=failed, no bind in flight, and failed after it took the lock"
    if _fully_served(holder, name):
        return f"{who} has every container served"
    return None


def _fully_served(pod: Mapping[str, Any], node: str) -> bool:
    try:
        remaining = read_pod_to_allocate(pod)
    except AnnotationError:
        return False
    return (
        bound_to(pod) == node
        and bind_phase(pod) == "success"
        and remaining is not None
        and allocation_done(remaining)
    )


def _lock_problems(view: View, node: Mapping[str, Any]) -> list[str]:
    name = str(meta(node).get("name"))
    text = (meta(node).get("annotations") or {}).get(NODE_LOCK)
    if not text:
        return []
    try:
        decode_node_lock(text)
    except AnnotationError as exc:
        return [f"[lock] node {name}: unreadable lock {text!r}: {exc}"]
    reason = dead_holder(view, node)
    if reason is not None and reason.endswith("every container served"):
        return [f"[lock] node {name}: lock {text!r} outlived its holder: {reason}"]
    return []


# ------------------------------------------------------------------------------------------- served
def _served_problems(view: View, pods: Mapping[PodKey, Mapping[str, Any]]) -> list[str]:
    problems: list[str] = []
    live = [s for s in view.served if _still_there(s, pods)]
    for s in live:
        pod = pods[(s.namespace, s.name)]
        label = f"{s.namespace}/{s.name}"
        node = read_vgpu_node(pod)
        if node != s.node:
            problems.append(f"[served-match] pod {label} admitted on {s.node} but vgpu-node is {node!r}")
        try:
            containers = allocated_containers(pod)
        except AnnotationError as exc:
            problems.append(f"[served-match] pod {label}: unreadable allocation after Allocate: {exc}")
            continue
        own = containers[s.index][1] if containers is not None and s.index < len(containers) else None
        if own is None or _grants(own) != _grants(s.grants):
            problems.append(
                f"[served-match] pod {label} container #{s.index} was served {_grants(s.grants)} "
                f"but its vgpu-devices-allocated holds {None if own is None else _grants(own)}"
            )
    for stored in view.nodes:
        name = str(meta(stored).get("name"))
        holders: dict[PodKey, list[tuple[bool, Sequence[Grant]]]] = {}
        for s in live:
            if s.node == name:
                holders.setdefault((s.namespace, s.name), []).append((s.init, s.grants))
        uses = [
            ("/".join(key), pod_cards(parts, skip_init=init_done(pods[key])))
            for key, parts in holders.items()
        ]
        cards = cards_of(stored)
        problems += _over("served", name, card_usage(uses, cards), cards)
    return problems


def _still_there(s: Served, pods: Mapping[PodKey, Mapping[str, Any]]) -> bool:
    pod = pods.get((s.namespace, s.name))
    return pod is not None and str(meta(pod).get("uid") or "") == s.uid and phase_of(pod) not in TERMINAL


def _grants(grants: Sequence[Grant]) -> list[tuple[str, int, int]]:
    return [(g.uuid, g.memory_mib, g.cores) for g in grants]


# -------------------------------------------------------------------------------------------- check
def check(view: View) -> list[str]:
    """Every violated rule, one line each (empty when all hold)."""
    pods = {key_of(p): p for p in view.pods}
    problems: list[str] = []
    for node in view.nodes:
        name = str(meta(node).get("name"))
        cards = cards_of(node)
        holders, unreadable = bound_usage(view.pods, name)
        problems += unreadable
        problems += _over("bound", name, card_usage(holders.items(), cards), cards)
        holders, unreadable = counted_usage(view, name)
        problems += unreadable
        problems += _over("counted", name, card_usage(holders.items(), cards), cards)
        problems += _lock_problems(view, node)
    problems += _served_problems(view, pods)
    return problems
