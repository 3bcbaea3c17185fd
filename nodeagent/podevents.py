"""Events the node agent records on pods: ``AllocationFailed`` and ``AllocationAmbiguous`` (Warning) and
``AllocationSucceeded``.

Owns the texts (what failed, and what a person can do about it) and the fire-and-forget writing: an
Event must never delay or fail an ``Allocate`` answer, so each one is a tracked background task whose
errors are logged and dropped; at most ``limit`` are in flight (more are dropped with a log line, so a
broken API server cannot pile them up); :meth:`PodEvents.drain` waits for them on shutdown and in
tests. Events go through ``hami.kube.events.record_event`` with component ``hami-node-agent``.
Imports ``hami.kube`` and the codec; must not import grpc or pynvml.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

from hami import objects
from hami.annotations import POD_BIND_PHASE, AnnotationError, read_pod_devices
from hami.core.model import Grant
from hami.kube.client import KubeError
from hami.kube.events import record_event
from hami.kube.protocol import KubeApi
from hami.process.tasks import TaskSet
from nodeagent.allocate_rules import HandoutRefused, container_names

log = logging.getLogger(__name__)

COMPONENT = "hami-node-agent"
FAILED = "AllocationFailed"
SUCCEEDED = "AllocationSucceeded"
#: kubelet's call could be for this pod or another with different cards: nothing was handed out
AMBIGUOUS = "AllocationAmbiguous"


def failure_message(node: str, cause: BaseException, *, recorded: bool = True) -> str:
    """What failed, what the agent did about it, and what a person should do next. ``recorded``: the pod
    waited for our grant here, so it was marked failed and its node lock released."""
    if isinstance(cause, HandoutRefused):
        advice = (
            "The node agent hands out only what the HAMi scheduler granted this pod on this node's cards: "
            "GPU pods must be placed by the HAMi scheduler (the webhook sets it) and their hami.io "
            "annotations must not be changed after scheduling: do not edit them by hand"
        )
    elif isinstance(cause, KubeError):
        advice = (
            "The node agent could not read or write the pod or node: check that hami-node-agent on this node "
            "reaches the API server and keeps its permissions (pods get/list/patch, nodes get/patch)"
        )
    elif isinstance(cause, AnnotationError):
        advice = "The pod's hami.io annotations were changed after scheduling: do not edit them by hand"
    elif isinstance(cause, OSError):
        advice = (
            "The node agent could not prepare HAMi-core's files under --hook-path: check that host "
            "directory and its free space"
        )
    else:
        advice = f"If it happens again, read the hami-node-agent log on node {node}"
    done = (
        f"The pod is marked {POD_BIND_PHASE}=failed, its node lock is released and kubelet rejects it"
        if recorded
        else "Kubelet rejects the pod"
    )
    return (
        f"GPU allocation on node {node} failed: {cause}. {done} (UnexpectedAdmissionError). {advice}; "
        "then delete the pod so it is scheduled again (a Deployment, Job or StatefulSet recreates it)."
    )


def _grant(grant: Grant) -> str:
    return f"{grant.uuid} ({grant.memory_mib} MiB, {grant.cores}% cores)"


def success_message(node: str, pod: Mapping[str, Any], served: Sequence[tuple[str, Sequence[str]]]) -> str:
    """Every container's cards (from ``hami.io/vgpu-devices-allocated``; ``served`` if unreadable)."""
    try:
        devices = read_pod_devices(pod) or ()
    except AnnotationError:
        devices = ()
    names = container_names(pod)
    parts = [
        f"{names[index] if index < len(names) else f'#{index}'}: {', '.join(_grant(g) for g in grants)}"
        for index, grants in enumerate(devices)
        if grants
    ]
    if not parts:
        parts = [f"{container}: {', '.join(uuids)}" for container, uuids in served]
    return f"GPUs allocated on node {node}: " + "; ".join(parts)


class PodEvents:
    """Writes Events in the background (the shared :class:`~hami.process.tasks.TaskSet`); nothing here
    ever raises into the caller."""

    def __init__(self, api: KubeApi, *, component: str = COMPONENT, limit: int = 32) -> None:
        self._api = api
        self._component = component
        # ValueError: an unreadable answer
        self._tasks = TaskSet(concurrency=limit, limit=limit, expected=(KubeError, ValueError), logger=log)

    def record(self, pod: Mapping[str, Any], reason: str, message: str, *, warning: bool = False) -> None:
        name = objects.name(pod)
        event = record_event(
            self._api,
            involved=pod,
            reason=reason,
            message=message,
            type="Warning" if warning else "Normal",
            component=self._component,
        )
        self._tasks.spawn(event, f"record the {reason} event of pod {name}")

    async def drain(self, seconds: float = 5.0) -> None:
        """Wait for the Events being written (at most ``seconds``), then cancel what is left."""
        await self._tasks.drain(seconds)

    def __len__(self) -> int:
        return len(self._tasks)
