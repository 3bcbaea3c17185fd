"""The rules behind ``hami doctor`` for GPU pods and card usage.

Pods: a hand-off stuck in ``bind-phase=allocating`` beyond the lock timeout, failed binds, pods asking
for our resources under another ``schedulerName`` (the webhook skipped them: HAMi's most common install
problem) and unreadable ``hami.io/vgpu-devices-allocated``. Usage: cards whose collapsed usage, as the
scheduler's snapshot counts it, exceeds their memory, cores or slots.

Pure: no I/O, no clock, no logging; must not import the Kubernetes client or ``hami.kube``.
"""

from __future__ import annotations

import datetime
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from hami import objects
from hami.annotations import (
    POD_DEVICES_ALLOCATED,
    WEBHOOK_IGNORE_LABEL,
    AnnotationError,
    BindPhase,
    pod_annotations,
    read_bind_phase,
    read_bind_time,
    read_pod_devices,
    read_vgpu_node,
)
from hami.core.model import NodeState
from hami.doctor.findings import CLUSTER, DoctorSettings, Finding, Severity, finding, plural, pod_key, seconds
from hami.settings import DeviceConfig

DEFAULT_SCHEDULER = "default-scheduler"
HAND_EDITED = "do not edit hami.io annotations by hand; delete the pod so it is scheduled again"

OK, WARN, FAIL = Severity.OK, Severity.WARN, Severity.FAIL


def gpu_resources(pod: Mapping[str, Any], config: DeviceConfig) -> list[str]:
    """The managed resource names the pod's containers (init included) ask for, in limits or requests."""
    asked: set[str] = set()
    for container in objects.containers_init_first(pod):
        resources = container.get("resources")
        for which in ("limits", "requests"):
            values = resources.get(which) if isinstance(resources, Mapping) else None
            if isinstance(values, Mapping):
                asked.update(k for k in values if k in config.resources.managed)
    return sorted(asked)


def _routing(pod: Mapping[str, Any], asked: Sequence[str], settings: DoctorSettings) -> Finding | None:
    scheduler = objects.scheduler_name(pod) or DEFAULT_SCHEDULER
    if not asked or scheduler == settings.scheduler_name:
        return None
    ignored = (
        f" (labelled {WEBHOOK_IGNORE_LABEL}=ignore)" if objects.labels(pod).get(WEBHOOK_IGNORE_LABEL) else ""
    )
    message = (
        f"asks for {', '.join(asked)} but its schedulerName is {scheduler!r}, not "
        f"{settings.scheduler_name!r}{ignored}: the webhook did not route it"
    )
    action = "check the webhook findings and the namespace's hami.io/webhook label, then recreate the pod"
    return finding(FAIL, "pod", f"pod {pod_key(pod)}", message, action)


def _bind_state(pod: Mapping[str, Any], settings: DoctorSettings, now: datetime.datetime) -> Finding | None:
    subject = f"pod {pod_key(pod)}"
    where = read_vgpu_node(pod) or "no node"
    try:
        phase = read_bind_phase(pod)
        bound_at = read_bind_time(pod) if phase is BindPhase.ALLOCATING else None
    except AnnotationError as exc:
        return finding(FAIL, "pod", subject, f"unreadable bind state: {exc}", HAND_EDITED)
    timeout = settings.lock_timeout
    if bound_at is not None and now - bound_at > timeout:
        message = (
            f"bind-phase allocating for {seconds(now - bound_at)} on {where}, longer than the "
            f"{seconds(timeout)} lock timeout: the node agent never finished the hand-off"
        )
        action = (
            f"check hami-node-agent's log on {where} and the pod's events (UnexpectedAdmissionError); "
            "delete the pod so it is scheduled again"
        )
        return finding(FAIL, "pod", subject, message, action)
    if phase is BindPhase.FAILED:
        action = "kubectl describe pod: its BindingFailed or AllocationFailed event says why"
        return finding(WARN, "pod", subject, f"bind-phase failed on {where}", action)
    return None


def check_pods(
    pods: Iterable[Mapping[str, Any]], settings: DoctorSettings, *, now: datetime.datetime
) -> list[Finding]:
    """Every pod not yet Succeeded/Failed that asks for our resources or was placed by us."""
    found: list[Finding] = []
    gpu_pods = 0
    for pod in sorted(pods, key=pod_key):
        if objects.finished(pod):
            continue
        asked = gpu_resources(pod, settings.config)
        if not asked and read_vgpu_node(pod) is None:
            continue
        gpu_pods += 1
        for problem in (_routing(pod, asked, settings), _bind_state(pod, settings, now)):
            if problem is not None:
                found.append(problem)
        if POD_DEVICES_ALLOCATED in pod_annotations(pod):
            try:
                read_pod_devices(pod)
            except AnnotationError as exc:
                message = f"{exc}: the scheduler does not count this pod's cards"
                found.append(finding(FAIL, "pod", f"pod {pod_key(pod)}", message, HAND_EDITED))
    if not found:
        message = f"{plural(gpu_pods, 'GPU pod')}, none stuck allocating, failed, unrouted or unreadable"
        found.append(finding(OK, "pod", CLUSTER, message))
    return found


def check_usage(
    states: Iterable[NodeState], holders: Mapping[tuple[str, str], Sequence[str]]
) -> list[Finding]:
    """Cards granted beyond their memory, cores or slots. ``states`` carry the usage the scheduler
    counts; ``holders`` maps ``(node, card uuid)`` to the ``namespace/name`` of the pods counted there."""
    found: list[Finding] = []
    cards = 0
    for state in sorted(states, key=lambda s: s.name):
        for card in state.devices:
            cards += 1
            device = card.device
            over = [
                f"{label} {used}/{total}{unit}"
                for label, used, total, unit in (
                    ("memory", card.used_mem, device.memory_mib, " MiB"),
                    ("cores", card.used_cores, device.cores, "%"),
                    ("slots", card.used, device.count, ""),
                )
                if used > total
            ]
            if over:
                pods = ", ".join(sorted(holders.get((state.name, device.uuid), ())))
                message = f"granted beyond the card: {', '.join(over)} (pods {pods})"
                action = "a hand-edited annotation or a card that shrank: delete one of these pods"
                found.append(finding(FAIL, "usage", f"node {state.name} card {device.uuid}", message, action))
    if not found:
        message = f"no card is granted beyond its memory, cores or slots ({plural(cards, 'card')})"
        found.append(finding(OK, "usage", CLUSTER, message))
    return found
