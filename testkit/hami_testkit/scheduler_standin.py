"""SIMULATION ONLY: the part of kube-scheduler that drives a scheduler extender.

The embedded cluster has no kube-scheduler. :class:`SchedulerStandIn` watches pods and nodes and,
for each pending pod whose ``spec.schedulerName`` is our profile (one pod at a time, the highest
``spec.priority`` first, then the oldest, as kube-scheduler's PrioritySort queue), does what
kube-scheduler does with an extender configured ``nodeCacheCapable: true``: keep the nodes its own
plugins would keep (Ready, schedulable, ``nodeSelector`` matches), POST ``/filter`` with node names
only (a pod with ``status.nominatedNodeName`` first with that node alone, as kube-scheduler tries
the nominated node first), POST ``/prioritize`` when more than one node is left (highest weighted
score wins; ties go to the first node the filter returned instead of a random one, so runs repeat),
then POST ``/bind``. The JSON is the extender v1 shape (Go field names). When no node takes the pod,
kube-scheduler's DefaultPreemption runs (:mod:`hami_testkit.preemption_standin`: the extender's
``/preempt``, victims evicted, the pod nominated; :attr:`SchedulerStandIn.preemption` records who
was preempted for whom). An unschedulable pod gets the ``PodScheduled`` condition and a
``FailedScheduling`` event, and is retried when the cluster changes (a node's labels, registration or
allocatable change, a node appears, a pod goes away) or after ``flush_after`` seconds; an error
(extender down, bind refused, preemption failed) is retried with exponential backoff.

With ``warn_other_schedulers`` (the embedded cluster, where this is the only scheduler), a pending pod
that names another scheduler (``default-scheduler`` for a pod HAMi's webhook left alone: one asking for
no GPU) gets one Warning Event, reason :data:`NO_SCHEDULER`, saying that no such scheduler runs here
and the pod stays Pending; nothing binds it.
Must not import ``hami.scheduler``, ``webhook``, ``nodeagent`` or the Kubernetes client.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import aiohttp

from hami import objects
from hami.annotations import NODE_HANDSHAKE, NODE_LOCK
from hami_testkit.events import pod_event
from hami_testkit.kubeapi import ApiError, JsonDict, SimApi, nodes_path, pods_path
from hami_testkit.preemption_standin import Nominated, NotNominated, PreemptionError, PreemptionStandIn

logger = logging.getLogger("hami_testkit.scheduler_standin")

#: The reason of the Warning Event for a pod whose scheduler does not run in the embedded cluster.
NO_SCHEDULER = "NoScheduler"
#: Who writes that Event (no kube-scheduler would: it is the embedded cluster telling the user).
CLUSTER_COMPONENT = "embedded-cluster"

#: Node annotations that change on every heartbeat or bind and do not change what fits.
_VOLATILE = frozenset({NODE_HANDSHAKE, NODE_LOCK})


@dataclass(slots=True)
class Attempt:
    """The last scheduling attempt of one pod (by uid)."""

    kind: Literal["unschedulable", "error", "bound"]
    message: str
    generation: int  # the cluster generation the attempt saw
    retry_at: float  # loop time after which the pod is tried again regardless of changes
    failed_nodes: dict[str, str] = field(default_factory=dict)
    node: str = ""
    failures: int = 0  # consecutive errors, for the backoff
    nominated: str = ""  # the node preemption nominated it to (victims evicted there)


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
        preempt_verb: str = "preempt",
        node_cache_capable: bool = True,
        warn_other_schedulers: bool = False,
    ) -> None:
        self._api = api
        self._session = session
        self._url = extender_url.rstrip("/")
        self.scheduler_name = scheduler_name
        self._timeout = aiohttp.ClientTimeout(total=http_timeout)
        self._backoff = backoff
        self._flush_after = flush_after
        self.pods: dict[tuple[str, str], JsonDict] = {}  # insertion order = arrival order
        self.nodes: dict[str, JsonDict] = {}
        self._fingerprints: dict[str, Any] = {}
        self.generation = 0
        self.attempts: dict[str, Attempt] = {}  # by pod uid (or ns/name when the pod has none)
        self._changed = asyncio.Event()
        self.calls: Counter[str] = Counter()  # verb -> how many requests were sent
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
        """True when the pod is unschedulable and nothing changed since it was last tried."""
        last = self.attempt(pod)
        return last is not None and last.kind == "unschedulable" and last.generation == self.generation

    # ------------------------------------------------------------------------------- main loop

    async def run(self) -> None:
        async with asyncio.TaskGroup() as group:
            group.create_task(self._watch_nodes(), name="standin-watch-nodes")
            group.create_task(self._watch_pods(), name="standin-watch-pods")
            group.create_task(self._loop(), name="standin-schedule")

    async def _loop(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            self._changed.clear()
            pod, wake_at = self._next(loop.time())
            if pod is None:
                delay = None if wake_at is None else max(wake_at - loop.time(), 0.0)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._changed.wait(), delay)
                continue
            await self.schedule_one(pod)

    def _next(self, now: float) -> tuple[JsonDict | None, float | None]:
        """The pod due for an attempt with the highest priority (the oldest of those), else when the
        next one becomes due."""
        wake_at: float | None = None
        due: JsonDict | None = None
        for pod in self.pods.values():
            if not self._ours(pod):
                continue
            last = self.attempt(pod)
            if last is not None and last.kind == "bound":
                continue  # the binding is on its way through the watch
            if (
                last is None
                or (last.kind == "unschedulable" and last.generation != self.generation)
                or now >= last.retry_at
            ):
                if due is None or objects.priority(pod) > objects.priority(due):
                    due = pod
                continue
            wake_at = last.retry_at if wake_at is None else min(wake_at, last.retry_at)
        return (due, None) if due is not None else (None, wake_at)

    def _ours(self, pod: Mapping[str, Any]) -> bool:
        return (
            objects.scheduler_name(pod) == self.scheduler_name
            and not objects.node_name(pod)
            and (objects.pod_phase(pod) or "Pending") == "Pending"
            and not objects.meta(pod).get("deletionTimestamp")
        )

    # ------------------------------------------------------------------------------- one pod

    async def schedule_one(self, pod: JsonDict) -> Attempt:
        namespace, name = objects.pod_key(pod)
        loop = asyncio.get_running_loop()
        generation = self.generation
        previous = self.attempt(pod)
        candidates, excluded = self._candidates(pod)
        try:
            feasible, failed, resolvable = await self._filter(pod, candidates)
            if not feasible:
                outcome = await self.preemption.preempt(
                    pod, sorted(self.nodes), resolvable, list(self.pods.values()), self._event
                )
                return await self._unschedulable(pod, generation, excluded, failed, outcome)
            node = feasible[0] if len(feasible) == 1 else await self._prioritize(pod, feasible)
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
        except (_ExtenderError, PreemptionError, aiohttp.ClientError, TimeoutError, ValueError) as exc:
            failures = previous.failures + 1 if previous is not None and previous.kind == "error" else 1
            delay = min(self._backoff[0] * 2 ** (failures - 1), self._backoff[1])
            logger.info("%s/%s: scheduling error (retry in %.1fs): %s", namespace, name, delay, exc)
            attempt = Attempt(
                kind="error",
                message=str(exc),
                generation=generation,
                retry_at=loop.time() + delay,
                failures=failures,
            )
            self.attempts[_ident(pod)] = attempt
            return attempt
        logger.info("%s/%s: bound to %s", namespace, name, node)
        message = f"Successfully assigned {namespace}/{name} to {node}"
        attempt = Attempt(
            kind="bound", message=message, node=node, generation=generation, retry_at=float("inf")
        )
        self.attempts[_ident(pod)] = attempt
        await self._event(pod, "Normal", "Scheduled", attempt.message)
        return attempt

    async def _filter(
        self, pod: JsonDict, candidates: list[str]
    ) -> tuple[list[str], dict[str, str], set[str]]:
        """``/filter``: the feasible nodes, every failed node's reason, and the nodes whose failure
        removing pods may resolve (``FailedNodes``). A nominated node is asked alone first."""
        if not candidates:
            return [], {}, set()
        nominated = str(objects.status(pod).get("nominatedNodeName") or "")
        if nominated in candidates and len(candidates) > 1:
            reply = await self._filter_call(pod, [nominated])
            if nominated in [str(n) for n in reply.get("NodeNames") or []]:
                return [nominated], {}, set()
        reply = await self._filter_call(pod, candidates)
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

    def _candidates(self, pod: Mapping[str, Any]) -> tuple[list[str], Counter[str]]:
        """Nodes kube-scheduler's own filters keep, sorted by name, and why the others were dropped."""
        selector = (pod.get("spec") or {}).get("nodeSelector") or {}
        kept: list[str] = []
        excluded: Counter[str] = Counter()
        for name in sorted(self.nodes):
            node = self.nodes[name]
            labels = objects.labels(node)
            ready = any(
                c.get("type") == "Ready" and c.get("status") == "True"
                for c in objects.status(node).get("conditions") or []
            )
            if not ready:
                excluded["node(s) were not ready"] += 1
            elif (node.get("spec") or {}).get("unschedulable"):
                excluded["node(s) were unschedulable"] += 1
            elif any(labels.get(k) != v for k, v in selector.items()):
                excluded["node(s) didn't match Pod's node affinity/selector"] += 1
            else:
                kept.append(name)
        return kept, excluded

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
        attempt = Attempt(
            kind="unschedulable",
            message=message,
            generation=generation,
            retry_at=loop.time() + self._flush_after,
            failed_nodes=dict(failed),
            nominated=nominated,
        )
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
                self._bump()
                continue
            self.nodes[name] = node
            fingerprint = _node_fingerprint(node)
            if self._fingerprints.get(name) != fingerprint:
                self._fingerprints[name] = fingerprint
                self._bump()
            self._changed.set()

    async def _watch_pods(self) -> None:
        async for kind, pod in self._api.watch(pods_path()):
            key = objects.pod_key(pod)
            old = self.pods.get(key)
            if kind == "DELETED":
                self.pods.pop(key, None)
                self.attempts.pop(_ident(pod), None)
                self._warned.discard(_ident(pod))
                if (pod.get("spec") or {}).get("nodeName"):
                    self._bump()  # its cards are free again
            else:
                self.pods[key] = pod
                phase = (pod.get("status") or {}).get("phase")
                old_phase = ((old or {}).get("status") or {}).get("phase")
                if phase in objects.FINISHED_PHASES and old_phase != phase:
                    self._bump()
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

    def _bump(self) -> None:
        self.generation += 1
        self._changed.set()


class _ExtenderError(Exception):
    """The extender answered with an error (or not in the expected shape)."""


def _ident(pod: Mapping[str, Any]) -> str:
    return objects.uid(pod) or f"{objects.namespace(pod)}/{objects.name(pod)}"


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
