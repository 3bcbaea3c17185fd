"""What the API server's stored objects say about over-commit and lost pods, after a fault.

Owns :func:`audit` -> :class:`Audit`, the verdict the fault benchmark (``benchmarks/bench_faults.py``)
and the scale-fault tests (``tests/integrity/test_scale_faults.py``) take over the stored Nodes, Pods and
ResourceQuotas at the end of a run (docs/scale.md, "Scale faults"):

* **over-committed cards**: per registered card (``hami.io/node-nvidia-register``, decoded by the codec),
  the pods holding grants on it by their ``hami.io/vgpu-devices-allocated``: memory above the card's,
  cores above the card's, or more grants than its split count. A pod holds its grants when it is bound
  (``spec.nodeName``) or its bind is in flight (``hami.io/vgpu-node`` set, not bound), is not
  Succeeded/Failed and not ``hami.io/bind-phase=failed``. Every container's grants count (app
  containers add up; these runs have no init containers, so no collapse is made: a run with init
  containers would be over-counted, never under-counted). A grant naming a card the node did not
  register counts as an over-commit too.
* **over-committed quotas**: per namespace, the sum of those grants' memory and cores against the
  tightest ``limits.nvidia.com/gpumem`` / ``limits.nvidia.com/gpucores`` of its ResourceQuotas.
* **accounting** of the pods the run created (``expected``): Running; bound and waiting for kubelet;
  Pending with a reason (a ``PodScheduled`` condition ``False`` with a message: kube-scheduler said why);
  and **lost**: absent, Failed, Succeeded, or Pending with no reason.

Pure (the codec and plain dicts); the sums are written here, independently of ``hami.core.usage``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from hami.annotations import (
    NODE_REGISTER,
    POD_BIND_PHASE,
    AnnotationError,
    decode_node_devices,
    read_pod_devices,
    read_vgpu_node,
)
from hami.core.model import Device
from hami.core.quantity import parse_quantity

MEMORY_LIMIT = "limits.nvidia.com/gpumem"
CORES_LIMIT = "limits.nvidia.com/gpucores"
TERMINAL = ("Succeeded", "Failed")


@dataclass(slots=True)
class Audit:
    """The verdict; each problem is one line naming the card, quota or pod."""

    cards: list[str] = field(default_factory=list)  # over-committed cards
    quotas: list[str] = field(default_factory=list)  # over-committed quotas
    lost: list[str] = field(default_factory=list)  # pods created and neither Running nor pending
    running: int = 0
    bound_waiting: int = 0  # bound (or bind in flight), not Running yet
    pending_with_reason: int = 0
    #: the reason each of those pods is Pending (kube-scheduler's message) -> how many
    pending_reasons: dict[str, int] = field(default_factory=dict)
    #: per namespace with a quota: (memory used, memory limit, cores used, cores limit)
    quota_use: dict[str, tuple[int, int | None, int, int | None]] = field(default_factory=dict)

    @property
    def problems(self) -> list[str]:
        return self.cards + self.quotas + self.lost


def _meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    meta = obj.get("metadata")
    return meta if isinstance(meta, Mapping) else {}


def _annotations(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    value = _meta(obj).get("annotations")
    return value if isinstance(value, Mapping) else {}


def _phase(pod: Mapping[str, Any]) -> str:
    return str((pod.get("status") or {}).get("phase") or "Pending")


def _label(pod: Mapping[str, Any]) -> str:
    return f"{_meta(pod).get('namespace')}/{_meta(pod).get('name')}"


def _holding(pod: Mapping[str, Any]) -> str | None:
    """The node ``pod``'s grants are held on (bound, or a bind in flight), or None."""
    if _phase(pod) in TERMINAL or _annotations(pod).get(POD_BIND_PHASE) == "failed":
        return None
    bound = (pod.get("spec") or {}).get("nodeName")
    if bound:
        return str(bound)
    try:
        return read_vgpu_node(pod)
    except AnnotationError:
        return None


def _grants(pod: Mapping[str, Any], problems: list[str]) -> list[tuple[str, int, int]]:
    try:
        devices = read_pod_devices(pod)
    except AnnotationError as exc:
        problems.append(f"pod {_label(pod)}: unreadable allocation: {exc}")
        return []
    return [(g.uuid, g.memory_mib, g.cores) for grants in devices or () for g in grants]


def _limit(value: object) -> int | None:
    if value is None:
        return None
    try:
        return math.ceil(parse_quantity(str(value)).value)
    except ValueError:
        return None


def _reason(pod: Mapping[str, Any]) -> str | None:
    for condition in (pod.get("status") or {}).get("conditions") or ():
        if condition.get("type") == "PodScheduled" and condition.get("status") == "False":
            return str(condition.get("message") or condition.get("reason") or "") or None
    return None


def audit(
    nodes: Iterable[Mapping[str, Any]],
    pods: Iterable[Mapping[str, Any]],
    quotas: Iterable[Mapping[str, Any]] = (),
    expected: Iterable[tuple[str, str]] = (),
) -> Audit:
    """See the module docstring; ``expected`` are the (namespace, name) of the pods the run created."""
    out = Audit()
    cards: dict[tuple[str, str], Device] = {}
    for node in nodes:
        text = _annotations(node).get(NODE_REGISTER)
        if text:
            for registered in decode_node_devices(str(text)):
                cards[str(_meta(node).get("name")), registered.uuid] = registered
    stored = {(str(_meta(p).get("namespace")), str(_meta(p).get("name"))): p for p in pods}
    used: dict[tuple[str, str], list[int]] = {}  # (node, uuid) -> [grants, memory, cores]
    holders: dict[tuple[str, str], list[str]] = {}
    namespace_use: dict[str, list[int]] = {}
    for pod in stored.values():
        holder = _holding(pod)
        if holder is None:
            continue
        for uuid, memory, cores in _grants(pod, out.cards):
            total = used.setdefault((holder, uuid), [0, 0, 0])
            total[0], total[1], total[2] = total[0] + 1, total[1] + memory, total[2] + cores
            holders.setdefault((holder, uuid), []).append(_label(pod))
            in_ns = namespace_use.setdefault(str(_meta(pod).get("namespace")), [0, 0])
            in_ns[0], in_ns[1] = in_ns[0] + memory, in_ns[1] + cores
    for (holder, uuid), (grants, memory, cores) in sorted(used.items()):
        device = cards.get((holder, uuid))
        where = f"node {holder} card {uuid} ({len(holders[holder, uuid])} pods)"
        if device is None:
            out.cards.append(f"{where}: not a card {holder} registered")
            continue
        if memory > device.memory_mib:
            out.cards.append(f"{where}: memory {memory} > {device.memory_mib} MiB")
        if cores > device.cores:
            out.cards.append(f"{where}: cores {cores} > {device.cores}")
        if grants > device.count:
            out.cards.append(f"{where}: grants {grants} > split count {device.count}")
    limits: dict[str, list[int | None]] = {}
    for quota in quotas:
        hard = ((quota.get("spec") or {}).get("hard")) or {}
        namespace = str(_meta(quota).get("namespace"))
        tight = limits.setdefault(namespace, [None, None])
        for index, name in enumerate((MEMORY_LIMIT, CORES_LIMIT)):
            value = _limit(hard.get(name))
            if value is not None:
                current = tight[index]
                tight[index] = value if current is None else min(current, value)
    for ns, (memory_limit, cores_limit) in sorted(limits.items()):
        memory, cores = namespace_use.get(ns, [0, 0])
        out.quota_use[ns] = (memory, memory_limit, cores, cores_limit)
        if memory_limit is not None and memory > memory_limit:
            out.quotas.append(f"namespace {ns}: GPU memory {memory} > quota {memory_limit} MiB")
        if cores_limit is not None and cores > cores_limit:
            out.quotas.append(f"namespace {ns}: GPU cores {cores} > quota {cores_limit}")
    for wanted in expected:
        found = stored.get(wanted)
        label = "/".join(wanted)
        if found is None:
            out.lost.append(f"pod {label}: gone")
        elif _phase(found) == "Running":
            out.running += 1
        elif _phase(found) in TERMINAL:
            out.lost.append(f"pod {label}: {_phase(found)} ({(found.get('status') or {}).get('reason')})")
        elif _holding(found) is not None:
            out.bound_waiting += 1
        elif (reason := _reason(found)) is not None:
            out.pending_with_reason += 1
            out.pending_reasons[reason] = out.pending_reasons.get(reason, 0) + 1
        else:
            out.lost.append(f"pod {label}: Pending with no reason")
    return out
