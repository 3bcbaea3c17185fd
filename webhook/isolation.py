"""The isolation rules of admission: what a container may not set in its env to reach beyond its grant. PURE.

Two variables, each read by something outside our control once the node agent has handed out a card:

**``CUDA_DISABLE_CONTROL``**. With it true the node agent does not mount
``/etc/ld.so.preload`` (docs/protocol.md, "Allocate", ``nodeagent.allocate_rules.hook_mounts``), so HAMi-core
is never loaded and the container's memory and core limits are not enforced: on a card it shares, it could
take the whole card from its neighbours. :func:`isolation_problems` names such containers; whether a
container's env disables control is the core's rule (:func:`hami.core.gocompat.disabling_value`, Go's
``ParseBool``), which the node agent applies too.

A container may keep the variable only when it asks for whole cards: ``gpucores`` 100 (after the
webhook's own exclusive default) and memory not limited below the card (no ``gpumem`` and no default
memory, or ``gpumem-percentage`` 100). Only literal ``env[].value`` texts are judged, the way the node
agent reads them; a ``valueFrom`` or ``envFrom`` value is unknown at admission and is not checked.

**``NVIDIA_VISIBLE_DEVICES``**: the NVIDIA container runtime exposes the cards this variable names. The
node agent's Allocate answer sets it to the container's granted cards, and kubelet puts the pod's own
``env`` after the device plugin's, so a value in the pod replaces the grant (``all`` = every card of the
node). :func:`visible_devices_problems` refuses it in every container that asks for cards (any value,
``valueFrom`` included: only the agent may name cards), and in a container without a card request unless
its literal value hides every card (``""``, ``void`` or ``none``): on a node where the NVIDIA runtime is
the default one, such a container would otherwise see cards granted to other pods. ``envFrom`` (a whole
ConfigMap or Secret) cannot be read at admission; docs/security.md says what closes that gap.

Must not import kopf, aiohttp, the Kubernetes client, ``logging``, ``os`` or ``time``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from hami.core.gocompat import ENV_DISABLE_CONTROL, disabling_value
from hami.core.requests import parse_container
from hami.settings import DeviceConfig

ENV_VISIBLE_DEVICES = "NVIDIA_VISIBLE_DEVICES"
#: Values of ``NVIDIA_VISIBLE_DEVICES`` that expose no card (the NVIDIA container toolkit's spellings).
HIDING_VALUES = frozenset({"", "void", "none"})


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


def visible_devices_problems(
    containers: Iterable[tuple[Mapping[str, Any], bool]], device: DeviceConfig
) -> list[str]:
    """One message per container (``(container, asks_for_cards)``) whose env names cards itself."""
    found: list[str] = []
    for container, asks in containers:
        name = container.get("name", "")
        for entry in container.get("env") or ():
            if entry.get("name") != ENV_VISIBLE_DEVICES:
                continue
            value = entry.get("value")
            literal = "valueFrom" not in entry and (value is None or isinstance(value, str))
            if asks:
                found.append(
                    f'container "{name}": env {ENV_VISIBLE_DEVICES} is set by the node agent to the cards '
                    "granted to this container; a value in the pod would replace that list and could reach "
                    "cards granted to other pods; drop the variable"
                )
            elif not literal or (value or "") not in HIDING_VALUES:
                shown = f'="{value}"' if literal else " (from valueFrom, which cannot be checked)"
                found.append(
                    f'container "{name}": env {ENV_VISIBLE_DEVICES}{shown} would give a container that asks '
                    f"for no {device.resources.count} the node's cards (the NVIDIA container runtime reads "
                    f'it); ask for {device.resources.count}, or set it to "none" or "void"'
                )
            else:
                continue
            break  # one message per container
    return found
