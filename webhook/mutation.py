"""The admission decision for one new pod: a patch plan or a refusal (docs/protocol.md, "Admission"). PURE.

Owns :func:`plan`: given the pod as submitted (raw JSON dict) and :class:`MutationSettings`, it returns
:class:`Admit` (the new value of every top-level ``spec`` field that changes; empty when the pod is left
alone) or :class:`Refuse` (a message naming the container and the field). This module owns the order of
the rules; each container's checks and defaults are :mod:`webhook.containers`'s, request parsing and
every value range the core's (:mod:`hami.core.requests`). Must not import kopf, aiohttp, the Kubernetes
client, ``logging``, ``os`` or ``time``.

Per pod, in order:

1. A user-set internal annotation (or the ``hami.io/vgpu-node`` label) -> refuse: nobody may forge an
   allocation. Checked before anything else, even for ignored pods and foreign schedulers.
2. No containers (and not labelled ``hami.io/webhook: ignore``) -> refuse ``pod has no containers``.
3. Each container, init containers first (:mod:`webhook.containers`): refuse malformed or out-of-range
   values; default the card count (``defaultGPUNum``) when only memory/cores are given; the implicit
   exclusive ``gpucores: 100`` for a bare card request; env ``CUDA_TASK_PRIORITY`` /
   ``GPU_CORE_UTILIZATION_POLICY``.
4. A pod we do not route -- labelled ``hami.io/webhook: ignore`` (namespaces with that label are skipped
   by the configuration's ``namespaceSelector``; the apiserver never sends their pods), or naming another
   scheduler (not ours, not ``default-scheduler`` when forcing) -- gets only the protective refusals of
   step 7's isolation rules (judged on the containers as step 3 would book them), then is left untouched:
   no value checks, no defaults, no scheduler name. Its protective refusals matter because a user picks
   the routing: an ignored pod may still name our scheduler.
5. Typos (:mod:`webhook.typos`): a look-alike resource name in any container (``nvidia.com/gpumemory``),
   or an unknown one in ``hami.io/``, makes the pod ours to refuse even when it asks for nothing else;
   a count of 0 next to memory or cores is a value problem of step 3. Value problems -> refuse (422),
   the typos first. No container asks for a managed resource -> only the ``NVIDIA_VISIBLE_DEVICES``
   rule, then untouched (no env, no scheduler name). A GPU pod's annotation keys in HAMi's namespaces
   that HAMi does not read, then its steering annotations the codec cannot read
   (``pod_annotation_problems``: numa-bind, policies, scoring weights) -> refuse, listed after the
   container problems: the scheduler would ignore them or fail the pod's every Filter call.
6. A privileged container in a GPU pod -> refuse.
7. The isolation rules (:mod:`webhook.isolation`): a GPU container on a shared card with env
   ``CUDA_DISABLE_CONTROL`` true, or any container naming cards itself in ``NVIDIA_VISIBLE_DEVICES``
   -> refuse (403). Then a pod pinned to MPS cards that asks what MPS cannot express (:mod:`webhook.mps`:
   GPU containers running together as different users) -> refuse (422). Then a preset
   ``spec.nodeName`` -> refuse.
8. Set ``spec.schedulerName``, ``runtimeClassName`` (when configured and absent), and
   ``NVIDIA_VISIBLE_DEVICES=none`` on the pod's non-GPU containers when ``overwriteEnv``; the
   :class:`Admit` carries what the pod asks of its namespace's GPU quota (``quota_ask``), which
   :mod:`webhook.quota` checks next (it needs the cluster's ResourceQuotas, so it is not decided here).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from hami import objects
from hami.annotations import (
    INTERNAL_POD_ANNOTATIONS,
    POD_VGPU_MODE,
    POD_VGPU_NODE,
    WEBHOOK_IGNORE_LABEL,
    parse_pod_containers,
    pod_annotation_problems,
)
from hami.core.quota import QuotaAsk, admission_ask
from webhook import containers, mps, typos
from webhook.config import MutationSettings
from webhook.containers import Container, Problem, mutate_container, resource_names
from webhook.isolation import isolation_problems, visible_devices_problems
from webhook.mps import mps_problems
from webhook.typos import annotation_problems, resource_problems

IGNORE_VALUE = "ignore"
DEFAULT_SCHEDULER = "default-scheduler"
ENV_VISIBLE_DEVICES = "NVIDIA_VISIBLE_DEVICES"
#: Status codes of refusals: a value the user wrote is invalid, or the pod is not allowed as a whole.
CODE_INVALID = 422
CODE_FORBIDDEN = 403
CODE_BAD_REQUEST = 400

# Short reason codes of refusals (the ``reason`` label of ``hami_webhook_refusals_total``); the value
# problems' codes are ``webhook.containers``'s, the typos' ``webhook.typos``'s.
FORGED_ANNOTATION = "forged_annotation"
FORGED_LABEL = "forged_label"
NO_CONTAINERS = "no_containers"
PRIVILEGED = "privileged"
ISOLATION_DISABLED = "isolation_disabled"
VISIBLE_DEVICES = "visible_devices"
NODE_ASSIGNED = "node_assigned"
BAD_ANNOTATION = "bad_annotation"
EXCEEDING_QUOTA = "exceeding_quota"  # decided by webhook.quota, after plan (it reads ResourceQuotas)
REFUSAL_REASONS = (
    FORGED_ANNOTATION,
    FORGED_LABEL,
    NO_CONTAINERS,
    *containers.REASONS,
    PRIVILEGED,
    ISOLATION_DISABLED,
    VISIBLE_DEVICES,
    NODE_ASSIGNED,
    BAD_ANNOTATION,
    EXCEEDING_QUOTA,
    *typos.REASONS,
    *mps.REASONS,
)


@dataclass(frozen=True, slots=True, kw_only=True)
class Admit:
    """Allow the pod. ``spec`` maps each changed top-level spec field to its whole new value."""

    spec: Mapping[str, Any] = field(default_factory=dict)
    notes: tuple[str, ...] = ()  # what changed or why nothing did, for the log
    #: What a GPU pod we route asks of its namespace's GPU quota, as mutated (HAMi's ``fitResourceQuota``
    #: sum); None for every other pod, or when it asks for no memory and no cores. ``webhook.quota``
    #: checks it against the namespace's ResourceQuotas.
    quota_ask: QuotaAsk | None = None

    @property
    def changed(self) -> bool:
        return bool(self.spec)


@dataclass(frozen=True, slots=True, kw_only=True)
class Refuse:
    """Deny the pod; ``message`` names the container and field (several problems joined by ``; ``).

    ``reason`` is the short code of the first problem (one of :data:`REFUSAL_REASONS`), for metrics.
    """

    message: str
    code: int
    reason: str


def plan(pod: Mapping[str, Any], settings: MutationSettings) -> Admit | Refuse:
    """Decide what happens to ``pod`` (a new pod, as submitted). See the module docstring for the order."""
    metadata: Mapping[str, Any] = objects.meta(pod)
    spec = objects.spec(pod)

    forged = _forged(metadata)
    if forged:
        reason = FORGED_ANNOTATION if forged[0].startswith("annotation") else FORGED_LABEL
        return Refuse(message="; ".join(forged), code=CODE_FORBIDDEN, reason=reason)
    ignored = (metadata.get("labels") or {}).get(WEBHOOK_IGNORE_LABEL) == IGNORE_VALUE
    if not ignored and not spec.get("containers"):
        return Refuse(message="pod has no containers", code=CODE_BAD_REQUEST, reason=NO_CONTAINERS)

    groups = {key: [Container(c) for c in spec.get(key) or ()] for key in ("initContainers", "containers")}
    every = groups["initContainers"] + groups["containers"]
    problems: list[Problem] = []
    notes: list[str] = []
    for container in every:
        mutate_container(container, settings, problems, notes)

    scheduler = spec.get("schedulerName") or ""
    ours = settings.scheduler_name
    if ignored or (
        scheduler
        and scheduler != ours
        and not (scheduler == DEFAULT_SCHEDULER and settings.force_overwrite_default_scheduler)
    ):
        unrouted = _isolation(every, settings)
        if unrouted is not None:
            return unrouted
        note = (
            f"pod labelled {WEBHOOK_IGNORE_LABEL}={IGNORE_VALUE}"
            if ignored
            else f"scheduler {scheduler!r} is not ours"
        )
        return Admit(notes=(note,))

    problems[:0] = [
        Problem(typos.UNKNOWN_RESOURCE, message)
        for c in every
        for message in resource_problems(c.name, resource_names(c.original), settings.device.resources)
    ]
    if problems or any(c.uses_gpu for c in every):
        annotations = metadata.get("annotations") or {}
        problems.extend(
            Problem(typos.UNKNOWN_ANNOTATION, m)
            for m in annotation_problems(annotations, INTERNAL_POD_ANNOTATIONS)
        )
        problems.extend(Problem(BAD_ANNOTATION, f"annotation {p}") for p in pod_annotation_problems(pod))
    if problems:
        message = "; ".join(p.message for p in problems)
        return Refuse(message=message, code=CODE_INVALID, reason=problems[0].reason)
    if not any(c.uses_gpu for c in every):
        return _isolation(every, settings) or Admit(notes=("no container asks for a managed resource",))

    privileged = next((c for c in every if _privileged(c.original)), None)
    if privileged is not None:
        return Refuse(
            message=f"container {privileged.name} is privileged", code=CODE_FORBIDDEN, reason=PRIVILEGED
        )
    unisolated = _isolation(every, settings)
    if unisolated is not None:
        return unisolated
    inexpressible = mps_problems(
        spec,
        (metadata.get("annotations") or {}).get(POD_VGPU_MODE),
        [c.result for c in groups["initContainers"]],
        [c.result for c in groups["containers"]],
        (c.name for c in every if c.uses_gpu),
    )
    if inexpressible:
        return Refuse(message="; ".join(inexpressible), code=CODE_INVALID, reason=mps.MPS_MIXED_USERS)
    if spec.get("nodeName"):
        return Refuse(message="pod has node assigned", code=CODE_FORBIDDEN, reason=NODE_ASSIGNED)

    device = settings.device
    if device.overwrite_env:
        for container in every:
            if not container.uses_gpu:
                container.set_env(ENV_VISIBLE_DEVICES, "none")
    changes: dict[str, Any] = {}
    for key, group in groups.items():
        if any(c.copy is not None for c in group):
            changes[key] = [c.result for c in group]
    if ours and scheduler != ours:
        changes["schedulerName"] = ours
        notes.append(f"schedulerName set to {ours}")
    if device.runtime_class_name and not spec.get("runtimeClassName"):
        changes["runtimeClassName"] = device.runtime_class_name
        notes.append(f"runtimeClassName set to {device.runtime_class_name}")
    mutated = {"spec": {key: [c.result for c in group] for key, group in groups.items()}}
    requests = (parsed.request for parsed in parse_pod_containers(mutated, device))
    ask = admission_ask(requests, len(groups["initContainers"]))
    return Admit(spec=changes, notes=tuple(notes), quota_ask=ask if ask.memory or ask.cores else None)


def apply(pod: Mapping[str, Any], admit: Admit) -> dict[str, Any]:
    """The pod as it will be stored: a copy with the plan's spec fields replaced (for tests and tools)."""
    result = copy.deepcopy(dict(pod))
    result.setdefault("spec", {}).update(copy.deepcopy(dict(admit.spec)))
    return result


def _isolation(every: Sequence[Container], settings: MutationSettings) -> Refuse | None:
    """The isolation rules (:mod:`webhook.isolation`) on every container, as step 3 would book it."""
    device = settings.device
    found = isolation_problems((c.result for c in every if c.asks), device)
    reason = ISOLATION_DISABLED
    visible = visible_devices_problems(((c.result, c.asks) for c in every), device)
    if visible and not found:
        reason = VISIBLE_DEVICES
    found += visible
    if not found:
        return None
    return Refuse(message="; ".join(found), code=CODE_FORBIDDEN, reason=reason)


def _forged(metadata: Mapping[str, Any]) -> list[str]:
    annotations: Mapping[str, Any] = metadata.get("annotations") or {}
    labels: Mapping[str, Any] = metadata.get("labels") or {}
    found = [
        f"annotation {key} is written by HAMi only" for key in INTERNAL_POD_ANNOTATIONS if key in annotations
    ]
    if POD_VGPU_NODE in labels:
        found.append(f"label {POD_VGPU_NODE} is written by HAMi only")
    if found:
        found[-1] += "; a new pod may not carry it"
    return found


def _privileged(container: Mapping[str, Any]) -> bool:
    return bool((container.get("securityContext") or {}).get("privileged"))
