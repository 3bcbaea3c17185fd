"""SIMULATION ONLY: kube-scheduler's DefaultPreemption (its PostFilter) as far as an extender sees it.

Owns :class:`PreemptionStandIn`, which :class:`~hami_testkit.scheduler_standin.SchedulerStandIn` runs for
a pod no node took, in kube-scheduler's order (``pkg/scheduler/framework/preemption`` and the
``defaultpreemption`` plugin):

1. **eligible?** not with ``preemptionPolicy: Never``, nor while a pod it preempted on its
   ``status.nominatedNodeName`` is still terminating (``DisruptionTarget`` condition, being deleted);
2. **candidate nodes**: only nodes whose failure removing pods may resolve (the extender's
   ``FailedNodes``; its ``FailedAndUnresolvableNodes`` and the stand-in's own exclusions are
   ``Preemption is not helpful for scheduling``) that hold a pod of lower ``spec.priority``
   (else ``No preemption victims found for incoming pod``). kube-scheduler's own plugins would
   pick the victims here, but the GPU resources are ``ignoredByScheduler`` and the stand-in's
   plugins (Ready, unschedulable, nodeSelector) do not depend on pods: every candidate gets an empty
   victim list, as kube-scheduler hands a node that only an extender rejected to the preempt
   extender since kubernetes#135486 (before it, such a node was dropped with ``expected at least
   one victim pod``);
3. **the extender's** ``/preempt``: ``ExtenderPreemptionArgs`` with ``NodeNameToMetaVictims`` (by uid,
   ``nodeCacheCapable: true``) or ``NodeNameToVictims`` (full pods); the answer's uids are looked up
   among the pods bound to that node, a missing one or a node with no victim failing the whole
   attempt (the extender is not ``ignorable``), as kube-scheduler does;
4. **one node** (:func:`pick_one_node`): fewest PDB violations, lowest priority of the first victim
   (kube-scheduler reads ``Pods[0]`` as the highest), lowest sum of priorities, fewest victims, the
   latest earliest start time among the highest-priority victims; the first node by name on a tie
   (kube-scheduler: map order);
5. **nominate** the preemptor (``status.nominatedNodeName``), then **evict** each victim: the
   ``DisruptionTarget`` condition (reason ``PreemptionByScheduler``), the delete, and a ``Normal``
   ``Preempted`` Event on the victim, ``Preempted by pod <uid> on node <node>``, with the preemptor as
   its ``related`` object; lower-priority pods nominated to that node lose their nomination. Each
   eviction is recorded (:attr:`PreemptionStandIn.preemptions`, by victim, and
   :attr:`PreemptionStandIn.preempted_for`, by preemptor) for the demo's table.

The scheduler stand-in retries the preemptor when the victims' deletions reach its watch. The pure
rules (eligibility, the messages, the node order) are :mod:`hami_testkit.preemption_rules`.
Must not import ``hami.scheduler``, ``webhook``, ``nodeagent`` or the Kubernetes client.
"""

from __future__ import annotations

import contextlib
import datetime
import logging
import time
from collections.abc import Awaitable, Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from hami import objects
from hami_testkit.kubeapi import ApiError, JsonDict, SimApi, pods_path
from hami_testkit.preemption_rules import (
    DISRUPTION_TARGET,
    NO_CANDIDATE,
    NO_VICTIMS,
    NOT_HELPFUL,
    PREEMPTION_BY_SCHEDULER,
    Candidate,
    Victim,
    eligible,
    nodes_message,
    pick_one_node,
    victim,
)

logger = logging.getLogger("hami_testkit.preemption_standin")


#: POSTs one extender verb and returns the decoded answer (the scheduler stand-in's ``_post``).
Post = Callable[[str, Mapping[str, Any]], Awaitable[Any]]


class PreemptionError(Exception):
    """kube-scheduler's preemption failed with an error (the attempt is retried with backoff)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Nominated:
    """Preemption worked: the preemptor is nominated to ``node``; ``victims`` were evicted."""

    node: str
    victims: tuple[Victim, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class NotNominated:
    """Preemption cannot help; ``message`` goes after the FailedScheduling text (``preemption: ...``);
    ``clear``: no node could take the pod even with preemption, so its nomination goes."""

    message: str
    clear: bool = False


Outcome = Nominated | NotNominated


@dataclass(frozen=True, slots=True, kw_only=True)
class Preemption:
    """One pod evicted by preemption: for whom (``namespace/name``, uid), on which node, with whom."""

    victim: Victim
    preemptor: str
    preemptor_uid: str
    preemptor_priority: int
    node: str


# ------------------------------------------------------------------------------------ the flow


class PreemptionStandIn:
    """The PostFilter step of the kube-scheduler stand-in (see the module docstring)."""

    def __init__(
        self,
        api: SimApi,
        post: Post,
        *,
        scheduler_name: str,
        extender_url: str,
        verb: str = "preempt",
        node_cache_capable: bool = True,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._api = api
        self._post = post
        self._scheduler_name = scheduler_name
        self._url = extender_url
        self._verb = verb
        self._meta = node_cache_capable
        self._clock = clock
        #: victim ``namespace/name`` -> its preemption; a preemptor's ``namespace/name`` -> its victims
        self.preemptions: dict[str, Preemption] = {}
        self.preempted_for: dict[str, tuple[Preemption, ...]] = {}

    async def preempt(
        self,
        pod: JsonDict,
        nodes: Collection[str],
        resolvable: Collection[str],
        pods: Iterable[JsonDict],
        event: Callable[..., Awaitable[None]],
    ) -> Outcome:
        """Run the flow for ``pod``, which no node of ``nodes`` took; ``resolvable`` are the nodes the
        extender said removing pods may help; ``pods`` every pod the stand-in knows; ``event`` writes a
        pod Event (the scheduler stand-in's). Raises :class:`PreemptionError` on the extender's errors."""
        by_node: dict[str, list[JsonDict]] = {}
        for other in pods:
            node = objects.node_name(other)
            if node and not objects.finished(other):
                by_node.setdefault(node, []).append(other)
        nominated = str(objects.status(pod).get("nominatedNodeName") or "")
        why = eligible(pod, by_node.get(nominated, []) if nominated else [])
        if why:
            return NotNominated(message=why)
        own = objects.priority(pod)
        statuses = {node: NOT_HELPFUL for node in nodes}
        now = self._clock()
        candidates: list[str] = []
        for node in sorted(set(resolvable) & set(nodes)):
            if any(objects.priority(p) < own for p in by_node.get(node, [])):
                candidates.append(node)
            else:
                statuses[node] = NO_VICTIMS
        if not candidates:
            return NotNominated(message=nodes_message(len(nodes), statuses), clear=True)
        chosen = pick_one_node(await self._extender(pod, candidates, by_node, now))
        if chosen is None:
            return NotNominated(message=NO_CANDIDATE)
        await self._nominate(pod, chosen.node)
        for gone in chosen.victims:
            await self._evict(pod, chosen.node, by_node[chosen.node], gone, event)
        await self._clear_lower_nominations(own, chosen.node, pods)
        return Nominated(node=chosen.node, victims=chosen.victims)

    def _record(self, pod: JsonDict, node: str, gone: Victim) -> None:
        preemptor = f"{objects.namespace(pod)}/{objects.name(pod)}"
        record = Preemption(
            victim=gone,
            preemptor=preemptor,
            preemptor_uid=objects.uid(pod),
            preemptor_priority=objects.priority(pod),
            node=node,
        )
        self.preemptions[gone.key] = record
        self.preempted_for[preemptor] = (*self.preempted_for.get(preemptor, ()), record)

    async def _extender(
        self, pod: JsonDict, candidates: Sequence[str], by_node: Mapping[str, list[JsonDict]], now: float
    ) -> list[Candidate]:
        """``/preempt`` with every candidate's (empty) victim list; the answer as candidates."""
        empty: dict[str, Any] = {"Pods": [], "NumPDBViolations": 0}
        field = "NodeNameToMetaVictims" if self._meta else "NodeNameToVictims"
        try:
            reply = await self._post(
                self._verb, {"Pod": pod, field: {node: dict(empty) for node in candidates}}
            )
        except Exception as exc:
            raise PreemptionError(f"preempt: {exc}") from exc
        if not isinstance(reply, Mapping):
            raise PreemptionError(f"preempt: expected an ExtenderPreemptionResult, got {str(reply)[:200]}")
        answer = reply.get("NodeNameToMetaVictims") or {}
        if not isinstance(answer, Mapping):
            raise PreemptionError(f"preempt: NodeNameToMetaVictims is not an object: {str(answer)[:200]}")
        found: list[Candidate] = []
        for node, victims in answer.items():
            listed = victims.get("Pods") if isinstance(victims, Mapping) else None
            if not listed:
                raise PreemptionError(f'expected at least one victim pod on node "{node}"')
            on_node = {objects.uid(p): p for p in by_node.get(str(node), [])}
            chosen: list[Victim] = []
            for meta in listed:
                uid = str(meta.get("UID", "")) if isinstance(meta, Mapping) else ""
                if uid not in on_node:
                    raise PreemptionError(
                        f"extender: {self._url} claims to preempt pod (UID: {uid}) on node: {node}, "
                        "but the pod is not found on that node"
                    )
                chosen.append(victim(on_node[uid], now))
            pdb = victims.get("NumPDBViolations") if isinstance(victims, Mapping) else 0
            found.append(
                Candidate(
                    node=str(node), victims=tuple(chosen), pdb_violations=pdb if isinstance(pdb, int) else 0
                )
            )
        return found

    async def _nominate(self, pod: JsonDict, node: str) -> None:
        namespace, name = objects.namespace(pod), objects.name(pod)
        with contextlib.suppress(ApiError):
            await self._api.merge_patch(
                pods_path(namespace, name, "status"), {"status": {"nominatedNodeName": node}}
            )

    async def _evict(
        self,
        preemptor: JsonDict,
        node: str,
        on_node: Sequence[JsonDict],
        gone: Victim,
        event: Callable[..., Awaitable[None]],
    ) -> None:
        pod = next((p for p in on_node if objects.uid(p) == gone.uid), None)
        if pod is None or objects.meta(pod).get("deletionTimestamp"):
            return  # already being deleted: kube-scheduler sends nothing more
        condition = {
            "type": DISRUPTION_TARGET,
            "status": "True",
            "reason": PREEMPTION_BY_SCHEDULER,
            "message": f"{self._scheduler_name}: preempting to accommodate a higher priority pod",
            "lastTransitionTime": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        }
        others = [
            c
            for c in objects.status(pod).get("conditions") or []
            if isinstance(c, Mapping) and c.get("type") != DISRUPTION_TARGET
        ]
        path = pods_path(gone.namespace, gone.name)
        try:
            await self._api.merge_patch(f"{path}/status", {"status": {"conditions": [*others, condition]}})
            await self._api.delete(path)
        except ApiError as exc:
            if exc.status != 404:
                raise PreemptionError(f"preempting {gone.key}: {exc}") from exc
            return  # already gone
        self._record(preemptor, node, gone)
        logger.info(
            "%s/%s preempted %s on %s", objects.namespace(preemptor), objects.name(preemptor), gone.key, node
        )
        await event(
            pod,
            "Normal",
            "Preempted",
            f"Preempted by pod {objects.uid(preemptor)} on node {node}",
            action="Preempting",
            related=preemptor,
        )

    async def _clear_lower_nominations(self, own: int, node: str, pods: Iterable[JsonDict]) -> None:
        """Lower-priority pods nominated to ``node`` may no longer fit there: their nomination goes."""
        for other in list(pods):
            if objects.status(other).get("nominatedNodeName") == node and objects.priority(other) < own:
                with contextlib.suppress(ApiError):
                    await self._api.merge_patch(
                        pods_path(objects.namespace(other), objects.name(other), "status"),
                        {"status": {"nominatedNodeName": None}},
                    )
