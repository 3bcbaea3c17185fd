"""SIMULATION ONLY: the pure rules of the workload stand-in (kube-controller-manager's Deployment,
ReplicaSet and Job controllers, as far as a demo user needs them).

Owns what those controllers compute from objects already read: which pods count (active, ready,
available), the pod a template makes (labels, ``generateName``, the controller ``ownerReference``), the
``pod-template-hash`` of a Deployment's template, which pods a scale-down removes first, a rolling
update's next replica counts (kube's ``maxSurge``/``maxUnavailable`` arithmetic), and the ``status``
each kind shows in ``kubectl get``. No I/O: :mod:`hami_testkit.workloads_standin` reads and writes.
Must not import ``hami.kube``, ``aiohttp``, ``webhook`` or ``nodeagent``.
"""

from __future__ import annotations

import copy
import hashlib
import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from hami import objects

JsonDict = dict[str, Any]

HASH_LABEL = "pod-template-hash"
REVISION = "deployment.kubernetes.io/revision"
#: kube's rand.SafeEncodeString alphabet (no vowels, no look-alikes)
_SAFE = "bcdfghjklmnpqrstvwxz2456789"


def owner_reference(owner: Mapping[str, Any]) -> JsonDict:
    """The controller ``ownerReference`` a controller puts on what it creates."""
    return {
        "apiVersion": str(owner.get("apiVersion") or ""),
        "kind": str(owner.get("kind") or ""),
        "name": objects.name(owner),
        "uid": objects.uid(owner),
        "controller": True,
        "blockOwnerDeletion": True,
    }


def controller_uid(obj: Mapping[str, Any]) -> str:
    """The uid of the object's controller (its ``ownerReference`` with ``controller: true``), or ""."""
    for ref in objects.meta(obj).get("ownerReferences") or []:
        if isinstance(ref, Mapping) and ref.get("controller") is True:
            return str(ref.get("uid") or "")
    return ""


def owned_by(owner: Mapping[str, Any], candidates: Iterable[JsonDict]) -> list[JsonDict]:
    uid = objects.uid(owner)
    return [c for c in candidates if uid and controller_uid(c) == uid]


def deleting(obj: Mapping[str, Any]) -> bool:
    return bool(objects.meta(obj).get("deletionTimestamp"))


def terminal(pod: Mapping[str, Any]) -> bool:
    return objects.finished(pod)


def active(pod: Mapping[str, Any]) -> bool:
    """A pod a controller counts: not finished, not being deleted (kube's IsPodActive)."""
    return not terminal(pod) and not deleting(pod)


def ready(pod: Mapping[str, Any]) -> bool:
    """Running with the Ready condition True (minReadySeconds 0: ready is available)."""
    return objects.pod_phase(pod) == "Running" and any(
        isinstance(c, Mapping) and c.get("type") == "Ready" and c.get("status") == "True"
        for c in objects.status(pod).get("conditions") or []
    )


def whole(value: object, default: int) -> int:
    """A count field (replicas, parallelism, ...): a non-negative int, else ``default``."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else default


def pod_from_template(
    owner: Mapping[str, Any], template: Mapping[str, Any], labels: Mapping[str, str]
) -> JsonDict:
    """The pod ``owner`` creates from ``template`` (``generateName`` ``<owner>-``, the template's labels
    plus ``labels``, the controller reference); created through the apiserver like any pod, so
    admission (defaults, priority, the mutating webhooks) runs on it."""
    found_meta, found_spec = template.get("metadata"), template.get("spec")
    meta: Mapping[str, Any] = found_meta if isinstance(found_meta, Mapping) else {}
    spec: Mapping[str, Any] = found_spec if isinstance(found_spec, Mapping) else {}
    pod_meta: JsonDict = {
        "generateName": f"{objects.name(owner)}-",
        "namespace": objects.namespace(owner) or "default",
        "labels": {**objects.labels({"metadata": meta}), **labels},
        "ownerReferences": [owner_reference(owner)],
    }
    notes = objects.annotations({"metadata": meta})
    if notes:
        pod_meta["annotations"] = dict(notes)
    return {"apiVersion": "v1", "kind": "Pod", "metadata": pod_meta, "spec": copy.deepcopy(dict(spec))}


def template_hash(template: Mapping[str, Any], collisions: int = 0) -> str:
    """A stable ``pod-template-hash`` of a template (kube hashes its Go struct with FNV; this hashes the
    canonical JSON, so the value differs from kube's but is stable across runs)."""
    text = json.dumps(without_hash(template), sort_keys=True, separators=(",", ":")) + f"/{collisions}"
    number = int.from_bytes(hashlib.sha256(text.encode()).digest()[:4], "big")
    return "".join(_SAFE[ord(ch) % len(_SAFE)] for ch in str(number))


def without_hash(template: Mapping[str, Any]) -> JsonDict:
    """The template with the ``pod-template-hash`` label removed (kube's EqualIgnoreHash)."""
    result: JsonDict = copy.deepcopy(dict(template))
    labels = (result.get("metadata") or {}).get("labels")
    if isinstance(labels, dict):
        labels.pop(HASH_LABEL, None)
        if not labels:
            result["metadata"].pop("labels")
    if isinstance(result.get("metadata"), dict) and not result["metadata"]:
        result.pop("metadata")
    return result


def scale_down_order(pods: Sequence[JsonDict]) -> list[JsonDict]:
    """Which pods a scale-down deletes first (kube's ActivePods order, simplified): unscheduled before
    scheduled, Pending before Running, not ready before ready, then the newest first."""

    def key(pod: JsonDict) -> tuple[int, int, int, str]:
        phase_rank = {"Pending": 0, "Unknown": 1, "Running": 2}.get(objects.pod_phase(pod) or "Pending", 1)
        created = str(objects.meta(pod).get("creationTimestamp") or "")
        newest_first = "".join(chr(0x10FFFF - ord(c)) for c in created)
        return (1 if objects.node_name(pod) else 0, phase_rank, 1 if ready(pod) else 0, newest_first)

    return sorted(pods, key=key)


# ------------------------------------------------------------------------------ deployments


def surge_and_unavailable(deployment: Mapping[str, Any], replicas: int) -> tuple[int, int]:
    """``maxSurge`` (rounded up) and ``maxUnavailable`` (rounded down) resolved against ``replicas``;
    both default to 25 %; both 0 means one may be unavailable (kube's ResolveFenceposts)."""
    rolling = ((objects.spec(deployment).get("strategy") or {}).get("rollingUpdate")) or {}

    def resolve(value: object, round_up: bool) -> int:
        if isinstance(value, int) and not isinstance(value, bool):
            return max(value, 0)
        text = str(value if value is not None else "25%").strip()
        if text.endswith("%") and text[:-1].isdigit():
            share = int(text[:-1]) * replicas / 100
            return math.ceil(share) if round_up else math.floor(share)
        return int(text) if text.isdigit() else (math.ceil if round_up else math.floor)(replicas / 4)

    surge = resolve(rolling.get("maxSurge") if isinstance(rolling, Mapping) else None, True)
    unavailable = resolve(rolling.get("maxUnavailable") if isinstance(rolling, Mapping) else None, False)
    if surge == 0 and unavailable == 0:
        unavailable = 1
    return surge, unavailable


@dataclass(frozen=True, slots=True)
class Counted:
    """One ReplicaSet of a Deployment: its desired replicas and its pods' counts."""

    name: str
    spec: int
    pods: int  # active pods
    available: int


def rolling_step(
    replicas: int, surge: int, unavailable: int, new: Counted, old: Sequence[Counted]
) -> dict[str, int]:
    """The ReplicaSet sizes one rolling-update step sets (name -> replicas; empty when nothing moves):
    scale the new set up within ``replicas + surge`` pods in all; else scale old sets down, first
    their unavailable pods, then available ones, keeping ``replicas - unavailable`` available
    (kube's reconcileNewReplicaSet / reconcileOldReplicaSets, old sets oldest first)."""
    if not any(o.spec for o in old):
        return {new.name: replicas} if new.spec != replicas else {}
    if new.spec > replicas:
        return {new.name: replicas}
    total = new.spec + sum(o.spec for o in old)
    room = replicas + surge - total
    if room > 0 and new.spec < replicas:
        return {new.name: min(replicas, new.spec + room)}
    min_available = replicas - unavailable
    budget = total - min_available - max(new.spec - new.available, 0)
    changes: dict[str, int] = {}
    sizes = {o.name: o.spec for o in old}
    for o in old:  # the unhealthy first: they hold no availability
        if budget <= 0:
            break
        down = min(budget, max(sizes[o.name] - o.available, 0))
        if down:
            sizes[o.name] -= down
            budget -= down
            changes[o.name] = sizes[o.name]
    available = new.available + sum(min(o.available, sizes[o.name]) for o in old)
    excess = available - min_available
    for o in old:
        if excess <= 0:
            break
        down = min(sizes[o.name], excess)
        if down:
            sizes[o.name] -= down
            excess -= down
            changes[o.name] = sizes[o.name]
    return changes


def condition(
    kind: str, state: bool, reason: str, message: str, previous: Sequence[Any], now: str
) -> JsonDict:
    """A status condition; its times stay those of the previous one while its status does not change."""
    value = "True" if state else "False"
    old = next((c for c in previous if isinstance(c, Mapping) and c.get("type") == kind), None)
    since = (
        str(old.get("lastTransitionTime") or now) if old is not None and old.get("status") == value else now
    )
    return {
        "type": kind,
        "status": value,
        "reason": reason,
        "message": message,
        "lastTransitionTime": since,
        "lastUpdateTime": since,
    }


def same_status(current: Mapping[str, Any], wanted: Mapping[str, Any]) -> bool:
    """True when writing ``wanted`` would change nothing but timestamps."""

    def strip(value: Any) -> Any:
        if isinstance(value, Mapping):
            return {k: strip(v) for k, v in value.items() if not str(k).endswith(("Time", "Timestamp"))}
        if isinstance(value, list):
            return [strip(v) for v in value]
        return value

    return all(strip(current.get(k)) == strip(v) for k, v in wanted.items())
