"""Server-side printing: the ``meta.k8s.io/v1`` Table kube-apiserver answers to ``kubectl get``.

Owns :func:`as_table` (``Accept: application/json;as=Table;v=v1;g=meta.k8s.io``) with the columns
kube-apiserver's printers define for pods (NAME READY STATUS RESTARTS AGE, wide: IP NODE NOMINATED NODE
READINESS GATES), nodes (NAME STATUS ROLES AGE VERSION, wide: INTERNAL-IP EXTERNAL-IP OS-IMAGE
KERNEL-VERSION CONTAINER-RUNTIME) and core Events (LAST SEEN TYPE REASON OBJECT MESSAGE, wide: SUBOBJECT
SOURCE FIRST SEEN COUNT NAME), namespaces (NAME STATUS AGE), Deployments, ReplicaSets and Jobs
(:mod:`hami_testkit.workload_tables`), and its default (NAME, CREATED AT) for every
other resource;
:func:`human_duration` is Kubernetes' age format (``45s``, ``3m20s``, ``5h``, ``2d3h``). Rows carry the
object as ``includeObject`` asks (``None``, ``Metadata``: a PartialObjectMetadata, the default; ``Object``).
Simulation only; pure: stdlib only (``now`` is passed in).
"""

from __future__ import annotations

import datetime
from collections.abc import Iterable, Mapping
from typing import Any

from hami import objects
from hami_testkit import workload_tables

JsonDict = dict[str, Any]
NONE = "<none>"

#: (name, type, format, priority) per resource plural; priority 1 columns show with ``-o wide``.
_COLUMNS: dict[str, list[tuple[str, str, str, int]]] = {
    "pods": [
        ("Name", "string", "name", 0),
        ("Ready", "string", "", 0),
        ("Status", "string", "", 0),
        ("Restarts", "string", "", 0),
        ("Age", "string", "", 0),
        ("IP", "string", "", 1),
        ("Node", "string", "", 1),
        ("Nominated Node", "string", "", 1),
        ("Readiness Gates", "string", "", 1),
    ],
    "nodes": [
        ("Name", "string", "name", 0),
        ("Status", "string", "", 0),
        ("Roles", "string", "", 0),
        ("Age", "string", "", 0),
        ("Version", "string", "", 0),
        ("Internal-IP", "string", "", 1),
        ("External-IP", "string", "", 1),
        ("OS-Image", "string", "", 1),
        ("Kernel-Version", "string", "", 1),
        ("Container-Runtime", "string", "", 1),
    ],
    "events": [
        ("Last Seen", "string", "", 0),
        ("Type", "string", "", 0),
        ("Reason", "string", "", 0),
        ("Object", "string", "", 0),
        ("Subobject", "string", "", 1),
        ("Source", "string", "", 1),
        ("Message", "string", "", 0),
        ("First Seen", "string", "", 1),
        ("Count", "integer", "", 1),
        ("Name", "string", "name", 1),
    ],
    "namespaces": [("Name", "string", "name", 0), ("Status", "string", "", 0), ("Age", "string", "", 0)],
    **workload_tables.COLUMNS,  # deployments, replicasets, jobs
}
_DEFAULT = [("Name", "string", "name", 0), ("Created At", "date", "", 0)]


def human_duration(seconds: float) -> str:
    """Kubernetes' ``HumanDuration`` (what the AGE and LAST SEEN columns show)."""
    if seconds < -1:
        return "<invalid>"
    s = max(int(seconds), 0)
    minutes, hours = s // 60, s // 3600
    if s < 120:
        return f"{s}s"
    if minutes < 10:
        return f"{minutes}m" if s % 60 == 0 else f"{minutes}m{s % 60}s"
    if minutes < 180:
        return f"{minutes}m"
    if hours < 8:
        return f"{hours}h" if minutes % 60 == 0 else f"{hours}h{minutes % 60}m"
    if hours < 48:
        return f"{hours}h"
    days = hours // 24
    if hours < 24 * 8:
        return f"{days}d" if hours % 24 == 0 else f"{days}d{hours % 24}h"
    if hours < 24 * 365 * 2:
        return f"{days}d"
    years = days // 365
    if hours < 24 * 365 * 8:
        return f"{years}y" if days % 365 == 0 else f"{years}y{days % 365}d"
    return f"{years}y"


def _since(stamp: Any, now: datetime.datetime) -> str:
    if not stamp:
        return "<unknown>"
    try:
        then = datetime.datetime.fromisoformat(str(stamp).replace("Z", "+00:00"))
    except ValueError:
        return "<unknown>"
    if then.tzinfo is None:
        then = then.replace(tzinfo=datetime.UTC)
    return human_duration((now - then).total_seconds())


def _pod_cells(pod: Mapping[str, Any], now: datetime.datetime) -> list[Any]:
    meta, spec, status = objects.meta(pod), objects.spec(pod), objects.status(pod)
    containers = spec.get("containers") or []
    reason = status.get("reason") or status.get("phase") or ""
    ready = restarts = 0
    inits = status.get("initContainerStatuses") or []
    initializing = False
    for index, init in enumerate(inits):
        state = init.get("state") or {}
        restarts += int(init.get("restartCount") or 0)
        terminated, waiting = state.get("terminated"), state.get("waiting")
        if terminated and int(terminated.get("exitCode") or 0) == 0:
            continue
        initializing = True
        if terminated:
            reason = f"Init:{terminated.get('reason') or 'ExitCode:' + str(terminated.get('exitCode'))}"
        elif waiting and waiting.get("reason") and waiting.get("reason") != "PodInitializing":
            reason = f"Init:{waiting['reason']}"
        else:
            reason = f"Init:{index}/{len(spec.get('initContainers') or inits)}"
        break
    if not initializing:
        for container in reversed(status.get("containerStatuses") or []):
            restarts += int(container.get("restartCount") or 0)
            state = container.get("state") or {}
            if (state.get("waiting") or {}).get("reason"):
                reason = state["waiting"]["reason"]
            elif terminated := state.get("terminated"):
                reason = terminated.get("reason") or f"ExitCode:{terminated.get('exitCode')}"
            elif container.get("ready") and "running" in state:
                ready += 1
    if meta.get("deletionTimestamp"):
        reason = "Unknown" if status.get("reason") == "NodeLost" else "Terminating"
    gates = spec.get("readinessGates") or []
    return [
        meta.get("name", ""),
        f"{ready}/{len(containers)}",
        reason,
        str(restarts),
        _since(meta.get("creationTimestamp"), now),
        status.get("podIP") or NONE,
        spec.get("nodeName") or NONE,
        status.get("nominatedNodeName") or NONE,
        f"0/{len(gates)}" if gates else NONE,
    ]


def _node_cells(node: Mapping[str, Any], now: datetime.datetime) -> list[Any]:
    meta, spec, status = objects.meta(node), objects.spec(node), objects.status(node)
    ready = next((c for c in status.get("conditions") or [] if c.get("type") == "Ready"), None)
    state = {"True": "Ready", "False": "NotReady"}.get(str((ready or {}).get("status")), "Unknown")
    if spec.get("unschedulable"):
        state += ",SchedulingDisabled"
    labels = meta.get("labels") or {}
    roles = sorted(
        {k.split("/", 1)[1] for k in labels if k.startswith("node-role.kubernetes.io/") and "/" in k}
        | ({labels["kubernetes.io/role"]} if labels.get("kubernetes.io/role") else set())
    )
    addresses = status.get("addresses") or []
    info = status.get("nodeInfo") or {}

    def address(kind: str) -> str:
        return next((a.get("address") for a in addresses if a.get("type") == kind), None) or NONE

    return [
        meta.get("name", ""),
        state,
        ",".join(r for r in roles if r) or NONE,
        _since(meta.get("creationTimestamp"), now),
        info.get("kubeletVersion") or "",
        address("InternalIP"),
        address("ExternalIP"),
        info.get("osImage") or "<unknown>",
        info.get("kernelVersion") or "<unknown>",
        info.get("containerRuntimeVersion") or "<unknown>",
    ]


def _event_cells(event: Mapping[str, Any], now: datetime.datetime) -> list[Any]:
    meta, involved = objects.meta(event), event.get("involvedObject") or {}
    source = event.get("source") or {}
    component = source.get("component") or event.get("reportingComponent") or ""
    host = source.get("host") or event.get("reportingInstance") or ""
    first = event.get("firstTimestamp") or event.get("eventTime") or meta.get("creationTimestamp")
    last = event.get("lastTimestamp") or event.get("eventTime") or first
    return [
        _since(last, now),
        event.get("type") or "",
        event.get("reason") or "",
        f"{str(involved.get('kind') or '').lower()}/{involved.get('name') or ''}",
        involved.get("fieldPath") or "",
        f"{component}, {host}" if host else component,
        str(event.get("message") or "").strip(),
        _since(first, now),
        int(event.get("count") or 1),
        meta.get("name", ""),
    ]


def _cells(plural: str, obj: Mapping[str, Any], now: datetime.datetime) -> list[Any]:
    if plural == "pods":
        return _pod_cells(obj, now)
    if plural == "nodes":
        return _node_cells(obj, now)
    if plural == "events":
        return _event_cells(obj, now)
    if plural in workload_tables.CELLS:
        return workload_tables.CELLS[plural](obj, now, _since)
    meta = objects.meta(obj)
    if plural == "namespaces":
        phase = objects.status(obj).get("phase") or "Active"
        return [meta.get("name", ""), phase, _since(meta.get("creationTimestamp"), now)]
    return [meta.get("name", ""), meta.get("creationTimestamp") or None]


def _row_object(obj: Mapping[str, Any], include: str) -> JsonDict | None:
    if include == "None":
        return None
    if include == "Object":
        return dict(obj)
    return {
        "kind": "PartialObjectMetadata",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": objects.meta(obj),
    }


def as_table(
    plural: str,
    objects: Iterable[Mapping[str, Any]],
    now: datetime.datetime,
    *,
    include_object: str = "Metadata",
    resource_version: str = "",
    columns: bool = True,
) -> JsonDict:
    """The Table for ``objects`` of one resource (``columns=False``: rows only, for later watch events)."""
    definitions = _COLUMNS.get(plural, _DEFAULT)
    rows = []
    for obj in objects:
        row: JsonDict = {"cells": _cells(plural, obj, now)}
        embedded = _row_object(obj, include_object)
        if embedded is not None:
            row["object"] = embedded
        rows.append(row)
    table: JsonDict = {
        "kind": "Table",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": {"resourceVersion": resource_version},
        "columnDefinitions": [
            {"name": name, "type": kind, "format": fmt, "description": name, "priority": priority}
            for name, kind, fmt, priority in definitions
        ]
        if columns
        else [],
        "rows": rows,
    }
    return table


def wants_table(accept: str) -> bool:
    """Does an ``Accept`` header ask for a meta.k8s.io/v1 Table (kubectl get does)?"""
    for part in accept.split(","):
        params = {
            p.split("=", 1)[0].strip(): p.split("=", 1)[1].strip() for p in part.split(";")[1:] if "=" in p
        }
        if params.get("as") == "Table" and params.get("g") == "meta.k8s.io" and params.get("v") == "v1":
            return True
    return False
