"""A raw pod (JSON dict) -> the core's :class:`~hami.core.model.PodRequest` (spec-scheduler §3, §11, §17).

Owns the steering annotations users set on pods (type/uuid lists, numa-bind, vgpu-mode, policies,
scoring weights) and the per-container request parsing order (init containers first, then app
containers). Requests themselves are parsed by :func:`hami.core.requests.parse_container`.
Pure: ``hami.core``, ``hami.settings`` and the stdlib.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from hami.annotations._text import go_bool, go_int, split_list
from hami.annotations.errors import AnnotationError
from hami.annotations.keys import (
    POD_GPU_POLICY,
    POD_NODE_POLICY,
    POD_NOUSE_GPUTYPE,
    POD_NOUSE_GPUUUID,
    POD_NUMA_BIND,
    POD_SCORING_WEIGHTS,
    POD_USE_GPUTYPE,
    POD_USE_GPUUUID,
    POD_VGPU_MODE,
)
from hami.annotations.pod import pod_annotations
from hami.core.model import PodRequest, ScoringWeights
from hami.core.requests import ParsedContainer, parse_container
from hami.settings import DeviceConfig

_WEIGHT_KEYS = ("slot", "core", "memory")


def decode_scoring_weights(text: str | None) -> ScoringWeights:
    """``slot=a,core=b,memory=c`` (any order, trimmed) with HAMi's error texts; absent/blank -> 1,1,1."""
    if text is None or not text.strip():
        return ScoringWeights()
    entries = text.split(",")
    if len(entries) != len(_WEIGHT_KEYS):
        raise AnnotationError(POD_SCORING_WEIGHTS, text, "expected slot, core, and memory weights")
    weights: dict[str, int] = {}
    for entry in entries:
        key, found, raw = entry.partition("=")
        if not found:
            raise AnnotationError(POD_SCORING_WEIGHTS, text, "expected key=value entries")
        key, raw = key.strip(), raw.strip()
        if key not in _WEIGHT_KEYS:
            raise AnnotationError(POD_SCORING_WEIGHTS, text, f'unknown weight "{key}"')
        if key in weights:
            raise AnnotationError(POD_SCORING_WEIGHTS, text, f'duplicate "{key}" weight')
        value = go_int(raw)
        if value is None:
            raise AnnotationError(POD_SCORING_WEIGHTS, text, f'"{key}" weight must be an integer')
        if value < 0:
            raise AnnotationError(POD_SCORING_WEIGHTS, text, f'"{key}" weight must not be negative')
        weights[key] = value
    if not any(weights.values()):
        raise AnnotationError(POD_SCORING_WEIGHTS, text, "at least one weight must be positive")
    return ScoringWeights(slot=weights["slot"], core=weights["core"], memory=weights["memory"])


def encode_scoring_weights(weights: ScoringWeights) -> str:
    return f"slot={weights.slot},core={weights.core},memory={weights.memory}"


def decode_numa_bind(text: str | None, *, strict: bool = False) -> bool:
    """``nvidia.com/numa-bind`` with Go's ``strconv.ParseBool``. HAMi ignores an unreadable value
    (false); ``strict=True`` raises instead (the webhook uses it to refuse the pod)."""
    if text is None:
        return False
    value = go_bool(text)
    if value is None:
        if strict:
            raise AnnotationError(POD_NUMA_BIND, text, "expected true or false (also 1/0, t/f, TRUE/FALSE)")
        return False
    return value


def _optional(text: str | None) -> str | None:
    """A free-text annotation trimmed; blank counts as absent."""
    if text is None or not text.strip():
        return None
    return text.strip()


def pod_annotation_problems(pod: Mapping[str, Any]) -> tuple[AnnotationError, ...]:
    """Every steering annotation of ``pod`` that cannot be read (for the webhook to refuse early)."""
    annotations = pod_annotations(pod)
    problems: list[AnnotationError] = []
    try:
        decode_numa_bind(annotations.get(POD_NUMA_BIND), strict=True)
    except AnnotationError as exc:
        problems.append(exc)
    try:
        decode_scoring_weights(annotations.get(POD_SCORING_WEIGHTS))
    except AnnotationError as exc:
        problems.append(exc)
    return tuple(problems)


def _resources(container: Mapping[str, Any], which: str) -> dict[str, str]:
    resources = container.get("resources") or {}
    values = resources.get(which) if isinstance(resources, Mapping) else None
    if not isinstance(values, Mapping):
        return {}
    # Quantities are strings on the wire; a hand-built dict may hold plain numbers.
    return {str(name): str(value) for name, value in values.items()}


def _containers(pod: Mapping[str, Any]) -> tuple[list[Mapping[str, Any]], list[Mapping[str, Any]]]:
    spec = pod.get("spec") or {}
    init = [c for c in (spec.get("initContainers") or []) if isinstance(c, Mapping)]
    app = [c for c in (spec.get("containers") or []) if isinstance(c, Mapping)]
    return init, app


def parse_pod_containers(pod: Mapping[str, Any], config: DeviceConfig) -> tuple[ParsedContainer, ...]:
    """Every container's request and problems, init containers (sidecars included) first, then app."""
    init, app = _containers(pod)
    return tuple(
        parse_container(str(c.get("name", "")), _resources(c, "limits"), _resources(c, "requests"), config)
        for c in (*init, *app)
    )


def read_pod_request(pod: Mapping[str, Any], config: DeviceConfig) -> PodRequest:
    """A raw pod JSON object -> :class:`PodRequest` with its steering annotations.

    Follows HAMi: an unreadable ``numa-bind`` counts as false. An unreadable
    ``hami.io/device-scoring-weights`` raises :class:`AnnotationError` (HAMi reports it as an error).
    """
    metadata = pod.get("metadata") or {}
    annotations = pod_annotations(pod)
    init, _ = _containers(pod)
    return PodRequest(
        namespace=str(metadata.get("namespace") or ""),
        name=str(metadata.get("name") or ""),
        uid=str(metadata.get("uid") or ""),
        containers=tuple(parsed.request for parsed in parse_pod_containers(pod, config)),
        init_count=len(init),
        use_types=split_list(annotations.get(POD_USE_GPUTYPE)),
        nouse_types=split_list(annotations.get(POD_NOUSE_GPUTYPE)),
        use_uuids=split_list(annotations.get(POD_USE_GPUUUID)),
        nouse_uuids=split_list(annotations.get(POD_NOUSE_GPUUUID)),
        numa_bind=decode_numa_bind(annotations.get(POD_NUMA_BIND)),
        vgpu_mode=annotations.get(POD_VGPU_MODE),
        gpu_policy=_optional(annotations.get(POD_GPU_POLICY)),
        node_policy=_optional(annotations.get(POD_NODE_POLICY)),
        weights=decode_scoring_weights(annotations.get(POD_SCORING_WEIGHTS)),
    )
