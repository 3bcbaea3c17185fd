"""The node agent's Allocate answer for one container of a fake pod, made by the agent's own rules.

Owns :func:`agent_answer`: a grant of one card (``memory_mib``, ``cores``) to container ``container`` of
pod uid ``uid``, answered through ``nodeagent.allocate_rules`` (:func:`container_envs`,
:func:`hook_mounts`) with the host directories laid out as ``nodeagent.allocate_call.Allocator`` lays
them out (``<hook>/vgpu/containers/<uid>_<container>``, world-writable; the shared cache file
``<hook>/vgpu/<random>.cache``; the lock directory). The Allocator itself needs a Kubernetes API, which
the GPU machine does not have; ``tests/nodeagent/test_enforcement_modes.py`` holds this answer equal to
the one the running agent gives kubelet over gRPC for the same grant. :func:`mps_agent_answer` is the
same for an MPS-mode node (``nodeagent.mps.rules``, the namespace opened through
``nodeagent.mps.control.MpsControl``). Imports no Kubernetes client and no gRPC.
"""

from __future__ import annotations

import uuid as uuidlib
from pathlib import Path, PurePosixPath
from typing import Any

from hami.core.model import Grant
from nodeagent.allocate_rules import ContainerAnswer, container_envs, hook_mounts
from nodeagent.config import NodeSettings
from nodeagent.mps.control import MpsControl
from nodeagent.mps.protocol import MpsState
from nodeagent.mps.rules import card_limits, mps_answer, namespace_name


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


async def mps_agent_answer(
    control: MpsControl,
    state: MpsState,
    card: str,
    memory_mib: int,
    cores: int,
    *,
    uid: str,
    container: str = "main",
    index: int = 0,
) -> ContainerAnswer:
    """What the agent answers on an MPS-mode node for container number ``index`` (``container``) of pod
    ``uid`` granted ``memory_mib`` MiB and ``cores`` % of ``card``, with the daemon ``control`` in
    ``state``: as ``Allocator`` does it, the namespace opened on the daemon with the grant's limits
    first when the daemon has namespaces, else the limits in the environment (``nodeagent.mps.rules``)."""
    grants = (Grant(uuid=card, memory_mib=memory_mib, cores=cores),)
    pipe = PurePosixPath(control.pipe_dir)
    if state.namespaces:
        pipe = await control.open_namespace(namespace_name(uid, index), card_limits(grants))
    return mps_answer(
        container,
        grants,
        pipe_dir=pipe,
        shm_dir=PurePosixPath(control.shm_dir),
        namespaced=state.namespaces,
    )
