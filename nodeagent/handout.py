"""Whether a pod's grant may be handed out on this node: the checks Allocate makes before any card.

Owns the trust rules of docs/security.md ("The node agent's hand-out"): a grant is served only when the
pod names our scheduler and is bound to this node by it (``spec.schedulerName``, ``spec.nodeName`` and
``hami.io/vgpu-node``), the scheduler's record ``hami.io/vgpu-devices-allocated`` exists and lines up
with the pod's containers, every non-blank entry of ``hami.io/vgpu-devices-to-allocate`` equals the
matching record entry (same cards, type, memory and cores: the owner cannot rewrite it), each waiting
entry belongs to a container asking kubelet for exactly that many cards, and every card is one this
node registers (``all``, unknown, filtered-out cards and MIG instance UUIDs are not), named
once per container, within the card's registered memory and cores, with MIG bookings only on a MIG-mode
node. :func:`handout_problem` returns the first broken rule as a sentence naming the annotation and the
value, or None. Pure: must not import grpc, pynvml, the Kubernetes client, ``os`` or ``logging``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from hami import objects
from hami.annotations import (
    POD_DEVICES_ALLOCATED,
    POD_DEVICES_TO_ALLOCATE,
    POD_MIG_ALLOCATIONS,
    POD_VGPU_NODE,
    AnnotationError,
    pod_annotations,
    read_pod_devices,
    read_pod_mig_allocations,
    read_pod_to_allocate,
    read_vgpu_node,
)
from hami.core.model import NVIDIA, Device, DeviceMode, Grant, PodDevices
from hami.core.requests import card_count


def container_count(pod: Mapping[str, Any]) -> int:
    return len(objects.containers_init_first(pod))


def _plural(count: int, word: str) -> str:
    return f"{count} {word}" if count == 1 else f"{count} {word}s"


def _describe(grants: tuple[Grant, ...]) -> str:
    return "; ".join(f"{g.uuid} {g.type} {g.memory_mib} MiB {g.cores}% cores" for g in grants) or "nothing"


def whose_problem(pod: Mapping[str, Any], *, node: str, scheduler: str) -> str | None:
    """Whether the pod is ours to serve here: our scheduler placed it on this node and it is bound here."""
    named = objects.scheduler_name(pod) or None
    if named != scheduler:
        return (
            f"it names scheduler {named!r}, not {scheduler!r}: the node agent serves only pods {scheduler} "
            "placed"
        )
    bound = objects.node_name(pod) or None
    if bound != node:
        return f"it is bound to node {bound!r}, not {node!r}"
    granted_for = read_vgpu_node(pod)
    if granted_for != node:
        where = "no node" if granted_for is None else f"node {granted_for!r}"
        return f"its grant ({POD_VGPU_NODE}) is for {where}, not for node {node!r}"
    return None


def record_problem(pod: Mapping[str, Any]) -> str | None:
    """Whether ``to-allocate`` is what the scheduler recorded in ``allocated`` (blank entries = served)."""
    try:
        record = read_pod_devices(pod)
        remaining = read_pod_to_allocate(pod)
    except AnnotationError as exc:
        return str(exc)
    if record is None:
        return f"there is no {POD_DEVICES_ALLOCATED} (the scheduler's record of the grant)"
    if remaining is None:
        return f"there is no {POD_DEVICES_TO_ALLOCATE}"
    containers = container_count(pod)
    for key, devices in ((POD_DEVICES_ALLOCATED, record), (POD_DEVICES_TO_ALLOCATE, remaining)):
        if len(devices) != containers:
            return (
                f"{key} has entries for {_plural(len(devices), 'container')}, the pod has "
                f"{_plural(containers, 'container')}"
            )
    for index, (left, granted) in enumerate(zip(remaining, record, strict=True)):
        if left and left != granted:
            return (
                f"{POD_DEVICES_TO_ALLOCATE} entry {index} ({_describe(left)}) differs from the scheduler's "
                f"{POD_DEVICES_ALLOCATED} entry ({_describe(granted)})"
            )
    return None


def asked_count(container: Mapping[str, Any], resource: str) -> int | None:
    """The card count a container asks for (:func:`hami.core.requests.card_count`, as the scheduler
    reads it); 0 when it asks for none, None when the value is not a plain count."""
    resources = container.get("resources")
    return card_count(resource, _quantities(resources, "limits"), _quantities(resources, "requests"))


def _quantities(resources: object, which: str) -> dict[str, str]:
    """``resources.<which>`` as text (a hand-built pod may hold plain numbers; other shapes: none)."""
    values = resources.get(which) if isinstance(resources, Mapping) else None
    if not isinstance(values, Mapping):
        return {}
    return {str(key): str(value) for key, value in values.items()}


def container_problem(pod: Mapping[str, Any], devices: PodDevices, resource: str) -> str | None:
    """Whether every waiting entry belongs to a container asking kubelet for exactly that many cards:
    kubelet calls Allocate only for such containers, in this order, so any other entry would be handed
    to the wrong container."""
    containers = objects.containers_init_first(pod)
    for index, grants in enumerate(devices):
        if not grants or index >= len(containers):
            continue
        asked = asked_count(containers[index], resource)
        if asked != len(grants):
            wants = "none" if asked == 0 else "an unreadable count" if asked is None else str(asked)
            return (
                f"entry {index} gives container {containers[index].get('name')!r} {len(grants)} card(s), "
                f"but it asks kubelet for {wants} ({resource})"
            )
    return None


def card_problem(
    devices: PodDevices, *, node: str, registered: Mapping[str, Device], mode: str
) -> str | None:
    """Whether every card of ``devices`` is one this node registers, once per container, within bounds."""
    known = ", ".join(registered) or "none"
    for index, grants in enumerate(devices):
        seen: set[str] = set()
        for grant in grants:
            device = registered.get(grant.uuid)
            if device is None:
                return f"entry {index} names {grant.uuid!r}, which is not a card of node {node} ({known})"
            if grant.uuid in seen:
                return f"entry {index} names card {grant.uuid!r} twice"
            seen.add(grant.uuid)
            if grant.type != NVIDIA:
                return f"entry {index} gives card {grant.uuid!r} as type {grant.type!r}, not {NVIDIA}"
            if not 0 <= grant.memory_mib <= device.memory_mib:
                return (
                    f"entry {index} grants {grant.memory_mib} MiB of card {grant.uuid!r}, which registers "
                    f"{device.memory_mib} MiB"
                )
            if not 0 <= grant.cores <= device.cores:
                return (
                    f"entry {index} grants {grant.cores}% cores of card {grant.uuid!r}, which registers "
                    f"{device.cores}%"
                )
            if device.mode and device.mode != mode:
                return f"card {grant.uuid!r} is registered in {device.mode} mode, the node runs {mode}"
    return None


def handout_problem(
    pod: Mapping[str, Any],
    *,
    node: str,
    scheduler: str,
    registered: Mapping[str, Device],
    mode: str,
    resource: str,
) -> str | None:
    """The first rule the pod's grant breaks on this node, or None when it may be handed out."""
    problem = whose_problem(pod, node=node, scheduler=scheduler) or record_problem(pod)
    if problem is not None:
        return problem
    remaining = read_pod_to_allocate(pod) or ()  # decodable: record_problem read it
    problem = card_problem(remaining, node=node, registered=registered, mode=mode) or container_problem(
        pod, remaining, resource
    )
    if problem is not None:
        return f"{POD_DEVICES_TO_ALLOCATE} {problem}"
    if mode != DeviceMode.MIG.value and POD_MIG_ALLOCATIONS in pod_annotations(pod):
        try:
            booked = read_pod_mig_allocations(pod)
        except AnnotationError as exc:
            return str(exc)
        if booked:
            return f"it carries MIG bookings ({POD_MIG_ALLOCATIONS}) but node {node} runs {mode}"
    return None
