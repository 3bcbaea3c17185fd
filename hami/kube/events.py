"""Kubernetes Events (``v1``) recorded on Pods and Nodes.

Owns: building and creating one Event with an explicit unique name (``generateName`` is not honoured
by every API server, and two events must never collide). Imports ``hami.kube.client`` only.
"""

from __future__ import annotations

import datetime
import uuid
from collections.abc import Mapping
from typing import Any

from hami.kube.client import call_json, core_api


def build_event(
    *,
    involved: Mapping[str, Any],
    reason: str,
    message: str,
    type: str = "Normal",
    component: str,
    now: datetime.datetime | None = None,
) -> dict[str, Any]:
    """The Event body for ``involved`` (a raw Pod or Node dict)."""
    metadata = involved.get("metadata") or {}
    name = str(metadata.get("name") or "")
    namespace = str(metadata.get("namespace") or "default")
    stamp = (now or datetime.datetime.now(datetime.UTC)).strftime("%Y-%m-%dT%H:%M:%SZ")
    # list items carry no kind; namespaced objects here are Pods, cluster-scoped ones Nodes
    kind = str(involved.get("kind") or ("Pod" if metadata.get("namespace") else "Node"))
    reference: dict[str, Any] = {
        "apiVersion": str(involved.get("apiVersion") or "v1"),
        "kind": kind,
        "name": name,
    }
    if metadata.get("namespace"):
        reference["namespace"] = namespace
    if metadata.get("uid"):
        reference["uid"] = metadata["uid"]
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": f"{name}.{uuid.uuid4().hex[:16]}", "namespace": namespace},
        "involvedObject": reference,
        "reason": reason,
        "message": message[:1024],
        "type": type,
        "source": {"component": component},
        "reportingComponent": component,
        "firstTimestamp": stamp,
        "lastTimestamp": stamp,
        "count": 1,
    }


async def record_event(
    api: Any,
    *,
    involved: Mapping[str, Any],
    reason: str,
    message: str,
    type: str = "Normal",
    component: str,
) -> None:
    """Create one Event about ``involved``; Node events go to the ``default`` namespace."""
    body = build_event(involved=involved, reason=reason, message=message, type=type, component=component)
    await call_json(api, core_api(api).create_namespaced_event, body["metadata"]["namespace"], body)
