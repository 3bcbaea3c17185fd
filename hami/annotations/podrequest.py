"""A raw pod (JSON dict) -> the core's :class:`~hami.core.model.PodRequest`
(docs/protocol.md, "Requests", "Scoring", "Steering").

Owns the steering annotations users set on pods (type/uuid lists, numa-bind, vgpu-mode, policies,
scoring weights) and the per-container request parsing order (init containers first, then app
containers). Requests themselves are parsed by :func:`hami.core.requests.parse_container`.
Pure: ``hami.core``, ``hami.settings``, ``hami.objects`` and the stdlib.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from hami import objects
from hami.annotations._text import go_bool, go_int, split_list
from hami.annotations.enforcement import decode_require_enforcement
from hami.annotations.errors import AnnotationError
from hami.annotations.keys import (
    POD_GPU_POLICY,
    POD_NODE_POLICY,
    POD_NOUSE_GPUTYPE,
    POD_NOUSE_GPUUUID,
    POD_NUMA_BIND,
    POD_REQUIRE_ENFORCEMENT,
    POD_SCORING_WEIGHTS,
    POD_USE_GPUTYPE,
    POD_USE_GPUUUID,
    POD_VGPU_MODE,
)
from hami.annotations.limits import check_length
from hami.annotations.pod import pod_annotations
from hami.core.enforcement import Level
from hami.core.model import PodRequest, ScoringWeights
from hami.core.requests import ParsedContainer, parse_container
from hami.core.score import BINPACK, FRAGMENTATION, MUTEX, NUMA, SPREAD, TOPOLOGY
from hami.objects import RawContainer
from hami.settings import DeviceConfig

_WEIGHT_KEYS = ("slot", "core", "memory")
#: Values the scheduler acts on (docs/protocol.md, "Scoring"; ``fragmentation`` is ours, docs/policies.md).
#: HAMi treats anything else as binpack (node) or spread (card), silently; :func:`pod_annotation_problems`
#: reports it instead. ``fragmentation`` stands alone: it is no key of a card-order chain.
NODE_POLICIES = (BINPACK, SPREAD, FRAGMENTATION)
GPU_POLICIES = (BINPACK, SPREAD, MUTEX, TOPOLOGY, NUMA, FRAGMENTATION)
_NODE_POLICY_ACCEPTED = "expected binpack, spread or fragmentation"
_GPU_POLICY_ACCEPTED = (
    "expected binpack, spread, mutex, topology-aware or numa, or a comma list of them, or fragmentation alone"
)
_WEIGHTS_ACCEPTED = (
    "accepted: slot=<n>,core=<n>,memory=<n> in any order, non-negative integers, at least one positive"
)
_NUMA_BIND_ACCEPTED = "expected true or false (Go booleans: 1 t T TRUE true True, 0 f F FALSE false False)"


def decode_scoring_weights(text: str | None) -> ScoringWeights:
    """``slot=a,core=b,memory=c`` (any order, trimmed) with HAMi's error texts; absent/blank -> 1,1,1."""
    if text is None or not text.strip():
        return ScoringWeights()
    check_length(POD_SCORING_WEIGHTS, text)
    entries = text.split(",")
    if len(entries) != len(_WEIGHT_KEYS):
        raise AnnotationError(POD_SCORING_WEIGHTS, text, "expected slot, core, and memory weights")
    weights: dict[str, int] = {}
    for entry in entries:
        key, found, raw = entry.partition("=")
        if not found:
            raise AnnotationError(POD_SCORING_WEIGHTS, text, "expected key=value entries")
        key, raw = key.strip(), raw.strip()
        # HAMi's order: duplicate, integer, sign, and only then whether the key is known.
        if key in weights:
            raise AnnotationError(POD_SCORING_WEIGHTS, text, f'duplicate "{key}" weight')
        value = go_int(raw)
        if value is None:
            raise AnnotationError(POD_SCORING_WEIGHTS, text, f'"{key}" weight must be an integer')
        if value < 0:
            raise AnnotationError(POD_SCORING_WEIGHTS, text, f'"{key}" weight must not be negative')
        if key not in _WEIGHT_KEYS:
            raise AnnotationError(POD_SCORING_WEIGHTS, text, f'unknown weight "{key}"')
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
            raise AnnotationError(POD_NUMA_BIND, text, _NUMA_BIND_ACCEPTED)
        return False
    return value


def _optional(text: str | None) -> str | None:
    """A free-text annotation trimmed; blank counts as absent."""
    if text is None or not text.strip():
        return None
    return text.strip()


def decode_node_policy(text: str | None, *, strict: bool = False) -> str | None:
    """``hami.io/node-scheduler-policy`` trimmed; blank -> None (the scheduler's default).

    HAMi spreads only on ``spread`` and binpacks on anything else; ``strict=True`` raises on a value
    other than ``binpack``/``spread`` instead (the webhook uses it to refuse the pod).
    """
    value = _optional(text)
    if strict and value is not None and value not in NODE_POLICIES:
        raise AnnotationError(POD_NODE_POLICY, text, f"unknown node policy; {_NODE_POLICY_ACCEPTED}")
    return value


def decode_gpu_policy(text: str | None, *, strict: bool = False) -> str | None:
    """``hami.io/gpu-scheduler-policy`` trimmed (the scheduler splits it with the core's
    ``parse_gpu_policy``); blank -> None (the scheduler's default).

    HAMi ignores unknown entries (a lone unknown value sorts like ``spread``); ``strict=True`` raises
    on an entry outside :data:`GPU_POLICIES`, or a list naming no policy at all (``","``).
    """
    value = _optional(text)
    if not strict or value is None:
        return value
    entries = split_list(value)
    unknown = [entry for entry in entries if entry not in GPU_POLICIES]
    if unknown:
        named = ", ".join(f'"{entry}"' for entry in unknown)
        noun = "policy" if len(unknown) == 1 else "policies"
        raise AnnotationError(POD_GPU_POLICY, text, f"unknown GPU {noun} {named}; {_GPU_POLICY_ACCEPTED}")
    if not entries:
        raise AnnotationError(POD_GPU_POLICY, text, f"names no policy; {_GPU_POLICY_ACCEPTED}")
    if FRAGMENTATION in entries and len(entries) > 1:
        raise AnnotationError(POD_GPU_POLICY, text, f'"{FRAGMENTATION}" combined; {_GPU_POLICY_ACCEPTED}')
    return value


def pod_annotation_problems(pod: Mapping[str, Any]) -> tuple[AnnotationError, ...]:
    """Every steering annotation of ``pod`` the scheduler would ignore or fail on, in the order of
    docs/protocol.md, "Steering" (for the webhook to refuse the pod at admission). Each message names the key,
    quotes the text and says what is accepted; a weights problem keeps HAMi's reason and adds the accepted
    form. A blank value is never a problem: it means the default everywhere (for numa-bind Go's error reads as
    false, the default too).
    """
    annotations = pod_annotations(pod)
    problems: list[AnnotationError] = []
    checks: tuple[tuple[str, Callable[..., object]], ...] = (
        (POD_NUMA_BIND, decode_numa_bind),
        (POD_NODE_POLICY, decode_node_policy),
        (POD_GPU_POLICY, decode_gpu_policy),
    )
    for key, decode in checks:
        text = annotations.get(key)
        if text is None or not text.strip():
            continue
        try:
            decode(text, strict=True)
        except AnnotationError as exc:
            problems.append(exc)
    try:
        decode_scoring_weights(annotations.get(POD_SCORING_WEIGHTS))
    except AnnotationError as exc:
        problems.append(AnnotationError(exc.key, exc.text, f"{exc.reason}; {_WEIGHTS_ACCEPTED}"))
    try:
        decode_require_enforcement(annotations.get(POD_REQUIRE_ENFORCEMENT))
    except AnnotationError as exc:
        problems.append(exc)
    return tuple(problems)


def _resources(container: RawContainer, which: str) -> dict[str, str]:
    resources = container.get("resources")
    values = resources.get(which) if isinstance(resources, Mapping) else None
    if not isinstance(values, Mapping):
        return {}
    # Quantities are strings on the wire; a hand-built dict may hold plain numbers.
    return {str(name): str(value) for name, value in values.items()}


def parse_pod_containers(pod: Mapping[str, Any], config: DeviceConfig) -> tuple[ParsedContainer, ...]:
    """Every container's request and problems, init containers (sidecars included) first, then app."""
    return tuple(
        parse_container(str(c.get("name", "")), _resources(c, "limits"), _resources(c, "requests"), config)
        for c in objects.containers_init_first(pod)
    )


def read_pod_request(pod: Mapping[str, Any], config: DeviceConfig) -> PodRequest:
    """A raw pod JSON object -> :class:`PodRequest` with its steering annotations.

    Follows HAMi: an unreadable ``numa-bind`` counts as false and unknown policies are passed on for
    the scheduler to ignore. An unreadable
    ``hami.io/device-scoring-weights`` raises :class:`AnnotationError` (HAMi reports it as an error), and
    so does an unreadable ``hami.io/require-enforcement`` (ours: never read as "no requirement").
    """
    annotations = pod_annotations(pod)
    init = objects.init_containers(pod)
    return PodRequest(
        namespace=objects.namespace(pod),
        name=objects.name(pod),
        uid=objects.uid(pod),
        containers=tuple(parsed.request for parsed in parse_pod_containers(pod, config)),
        init_count=len(init),
        use_types=split_list(annotations.get(POD_USE_GPUTYPE)),
        nouse_types=split_list(annotations.get(POD_NOUSE_GPUTYPE)),
        use_uuids=split_list(annotations.get(POD_USE_GPUUUID)),
        nouse_uuids=split_list(annotations.get(POD_NOUSE_GPUUUID)),
        numa_bind=decode_numa_bind(annotations.get(POD_NUMA_BIND)),
        vgpu_mode=annotations.get(POD_VGPU_MODE),
        gpu_policy=decode_gpu_policy(annotations.get(POD_GPU_POLICY)),
        node_policy=decode_node_policy(annotations.get(POD_NODE_POLICY)),
        weights=decode_scoring_weights(annotations.get(POD_SCORING_WEIGHTS)),
        enforcement=decode_require_enforcement(annotations.get(POD_REQUIRE_ENFORCEMENT)) or Level.NONE,
    )
