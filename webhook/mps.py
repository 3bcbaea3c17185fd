"""What MPS cannot express, refused at admission for pods pinned to MPS cards. PURE.

An MPS-mode node enforces a slice with NVIDIA's Multi-Process Service (docs/node-agent.md, "Allocate on
an MPS node"). A pod **pins MPS** when its ``nvidia.com/vgpu-mode`` admits MPS cards and no other kind:
the scheduler's test is HAMi's substring match of the card's mode in the annotation, so the value
names ``mps`` and neither ``hami-core`` nor ``mig``. Only such a pod is judged here; one that may land on
either kind cannot be refused for what only one kind cannot do.

What MPS cannot express, and this module refuses (:func:`mps_problems`):

- **GPU containers of one pod that run at the same time as different users.** One MPS server serves
  one user (UID) at a time: a client of another user waits until every client of the running server has
  finished (NVIDIA's ``nvidia-cuda-mps-control`` manual). Two such containers would queue behind each
  other, and one that never exits (a server, a sidecar) would hold the other back for ever. Containers
  that run together: all app containers and the sidecars (init containers with ``restartPolicy:
  Always``); each other init container with the sidecars declared before it. A container's user is its
  ``securityContext.runAsUser``, else the pod's; a container with neither runs as its image's user,
  which admission cannot see, and is not judged.

The other limits of MPS (limits per client process, cooperative without namespaces, a user of
another pod on the same card) are not the pod's to fix: docs/compatibility.md lists them.

Must not import kopf, aiohttp, the Kubernetes client, ``logging``, ``os`` or ``time``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from hami.core.model import DeviceMode

#: The reason code of the refusal (``hami_webhook_refusals_total``).
MPS_MIXED_USERS = "mps_mixed_users"
REASONS = (MPS_MIXED_USERS,)
_OTHER_MODES = (DeviceMode.HAMI_CORE.value, DeviceMode.MIG.value)


def pins_mps(vgpu_mode: object) -> bool:
    """Whether ``nvidia.com/vgpu-mode`` (its text, or None when absent) lets the pod onto MPS cards only."""
    return (
        isinstance(vgpu_mode, str)
        and DeviceMode.MPS.value in vgpu_mode
        and not any(mode in vgpu_mode for mode in _OTHER_MODES)
    )


def user_of(container: Mapping[str, Any], pod_spec: Mapping[str, Any]) -> tuple[int, str] | None:
    """The user a container runs as and where it is set (``securityContext.runAsUser`` of the container,
    else of the pod), or None when neither sets an integer."""
    for where, context in (
        ("securityContext.runAsUser", container.get("securityContext")),
        ("the pod's securityContext.runAsUser", pod_spec.get("securityContext")),
    ):
        if isinstance(context, Mapping):
            value = context.get("runAsUser")
            if isinstance(value, int) and not isinstance(value, bool):
                return value, where
    return None


def running_together(
    init_containers: Sequence[Mapping[str, Any]], containers: Sequence[Mapping[str, Any]]
) -> list[list[Mapping[str, Any]]]:
    """The sets of containers that run at the same time: each ordinary init container with the sidecars
    declared before it, then the sidecars with every app container."""
    groups: list[list[Mapping[str, Any]]] = []
    sidecars: list[Mapping[str, Any]] = []
    for init in init_containers:
        if init.get("restartPolicy") == "Always":
            sidecars.append(init)
        else:
            groups.append([*sidecars, init])
    groups.append([*sidecars, *containers])
    return groups


def mps_problems(
    pod_spec: Mapping[str, Any],
    vgpu_mode: object,
    init_containers: Sequence[Mapping[str, Any]],
    containers: Sequence[Mapping[str, Any]],
    gpu: Iterable[str],
) -> list[str]:
    """One message per GPU container (name in ``gpu``) that runs beside a GPU container of another user
    in a pod pinned to MPS; empty for a pod that does not pin MPS."""
    if not pins_mps(vgpu_mode):
        return []
    uses_gpu = set(gpu)
    found: list[str] = []
    for group in running_together(init_containers, containers):
        first: tuple[str, int] | None = None
        for container in group:
            name = str(container.get("name", ""))
            user = user_of(container, pod_spec)
            if name not in uses_gpu or user is None:
                continue
            if first is None:
                first = (name, user[0])
                continue
            if user[0] != first[1]:
                message = (
                    f'container "{name}": {user[1]} {user[0]} differs from container "{first[0]}"\'s user '
                    f"{first[1]}, and both use an MPS card at the same time (nvidia.com/vgpu-mode: "
                    f"{vgpu_mode}); one MPS server serves one user at a time, so one would wait for the "
                    "other to finish; run the pod's GPU containers as one user"
                )
                if message not in found:
                    found.append(message)
    return found
