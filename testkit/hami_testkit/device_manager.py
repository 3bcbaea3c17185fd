"""Kubelet's device manager as a device plugin sees it: the one kubelet model of the test kit.

Owns :class:`DeviceManager`, which admits a pod bound to its node the way kubelet does: for each
container (init containers first) and each resource a device plugin registered that the container asks
for, it picks that many free replica IDs (asking ``GetPreferredAllocation`` when the plugin offers it;
kubelet ignores a preference that is not a valid pick), calls ``Allocate`` with them (and
``PreStartContainer`` when the plugin requires it), then writes ``status.phase=Running``; a plugin that
refuses, or too few free IDs, fails the pod with ``UnexpectedAdmissionError`` and kubelet's message. It
keeps what each pod holds (:class:`Assigned`) and frees it when told the pod is gone or finished; it
admits one pod at a time and each pod (uid) once.

Two drivers use it: the kubelet stand-in of the embedded cluster
(:class:`hami_testkit.kubelet_standin.NodeKubelet`: the plugin over gRPC, pods from a watch) and the
integrity tests (``tests/integrity/parts.py``: the plugin's servicer called in-process, pods from the
world). The plugin is reached through :class:`PluginCalls`; the status write is handed in.

Simulation only; no I/O of its own. Must not import ``hami.kube``, ``webhook`` or ``nodeagent``.
"""

from __future__ import annotations

import asyncio
import datetime
from collections.abc import Awaitable, Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from hami import objects
from hami.kubeletapi import api_pb2

#: Writes a pod's status: ``(namespace, name) , status``.
SetStatus = Callable[[tuple[str, str], dict[str, Any]], Awaitable[None]]


class PluginRefused(Exception):
    """A device plugin's call failed (gRPC: the status code's name and the details)."""

    def __init__(self, code: str, details: str) -> None:
        super().__init__(f"code = {code} desc = {details}")
        self.code, self.details = code, details


class PluginCalls(Protocol):
    """The calls kubelet makes to one registered device plugin (each may raise :class:`PluginRefused`)."""

    @property
    def devices(self) -> Mapping[str, bool]:
        """Replica ID -> healthy, in the plugin's order (its last ``ListAndWatch`` answer)."""

    @property
    def options(self) -> Any:
        """The plugin's ``DevicePluginOptions``."""

    async def preferred(self, request: Any) -> Any:
        """``GetPreferredAllocation``."""

    async def allocate(self, request: Any) -> Any:
        """``Allocate``."""

    async def pre_start(self, request: Any) -> Any:
        """``PreStartContainer``."""


class AdmissionError(Exception):
    """The pod cannot be admitted on this node; the text is kubelet's status message."""


@dataclass
class Assigned:
    """What one admitted pod holds: replica IDs per (container, resource) and the plugin answers."""

    uid: str
    entries: list[dict[str, Any]] = field(default_factory=list)

    def ids(self) -> set[str]:
        return {i for entry in self.entries for i in entry["deviceIDs"]}


@dataclass(frozen=True)
class Admission:
    """How one admission ended: admitted, or failed with kubelet's message; the entries handed out."""

    admitted: bool
    message: str
    entries: tuple[dict[str, Any], ...]


class DeviceManager:
    """One node's device manager (see the module docstring).

    ``registered()`` names the resources a plugin registered (a container's other extended resources
    are plain node resources to kubelet); ``plugin_for(resource)`` is the plugin with devices for it
    (it may wait for one, and raises :class:`AdmissionError` when there is none).
    """

    def __init__(
        self,
        node: str,
        registered: Callable[[], Collection[str]],
        plugin_for: Callable[[str], Awaitable[PluginCalls]],
    ) -> None:
        self.node = node
        self._registered = registered
        self._plugin_for = plugin_for
        self.assigned: dict[tuple[str, str], Assigned] = {}
        self.admitted: set[tuple[str, str, str]] = set()  # (namespace, name, uid): each pod once
        self._one_at_a_time = asyncio.Lock()

    def release(self, key: tuple[str, str]) -> bool:
        """The pod is gone or finished: its IDs are free again. True when it held some."""
        return self.assigned.pop(key, None) is not None

    def in_use(self) -> set[str]:
        return {i for held in self.assigned.values() for i in held.ids()}

    async def admit(
        self,
        pod: Mapping[str, Any],
        set_status: SetStatus,
        *,
        before_each: Callable[[], Awaitable[None]] | None = None,
    ) -> Admission:
        """Admit ``pod`` (see the module docstring). ``before_each`` runs before each container's
        allocation (a driver without a watch brings the pods it holds up to date there)."""
        async with self._one_at_a_time:
            key = (objects.namespace(pod), objects.name(pod))
            held = Assigned(uid=objects.uid(pod))
            self.admitted.add((*key, held.uid))
            self.assigned[key] = held
            inits = list(objects.spec(pod).get("initContainers") or [])
            containers = [*inits, *(objects.spec(pod).get("containers") or [])]
            try:
                for container in containers:
                    for resource, count in device_requests(container).items():
                        if resource not in self._registered():
                            continue  # not a device-plugin resource (e.g. nvidia.com/gpumem)
                        if before_each is not None:
                            await before_each()
                        entry = await self._allocate(key, str(container["name"]), resource, count, held)
                        held.entries.append(entry)
            except AdmissionError as exc:
                self.release(key)
                await set_status(key, failed_status(str(exc)))
                return Admission(False, str(exc), tuple(held.entries))
            await set_status(key, running_status(pod, inits))
            return Admission(True, "", tuple(held.entries))

    async def _allocate(
        self, key: tuple[str, str], container: str, resource: str, count: int, held: Assigned
    ) -> dict[str, Any]:
        plugin = await self._plugin_for(resource)
        in_use = self.in_use() | held.ids()
        free = [i for i, healthy in plugin.devices.items() if healthy and i not in in_use]
        if len(free) < count:
            raise AdmissionError(
                f"Allocate failed due to requested number of devices unavailable for {resource}. "
                f"Requested: {count}, Available: {len(free)}, which is unexpected"
            )
        chosen = free[:count]
        try:
            if plugin.options.get_preferred_allocation_available:
                chosen = await self._preferred(plugin, free, count) or chosen
            request = api_pb2.AllocateRequest(
                container_requests=[api_pb2.ContainerAllocateRequest(devices_ids=chosen)]
            )
            answer = await plugin.allocate(request)
            if plugin.options.pre_start_required:
                await plugin.pre_start(api_pb2.PreStartContainerRequest(devices_ids=chosen))
        except PluginRefused as exc:
            raise AdmissionError(f"Allocate failed due to rpc error: {exc}, which is unexpected") from exc
        response = (
            answer.container_responses[0]
            if answer.container_responses
            else api_pb2.ContainerAllocateResponse()
        )
        return {
            "podUID": held.uid,
            "namespace": key[0],
            "pod": key[1],
            "containerName": container,
            "resourceName": resource,
            "deviceIDs": list(chosen),
            "envs": dict(response.envs),
            "annotations": dict(response.annotations),
            "mounts": [
                {"containerPath": m.container_path, "hostPath": m.host_path, "readOnly": m.read_only}
                for m in response.mounts
            ],
            "devices": [
                {"containerPath": d.container_path, "hostPath": d.host_path} for d in response.devices
            ],
        }

    async def _preferred(self, plugin: PluginCalls, free: list[str], count: int) -> list[str] | None:
        request = api_pb2.PreferredAllocationRequest(
            container_requests=[
                api_pb2.ContainerPreferredAllocationRequest(available_deviceIDs=free, allocation_size=count)
            ]
        )
        answer = await plugin.preferred(request)
        ids = list(answer.container_responses[0].deviceIDs) if answer.container_responses else []
        # kubelet ignores a preference that is not a valid pick
        return ids if len(ids) == count and set(ids) <= set(free) else None


def device_requests(container: Mapping[str, Any]) -> dict[str, int]:
    """Extended resources (``vendor/name`` with an integer count > 0) a container asks for; only those a
    device plugin registered are allocated (kubelet treats the others as plain node resources)."""
    resources = container.get("resources") or {}
    merged = {**(resources.get("requests") or {}), **(resources.get("limits") or {})}
    wanted: dict[str, int] = {}
    for name, value in merged.items():
        if "/" not in name or name.startswith(("kubernetes.io/", "hugepages-")):
            continue
        try:
            count = int(str(value))
        except ValueError:
            continue
        if count > 0:
            wanted[name] = count
    return wanted


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def running_status(pod: Mapping[str, Any], init: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """What kubelet reports once every container started: init containers completed, the others
    running and ready."""
    now = _now()
    containers = objects.spec(pod).get("containers") or []
    return {
        "phase": "Running",
        "hostIP": "127.0.0.1",
        "startTime": now,
        "conditions": [
            {"type": kind, "status": "True", "lastTransitionTime": now}
            for kind in ("PodScheduled", "Initialized", "ContainersReady", "Ready")
        ],
        "initContainerStatuses": [
            {
                "name": c["name"],
                "ready": True,
                "restartCount": 0,
                "image": c.get("image", ""),
                "state": {"terminated": {"exitCode": 0, "reason": "Completed", "finishedAt": now}},
            }
            for c in init
        ],
        "containerStatuses": [
            {
                "name": c["name"],
                "ready": True,
                "started": True,
                "restartCount": 0,
                "image": c.get("image", ""),
                "state": {"running": {"startedAt": now}},
            }
            for c in containers
        ],
    }


def failed_status(message: str) -> dict[str, Any]:
    """Kubelet's answer to a pod it cannot admit."""
    return {"phase": "Failed", "reason": "UnexpectedAdmissionError", "message": message}
