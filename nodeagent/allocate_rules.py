"""What one container gets from Allocate: the pure rules (docs/protocol.md, "Allocate"), no I/O.

Owns: the Allocate outcomes (:class:`AllocationError` and its kinds :class:`PodMissing`,
:class:`HandoutRefused`, :class:`Ambiguous`; :class:`ContainerAnswer` and :class:`MountSpec`, what
the device plugin turns into kubelet's answer), recognising a pod waiting here for our grant
(:func:`is_candidate`; ``nodeagent.pairing`` decides which one kubelet is admitting), the containers in
annotation order (init first: :func:`container_names`, :func:`container_spec`), and the envs and
HAMi-core mounts for one container's grants (:func:`container_envs`, :func:`hook_mounts`; the
``CUDA_DISABLE_CONTROL`` rule is the core's ``hami.core.gocompat``, shared with the webhook).
``nodeagent.allocate_call`` does the API calls and the host directory work. Pure: must not import grpc,
pynvml, the Kubernetes client, ``os`` or ``logging``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Any

from hami import objects
from hami.annotations import (
    POD_BIND_PHASE,
    POD_BIND_TIME,
    BindPhase,
    pending_container,
    pod_annotations,
    read_bind_phase,
    read_pod_to_allocate,
    read_vgpu_node,
)
from hami.core.gocompat import disabling_value
from hami.core.model import Grant
from nodeagent.config import NodeSettings


class AllocationError(Exception):
    """Allocate cannot finish; the message names the pod and node and says why (kubelet shows it)."""


class PodMissing(AllocationError):
    """No pod on this node is waiting for its cards."""


class HandoutRefused(AllocationError):
    """The pod kubelet is admitting has a grant this node must not hand out (``nodeagent.handout``)."""


class Ambiguous(AllocationError):
    """Several pods may be the one kubelet is admitting, with different cards (``nodeagent.pairing``)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class MountSpec:
    container_path: str
    host_path: str
    read_only: bool


@dataclass(frozen=True, slots=True, kw_only=True)
class ContainerAnswer:
    """The answer for one container of the kubelet request."""

    container: str  # container name in the pod spec
    uuids: tuple[str, ...]  # real card uuids, deduplicated, in grant order
    envs: Mapping[str, str]
    mounts: tuple[MountSpec, ...] = ()


def is_candidate(pod: Mapping[str, Any], node: str) -> bool:
    """A pod bound here whose cards are not all handed out yet (HAMi's pending-pod test,
    docs/protocol.md, "Allocate").

    HAMi also accepts ``bind-phase=success``; a pod whose entries are all blank has nothing for
    Allocate to hand out, so it is not a candidate here. A malformed annotation still makes the pod a
    candidate: Allocate must report it (and mark the pod failed) rather than look elsewhere.
    """
    if (objects.pod_phase(pod) or "Pending") != "Pending":
        return False
    if read_vgpu_node(pod) != node or POD_BIND_TIME not in pod_annotations(pod):
        return False
    try:
        phase = read_bind_phase(pod)
        devices = read_pod_to_allocate(pod)
    except ValueError:
        return phase_text(pod) in (BindPhase.ALLOCATING.value, BindPhase.SUCCESS.value)
    return (
        phase in (BindPhase.ALLOCATING, BindPhase.SUCCESS)
        and devices is not None
        and (pending_container(devices) is not None)
    )


def phase_text(pod: Mapping[str, Any]) -> str:
    return str(pod_annotations(pod).get(POD_BIND_PHASE) or "")


def container_names(pod: Mapping[str, Any]) -> tuple[str, ...]:
    """Names in device-annotation order (:func:`hami.objects.containers_init_first`)."""
    return tuple(str(c.get("name") or "") for c in objects.containers_init_first(pod))


def container_spec(pod: Mapping[str, Any], index: int) -> Mapping[str, Any]:
    every = objects.containers_init_first(pod)
    return every[index] if 0 <= index < len(every) else {}


def container_envs(
    grants: Sequence[Grant], container: Mapping[str, Any], settings: NodeSettings, *, cache_file: str | None
) -> dict[str, str]:
    """Envs for one container (docs/protocol.md, "Allocate"). Example: grants (GPU-a 3000 MiB 30 %), (GPU-b
    4000 MiB 30 %) → ``NVIDIA_VISIBLE_DEVICES=GPU-a,GPU-b``, ``CUDA_DEVICE_MEMORY_LIMIT_0=3000m``,
    ``CUDA_DEVICE_MEMORY_LIMIT_1=4000m``, ``CUDA_DEVICE_SM_LIMIT=30``."""
    uuids = tuple(dict.fromkeys(g.uuid for g in grants))
    envs = {"NVIDIA_VISIBLE_DEVICES": ",".join(uuids)}
    if settings.mode == "mig":
        return envs
    for position, grant in enumerate(grants):
        envs[f"CUDA_DEVICE_MEMORY_LIMIT_{position}"] = f"{grant.memory_mib}m"  # by position, not GPU index
    envs["CUDA_DEVICE_SM_LIMIT"] = str(grants[0].cores)
    if cache_file:
        envs["CUDA_DEVICE_MEMORY_SHARED_CACHE"] = cache_file
    if settings.memory_scaling > 1:
        envs["CUDA_OVERSUBSCRIBE"] = "true"
    if settings.lib_cuda_log_level:
        envs["LIBCUDA_LOG_LEVEL"] = settings.lib_cuda_log_level
    if settings.device.disable_core_limit:
        envs["GPU_CORE_UTILIZATION_POLICY"] = "disable"
    limits = (container.get("resources") or {}).get("limits") or {}
    priority = limits.get(settings.device.resources.priority)
    if priority is not None:
        envs["CUDA_TASK_PRIORITY"] = str(priority)
    return envs


def hook_mounts(
    hook: PurePosixPath,
    container_dir: PurePosixPath,
    container: Mapping[str, Any],
    *,
    lock_dir: str,
    licensed: bool,
) -> tuple[MountSpec, ...]:
    """HAMi-core mounts (``hook`` = HAMi's HOOK_PATH; the library lives in ``hook/vgpu``)."""
    vgpu = hook / "vgpu"
    mounts = [
        MountSpec(
            container_path=str(vgpu / "libvgpu.so"), host_path=str(vgpu / "libvgpu.so"), read_only=True
        ),
        MountSpec(container_path=str(vgpu), host_path=str(container_dir), read_only=False),
        MountSpec(container_path="/tmp/vgpulock", host_path=lock_dir, read_only=False),
    ]
    if disabling_value(container) is None:  # the core's rule, shared with the webhook
        mounts.append(
            MountSpec(
                container_path="/etc/ld.so.preload", host_path=str(vgpu / "ld.so.preload"), read_only=True
            )
        )
    if licensed:
        mounts.append(
            MountSpec(container_path="/tmp/license", host_path=str(vgpu / "license"), read_only=True)
        )
        mounts.append(
            MountSpec(
                container_path="/usr/bin/vgpuvalidator", host_path=str(vgpu / "vgpuvalidator"), read_only=True
            )
        )
    return tuple(mounts)
