"""SIMULATION ONLY: the ``kubectl get`` columns of Deployments, ReplicaSets and Jobs (kube-apiserver's
printers), which :mod:`hami_testkit.tables` serves in its Tables.

Owns :data:`COLUMNS` (name, type, format, priority; priority 1 shows with ``-o wide``) and :data:`CELLS`
(one row's cells from the object, the time now and the Table's age formatter): Deployments NAME READY
UP-TO-DATE AVAILABLE AGE (wide: CONTAINERS IMAGES SELECTOR), ReplicaSets NAME DESIRED CURRENT READY AGE
(wide: the same three), Jobs NAME STATUS COMPLETIONS DURATION AGE (wide: CONTAINERS IMAGES SELECTOR).
Pure: stdlib only. Must not import ``hami_testkit.tables`` (it imports this).
"""

from __future__ import annotations

import datetime
from collections.abc import Callable, Mapping
from typing import Any

from hami import objects

Since = Callable[[Any, datetime.datetime], str]
_WIDE = [("Containers", "string", "", 1), ("Images", "string", "", 1), ("Selector", "string", "", 1)]
COLUMNS: dict[str, list[tuple[str, str, str, int]]] = {
    "deployments": [
        ("Name", "string", "name", 0),
        ("Ready", "string", "", 0),
        ("Up-to-date", "integer", "", 0),
        ("Available", "integer", "", 0),
        ("Age", "string", "", 0),
        *_WIDE,
    ],
    "replicasets": [
        ("Name", "string", "name", 0),
        ("Desired", "integer", "", 0),
        ("Current", "integer", "", 0),
        ("Ready", "integer", "", 0),
        ("Age", "string", "", 0),
        *_WIDE,
    ],
    "jobs": [
        ("Name", "string", "name", 0),
        ("Status", "string", "", 0),
        ("Completions", "string", "", 0),
        ("Duration", "string", "", 0),
        ("Age", "string", "", 0),
        *_WIDE,
    ],
}


def _count(value: object) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def _wide(obj: Mapping[str, Any]) -> list[str]:
    template = objects.spec(obj).get("template") or {}
    containers = objects.containers(template)
    selector = objects.spec(obj).get("selector") or {}
    labels = selector.get("matchLabels") if isinstance(selector, Mapping) else None
    shown = ",".join(f"{k}={v}" for k, v in sorted((labels or {}).items())) or "<none>"
    return [
        ",".join(str(c.get("name") or "") for c in containers),
        ",".join(str(c.get("image") or "") for c in containers),
        shown,
    ]


def _replicas(obj: Mapping[str, Any]) -> int:
    wanted = objects.spec(obj).get("replicas")
    return wanted if isinstance(wanted, int) and not isinstance(wanted, bool) else 1


def _deployment(obj: Mapping[str, Any], now: datetime.datetime, since: Since) -> list[Any]:
    status = objects.status(obj)
    return [
        objects.name(obj),
        f"{_count(status.get('readyReplicas'))}/{_replicas(obj)}",
        _count(status.get("updatedReplicas")),
        _count(status.get("availableReplicas")),
        since(objects.meta(obj).get("creationTimestamp"), now),
        *_wide(obj),
    ]


def _replicaset(obj: Mapping[str, Any], now: datetime.datetime, since: Since) -> list[Any]:
    status = objects.status(obj)
    return [
        objects.name(obj),
        _replicas(obj),
        _count(status.get("replicas")),
        _count(status.get("readyReplicas")),
        since(objects.meta(obj).get("creationTimestamp"), now),
        *_wide(obj),
    ]


def _job(obj: Mapping[str, Any], now: datetime.datetime, since: Since) -> list[Any]:
    status = objects.status(obj)
    spec = objects.spec(obj)
    true = {
        str(c.get("type"))
        for c in status.get("conditions") or []
        if isinstance(c, Mapping) and c.get("status") == "True"
    }
    shown = "Complete" if "Complete" in true else "Failed" if "Failed" in true else "Running"
    if spec.get("suspend") is True and shown == "Running":
        shown = "Suspended"
    completions = spec.get("completions")
    total = completions if isinstance(completions, int) and not isinstance(completions, bool) else 1
    started, finished = status.get("startTime"), status.get("completionTime")
    duration = ""
    if isinstance(started, str) and started:
        try:
            end = (
                datetime.datetime.fromisoformat(finished.replace("Z", "+00:00"))
                if isinstance(finished, str) and finished
                else now
            )
        except ValueError:
            end = now
        duration = since(started, end)
    return [
        objects.name(obj),
        shown,
        f"{_count(status.get('succeeded'))}/{total}",
        duration,
        since(objects.meta(obj).get("creationTimestamp"), now),
        *_wide(obj),
    ]


CELLS: dict[str, Callable[[Mapping[str, Any], datetime.datetime, Since], list[Any]]] = {
    "deployments": _deployment,
    "replicasets": _replicaset,
    "jobs": _job,
}
