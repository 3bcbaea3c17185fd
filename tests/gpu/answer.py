"""The node agent's Allocate answer for one container of a fake pod, made by the agent's own rules.

Owns :func:`agent_answer`: a grant of one card (``memory_mib``, ``cores``) to container ``container`` of
pod uid ``uid``, answered through ``monitor.allocate_rules`` (:func:`container_envs`,
:func:`hook_mounts`) with the host directories laid out as ``monitor.allocate_call.Allocator`` lays
them out (``<hook>/vgpu/containers/<uid>_<container>``, world-writable; the shared cache file
``<hook>/vgpu/<random>.cache``; the lock directory). The Allocator itself needs a Kubernetes API, which
the GPU machine does not have; ``tests/monitor/test_enforcement_modes.py`` holds this answer equal to
the one the running agent gives kubelet over gRPC for the same grant. Imports only the agent's pure
rules (no Kubernetes client, no gRPC).
"""

from __future__ import annotations

import uuid as uuidlib
from pathlib import Path, PurePosixPath
from typing import Any

from hami.core.model import Grant
from monitor.allocate_rules import ContainerAnswer, container_envs, hook_mounts
from monitor.config import NodeSettings


def agent_answer(
    card: str,
    memory_mib: int,
    cores: int,
    *,
    hook: Path,
    lock_dir: Path,
    uid: str = "gpu-check",
    container: str = "main",
    settings: NodeSettings | None = None,
) -> ContainerAnswer:
    """What the agent answers kubelet for ``container`` granted ``memory_mib`` MiB and ``cores`` % of
    card ``card``, with ``--hook-path=hook``; makes the container's directory and the lock directory."""
    spec: dict[str, Any] = {"name": container, "image": "x"}
    container_dir = hook / "vgpu" / "containers" / f"{uid}_{container}"
    container_dir.mkdir(parents=True, exist_ok=True)
    container_dir.chmod(0o777)
    lock_dir.mkdir(parents=True, exist_ok=True)
    lock_dir.chmod(0o777)
    cache = str(PurePosixPath(hook) / "vgpu" / f"{uuidlib.uuid4()}.cache")
    mounts = hook_mounts(
        PurePosixPath(hook),
        PurePosixPath(container_dir),
        spec,
        lock_dir=str(lock_dir),
        licensed=(hook / "vgpu" / "license").exists(),
    )
    grants = (Grant(uuid=card, memory_mib=memory_mib, cores=cores),)
    envs = container_envs(grants, spec, settings or NodeSettings(), cache_file=cache)
    return ContainerAnswer(container=container, uuids=(card,), envs=envs, mounts=mounts)
