"""SIMULATION ONLY: the part of kube-scheduler that drives a scheduler extender.

The embedded cluster has no kube-scheduler. :class:`SchedulerStandIn` watches pods and nodes and,
for each pending pod whose ``spec.schedulerName`` is our profile (one pod at a time, the highest
``spec.priority`` first, then the oldest, as kube-scheduler's PrioritySort queue), does what
kube-scheduler does with an extender configured ``nodeCacheCapable: true``: keep the nodes its own
plugins would keep (Ready, schedulable, ``nodeSelector`` matches), POST ``/filter`` with node names
only (a pod with ``status.nominatedNodeName`` first with that node alone, as kube-scheduler tries
the nominated node first), POST ``/prioritize`` when more than one node is left (highest weighted
score wins; ties go to the first node the filter returned instead of a random one, so runs repeat),
then *assume* the pod on that node and POST ``/bind`` in a task of its own (kube-scheduler's binding
cycle, a goroutine per pod) while the next pod is scheduled: an assumed pod is not tried again and counts
on its node for preemption; a failed bind *forgets* it (an ``AssignedPod/Delete`` event for the parked
pods, as kube-scheduler's ``handleBindingCycleError`` sends) and retries it after its backoff. At most
:data:`MAX_BINDING` binds are in flight; ``background_binds=False`` waits for each bind before the next
pod instead. Stopping :meth:`SchedulerStandIn.run` cancels and awaits every bind in flight. The JSON is
the extender v1 shape (Go field names). Which nodes go to ``/filter`` follows kube-scheduler's
``percentageOfNodesToScore`` (``percentage_of_nodes_to_score``; 100, the default, is what our chart
renders): its in-tree filters walk the nodes (sorted by name) from a start index that rotates across
attempts and stop once :func:`feasible_nodes_to_find` nodes passed; only those are sent, and the start
moves on by the nodes the walk processed (kept or dropped), as ``findNodesThatPassFilters`` and
``nextStartNodeIndex`` do (the nominated node is still tried alone first). Below 100 a pod that fits
few nodes can be refused for a sample that missed them and placed on a later attempt, as kube-scheduler
does (docs/install.md, "Scheduling on large clusters"). When no node takes the pod, kube-scheduler's
DefaultPreemption runs (:mod:`hami_testkit.preemption_standin`: the extender's
``/preempt``, victims evicted, the pod nominated; :attr:`SchedulerStandIn.preemption` records who
was preempted for whom). An unschedulable pod gets the ``PodScheduled`` condition and a
``FailedScheduling`` event and waits in the *unschedulable pool* the way kube-scheduler's queue keeps
it (docs/scheduler.md, "Waking pending pods"): the attempt records its *rejectors* (kube-scheduler's
``UnschedulablePlugins``: :data:`EXTENDER` when the extender's filter failed some node, the in-tree plugin
whose check dropped a node otherwise) and the pod is retried only when a cluster event that one of its
rejectors registers for arrives (:func:`requeues`), after its backoff, or when it has waited
``flush_after`` seconds (kube-scheduler's ``podMaxInUnschedulablePodsDuration``, 5 minutes there). Events:
a node added or updated (allocatable, labels, taints or ``spec.unschedulable``, conditions,
annotations, each its own kind), an assigned pod deleted or finished (the scheduler's pod informer
drops terminal pods, so finishing reaches it as a Delete), and an update of the parked pod itself; an
assigned pod's annotation change reaches no parked pod. ``queueing_hints`` chooses kube-scheduler's
``SchedulerQueueingHints`` gate: on, the pod's own update requeues it only when a rejector registered
for pod updates (:data:`EXTENDER` does); off, any change outside its status requeues it. The event
that moved each pod is kept in :attr:`SchedulerStandIn.requeues`. An error (extender down, bind
refused, preemption failed) is retried with exponential backoff, as a rejection with no rejectors is.

With ``warn_other_schedulers`` (the embedded cluster, where this is the only scheduler), a pending pod
that names another scheduler (``default-scheduler`` for a pod HAMi's webhook left alone: one asking for
no GPU) gets one Warning Event, reason :data:`NO_SCHEDULER`, saying that no such scheduler runs here
and the pod stays Pending; nothing binds it.
Must not import ``hami.scheduler``, ``webhook``, ``nodeagent`` or the Kubernetes client.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
from collections import Counter, deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import aiohttp

from hami import objects
from hami.annotations import NODE_HANDSHAKE, NODE_LOCK
from hami_testkit.events import pod_event
from hami_testkit.kubeapi import ApiError, JsonDict, SimApi, nodes_path, pods_path
from hami_testkit.preemption_standin import Nominated, NotNominated, PreemptionError, PreemptionStandIn

logger = logging.getLogger("hami_testkit.scheduler_standin")

#: How many binding cycles may be in flight at once. kube-scheduler has no cap (a goroutine per pod); the
#: stand-in's binds share one aiohttp session with its watches, its ``/filter`` calls and the other
#: in-process stand-ins (aiohttp's default: 100 connections), and a bind past that limit would wait for a
#: connection inside aiohttp, where it could starve the scheduling cycle's own calls. At the cap the
#: scheduling cycle waits for a bind to finish (counted in :attr:`SchedulerStandIn.bind_waits`).
MAX_BINDING = 32
#: kube-scheduler's ``minFeasibleNodesToFind``: it looks for at least this many feasible nodes (every node,
#: in a smaller cluster), whatever ``percentageOfNodesToScore`` says.
MIN_FEASIBLE_NODES = 100
#: kube-scheduler's ``minFeasibleNodesPercentageToFind``: the floor of its adaptive percentage.
MIN_FEASIBLE_PERCENTAGE = 5
#: The reason of the Warning Event for a pod whose scheduler does not run in the embedded cluster.
NO_SCHEDULER = "NoScheduler"
#: Who writes that Event (no kube-scheduler would: it is the embedded cluster telling the user).
CLUSTER_COMPONENT = "embedded-cluster"

#: Node annotations that change on every heartbeat or bind (they are events all the same).
_VOLATILE = frozenset({NODE_HANDSHAKE, NODE_LOCK})

#: kube-scheduler's name among a pod's ``UnschedulablePlugins`` when an extender failed some node
#: (``framework.ExtenderName``); it registers every event with a hint that always says Queue.
EXTENDER = "Extender"
#: The in-tree plugins whose checks the stand-in makes itself, and the node events each registers for
#: (with queueing hints on; off, the Node/Add registrants also get UpdateNodeTaint and UpdateNodeLabel).
_NODE_PLUGIN_EVENTS: dict[str, frozenset[str]] = {
    "TaintToleration": frozenset({"Add", "UpdateNodeTaint", "UpdateNodeCondition"}),  # not-ready taint
    "NodeUnschedulable": frozenset({"Add", "UpdateNodeTaint"}),
    "NodeAffinity": frozenset({"Add", "UpdateNodeLabel"}),
}
#: The stand-in's rejector for a cluster without nodes. kube-scheduler answers ``ErrNoNodesAvailable``
#: (no rejector: retried after its backoff); the stand-in parks the pod until a node is added instead,
#: so pods waiting for a cluster's first node are then tried in queue order.
NO_NODES = "NoNodes"
_NODE_PLUGIN_EVENTS[NO_NODES] = frozenset({"Add"})
_QHINTS_OFF_EXTRA = frozenset({"UpdateNodeTaint", "UpdateNodeLabel"})
#: Which plugin dropped a node, by the stand-in's reason.
_REASON_PLUGIN = {
    "node(s) were not ready": "TaintToleration",
    "node(s) were unschedulable": "NodeUnschedulable",
    "node(s) didn't match Pod's node affinity/selector": "NodeAffinity",
}


def requeues(
    rejectors: Iterable[str], resource: str, actions: Iterable[str], *, queueing_hints: bool
) -> bool:
    """Whether kube-scheduler's queue moves a parked pod with these rejectors on this event.

    ``resource`` is ``Node``, ``AssignedPod`` or ``UnschedulablePod`` (the parked pod's own update);
    ``actions`` the event's action types (``Add``, ``Delete``, ``Update``, ``UpdateNodeAnnotation``, ...).
    No rejectors: the pod was never parked (it waits out its backoff). With queueing hints off, the
    pod's own update requeues it whenever it changed outside its status (the caller decides that).
    """
    names = set(rejectors)
    if not names or EXTENDER in names:
        return True  # Extender registers every resource with action All
    if resource == "UnschedulablePod":
        return not queueing_hints
    if resource != "Node":
        return False  # the stand-in's in-tree checks read nodes only
    acts = set(actions)
    for name in names:
        registered = _NODE_PLUGIN_EVENTS.get(name, frozenset())
        if not queueing_hints and "Add" in registered:
            registered = registered | _QHINTS_OFF_EXTRA
        if acts & registered:
            return True
    return False


def feasible_nodes_to_find(percentage: int, nodes: int) -> int:
    """kube-scheduler's ``numFeasibleNodesToFind``: after how many feasible nodes (of ``nodes``) its in-tree
    filters stop. Every node below :data:`MIN_FEASIBLE_NODES`; else ``percentage`` of them (0: adaptive,
    ``50 - nodes/125`` percent, at least :data:`MIN_FEASIBLE_PERCENTAGE`), at least
    :data:`MIN_FEASIBLE_NODES`: 144 of 300 nodes, 420 of 1,000 adaptively."""
    if nodes < MIN_FEASIBLE_NODES:
        return nodes
    if percentage == 0:
        percentage = max(50 - nodes // 125, MIN_FEASIBLE_PERCENTAGE)
    return max(nodes * percentage // 100, MIN_FEASIBLE_NODES)


def checked_percentage(value: object) -> int:
    """``percentage_of_nodes_to_score`` as kube-scheduler's validation takes it: an integer 0..100."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 100:
        raise ValueError(
            f"percentage_of_nodes_to_score must be an integer from 0 (adaptive) to 100, not {value!r}"
        )
    return value


@dataclass(frozen=True, slots=True)
class Sample:
    """What kube-scheduler's in-tree filters made of the nodes for one attempt."""

    nodes: list[str]  # the feasible nodes found, in walk order: what /filter is sent
    excluded: Counter[str]  # why the processed nodes they dropped were dropped
    start: int  # where the walk began
    processed: int  # how many nodes it looked at (kept or dropped)
    total: int  # how many nodes there were
    nominated_passes: bool  # the pod's nominated node passes the in-tree filters


#: The order pods entered the scheduling queue (first seen, or queued again after a failed attempt).
_QUEUE_ORDER = itertools.count()


@dataclass(slots=True)
class Attempt:
    """The last scheduling attempt of one pod (by uid)."""

    kind: Literal["unschedulable", "error", "binding", "bound"]
    message: str
    generation: int  # the cluster generation the attempt saw
    retry_at: float  # loop time after which the pod is tried again regardless of changes
    failed_nodes: dict[str, str] = field(default_factory=dict)
    node: str = ""
    failures: int = 0  # consecutive errors (or unschedulable attempts), for the backoff
    nominated: str = ""  # the node preemption nominated it to (victims evicted there)
    rejectors: frozenset[str] = frozenset()  # kube-scheduler's UnschedulablePlugins
    requeued: str = ""  # the event that moved it out of the unschedulable pool ("" while parked)
    backoff_until: float = 0.0  # loop time before which a requeued pod is not tried
    #: kube-scheduler's queue timestamp, as an order: the attempt was made (its pod queued again) now
    queued: int = field(default_factory=lambda: next(_QUEUE_ORDER))


class SchedulerStandIn:
    """kube-scheduler's extender loop over the embedded apiserver (see the module docstring)."""

    def __init__(
        self,
        api: SimApi,
        session: aiohttp.ClientSession,
        extender_url: str,
        *,
        scheduler_name: str = "hami-scheduler",
        http_timeout: float = 30.0,
        backoff: tuple[float, float] = (0.2, 5.0),
        flush_after: float = 60.0,
        queueing_hints: bool = True,
        preempt_verb: str = "preempt",
        node_cache_capable: bool = True,
        warn_other_schedulers: bool = False,
        background_binds: bool = True,
        max_binding: int = MAX_BINDING,
        percentage_of_nodes_to_score: int = 100,
    ) -> None:
        if max_binding < 1:
            raise ValueError(f"max_binding must be at least 1, not {max_binding}")
        #: kube-scheduler's percentageOfNodesToScore (0: adaptive); see :func:`feasible_nodes_to_find`.
        self.percentage_of_nodes_to_score = checked_percentage(percentage_of_nodes_to_score)
        self._next_start = 0  # kube-scheduler's nextStartNodeIndex
        self._api = api
        self._session = session
        self._url = extender_url.rstrip("/")
        self.scheduler_name = scheduler_name
        self._timeout = aiohttp.ClientTimeout(total=http_timeout)
        self._backoff = backoff
        self._flush_after = flush_after
        self.queueing_hints = queueing_hints
        #: (pod ident, event label, loop time) for every pod an event moved out of the pool, newest last.
        self.requeues: deque[tuple[str, str, float]] = deque(maxlen=4096)
        #: The pod being tried (by ident) and the events that arrived meanwhile (kube-scheduler's in-flight
        #: events: a rejection is requeued at once when one of them would have moved it).
        self._inflight: tuple[str, list[tuple[str, tuple[str, ...]]]] | None = None
        self.pods: dict[tuple[str, str], JsonDict] = {}  # insertion order = arrival order
        self.nodes: dict[str, JsonDict] = {}
        self._fingerprints: dict[str, Any] = {}
        self.generation = 0
        self.attempts: dict[str, Attempt] = {}  # by pod uid (or ns/name when the pod has none)
        self._arrived: dict[str, int] = {}  # by pod ident: the queue order of its first sight
        self._changed = asyncio.Event()
        self.calls: Counter[str] = Counter()  # verb -> how many requests were sent
        self._background = background_binds
        self._max_binding = max_binding
        #: How often the scheduling cycle waited because ``max_binding`` binds were in flight.
        self.bind_waits = 0
        self._binds: set[asyncio.Task[Attempt]] = set()  # the binding cycles in flight
        self._group: asyncio.TaskGroup | None = None  # run()'s: the binding cycles' tasks end with it
        self._warn_others = warn_other_schedulers
        self._warned: set[str] = set()  # pods (by uid) told that their scheduler does not run here
        self.preemption = PreemptionStandIn(
            api,
            self._post,
            scheduler_name=scheduler_name,
            extender_url=self._url,
            verb=preempt_verb,
            node_cache_capable=node_cache_capable,
        )

    # ------------------------------------------------------------------------------- public view

    def attempt(self, pod: Mapping[str, Any]) -> Attempt | None:
        return self.attempts.get(_ident(pod))

    def settled(self, pod: Mapping[str, Any]) -> bool:
        """True when the pod is unschedulable and parked: no event moved it since it was last tried."""
        last = self.attempt(pod)
        return last is not None and last.kind == "unschedulable" and not last.requeued

    @property
    def binding(self) -> int:
        """How many binding cycles are in flight (pods assumed on a node, their ``/bind`` not answered)."""
        return len(self._binds)

    def requeued_by(self, pod: Mapping[str, Any]) -> list[str]:
        """The events that moved this pod out of the unschedulable pool, oldest first."""
        ident = _ident(pod)
        return [label for who, label, _ in self.requeues if who == ident]

    # ------------------------------------------------------------------------------- main loop

    async def run(self) -> None:
        """Watch and schedule until cancelled; cancelling it cancels and awaits every bind in flight."""
        try:
            async with asyncio.TaskGroup() as group:
                self._group = group
                group.create_task(self._watch_nodes(), name="standin-watch-nodes")
                group.create_task(self._watch_pods(), name="standin-watch-pods")
                group.create_task(self._loop(), name="standin-schedule")
        finally:
            self._group = None

    async def _loop(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            self._changed.clear()
            if len(self._binds) >= self._max_binding:
                self.bind_waits += 1
                await asyncio.wait(set(self._binds), return_when=asyncio.FIRST_COMPLETED)
                continue
            pod, wake_at = self._next(loop.time())
            if pod is None:
                delay = None if wake_at is None else max(wake_at - loop.time(), 0.0)
                # asyncio.timeout, not wait_for: on Python 3.11 wait_for returns the result instead of
                # raising when a cancel and the event arrive together, and the loop would outlive run()
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(delay):
                        await self._changed.wait()
                continue
            await self.schedule_one(pod)

    def _next(self, now: float) -> tuple[JsonDict | None, float | None]:
        """The pod due for an attempt with the highest priority, of those the one queued first, else when
        the next one becomes due. As kube-scheduler's PrioritySort: equal priorities go by the time the
        pod entered the queue, which a failed attempt renews (a pod tried and rejected goes behind the
        pods that arrived before its rejection and were never tried; by creation time instead, a burst's
        rejected pods were tried again and again ahead of the untried ones)."""
        wake_at: float | None = None
        due: JsonDict | None = None
        due_key: tuple[int, int] = (0, 0)
        for pod in self.pods.values():
            if not self._ours(pod):
                continue
            last = self.attempt(pod)
            if last is not None and last.kind in ("binding", "bound"):
                continue  # assumed (its bind in flight), or bound (the binding on its way through the watch)
            if (
                last is not None
                and last.kind == "unschedulable"
                and not last.requeued
                and now >= last.retry_at
            ):
                self._requeue(pod, last, "UnschedulableTimeout", now)
            if (
                last is None
                or (last.kind == "unschedulable" and last.requeued and now >= last.backoff_until)
                or (last.kind == "error" and now >= last.retry_at)
            ):
                order = last.queued if last is not None else self._arrived.get(_ident(pod), 0)
                key = (-objects.priority(pod), order)
                if due is None or key < due_key:
                    due, due_key = pod, key
                continue
            at = last.backoff_until if last.kind == "unschedulable" and last.requeued else last.retry_at
            wake_at = at if wake_at is None else min(wake_at, at)
        return (due, None) if due is not None else (None, wake_at)

    def _requeue(self, pod: Mapping[str, Any], last: Attempt, label: str, now: float) -> None:
        last.requeued = label
        self.requeues.append((_ident(pod), label, now))

    def _event_for_parked(self, resource: str, actions: Iterable[str], only: str | None = None) -> None:
        """Hand one cluster event to the parked pods (``only``: the pod whose own update it is)."""
        acts = tuple(actions)
        if not acts:
            return
        self.generation += 1
        now = asyncio.get_running_loop().time()
        label = f"{resource}/{'|'.join(acts)}"
        if self._inflight is not None and only in (None, self._inflight[0]):
            self._inflight[1].append((resource, acts))
        for pod in self.pods.values():
            last = self.attempt(pod)
            if last is None or last.kind != "unschedulable" or last.requeued:
                continue
            if only is not None and _ident(pod) != only:
                continue
            if requeues(last.rejectors, resource, acts, queueing_hints=self.queueing_hints):
                self._requeue(pod, last, label, now)
        self._changed.set()

    def _ours(self, pod: Mapping[str, Any]) -> bool:
        return (
            objects.scheduler_name(pod) == self.scheduler_name
            and not objects.node_name(pod)
            and (objects.pod_phase(pod) or "Pending") == "Pending"
            and not objects.meta(pod).get("deletionTimestamp")
        )

    # ------------------------------------------------------------------------------- one pod

    async def schedule_one(self, pod: JsonDict) -> Attempt:
        """One scheduling cycle for ``pod``; with background binds it returns once the pod is assumed
        (kind ``binding``), the bind going on in a task of its own."""
        namespace, name = objects.pod_key(pod)
        generation = self.generation
        previous = self.attempt(pod)
        sample = self._candidates(pod)
        self._inflight = (_ident(pod), [])
        try:
            return await self._try(pod, namespace, name, generation, previous, sample)
        finally:
            self._inflight = None

    async def _try(
        self,
        pod: JsonDict,
        namespace: str,
        name: str,
        generation: int,
        previous: Attempt | None,
        sample: Sample,
    ) -> Attempt:
        failures = previous.failures if previous is not None and previous.kind == "error" else 0
        try:
            feasible, failed, resolvable = await self._filter(pod, sample)
            if not feasible:
                outcome = await self.preemption.preempt(
                    pod, sorted(self.nodes), resolvable, self._with_assumed(), self._event
                )
                return await self._unschedulable(pod, generation, sample.excluded, failed, outcome)
            node = feasible[0] if len(feasible) == 1 else await self._prioritize(pod, feasible)
        except (_ExtenderError, PreemptionError, aiohttp.ClientError, TimeoutError, ValueError) as exc:
            return self._error(pod, failures, generation, exc)
        # kube-scheduler's assume: the pod is on the node in its cache from now on, and the binding cycle
        # runs on its own while the next pod is scheduled
        assumed = Attempt(
            kind="binding",
            message=f"assumed on {node}, binding",
            node=node,
            generation=generation,
            retry_at=float("inf"),
            failures=failures,
        )
        self.attempts[_ident(pod)] = assumed
        if not self._background or self._group is None:
            return await self._bind(pod, assumed)
        task = self._group.create_task(self._bind(pod, assumed), name=f"standin-bind-{namespace}/{name}")
        self._binds.add(task)
        task.add_done_callback(self._binds.discard)
        return assumed

    async def _bind(self, pod: JsonDict, assumed: Attempt) -> Attempt:
        """kube-scheduler's binding cycle for a pod assumed on ``assumed.node``: the extender's ``/bind``
        (it is the binder); on success the ``Scheduled`` Event, on failure
        :meth:`_forget` (kube-scheduler's ``handleBindingCycleError``)."""
        namespace, name = objects.pod_key(pod)
        node = assumed.node
        try:
            bound = await self._post(
                "bind",
                {
                    "PodName": name,
                    "PodNamespace": namespace,
                    "PodUID": objects.uid(pod),
                    "Node": node,
                },
            )
            if bound.get("Error"):
                raise _ExtenderError(f"bind to {node}: {bound['Error']}")
        except (_ExtenderError, aiohttp.ClientError, TimeoutError, ValueError) as exc:
            return self._forget(pod, assumed, exc)
        finally:
            self._changed.set()  # the loop looks again: a slot is free, and a failed pod has a retry time
        logger.info("%s/%s: bound to %s", namespace, name, node)
        message = f"Successfully assigned {namespace}/{name} to {node}"
        attempt = Attempt(
            kind="bound", message=message, node=node, generation=assumed.generation, retry_at=float("inf")
        )
        if self.attempts.get(_ident(pod)) is assumed:  # else the pod was deleted meanwhile
            self.attempts[_ident(pod)] = attempt
        await self._event(pod, "Normal", "Scheduled", attempt.message)
        return attempt

    def _forget(self, pod: JsonDict, assumed: Attempt, exc: Exception) -> Attempt:
        """The bind failed: the assumed pod leaves its node (for the parked pods an ``AssignedPod/Delete``
        event, as the room it held is free again) and waits out its backoff, as any error does."""
        attempt = self._error(pod, assumed.failures, assumed.generation, exc, record=False)
        if self.attempts.get(_ident(pod)) is not assumed:
            return attempt  # the pod was deleted meanwhile: nothing to requeue
        self.attempts[_ident(pod)] = attempt
        self._event_for_parked("AssignedPod", ["Delete"])
        return attempt

    def _error(
        self, pod: JsonDict, errors: int, generation: int, exc: Exception, *, record: bool = True
    ) -> Attempt:
        """An error (extender down, bind refused, preemption failed) after ``errors`` consecutive ones:
        retried after a backoff that doubles with each."""
        failures = errors + 1
        delay = min(self._backoff[0] * 2 ** (failures - 1), self._backoff[1])
        namespace, name = objects.pod_key(pod)
        logger.info("%s/%s: scheduling error (retry in %.1fs): %s", namespace, name, delay, exc)
        attempt = Attempt(
            kind="error",
            message=str(exc),
            generation=generation,
            retry_at=asyncio.get_running_loop().time() + delay,
            failures=failures,
        )
        if record:
            self.attempts[_ident(pod)] = attempt
        return attempt

    def _with_assumed(self) -> list[JsonDict]:
        """Every pod the stand-in knows, an assumed one on its node (kube-scheduler's cache)."""
        out: list[JsonDict] = []
        for pod in self.pods.values():
            last = self.attempt(pod)
            if last is not None and last.kind == "binding" and not objects.node_name(pod):
                pod = {**pod, "spec": {**(pod.get("spec") or {}), "nodeName": last.node}}
            out.append(pod)
        return out

    async def _filter(self, pod: JsonDict, sample: Sample) -> tuple[list[str], dict[str, str], set[str]]:
        """``/filter``: the feasible nodes, every failed node's reason, and the nodes whose failure
        removing pods may resolve (``FailedNodes``). A nominated node that passes the in-tree filters is
        asked alone first (kube-scheduler's ``evaluateNominatedNode``: taken, no walk is made and the start
        index stays); else the sample, the start index moved on past the nodes its walk processed."""
        nominated = str(objects.status(pod).get("nominatedNodeName") or "")
        reply: Mapping[str, Any] | None = None
        if sample.nominated_passes:
            reply = await self._filter_call(pod, [nominated])
            if nominated in [str(n) for n in reply.get("NodeNames") or []]:
                return [nominated], {}, set()
        if sample.total:
            self._next_start = (sample.start + sample.processed) % sample.total
        if not sample.nodes:
            return [], {}, set()
        if reply is None or sample.nodes != [nominated]:  # the lone nominated node is not asked twice
            reply = await self._filter_call(pod, sample.nodes)
        resolvable = {str(n): str(r) for n, r in (reply.get("FailedNodes") or {}).items()}
        failed = {**resolvable, **(reply.get("FailedAndUnresolvableNodes") or {})}
        return [str(n) for n in reply.get("NodeNames") or []], failed, set(resolvable)

    async def _filter_call(self, pod: JsonDict, names: list[str]) -> Mapping[str, Any]:
        reply = await self._post("filter", {"Pod": pod, "Nodes": None, "NodeNames": names})
        if not isinstance(reply, Mapping):
            raise _ExtenderError(f"filter: expected an ExtenderFilterResult, got {str(reply)[:200]}")
        if reply.get("Error"):
            raise _ExtenderError(f"filter: {reply['Error']}")
        return reply

    def _candidates(self, pod: Mapping[str, Any]) -> Sample:
        """kube-scheduler's ``findNodesThatPassFilters``: its own filters over the nodes (sorted by name)
        from the start index on, until :func:`feasible_nodes_to_find` nodes passed; why the processed
        others were dropped. The start index moves only once the sample is used (:meth:`_filter`)."""
        selector = (pod.get("spec") or {}).get("nodeSelector") or {}
        names = sorted(self.nodes)
        total = len(names)
        to_find = feasible_nodes_to_find(self.percentage_of_nodes_to_score, total)
        start = self._next_start % total if total else 0
        kept: list[str] = []
        excluded: Counter[str] = Counter()
        processed = 0
        while len(kept) < to_find and processed < total:
            name = names[(start + processed) % total]
            processed += 1
            reason = _dropped(self.nodes[name], selector)
            if reason:
                excluded[reason] += 1
            else:
                kept.append(name)
        nominated = str(objects.status(pod).get("nominatedNodeName") or "")
        nominated_passes = nominated in self.nodes and not _dropped(self.nodes[nominated], selector)
        return Sample(kept, excluded, start, processed, total, nominated_passes)

    async def _prioritize(self, pod: JsonDict, feasible: list[str]) -> str:
        reply = await self._post("prioritize", {"Pod": pod, "Nodes": None, "NodeNames": feasible})
        if not isinstance(reply, list):
            raise _ExtenderError(f"prioritize: expected a HostPriorityList, got {str(reply)[:200]}")
        scores = {str(entry.get("Host")): int(entry.get("Score") or 0) for entry in reply}
        return max(feasible, key=lambda n: scores.get(n, 0))  # max() keeps the first of equal scores

    async def _unschedulable(
        self,
        pod: JsonDict,
        generation: int,
        excluded: Counter[str],
        failed: Mapping[str, str],
        preemption: Nominated | NotNominated | None = None,
    ) -> Attempt:
        reasons = Counter(excluded)
        for reason in failed.values():
            reasons[str(reason)] += 1
        summary = ", ".join(f"{count} {reason}" for reason, count in sorted(reasons.items()))
        message = f"0/{len(self.nodes)} nodes are available: {summary}."
        if isinstance(preemption, NotNominated):
            message += f" preemption: {preemption.message}."  # kube-scheduler's FitError adds the dot
        nominated = preemption.node if isinstance(preemption, Nominated) else ""
        previous = self.attempt(pod)
        loop = asyncio.get_running_loop()
        rejectors = frozenset(_REASON_PLUGIN.get(reason, reason) for reason in excluded)
        if failed:
            rejectors |= {EXTENDER}
        if not self.nodes:
            rejectors = frozenset({NO_NODES})
        failures = previous.failures + 1 if previous is not None and previous.kind == "unschedulable" else 1
        # kube-scheduler's backoff doubles from podInitialBackoffSeconds with each attempt; the stand-in
        # waives the first (pods rejected once and requeued by one event are then tried in queue order)
        backoff = 0.0 if failures == 1 else min(self._backoff[0] * 2 ** (failures - 2), self._backoff[1])
        attempt = Attempt(
            kind="unschedulable",
            message=message,
            generation=generation,
            retry_at=loop.time() + self._flush_after,
            failed_nodes=dict(failed),
            nominated=nominated,
            failures=failures,
            rejectors=rejectors,
            backoff_until=loop.time() + backoff,
        )
        if not rejectors:  # kube-scheduler's queue: no rejector, nothing to wait for but the backoff
            attempt.requeued = "ScheduleAttemptFailure"
        elif self._inflight is not None and self._inflight[0] == _ident(pod):
            for resource, acts in self._inflight[1]:  # an event that arrived while the pod was tried
                if requeues(rejectors, resource, acts, queueing_hints=self.queueing_hints):
                    attempt.requeued = f"{resource}/{'|'.join(acts)}"
                    self.requeues.append((_ident(pod), attempt.requeued, loop.time()))
                    break
        self.attempts[_ident(pod)] = attempt
        if previous is None or previous.message != message or nominated:
            namespace, name = objects.pod_key(pod)
            logger.info("%s/%s: unschedulable: %s", namespace, name, message)
            condition = {
                "type": "PodScheduled",
                "status": "False",
                "reason": "Unschedulable",
                "message": message,
            }
            status: dict[str, Any] = {"conditions": [condition]}
            if isinstance(preemption, NotNominated) and preemption.clear:
                status["nominatedNodeName"] = None
            with contextlib.suppress(ApiError):
                await self._api.merge_patch(pods_path(namespace, name, "status"), {"status": status})
            await self._event(pod, "Warning", "FailedScheduling", message)
        return attempt

    async def _post(self, verb: str, body: Mapping[str, Any]) -> Any:
        self.calls[verb] += 1
        async with self._session.post(f"{self._url}/{verb}", json=body, timeout=self._timeout) as response:
            if response.status != 200:
                raise _ExtenderError(f"{verb}: HTTP {response.status}: {(await response.text())[:300]}")
            return await response.json(content_type=None)

    async def _event(
        self,
        pod: Mapping[str, Any],
        kind: str,
        reason: str,
        message: str,
        *,
        action: str = "",
        related: Mapping[str, Any] | None = None,
    ) -> None:
        await pod_event(
            self._api,
            pod,
            kind,
            reason,
            message,
            component=self.scheduler_name,
            action=action,
            related=related,
        )

    # ------------------------------------------------------------------------------- watches

    async def _watch_nodes(self) -> None:
        async for kind, node in self._api.watch(nodes_path()):
            name = objects.name(node)
            if kind == "DELETED":
                self.nodes.pop(name, None)
                self._fingerprints.pop(name, None)
                self._bump()  # no plugin of ours registers Node/Delete; the generation moves all the same
                continue
            old = self.nodes.get(name)
            self.nodes[name] = node
            self._fingerprints[name] = _node_fingerprint(node)
            self._event_for_parked("Node", ["Add"] if old is None else node_update_actions(old, node))
            self._changed.set()

    async def _watch_pods(self) -> None:
        async for kind, pod in self._api.watch(pods_path()):
            key = objects.pod_key(pod)
            old = self.pods.get(key)
            if kind == "DELETED":
                self.pods.pop(key, None)
                self.attempts.pop(_ident(pod), None)
                self._arrived.pop(_ident(pod), None)
                self._warned.discard(_ident(pod))
                old_phase = ((old or pod).get("status") or {}).get("phase")
                if (pod.get("spec") or {}).get("nodeName") and old_phase not in objects.FINISHED_PHASES:
                    self._event_for_parked("AssignedPod", ["Delete"])  # its cards are free again
            else:
                self.pods[key] = pod
                self._arrived.setdefault(_ident(pod), next(_QUEUE_ORDER))
                phase = (pod.get("status") or {}).get("phase")
                old_phase = ((old or {}).get("status") or {}).get("phase")
                if objects.node_name(pod):
                    if phase in objects.FINISHED_PHASES and old_phase not in objects.FINISHED_PHASES:
                        # kube-scheduler's pod informer lists non-terminal pods only: leaving it is a Delete
                        self._event_for_parked("AssignedPod", ["Delete"])
                elif old is not None:
                    self._own_update(old, pod)
                if self._warn_others:
                    await self._warn_no_scheduler(pod)
            self._changed.set()

    async def _warn_no_scheduler(self, pod: JsonDict) -> None:
        named = objects.scheduler_name(pod) or "default-scheduler"
        if (
            named == self.scheduler_name
            or objects.node_name(pod)
            or (objects.pod_phase(pod) or "Pending") != "Pending"
            or objects.meta(pod).get("deletionTimestamp")
            or _ident(pod) in self._warned
        ):
            return
        self._warned.add(_ident(pod))
        message = (
            f'no scheduler named "{named}" runs in this embedded cluster: it runs "{self.scheduler_name}" '
            "only, for the pods HAMi's webhook sends to it (those asking for GPUs); this pod stays Pending"
        )
        logger.info("%s/%s: %s", *objects.pod_key(pod), message)
        await pod_event(self._api, pod, "Warning", NO_SCHEDULER, message, component=CLUSTER_COMPONENT)

    def _own_update(self, old: Mapping[str, Any], new: Mapping[str, Any]) -> None:
        """A pending pod changed: kube-scheduler's ``PriorityQueue.Update`` for a parked pod."""
        if not pod_updated(old, new):
            return
        if self.queueing_hints:
            actions = ["UpdatePodLabel"] if objects.labels(old) != objects.labels(new) else ["Update"]
        else:
            actions = ["Update"]
        self._event_for_parked("UnschedulablePod", actions, only=_ident(new))

    def _bump(self) -> None:
        self.generation += 1
        self._changed.set()


class _ExtenderError(Exception):
    """The extender answered with an error (or not in the expected shape)."""


def _dropped(node: Mapping[str, Any], selector: Mapping[str, Any]) -> str:
    """Why kube-scheduler's own filters drop ``node`` for a pod with this ``nodeSelector`` ("" if not)."""
    ready = any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in objects.status(node).get("conditions") or []
    )
    if not ready:
        return "node(s) were not ready"
    if (node.get("spec") or {}).get("unschedulable"):
        return "node(s) were unschedulable"
    labels = objects.labels(node)
    if any(labels.get(k) != v for k, v in selector.items()):
        return "node(s) didn't match Pod's node affinity/selector"
    return ""


def _ident(pod: Mapping[str, Any]) -> str:
    return objects.uid(pod) or f"{objects.namespace(pod)}/{objects.name(pod)}"


def pod_updated(old: Mapping[str, Any], new: Mapping[str, Any]) -> bool:
    """kube-scheduler's ``isPodUpdated``: the pod changed outside its status, resourceVersion,
    generation, managed fields and finalizers."""

    def strip(pod: Mapping[str, Any]) -> dict[str, Any]:
        meta = {
            k: v
            for k, v in (pod.get("metadata") or {}).items()
            if k not in ("resourceVersion", "generation", "managedFields", "finalizers")
        }
        return {**{k: v for k, v in pod.items() if k not in ("status", "metadata")}, "metadata": meta}

    return strip(old) != strip(new)


def node_update_actions(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[str]:
    """kube-scheduler's ``NodeSchedulingPropertiesChange``: the action types of one node update."""
    actions: list[str] = []
    old_spec, new_spec = old.get("spec") or {}, new.get("spec") or {}
    if bool(old_spec.get("unschedulable")) and not new_spec.get("unschedulable"):
        actions.append("UpdateNodeTaint")  # kube-scheduler reports spec.unschedulable -> false so
    if (objects.status(old).get("allocatable") or {}) != (objects.status(new).get("allocatable") or {}):
        actions.append("UpdateNodeAllocatable")
    if objects.labels(old) != objects.labels(new):
        actions.append("UpdateNodeLabel")
    if (old_spec.get("taints") or []) != (new_spec.get("taints") or []) and "UpdateNodeTaint" not in actions:
        actions.append("UpdateNodeTaint")

    def conditions(node: Mapping[str, Any]) -> dict[Any, Any]:
        return {c.get("type"): c.get("status") for c in objects.status(node).get("conditions") or []}

    if conditions(old) != conditions(new):
        actions.append("UpdateNodeCondition")
    if objects.annotations(old) != objects.annotations(new):
        actions.append("UpdateNodeAnnotation")
    return actions


def _node_fingerprint(node: Mapping[str, Any]) -> Any:
    annotations = {k: v for k, v in objects.annotations(node).items() if k not in _VOLATILE}
    status = objects.status(node)
    return (
        sorted(objects.labels(node).items()),
        sorted(annotations.items()),
        bool((node.get("spec") or {}).get("unschedulable")),
        sorted((status.get("allocatable") or {}).items()),
        sorted((c.get("type"), c.get("status")) for c in status.get("conditions") or []),
    )
