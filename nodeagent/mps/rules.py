"""What one container gets from Allocate on an MPS-mode node: the pure rules, no I/O.

Owns the MPS answer (docs/node-agent.md, "Allocate on an MPS node"): for one container's grants
(``hami.core.model.Grant``: card UUID, MiB, cores %) the envs and mounts kubelet hands the container,
and the per-card limits a namespaced control daemon holds instead (:func:`card_limits`).

- ``NVIDIA_VISIBLE_DEVICES`` = the real card UUIDs, deduplicated, in grant order (as the HAMi-core
  answer), and ``CUDA_VISIBLE_DEVICES`` = the same UUIDs, so that CUDA enumerates the cards in grant
  order (NVIDIA's MPS guide: devices are enumerated in the order of that list, UUIDs recommended).
- ``CUDA_MPS_PIPE_DIRECTORY`` = :data:`CONTAINER_PIPE_DIR`, the host pipe directory mounted there
  (the daemon's, or the pod's namespace's), and the host shared-memory directory mounted at
  ``/dev/shm`` (MPS server and clients share it).
- Per-client limits (no namespaces: cooperative, the client's environment carries them):
  ``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT`` = ``<ordinal>=<MiB>M`` per card, ordinals in that enumeration
  order; ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`` = the container's cores (one value per client process,
  all its cards), left out when the cores are 0 (HAMi: no core limit), 100 or more (the whole card), or
  the device config's ``disableCoreLimit`` is on. A grant of 0 MiB has no memory entry.
- Namespaced (the daemon holds the limits, tenant-proof): no limit env at all; the limits go to the
  daemon (:func:`card_limits`, thread percentage 100 where the per-client rule leaves the env out), in
  one namespace per container (:func:`namespace_name`).

A grant of 0 MiB (only a ``gpumem-percentage`` of a card under 100 MiB gets one) is refused: MPS has
no limit that means "no memory", and leaving the card unlimited would hand out the whole card.

No HAMi-core env or mount (``CUDA_DEVICE_MEMORY_LIMIT_*``, ``ld.so.preload``): MPS enforces, and a
second limiter inside the container would count the same memory twice.

Pure: must not import grpc, pynvml, the Kubernetes client, ``os``, ``logging`` or ``asyncio``.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import PurePosixPath

from hami.core.model import Grant
from nodeagent.allocate_rules import AllocationError, ContainerAnswer, MountSpec
from nodeagent.mps.protocol import CLIENT_MEMORY_ENV, CLIENT_THREADS_ENV, PIPE_ENV, CardLimit

ENV_VISIBLE = "NVIDIA_VISIBLE_DEVICES"
ENV_CUDA_VISIBLE = "CUDA_VISIBLE_DEVICES"
ENV_PIPE = PIPE_ENV
ENV_MEMORY = CLIENT_MEMORY_ENV
ENV_THREADS = CLIENT_THREADS_ENV
#: Where a container finds the pipe directory (MPS's own default, so a client finds it without the env)
CONTAINER_PIPE_DIR = PurePosixPath("/tmp/nvidia-mps")
CONTAINER_SHM = PurePosixPath("/dev/shm")
#: MPS clients per card on Volta and newer (NVIDIA's MPS guide); a card's split count is capped here.
MAX_CLIENTS = 48
#: A namespace is named after the pod UID and the container's position; the UID must be plain (a
#: Kubernetes UID is 36 lowercase hex digits and dashes), the name at most 63 characters.
_UID = re.compile(r"[0-9a-z-]{1,56}")


class MpsUnavailable(AllocationError):
    """The node is in MPS mode but its control daemon cannot enforce a slice now."""


def thread_percentage(grants: Sequence[Grant], *, core_limit: bool = True) -> int | None:
    """The one active-thread percentage of a container, None for no limit.

    HAMi books one ``gpucores`` value on each card of a container; should the grants differ, the
    smallest limit among them is taken (MPS has one value per client for all its cards, and handing
    out more than a grant is not ours to do). 0 (HAMi: no core limit), 100 and more, and
    ``core_limit=False`` (``disableCoreLimit``) mean no limit."""
    if not core_limit:
        return None
    limited = [g.cores for g in grants if 0 < g.cores < 100]
    return min(limited) if limited else None


def card_limits(grants: Sequence[Grant], *, core_limit: bool = True) -> tuple[CardLimit, ...]:
    """Per card, in grant order (a card granted twice keeps its first entry): the limits of the slice,
    as a namespace holds them (no thread limit is 100 there). Raises :class:`AllocationError` for a
    grant MPS cannot express (0 MiB) or a card UUID that cannot be written into a daemon command."""
    percentage = thread_percentage(grants, core_limit=core_limit) or 100
    seen: dict[str, CardLimit] = {}
    for grant in grants:
        if grant.uuid in seen:
            continue
        if grant.memory_mib < 1:
            raise AllocationError(
                f"card {grant.uuid} is granted {grant.memory_mib} MiB: MPS cannot limit a card to no memory"
            )
        try:
            seen[grant.uuid] = CardLimit(
                uuid=grant.uuid, memory_mib=grant.memory_mib, thread_percentage=percentage
            )
        except ValueError as exc:
            raise AllocationError(str(exc)) from exc
    return tuple(seen.values())


def memory_limit_env(limits: Sequence[CardLimit]) -> str:
    """``0=3000M,1=4000M``: each card's MiB by its ordinal in the container (grant order)."""
    return ",".join(f"{ordinal}={limit.memory_mib}M" for ordinal, limit in enumerate(limits))


def namespace_name(pod_uid: str, index: int) -> str:
    """The MPS namespace of one container: ``<pod uid>-<container index>`` (init containers first).

    One per container, not per pod: the containers of a pod may hold different slices (a namespace has
    one set of limits). Short on purpose: the daemon's socket path under it must stay within the
    ~107 bytes of a unix socket address. A UID that is not plain (lowercase letters, digits, ``-``, at
    most 56) is refused; :func:`namespace_pod` reads the UID back."""
    if not _UID.fullmatch(pod_uid) or not 0 <= index < 10**6:
        raise AllocationError(
            f"pod uid {pod_uid!r} cannot name an MPS namespace (lowercase letters, digits and - only)"
        )
    return f"{pod_uid}-{index}"


def namespace_pod(name: str) -> str | None:
    """The pod UID a :func:`namespace_name` was made from (None for another name)."""
    uid, dash, index = name.rpartition("-")
    if not dash or not index.isascii() or not index.isdigit() or not _UID.fullmatch(uid):
        return None
    return uid


def mps_answer(
    container: str,
    grants: Sequence[Grant],
    *,
    pipe_dir: PurePosixPath,
    shm_dir: PurePosixPath,
    namespaced: bool,
    core_limit: bool = True,
) -> ContainerAnswer:
    """The answer for one container: ``pipe_dir`` (host) is the daemon's pipe directory, or with
    ``namespaced`` the container's namespace directory; ``shm_dir`` the host directory the daemon sees
    as ``/dev/shm``. Example, per-client: grants (GPU-a 3000 MiB 30 %), (GPU-b 4000 MiB 30 %) →
    ``NVIDIA_VISIBLE_DEVICES=GPU-a,GPU-b``, ``CUDA_VISIBLE_DEVICES=GPU-a,GPU-b``,
    ``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=3000M,1=4000M``, ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=30``."""
    uuids = tuple(dict.fromkeys(g.uuid for g in grants))
    envs = {
        ENV_VISIBLE: ",".join(uuids),
        ENV_CUDA_VISIBLE: ",".join(uuids),
        ENV_PIPE: str(CONTAINER_PIPE_DIR),
    }
    limits = card_limits(grants, core_limit=core_limit)  # refuses what MPS cannot express, in both modes
    if not namespaced:
        envs[ENV_MEMORY] = memory_limit_env(limits)
        threads = thread_percentage(grants, core_limit=core_limit)
        if threads is not None:
            envs[ENV_THREADS] = str(threads)
    mounts = (
        MountSpec(container_path=str(CONTAINER_PIPE_DIR), host_path=str(pipe_dir), read_only=False),
        MountSpec(container_path=str(CONTAINER_SHM), host_path=str(shm_dir), read_only=False),
    )
    return ContainerAnswer(container=container, uuids=uuids, envs=envs, mounts=mounts)


def capped_split_count(count: int) -> int:
    """A card's split count on an MPS node: at most :data:`MAX_CLIENTS` containers share it."""
    return min(count, MAX_CLIENTS)
