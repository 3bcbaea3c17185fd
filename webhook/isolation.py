"""The isolation rule of admission: no ``CUDA_DISABLE_CONTROL`` on a shared card (users.md pain 9). PURE.

With env ``CUDA_DISABLE_CONTROL`` true the node agent does not mount ``/etc/ld.so.preload``
(spec-node-chart §A.9, ``monitor.allocation.hook_mounts``), so HAMi-core is never loaded and the
container's memory and core limits are not enforced: on a card it shares, it could take the whole
card from its neighbours. Owns :func:`isolation_problems`, the messages for such containers.

A container may keep the variable only when it asks for whole cards: ``gpucores`` 100 (after the
webhook's own exclusive default) and memory not limited below the card (no ``gpumem`` and no default
memory, or ``gpumem-percentage`` 100). Only literal ``env[].value`` texts are judged, the way the node
agent reads them; a ``valueFrom`` or ``envFrom`` value is unknown at admission and is not checked.
Must not import kopf, aiohttp, the Kubernetes client, ``logging``, ``os`` or ``time``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from hami.core.requests import parse_container
from hami.settings import DeviceConfig

ENV_DISABLE_CONTROL = "CUDA_DISABLE_CONTROL"
#: The spellings Go's ``strconv.ParseBool`` reads as true; HAMi (and ``monitor.allocation``) parse the
#: variable with it, so ``"yes"`` or ``" true"`` do not disable anything and are not refused.
GO_TRUE = frozenset({"1", "t", "T", "true", "TRUE", "True"})


def disabling_value(container: Mapping[str, Any]) -> str | None:
    """The first literal true value of ``CUDA_DISABLE_CONTROL`` in ``env``, or None.

    Any entry counts, as for the node agent: a false entry before a true one does not help.
    """
    for entry in container.get("env") or ():
        value = entry.get("value")
        if entry.get("name") == ENV_DISABLE_CONTROL and isinstance(value, str) and value in GO_TRUE:
            return value
    return None


def whole_cards(container: Mapping[str, Any], device: DeviceConfig) -> bool:
    """Whether the container (as mutated) asks for whole cards: all cores and all memory of each.

    Read through the core parser, so the memory and core figures are the ones the scheduler books
    (``defaultMemory`` included): a card booked at 100 % cores and 100 % memory has no neighbour.
    """
    resources: Mapping[str, Any] = container.get("resources") or {}
    limits = {str(k): str(v) for k, v in (resources.get("limits") or {}).items()}
    requests = {str(k): str(v) for k, v in (resources.get("requests") or {}).items()}
    request = parse_container(str(container.get("name", "")), limits, requests, device).request
    return (
        request is not None and request.cores >= 100 and request.memory_mib == 0 and request.percentage == 100
    )


def isolation_problems(gpu_containers: Iterable[Mapping[str, Any]], device: DeviceConfig) -> list[str]:
    """One message per container (as mutated) that uses a shared card with isolation disabled."""
    res = device.resources
    memory_advice = f"{res.memory_percentage}: 100"
    if res.memory and not device.default_memory:
        memory_advice = f"no {res.memory} (or {memory_advice})"
    found: list[str] = []
    for container in gpu_containers:
        value = disabling_value(container)
        if value is None or whole_cards(container, device):
            continue
        found.append(
            f'container "{container.get("name", "")}": env {ENV_DISABLE_CONTROL}="{value}" turns off '
            "HAMi-core's memory and core limits, so on a shared card it could take the whole card from "
            f"its neighbours; drop the variable, or ask for whole cards with {res.cores}: 100 "
            f"and {memory_advice}"
        )
    return found
