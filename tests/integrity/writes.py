"""Rules on the scheduler's writes, judged on the objects just before a write lands (pure).

The fault proxy shows every scheduler write to :func:`problems_of_write` before applying it; the world
records the problems only if the write then lands (2xx). A write breaks a rule when it:

* marks a pod ``bind-phase=failed`` that is already bound (and not Succeeded/Failed);
* rewrites ``vgpu-devices-allocated`` or ``vgpu-node`` of a pod already bound;
* removes the node lock of a pod bound to that node and still waiting for Allocate;
* replaces a fresh node lock whose holder is alive (:func:`~.checker.dead_holder` finds no reason)
  with another pod's (a re-entrant refresh by the same pod is fine).

Pure: the codec and the checker's helpers only.
"""

from __future__ import annotations

import datetime
import json
from collections.abc import Mapping
from typing import Any

from hami.annotations import (
    POD_BIND_PHASE,
    POD_DEVICES_ALLOCATED,
    POD_VGPU_NODE,
    AnnotationError,
    decode_node_lock,
    pending_container,
    read_pod_to_allocate,
)
from hami.kube.nodelock import LOCK_POINTER

from .checker import TERMINAL, View, bind_phase, bound_to, dead_holder, key_of, meta, phase_of


def problems_of_write(view: View, kind: str, subject: str, body: bytes) -> list[str]:
    """What is wrong with the scheduler's ``kind`` write (``pod-patch``/``node-patch``) of ``subject``."""
    if kind == "pod-patch":
        pod = next((p for p in view.pods if key_of(p) == ("default", subject)), None)
        return [] if pod is None else pod_write(pod, body)
    if kind == "node-patch":
        return lock_write(view, subject, body)
    return []


def pod_write(pod: Mapping[str, Any], body: bytes) -> list[str]:
    name = str(meta(pod).get("name"))
    if not bound_to(pod):
        return []
    sets = annotations_set(body)
    current = meta(pod).get("annotations") or {}
    problems = []
    if sets.get(POD_BIND_PHASE) == "failed" and phase_of(pod) not in TERMINAL:
        problems.append(f"[write] the scheduler marked {name} failed, already bound to {bound_to(pod)}")
    rewrite = {k: sets[k] for k in (POD_DEVICES_ALLOCATED, POD_VGPU_NODE) if k in sets}
    if any(current.get(k) != v for k, v in rewrite.items()):
        problems.append(
            f"[write] the scheduler rewrote the allocation of {name}, already bound to {bound_to(pod)}: "
            f"{ {k: current.get(k) for k in rewrite} } -> {rewrite}"
        )
    return problems


def lock_write(view: View, node: str, body: bytes) -> list[str]:
    try:
        ops = json.loads(body)
    except ValueError:
        return []
    if not isinstance(ops, list):
        return []
    tested = next(
        (o.get("value") for o in ops if o.get("op") == "test" and o.get("path") == LOCK_POINTER), None
    )
    change = next(
        (o for o in ops if o.get("op") in ("remove", "replace") and o.get("path") == LOCK_POINTER), None
    )
    held = _holder(tested) if tested else None
    node_obj = next((n for n in view.nodes if meta(n).get("name") == node), None)
    if held is None or held[1] is None or change is None or node_obj is None:
        return []
    holder = next((p for p in view.pods if key_of(p) == held), None)
    if holder is None:
        return []
    who = f"{held[0]}/{held[1]}"
    if change["op"] == "remove":
        if waiting_for_allocate(holder, node):
            return [
                f"[write] the scheduler released the lock of {node} held by {who}, bound there and "
                "waiting for Allocate"
            ]
        return []
    if _holder(change.get("value")) == held:
        return []  # a re-entrant refresh
    lock = decode_node_lock(str(tested))
    moment = lock.time if lock.time.tzinfo else lock.time.replace(tzinfo=datetime.UTC)
    if view.now - moment <= view.lock_timeout and dead_holder(view, node_obj) is None:
        return [f"[write] the scheduler took over the fresh lock of {node} from live holder {who}"]
    return []


def annotations_set(body: bytes) -> dict[str, Any]:
    """The annotation values a merge patch or JSON patch of a pod sets."""
    try:
        patch = json.loads(body)
    except ValueError:
        return {}
    if isinstance(patch, dict):
        return dict((patch.get("metadata") or {}).get("annotations") or {})
    out: dict[str, Any] = {}
    prefix = "/metadata/annotations/"
    for op in patch if isinstance(patch, list) else ():
        if op.get("op") not in ("add", "replace"):
            continue
        path = str(op.get("path") or "")
        if path == "/metadata/annotations" and isinstance(op.get("value"), dict):
            out.update(op["value"])
        elif path.startswith(prefix):
            out[path[len(prefix) :].replace("~1", "/").replace("~0", "~")] = op.get("value")
    return out


def waiting_for_allocate(pod: Mapping[str, Any], node: str) -> bool:
    """Bound to ``node``, Pending, not failed, and some container's cards not handed out yet."""
    if bound_to(pod) != node or phase_of(pod) != "Pending" or bind_phase(pod) == "failed":
        return False
    try:
        remaining = read_pod_to_allocate(pod)
    except AnnotationError:
        return False
    return remaining is not None and pending_container(remaining) is not None


def _holder(value: Any) -> tuple[str | None, str | None] | None:
    try:
        lock = decode_node_lock(str(value))
    except AnnotationError:
        return None
    return lock.namespace, lock.name
