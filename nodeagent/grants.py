"""What the scheduler granted on this node, read back from the pods for the exporter.

Owns turning one pod's decoded ``hami.io/vgpu-devices-allocated`` into per-container
:class:`ContainerGrant` s with their container names, the per-card totals (the same collapse
(docs/protocol.md, "Usage") the scheduler applies, through ``hami.core.usage``), and :class:`GrantBook`, the
periodic pass over the node's pods (the agent's pod cache, ``nodeagent.podcache``: no API request while it is
synced) that keeps them fresh and remembers whose init containers already gave their cards back (sticky, as
the scheduler's view). Which pods hold cards here is the shared rule ``hami.annotations.holding`` with the
grant required, so the totals are exactly what the scheduler counts for the node's cards. Every
annotation is decoded by the shared codec; nothing here splits annotation text. Imports the codec, the
core and ``hami.kube``; must not import grpc, pynvml or the Kubernetes client.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from hami import objects
from hami.annotations import AnnotationError, read_pod_devices, read_pod_mig_allocations
from hami.annotations.holding import holding, init_containers_done
from hami.core.model import Device, DeviceState, NodeState
from hami.core.usage import PodUsage, apply_usage, pod_usage
from hami.kube.client import KubeError
from hami.kube.protocol import KubeApi
from nodeagent.podcache import ListedPods, NodePods

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True, kw_only=True)
class ContainerGrant:
    """One card granted to one container. ``vdevice_index`` is the card's position within the
    container (the order of ``NVIDIA_VISIBLE_DEVICES``, HAMi's ``vdevice_index``)."""

    container: str
    container_index: int  # init containers first, as in the annotation
    vdevice_index: int
    uuid: str
    memory_mib: int
    cores: int


@dataclass(frozen=True, slots=True, kw_only=True)
class PodGrants:
    """One tracked pod: its grants that still hold, their collapsed per-card usage, and its runtime
    container IDs (``containerd://<id>`` without the scheme) → container names, to attribute processes."""

    namespace: str
    name: str
    uid: str
    grants: tuple[ContainerGrant, ...]
    usage: PodUsage
    container_ids: Mapping[str, str] = field(default_factory=dict)
    init_done: bool = False  # its init containers gave their cards back


class TrackedPods(Protocol):
    """Where the exporter reads the tracked pods from (:class:`GrantBook` in the agent)."""

    @property
    def pods(self) -> tuple[PodGrants, ...]: ...


def read_pod_grants(
    pod: Mapping[str, Any], node: str | None = None, *, init_done_before: bool = False
) -> PodGrants | None:
    """The pod's grants that hold now; None when it holds no card (on ``node``, when given: the rule of
    ``hami.annotations.holding``). ``init_done_before``: its init containers were seen done earlier.

    Raises :class:`~hami.annotations.AnnotationError` (naming the key and text) for an unreadable
    annotation; the caller skips such a pod, as the scheduler does.
    """
    where = holding(pod).node
    if where is None or (node is not None and where != node):
        return None
    devices = read_pod_devices(pod)
    if devices is None:
        return None
    init = objects.init_containers(pod)
    names = [str(c.get("name", "")) for c in objects.containers_init_first(pod)]
    done = init_done_before or init_containers_done(pod)
    start = len(init) if done else 0
    grants = tuple(
        ContainerGrant(
            container=names[position] if position < len(names) else f"#{position}",
            container_index=position,
            vdevice_index=vdevice,
            uuid=grant.uuid,
            memory_mib=grant.memory_mib,
            cores=grant.cores,
        )
        for position, container in enumerate(devices)
        if position >= start
        for vdevice, grant in enumerate(container)
    )
    ids: dict[str, str] = {}
    for key in ("initContainerStatuses", "containerStatuses"):
        entries = objects.status(pod).get(key)
        for entry in entries if isinstance(entries, list) else []:
            if not isinstance(entry, Mapping):
                continue
            container_id = str(entry.get("containerID") or "")
            if container_id:
                ids[container_id.rpartition("://")[2]] = str(entry.get("name", ""))
    return PodGrants(
        namespace=objects.namespace(pod),
        name=objects.name(pod),
        uid=objects.uid(pod),
        grants=grants,
        usage=pod_usage(devices, len(init), init_done=done, mig=read_pod_mig_allocations(pod)),
        container_ids=ids,
        init_done=done,
    )


def card_totals(node: str, devices: Sequence[Device], pods: Iterable[PodGrants]) -> NodeState:
    """The node's registered cards with every tracked pod's collapsed usage added (slots, MiB, cores),
    exactly as the scheduler's snapshot counts them. Grants naming other cards are ignored."""
    state = NodeState(name=node, devices=tuple(DeviceState(device=d) for d in devices))
    for pod in pods:
        state = apply_usage(state, pod.usage)
    return state


class GrantBook:
    """The tracked pods of one node, refreshed by a periodic list (``run``; cancel it to stop).

    Reads the pods bound to the node (``pods``: the agent's cache; without one, a list of the node's pods
    each time, field selector re-checked client-side) and keeps those that hold
    cards here (:func:`read_pod_grants`). The tuple is replaced whole, so the exporter's scrape thread always
    reads one consistent list. A pod that cannot be read (an unreadable annotation, or any error reading
    it) is left out with a log line naming it; it never ends the loop, nor the agent.
    """

    def __init__(self, *, api: KubeApi, node_name: str, pods: NodePods | None = None) -> None:
        self._api, self._node = api, node_name
        self._source = pods if pods is not None else ListedPods(api, node_name)
        self._pods: tuple[PodGrants, ...] = ()
        self._init_done: set[str] = set()  # uids of listed pods whose init containers were seen done

    @property
    def pods(self) -> tuple[PodGrants, ...]:
        return self._pods

    async def refresh(self) -> tuple[PodGrants, ...]:
        """Read the node's pods now; raises :class:`~hami.kube.client.KubeError` when a list is needed and
        fails (the previous pods are kept)."""
        tracked = []
        listed: set[str] = set()
        for pod in (await self._source.view()).pods:
            uid = objects.uid(pod) or "/".join(objects.pod_key(pod))
            listed.add(uid)
            try:
                grants = read_pod_grants(pod, self._node, init_done_before=uid in self._init_done)
            except Exception as exc:  # one unreadable pod (AnnotationError, or an odd shape) is skipped
                reason = str(exc) if isinstance(exc, AnnotationError) else f"{type(exc).__name__}: {exc}"
                log.warning("pod %s/%s: not exported: %s", *objects.pod_key(pod), reason[:500])
                continue
            if grants is not None:
                tracked.append(grants)
                if grants.init_done:
                    self._init_done.add(uid)
        self._init_done &= listed
        self._pods = tuple(tracked)
        return self._pods

    async def run(self, interval: float) -> None:
        while True:
            try:
                await self.refresh()
            except KubeError as exc:
                log.warning(
                    "listing the pods of node %s failed (metrics keep the last list): %s", self._node, exc
                )
            await asyncio.sleep(interval)
