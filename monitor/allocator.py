"""Finish a pod's allocation when kubelet calls Allocate, then hand the node lock back.

Owns the Allocate hand-off of spec-node-chart §A.9 / spec-scheduler §16: find the pod (the node lock's
owner when it is waiting here, else the first pending candidate on this node), take the first
non-empty container entry of ``hami.io/vgpu-devices-to-allocate`` per kubelet container request, check
the device count, build envs and HAMi-core mounts (in MIG mode ``monitor.mig`` makes and records the
booked instances instead), blank the entry and patch the annotation back; when
no entry is left set ``bind-phase=success`` and release the lock; on any error set
``bind-phase=failed`` and release it (release is owner-checked: a lock held by another pod stays).
Either way an Event tells the pod's owner (``monitor.podevents``: ``AllocationFailed`` with what to do,
``AllocationSucceeded`` once every container is served), written in the background so it never
delays or fails the answer. Calls are serialised: kubelet's request names no pod, so only one pod
may be in flight per node.
Imports the codec and ``hami.kube``; must not import grpc or pynvml.
"""

from __future__ import annotations

import asyncio
import logging
import shutil
import uuid as uuidlib
from collections.abc import Mapping, Sequence
from pathlib import Path, PurePosixPath
from typing import Any

from hami.annotations import (
    NODE_LOCK,
    POD_DEVICES_TO_ALLOCATE,
    AnnotationError,
    BindPhase,
    allocation_done,
    bind_annotations,
    blank_container,
    decode_node_lock,
    encode_pod_devices,
    pending_container,
    pod_annotations,
    read_pod_to_allocate,
)
from hami.core.model import DeviceMode, Grant, PodDevices
from hami.kube.client import KubeError, NotFound
from hami.kube.nodelock import release_node_lock
from hami.kube.nodes import get_node
from hami.kube.pods import get_pod, list_pods, patch_pod
from monitor.allocation import (
    AllocationError,
    ContainerAnswer,
    PodMissing,
    container_envs,
    container_names,
    container_spec,
    hook_mounts,
    is_candidate,
    pod_key,
)
from monitor.backends.base import Backend
from monitor.config import NodeSettings
from monitor.mig import allocate_mig
from monitor.podevents import FAILED, SUCCEEDED, PodEvents, failure_message, success_message

log = logging.getLogger(__name__)


class Allocator:
    """The node's Allocate hand-off (one per agent)."""

    def __init__(
        self,
        *,
        api: Any,
        node_name: str,
        settings: NodeSettings,
        hook_path: Path | None = None,
        lock_dir: Path = Path("/tmp/vgpulock"),
        backend: Backend | None = None,
        events: PodEvents | None = None,
    ) -> None:
        self._api, self._node, self._settings = api, node_name, settings
        self.events = events if events is not None else PodEvents(api)
        self._backend = backend  # makes the MIG instances in MIG mode
        self._hook, self._lock_dir = hook_path, lock_dir
        self._serial = asyncio.Lock()

    # ------------------------------------------------------------------------------------ find pod
    async def find_pod(self) -> dict[str, Any]:
        """The pod kubelet is admitting: the lock owner if it waits here, else the first candidate."""
        node = await get_node(self._api, self._node)
        lock = pod_annotations(node).get(NODE_LOCK)
        owner: tuple[str, str] | None = None
        if lock:
            try:
                held = decode_node_lock(lock)
            except AnnotationError:
                held = None
            if held is not None and held.namespace is not None and held.name is not None:
                owner = (held.namespace, held.name)
                try:
                    pod = await get_pod(self._api, *owner)
                except NotFound:
                    pod = None
                if pod is not None and is_candidate(pod, self._node):
                    return pod
        for pod in await list_pods(self._api, node_name=self._node):
            if is_candidate(pod, self._node):
                return pod
        held_by = f" (the node lock names {owner[0]}/{owner[1]}, which is not waiting here)" if owner else ""
        raise PodMissing(f"no pod bound to node {self._node} is waiting for its GPUs{held_by}")

    async def next_uuids(self) -> tuple[str, ...]:
        """Cards of the next container Allocate will serve (GetPreferredAllocation's hint); read-only."""
        pod = await self.find_pod()
        remaining = read_pod_to_allocate(pod) or ()
        index = pending_container(remaining)
        return () if index is None else tuple(g.uuid for g in remaining[index])

    # ------------------------------------------------------------------------------------ allocate
    async def allocate(self, requests: Sequence[Sequence[str]]) -> list[ContainerAnswer]:
        """Answer kubelet's ``Allocate`` (one list of replica ids per container)."""
        async with self._serial:
            pod = await self.find_pod()
            namespace, name = pod_key(pod)
            try:
                served, remaining = self._take(pod, requests)
                if self._settings.mode == DeviceMode.MIG.value:
                    answers = await allocate_mig(
                        api=self._api, backend=self._backend, node=self._node, pod=pod, served=served
                    )
                else:
                    answers = [self._answer(pod, index, grants) for index, grants in served]
                await patch_pod(
                    self._api,
                    namespace,
                    name,
                    annotations={POD_DEVICES_TO_ALLOCATE: encode_pod_devices(remaining)},
                )
                if allocation_done(remaining):
                    await patch_pod(
                        self._api, namespace, name, annotations=bind_annotations(BindPhase.SUCCESS)
                    )
                    await release_node_lock(self._api, self._node, namespace, name)
            except (AllocationError, KubeError, ValueError, OSError) as exc:
                await self._fail(namespace, name, exc)
                self.events.record(pod, FAILED, failure_message(self._node, exc), warning=True)
                if isinstance(exc, AllocationError):
                    raise
                raise AllocationError(
                    f"allocating pod {namespace}/{name} on node {self._node}: {exc}"
                ) from exc
            if allocation_done(remaining):
                served_uuids = [(a.container, a.uuids) for a in answers]
                self.events.record(pod, SUCCEEDED, success_message(self._node, pod, served_uuids))
            done = "complete" if allocation_done(remaining) else "more containers to come"
            log.info(
                "allocated pod %s/%s on node %s: %s (%s)",
                namespace,
                name,
                self._node,
                "; ".join(f"{a.container}={','.join(a.uuids)}" for a in answers),
                done,
            )
            return answers

    def _take(
        self, pod: Mapping[str, Any], requests: Sequence[Sequence[str]]
    ) -> tuple[list[tuple[int, tuple[Grant, ...]]], PodDevices]:
        """Pop one entry per kubelet container request: (container index, grants), and what is left."""
        namespace, name = pod_key(pod)
        where = f"pod {namespace}/{name} on node {self._node}"
        remaining = read_pod_to_allocate(pod)  # AnnotationError (a ValueError) names the key and text
        if remaining is None:
            raise AllocationError(f"{where}: annotation {POD_DEVICES_TO_ALLOCATE} is missing")
        names = container_names(pod)
        served = []
        for ids in requests:
            index = pending_container(remaining)
            if index is None:
                raise AllocationError(f"{where}: no container left in {POD_DEVICES_TO_ALLOCATE}")
            grants = remaining[index]
            container = names[index] if index < len(names) else f"#{index}"
            if len(grants) != len(ids):
                raise AllocationError(
                    f"{where}: device number not matched for container {container}: kubelet asked for "
                    f"{len(ids)}, {POD_DEVICES_TO_ALLOCATE} holds {len(grants)}"
                )
            served.append((index, grants))
            remaining = blank_container(remaining, index)
        return served, remaining

    def _answer(self, pod: Mapping[str, Any], index: int, grants: tuple[Grant, ...]) -> ContainerAnswer:
        """HAMi-core mode: the real card uuids, the limit envs and the HAMi-core mounts."""
        namespace, name = pod_key(pod)
        names = container_names(pod)
        container = names[index] if index < len(names) else f"#{index}"
        uid = str((pod.get("metadata") or {}).get("uid") or f"{namespace}-{name}")
        spec = container_spec(pod, index)
        mounts: tuple[Any, ...] = ()
        cache: str | None = None
        if self._hook is not None:
            container_dir = self._prepare_container_dir(uid, container)
            cache = str(PurePosixPath(self._hook) / "vgpu" / f"{uuidlib.uuid4()}.cache")
            mounts = hook_mounts(
                PurePosixPath(self._hook),
                PurePosixPath(container_dir),
                spec,
                lock_dir=str(self._lock_dir),
                licensed=(self._hook / "vgpu" / "license").exists(),
            )
        envs = container_envs(grants, spec, self._settings, cache_file=cache)
        uuids = tuple(dict.fromkeys(g.uuid for g in grants))
        return ContainerAnswer(container=container, uuids=uuids, envs=envs, mounts=mounts)

    def _prepare_container_dir(self, uid: str, container: str) -> Path:
        """HAMi-core's per-container cache dir, recreated empty and world-writable on every Allocate."""
        assert self._hook is not None
        path = self._hook / "vgpu" / "containers" / f"{uid}_{container}"
        shutil.rmtree(path, ignore_errors=True)
        path.mkdir(parents=True)
        path.chmod(0o777)
        self._lock_dir.mkdir(parents=True, exist_ok=True)
        self._lock_dir.chmod(0o777)
        return path

    async def _fail(self, namespace: str, name: str, cause: BaseException) -> None:
        """Mark the pod failed and release its lock; each step best effort (the cause is what matters)."""
        log.error("allocation of pod %s/%s on node %s failed: %s", namespace, name, self._node, cause)
        try:
            await patch_pod(self._api, namespace, name, annotations=bind_annotations(BindPhase.FAILED))
        except KubeError as exc:
            log.error("could not mark pod %s/%s failed: %s", namespace, name, exc)
        try:
            await release_node_lock(self._api, self._node, namespace, name)
        except KubeError as exc:
            log.error("could not release the lock of node %s for %s/%s: %s", self._node, namespace, name, exc)
