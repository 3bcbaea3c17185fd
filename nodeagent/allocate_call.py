"""Finish a pod's allocation when kubelet calls Allocate, then hand the node lock back.

Owns the Allocate hand-off of docs/protocol.md, "Allocate", "Node lock" and its checks
(docs/security.md, "The node agent's hand-out"): list this node's pods (one fresh list: below), pair
kubelet's call with the pod
it is admitting (``nodeagent.pairing``: the pod whose next waiting entry matches kubelet's card count;
ambiguous = fail closed, no card, a Warning Event on every candidate), refuse a grant that breaks a
hand-out rule (``nodeagent.handout``: our scheduler's pod, bound here, ``to-allocate`` equal to the
scheduler's record, only this node's registered cards), then take the next non-empty container entry of
``hami.io/vgpu-devices-to-allocate`` per kubelet container request, build envs and HAMi-core mounts (in
MIG mode ``nodeagent.mig`` makes and records the booked instances instead), blank the entry and patch the
annotation back; when no entry is left set ``bind-phase=success`` and release the lock. Before a card is
handed out, its enforcement now (``nodeagent.registrar.card_enforcement``, as the registration reports it)
must not be weaker than the kind bind recorded for it in ``hami.io/vgpu-enforcement``
(:class:`EnforcementDropped`; no readable record: no check). On an MPS-mode
node each container gets the MPS answer (``nodeagent.mps.rules``: pipe directory and shared memory
mounted, per-client limit envs, or with namespaces its own namespace opened on the daemon with the
limits of its grant first); with the control daemon down nothing is handed out (``MpsUnavailable``).
On any error with the pod known, set ``bind-phase=failed`` and release its lock (only on a pod waiting
for our grant here; release is owner-checked: a lock held by another pod stays) and remember its UID,
since kubelet rejects it. Either way an Event tells the pod's owner (``nodeagent.podevents``). Calls are
serialised: kubelet's request names no pod, so only one pod may be in flight per node. Also answers
GetPreferredAllocation's question, the paired pod's next cards (:meth:`Allocator.next_uuids`).
Pairing is always decided on one fresh list of the node's pods, never on the pod cache's view (a pod
bound moments before kubelet's call may not be in it yet: docs/node-agent.md, "Pod cache").
The rules are pure modules (``allocate_rules``, ``pairing``, ``handout``); this one does their I/O
(``nodeagent.mig`` its own, for the instances). Imports the codec and ``hami.kube``; must not import
grpc or pynvml.
"""

from __future__ import annotations

import asyncio
import logging
import shutil
import uuid as uuidlib
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from pathlib import Path, PurePosixPath
from typing import Any

from hami import objects
from hami.annotations import (
    POD_DEVICES_TO_ALLOCATE,
    POD_VGPU_ENFORCEMENT,
    AnnotationError,
    BindPhase,
    Enforcement,
    allocation_done,
    bind_annotations,
    blank_container,
    decode_pod_enforcement,
    encode_pod_devices,
    pending_container,
    read_pod_to_allocate,
)
from hami.core.enforcement import level_of
from hami.core.model import Device, DeviceMode, Grant, PodDevices
from hami.kube.client import KubeError
from hami.kube.nodelock import release_node_lock
from hami.kube.pods import patch_pod
from hami.kube.protocol import KubeApi
from hami.objects import pod_key
from nodeagent.allocate_rules import (
    AllocationError,
    Ambiguous,
    ContainerAnswer,
    HandoutRefused,
    PodMissing,
    container_envs,
    container_names,
    container_spec,
    hook_mounts,
)
from nodeagent.backends.base import EXCLUSIVE_PROCESS, Backend, BackendError, Card
from nodeagent.config import NodeSettings
from nodeagent.inventory import Inventory
from nodeagent.mig import allocate_mig
from nodeagent.mps.control import MpsControl
from nodeagent.mps.protocol import MpsError, MpsState
from nodeagent.mps.rules import MpsUnavailable, card_limits, mps_answer, namespace_name
from nodeagent.pairing import Pairing, Suspect, ambiguity, asked, pair, suspects
from nodeagent.podcache import ListedPods, NodePods
from nodeagent.podevents import AMBIGUOUS, FAILED, SUCCEEDED, PodEvents, failure_message, success_message
from nodeagent.registrar import build_registration, card_enforcement, hami_core_installed

log = logging.getLogger(__name__)

#: How many refused pod UIDs are remembered (kubelet rejects them; they are not suspects any more).
REFUSED_KEPT = 1024


class EnforcementDropped(AllocationError):
    """A granted card's enforcement is now below what bind recorded for the pod."""


def recorded_enforcement(pod: Mapping[str, Any]) -> dict[str, Enforcement]:
    """The kind of each granted card bind recorded in ``hami.io/vgpu-enforcement``; empty when the pod has
    no record (an older scheduler's or HAMi's bind) or an unreadable one (logged): nothing to hold to."""
    text = objects.annotations(pod).get(POD_VGPU_ENFORCEMENT)
    if text is None:
        return {}
    try:
        return decode_pod_enforcement(text)
    except AnnotationError as exc:
        namespace, name = pod_key(pod)
        log.warning("pod %s/%s: no enforcement record to hold the node to: %s", namespace, name, exc)
        return {}


def hold_to_record(
    where: str,
    grants: Sequence[Grant],
    recorded: Mapping[str, Enforcement],
    current: Mapping[str, Enforcement],
) -> None:
    """Raise :class:`EnforcementDropped` for the first granted card whose enforcement now (``current``;
    a card it does not list has ``none``) is at a lower level than its recorded kind; a card without a
    record is not checked."""
    for grant in grants:
        promised = recorded.get(grant.uuid)
        if promised is None:
            continue
        now = current.get(grant.uuid, Enforcement.NONE)
        if level_of(now) < level_of(promised):
            raise EnforcementDropped(
                f"{where}: card {grant.uuid} was placed with enforcement {promised.value} "
                f"({level_of(promised).word}), the node now has {now.value} ({level_of(now).word}); "
                f"the pod is not run under less than it was placed with ({POD_VGPU_ENFORCEMENT}): "
                "its controller makes it again and the scheduler places it where the enforcement holds"
            )


class Allocator:
    """The node's Allocate hand-off (one per agent)."""

    def __init__(
        self,
        *,
        api: KubeApi,
        node_name: str,
        settings: NodeSettings,
        hook_path: Path | None = None,
        lock_dir: Path = Path("/tmp/vgpulock"),
        backend: Backend | None = None,
        events: PodEvents | None = None,
        inventory: Inventory | None = None,
        scheduler_name: str = "hami-scheduler",
        mps: MpsControl | None = None,
        pods: NodePods | None = None,
    ) -> None:
        self._api, self._node, self._settings = api, node_name, settings
        self._pods = pods if pods is not None else ListedPods(api, node_name)
        self._inventory, self._scheduler = inventory, scheduler_name
        self.events = events if events is not None else PodEvents(api)
        self._backend = backend  # makes the MIG instances in MIG mode; the cards when there is no inventory
        self._hook, self._lock_dir = hook_path, lock_dir
        self._mps = mps  # the node's MPS control daemon (MPS mode only)
        self._serial = asyncio.Lock()
        self._refused: OrderedDict[str, None] = OrderedDict()

    # ------------------------------------------------------------------------------------ pairing
    async def _cards(self) -> tuple[Card, ...]:
        """This node's cards as last discovered (the inventory's, else the backend's now)."""
        if self._inventory is not None:
            return self._inventory.cards
        if self._backend is not None:
            return tuple(await asyncio.to_thread(self._backend.cards))
        return ()

    async def registered(self) -> dict[str, Device]:
        """This node's cards as the registrar registers them (filtered cards left out), by UUID."""
        return {d.uuid: d for d in build_registration(await self._cards(), (), self._settings).devices}

    async def _pair(self, pods: Sequence[Mapping[str, Any]], counts: Sequence[int]) -> Pairing:
        found = suspects(
            pods,
            node=self._node,
            scheduler=self._scheduler,
            resource=self._settings.resource_name,
            registered=await self.registered(),
            mode=self._settings.mode,
            refused=self._refused,
        )
        return pair(found, counts)

    async def pairing(self, counts: Sequence[int]) -> Pairing:
        """Which pod a call for ``counts`` cards per container is for (``nodeagent.pairing``); read-only.

        Always decided on one fresh list of the node's pods, never on the cache: a pod bound moments
        before kubelet's call, not yet delivered by the watch, could otherwise leave the cache showing
        one pod cleanly waiting where the API server has two (the hand-out must fail closed, ambiguous)
        or serve a pod out of bind order (docs/node-agent.md, "Pod cache")."""
        return await self._pair((await self._pods.listed()).pods, counts)

    async def next_uuids(self, sizes: Sequence[int] = (1,)) -> tuple[str, ...]:
        """Cards of the next container Allocate will serve (GetPreferredAllocation's hint); () when the
        call cannot be paired with a pod whose grant is served. Read-only; never raises."""
        try:
            chosen = (await self.pairing(sizes)).chosen
        except (KubeError, ValueError, BackendError) as exc:
            log.info("preferred allocation on node %s without a pod hint: %s", self._node, exc)
            return ()
        if chosen is None or chosen.problem is not None or not chosen.matches(sizes):
            return ()
        return tuple(g.uuid for g in chosen.next_grants(1)[0])

    async def _paired(self, counts: Sequence[int]) -> Suspect:
        """The pod kubelet is admitting; raises PodMissing / Ambiguous (with Events) / AllocationError."""
        try:
            found = await self.pairing(counts)
        except (KubeError, ValueError, BackendError) as exc:
            raise AllocationError(
                f"node {self._node}: cannot tell which pod is being admitted: {exc}"
            ) from exc
        if found.chosen is not None:
            return found.chosen
        if not found.candidates:
            raise PodMissing(
                f"no pod bound to node {self._node} is waiting for its GPUs "
                f"(kubelet asked for {asked(counts)})"
            )
        message = ambiguity(self._node, counts, found.candidates)
        log.warning("%s", message)
        for candidate in found.candidates:
            self.events.record(candidate.pod, AMBIGUOUS, message, warning=True)
        raise Ambiguous(message)

    # ------------------------------------------------------------------------------------ allocate
    async def allocate(self, requests: Sequence[Sequence[str]]) -> list[ContainerAnswer]:
        """Answer kubelet's ``Allocate`` (one list of replica ids per container)."""
        async with self._serial:
            chosen = await self._paired([len(ids) for ids in requests])
            pod = chosen.pod
            namespace, name = pod_key(pod)
            try:
                if chosen.problem is not None:
                    raise HandoutRefused(
                        f"pod {namespace}/{name} on node {self._node} gets no card: {chosen.problem}"
                    )
                served, remaining = self._take(pod, requests)
                recorded = recorded_enforcement(pod)
                if recorded and self._settings.mode != DeviceMode.MPS.value:  # MPS: per container
                    current = await self._current_enforcement(None)
                    for index, grants in served:
                        hold_to_record(self._where(pod, index), grants, recorded, current)
                if self._settings.mode == DeviceMode.MIG.value:
                    answers = await allocate_mig(
                        api=self._api,
                        backend=self._backend,
                        node=self._node,
                        pod=pod,
                        served=served,
                        pods=self._pods,
                    )
                elif self._settings.mode == DeviceMode.MPS.value:
                    answers = [
                        await self._answer_mps(pod, index, grants, recorded) for index, grants in served
                    ]
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
                await self._fail(chosen, exc)
                self.events.record(
                    pod, FAILED, failure_message(self._node, exc, recorded=chosen.ours), warning=True
                )
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

    def _where(self, pod: Mapping[str, Any], index: int) -> str:
        """``pod ns/name on node n: container c gets no card`` (the start of a refusal)."""
        namespace, name = pod_key(pod)
        names = container_names(pod)
        container = names[index] if index < len(names) else f"#{index}"
        return f"pod {namespace}/{name} on node {self._node}: container {container} gets no card"

    async def _current_enforcement(self, mps: MpsState | None) -> dict[str, Enforcement]:
        """Each registered card's enforcement now, by the registrar's own rule
        (``nodeagent.registrar.card_enforcement``): the HAMi-core library read from disk again; in MPS
        mode ``mps``, the daemon's answer for this container, and the cards' compute modes as last
        discovered."""
        cards = await self._cards()
        devices = build_registration(cards, (), self._settings).devices
        hami_core = await asyncio.to_thread(hami_core_installed, self._hook)
        exclusive = {c.uuid for c in cards if c.compute_mode == EXCLUSIVE_PROCESS}
        return card_enforcement(devices, hami_core=hami_core, mps=mps, exclusive=exclusive)

    def _answer(self, pod: Mapping[str, Any], index: int, grants: tuple[Grant, ...]) -> ContainerAnswer:
        """HAMi-core mode: the real card uuids, the limit envs and the HAMi-core mounts."""
        namespace, name = pod_key(pod)
        names = container_names(pod)
        container = names[index] if index < len(names) else f"#{index}"
        uid = objects.uid(pod) or f"{namespace}-{name}"
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

    async def _answer_mps(
        self,
        pod: Mapping[str, Any],
        index: int,
        grants: tuple[Grant, ...],
        recorded: Mapping[str, Enforcement],
    ) -> ContainerAnswer:
        """MPS mode: the daemon is asked first (a slice it cannot enforce is not handed out, nor one it
        enforces less strongly than bind ``recorded``); with namespaces the container's own namespace is
        opened with its limits, else the limits travel in the container's environment
        (``nodeagent.mps.rules``)."""
        names = container_names(pod)
        container = names[index] if index < len(names) else f"#{index}"
        where = self._where(pod, index)
        if self._mps is None:
            raise MpsUnavailable(f"{where}: the node is in MPS mode but the agent runs no MPS control daemon")
        state = await self._mps.check()
        if not state.running:
            raise MpsUnavailable(
                f"{where}: the MPS control daemon is down ({state.detail}), and a slice it cannot enforce "
                "is not handed out"
            )
        if recorded:  # the answer below follows this same state: held to the record with it
            hold_to_record(where, grants, recorded, await self._current_enforcement(state))
        core_limit = not self._settings.device.disable_core_limit
        limits = card_limits(grants, core_limit=core_limit)  # AllocationError: MPS cannot express it
        pipe = PurePosixPath(self._mps.pipe_dir)
        if state.namespaces:
            uid = objects.uid(pod) or ""
            try:
                pipe = await self._mps.open_namespace(namespace_name(uid, index), limits)
            except MpsError as exc:
                raise MpsUnavailable(f"{where}: its MPS namespace could not be opened: {exc}") from exc
        return mps_answer(
            container,
            grants,
            pipe_dir=pipe,
            shm_dir=PurePosixPath(self._mps.shm_dir),
            namespaced=state.namespaces,
            core_limit=core_limit,
        )

    def _prepare_container_dir(self, uid: str, container: str) -> Path:
        """HAMi-core's per-container cache dir, recreated empty and world-writable on every Allocate.

        Its name comes from the pod (uid, container name): one that is not a plain file name (a ``/``,
        a NUL; kube-apiserver allows neither) is refused, so the directory emptied is always one entry
        of ``<hook>/vgpu/containers``."""
        assert self._hook is not None
        entry = f"{uid}_{container}"
        if "/" in entry or "\0" in entry:
            raise AllocationError(
                f"cannot make HAMi-core's directory for container {container!r} of pod uid {uid!r}: "
                "not a plain file name"
            )
        path = self._hook / "vgpu" / "containers" / entry
        shutil.rmtree(path, ignore_errors=True)
        path.mkdir(parents=True)
        path.chmod(0o777)
        self._lock_dir.mkdir(parents=True, exist_ok=True)
        self._lock_dir.chmod(0o777)
        return path

    async def _fail(self, chosen: Suspect, cause: BaseException) -> None:
        """Kubelet rejects the pod: remember it; on our own bookkeeping mark it failed and release its
        lock (each step best effort: the cause is what matters)."""
        namespace, name = pod_key(chosen.pod)
        log.error("allocation of pod %s/%s on node %s failed: %s", namespace, name, self._node, cause)
        uid = objects.uid(chosen.pod)
        if uid:
            self._refused[uid] = None
            while len(self._refused) > REFUSED_KEPT:
                self._refused.popitem(last=False)
        if not chosen.ours:
            return  # not waiting for our grant here: nothing of ours to undo on it
        try:
            await patch_pod(self._api, namespace, name, annotations=bind_annotations(BindPhase.FAILED))
        except KubeError as exc:
            log.error("could not mark pod %s/%s failed: %s", namespace, name, exc)
        try:
            await release_node_lock(self._api, self._node, namespace, name)
        except KubeError as exc:
            log.error("could not release the lock of node %s for %s/%s: %s", self._node, namespace, name, exc)
