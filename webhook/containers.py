"""One container of a new pod at admission: its value checks and the webhook's defaults. PURE.

Owns :func:`mutate_container` (docs/protocol.md, "Admission", per container, init containers first) and the
reason codes of its problems. For a container that asks for a managed resource (limits or requests):
the values are judged by the core parser with the webhook's :class:`~hami.core.requests.Bounds`
(every range and message is the core's; here each problem only gets its reason code), a card count
of 0 next to memory or cores is a typo (:func:`webhook.typos.zero_card_problem`); a valid container
gets ``defaultGPUNum`` when it names no count, the exclusive ``gpucores: 100`` when HAMi's rule says its
card is not shareable, and env ``CUDA_TASK_PRIORITY`` / ``GPU_CORE_UTILIZATION_POLICY``.
:class:`Container` holds the container as submitted and a private deep copy made only when something
changes. The pod-level order of the rules is :func:`webhook.mutation.plan`'s.

Must not import kopf, aiohttp, the Kubernetes client, ``logging``, ``os`` or ``time``.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from hami.core.requests import Bounds, lookup, parse_container, whole_number
from webhook import typos
from webhook.config import MutationSettings
from webhook.typos import zero_card_problem

ENV_PRIORITY = "CUDA_TASK_PRIORITY"
ENV_CORE_POLICY = "GPU_CORE_UTILIZATION_POLICY"

# Reason codes of value problems (``hami_webhook_refusals_total``), named after the HAMi resource role,
# whatever the resource is called in this cluster.
BAD_GPU = "bad_gpu"
BAD_GPUMEM = "bad_gpumem"
BAD_GPUMEM_PERCENTAGE = "bad_gpumem_percentage"
BAD_GPUCORES = "bad_gpucores"
BAD_REQUEST = "bad_request"
TOO_MANY_CARDS = "too_many_cards"
NO_CARD_COUNT = "no_card_count"
REASONS = (
    BAD_GPU,
    BAD_GPUMEM,
    BAD_GPUMEM_PERCENTAGE,
    BAD_GPUCORES,
    BAD_REQUEST,
    TOO_MANY_CARDS,
    NO_CARD_COUNT,
)


@dataclass(frozen=True, slots=True)
class Problem:
    """One problem of the pod: its reason code and the message the user sees."""

    reason: str
    message: str


@dataclass(slots=True)
class Container:
    """One container being mutated (a private deep copy, made only when something changes)."""

    original: Mapping[str, Any]
    asks: bool = False  # names a managed resource (whether or not its values are valid)
    uses_gpu: bool = False  # asks, with valid values
    copy: dict[str, Any] | None = None

    @property
    def name(self) -> str:
        return str(self.original.get("name", ""))

    @property
    def result(self) -> Mapping[str, Any]:
        return self.copy if self.copy is not None else self.original

    def _own(self) -> dict[str, Any]:
        if self.copy is None:
            self.copy = copy.deepcopy(dict(self.original))
        return self.copy

    def set_limit(self, resource: str, value: str) -> None:
        resources = self._own().setdefault("resources", {})
        resources.setdefault("limits", {})[resource] = value

    def set_env(self, name: str, value: str) -> None:
        """Set env ``name``; an existing plain entry of that name is replaced in place (order kept)."""
        if any(e.get("name") == name and e.get("value") == value for e in self.original.get("env") or ()):
            return
        env: list[dict[str, Any]] = self._own().setdefault("env", [])
        for entry in env:
            if entry.get("name") == name:
                entry.pop("valueFrom", None)
                entry["value"] = value
                return
        env.append({"name": name, "value": value})


def mutate_container(
    container: Container, settings: MutationSettings, problems: list[Problem], notes: list[str]
) -> None:
    """Judge one container and apply the webhook's defaults to it; problems and notes are appended."""
    device = settings.device
    res = device.resources
    name = container.name
    resources: Mapping[str, Any] = container.original.get("resources") or {}
    limits, requests = texts(resources, "limits"), texts(resources, "requests")
    asked = [r for r in res.managed if r and (r in limits or r in requests)]
    if not asked:
        return

    container.asks = True
    before = len(problems)
    reasons = _value_reasons(settings)
    bounds = Bounds(max_cards=settings.max_cards_per_container)
    problems.extend(
        Problem(
            TOO_MANY_CARDS if p.kind == "too_many_cards" else reasons.get(p.field, BAD_REQUEST), p.message
        )
        for p in parse_container(name, limits, requests, device, bounds=bounds).problems
    )
    zero = zero_card_problem(name, limits, requests, res)
    if zero is not None:
        problems.append(Problem(typos.ZERO_CARDS, zero))
    if len(problems) > before:
        return

    container.uses_gpu = True
    if lookup(res.count, limits, requests) is None:
        if device.default_gpu_num <= 0:
            message = (
                f'container "{name}": asks for {", ".join(asked)} without {res.count}, '
                "and defaultGPUNum is 0; set the card count"
            )
            problems.append(Problem(NO_CARD_COUNT, message))
            return
        container.set_limit(res.count, str(device.default_gpu_num))
        notes.append(f"container {name}: {res.count} set to {device.default_gpu_num} (defaultGPUNum)")
    if lookup(res.cores, limits, requests) is None and _exclusive(settings, limits, requests):
        container.set_limit(res.cores, "100")
        notes.append(f"container {name}: {res.cores} set to 100 (a whole card)")
    if res.priority in limits:
        container.set_env(ENV_PRIORITY, limits[res.priority])
    if device.gpu_core_policy and device.gpu_core_policy != "default":
        container.set_env(ENV_CORE_POLICY, device.gpu_core_policy)


def _value_reasons(settings: MutationSettings) -> dict[str, str]:
    """Resource name (as configured) -> the reason code of a bad value of it."""
    res = settings.device.resources
    return {
        res.count: BAD_GPU,
        res.memory: BAD_GPUMEM,
        res.memory_percentage: BAD_GPUMEM_PERCENTAGE,
        res.cores: BAD_GPUCORES,
    }


def _exclusive(settings: MutationSettings, limits: Mapping[str, str], requests: Mapping[str, str]) -> bool:
    """HAMi's rule: a card asked for without cores is exclusive unless memory makes it shareable."""
    res = settings.device.resources
    percentage = lookup(res.memory_percentage, limits, requests)
    if percentage is not None:
        return whole_number(percentage) == 100
    return not res.memory or lookup(res.memory, limits, requests) is None


def texts(resources: Mapping[str, Any], key: str) -> dict[str, str]:
    """``limits`` or ``requests`` as text (quantities arrive as strings; be lenient with raw numbers)."""
    values: Mapping[str, Any] = resources.get(key) or {}
    return {str(k): str(v) for k, v in values.items()}


def resource_names(container: Mapping[str, Any]) -> list[str]:
    """Every resource name in the container's ``limits`` and ``requests`` (for the typo rules)."""
    resources: Mapping[str, Any] = container.get("resources") or {}
    return [*texts(resources, "limits"), *texts(resources, "requests")]
