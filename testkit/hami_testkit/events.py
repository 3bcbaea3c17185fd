"""SIMULATION ONLY: the pod Events the kube-scheduler stand-in writes, as kube-scheduler's recorder does.

Owns :func:`pod_event`: one core/v1 Event about a pod (``involvedObject``), with kube-scheduler's
fields (``source.component`` and ``reportingComponent`` = the scheduler's name, ``count: 1``, first and
last timestamps), and for a preemption the ``action`` and the ``related`` object (the preemptor). A
failed write is dropped, as the recorder drops it. Must not import ``hami.scheduler``, ``webhook``,
``nodeagent`` or the Kubernetes client.
"""

from __future__ import annotations

import contextlib
import datetime
import uuid
from collections.abc import Mapping
from typing import Any

from hami import objects
from hami_testkit.kubeapi import ApiError, SimApi


def reference(pod: Mapping[str, Any]) -> dict[str, str]:
    """A pod's ObjectReference (an Event's ``involvedObject`` or ``related``)."""
    return {
        "kind": "Pod",
        "apiVersion": "v1",
        "namespace": objects.namespace(pod),
        "name": objects.name(pod),
        "uid": objects.uid(pod),
    }


async def pod_event(
    api: SimApi,
    pod: Mapping[str, Any],
    kind: str,
    reason: str,
    message: str,
    *,
    component: str,
    action: str = "",
    related: Mapping[str, Any] | None = None,
) -> None:
    """Write one Event about ``pod`` (``kind`` Normal or Warning)."""
    namespace, name = objects.namespace(pod), objects.name(pod)
    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    event: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": f"{name}.{uuid.uuid4().hex[:16]}", "namespace": namespace},
        "involvedObject": reference(pod),
        "reason": reason,
        "message": message,
        "type": kind,
        "source": {"component": component},
        "reportingComponent": component,
        "firstTimestamp": now,
        "lastTimestamp": now,
        "count": 1,
    }
    if action:
        event["action"] = action
    if related is not None:
        event["related"] = reference(related)
    with contextlib.suppress(ApiError):
        await api.create(f"/api/v1/namespaces/{namespace}/events", event)
