"""SIMULATION ONLY: kube-controller-manager's Deployment, ReplicaSet and Job controllers for the
embedded cluster, as far as a demo user needs them.

:class:`WorkloadStandIn` watches Deployments, ReplicaSets, Jobs and pods; any change wakes one loop that
reads the current objects back from the apiserver (so it never acts on a stale cache) and, in one pass:

1. runs the garbage collector (:mod:`hami_testkit.garbage_collector`): dependents of deleted owners go;
2. **Deployments**: the ReplicaSet whose template equals the Deployment's (the ``pod-template-hash``
   label ignored) is the new one; a missing one is created (``<deployment>-<hash>``, the hash label on
   its selector, template and labels, ``deployment.kubernetes.io/revision`` one above the old ones').
   ``Recreate`` scales the old sets to 0, waits for their pods to go, then sizes the new one;
   ``RollingUpdate`` (the default) takes kube's ``maxSurge``/``maxUnavailable`` steps
   (:func:`hami_testkit.workload_rules.rolling_step`); with no old pods left, ``spec.replicas`` (what
   ``kubectl scale`` writes) is given to the new set at once. Status: ``replicas``, ``updatedReplicas``,
   ``readyReplicas``, ``availableReplicas``, ``unavailableReplicas``, the ``Available`` and
   ``Progressing`` conditions (what ``kubectl rollout status`` reads);
3. **ReplicaSets**: create or delete pods until the active pods it controls equal ``spec.replicas``
   (unscheduled, Pending, not-ready and newest pods deleted first); status ``replicas``,
   ``readyReplicas``, ``availableReplicas``, ``fullyLabeledReplicas``;
4. **Jobs** the process Job stand-in does not run (:func:`hami_testkit.jobs.runs_as_process`, the one
   place that decides): :class:`hami_testkit.job_controller.JobController` (parallelism, completions,
   backoff, suspend, status; a started Job pod is written ``Succeeded``: no container runs here).

Every pod is created through the apiserver's create path like kubectl's
(:class:`hami_testkit.controller_writes.ControllerWrites`, shared with the Job controller), so admission runs
on it (the Priority plugin and the mutating webhooks: a GPU pod gets ``schedulerName: hami-scheduler``
from our webhook). Must not import ``hami.kube``, ``webhook`` or ``nodeagent``.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine, Mapping, Sequence
from typing import Any

import aiohttp

from hami import objects
from hami_testkit import workload_rules as rules
from hami_testkit.controller_writes import ControllerWrites, now, object_path
from hami_testkit.garbage_collector import GarbageCollector
from hami_testkit.job_controller import JobController
from hami_testkit.jobs import runs_as_process
from hami_testkit.kubeapi import ApiError, JsonDict, SimApi, pods_path
from hami_testkit.workload_rules import Counted

logger = logging.getLogger("hami_testkit.workloads_standin")

DEPLOYMENTS = "/apis/apps/v1/deployments"
REPLICASETS = "/apis/apps/v1/replicasets"
JOBS = "/apis/batch/v1/jobs"
#: the ``source.component`` of each controller's Events (kube's names)
RS_COMPONENT = "replicaset-controller"
DEPLOYMENT_COMPONENT = "deployment-controller"


#: the Deployment's Available condition: reason and message, by whether it has minimum availability
AVAILABLE = {
    True: ("MinimumReplicasAvailable", "Deployment has minimum availability."),
    False: ("MinimumReplicasUnavailable", "Deployment does not have minimum availability."),
}


def _progressing(done: bool, new: str) -> tuple[str, str]:
    if done:
        return "NewReplicaSetAvailable", f'ReplicaSet "{new}" has successfully progressed.'
    return "ReplicaSetUpdated", f'ReplicaSet "{new}" is progressing.'


class WorkloadStandIn:
    """Deployments, ReplicaSets and Jobs made into pods (see the module docstring)."""

    def __init__(
        self, api: SimApi, *, max_pass_writes: int = 500, backoff: tuple[float, float] = (0.2, 10.0)
    ) -> None:
        self._api = api
        self._backoff = backoff
        self._refused = False
        self._wake = asyncio.Event()
        self._writes = ControllerWrites(api, max_pass_writes)
        self.gc = GarbageCollector(api)
        self.jobs = JobController(api, self._writes)
        #: passes run so far (tests wait on progress)
        self.passes = 0

    async def run(self) -> None:
        """Watch and reconcile until cancelled."""
        async with asyncio.TaskGroup() as group:
            for path in (DEPLOYMENTS, REPLICASETS, JOBS, pods_path()):
                group.create_task(self._watch(path), name=f"workloads-watch {path}")
            group.create_task(self._loop(), name="workloads-reconcile")

    async def _watch(self, path: str) -> None:
        async for _, obj in self._api.watch(path):
            if path != pods_path() or objects.meta(obj).get("ownerReferences"):
                self._wake.set()

    async def _loop(self) -> None:
        failures = 0
        while True:
            await self._wake.wait()
            self._wake.clear()
            try:
                wrote = await self.reconcile()
            except (ApiError, aiohttp.ClientError) as exc:  # reading failed: the apiserver is going away
                logger.info("workloads: %s", exc)
                wrote, self._refused = False, True
            if self._refused:  # a write was refused: try again later, backing off as kube's queue does
                failures += 1
                await asyncio.sleep(min(self._backoff[0] * 2 ** (failures - 1), self._backoff[1]))
                self._wake.set()
                continue
            failures = 0
            if wrote:
                self._wake.set()  # something moved: look again (the watch would say so too)

    async def reconcile(self) -> bool:
        """One pass over the whole cluster; True when it wrote anything."""
        self.passes += 1
        self._refused = False
        # dependents before owners: a dependent read here has its live owner in the later reads
        pods = await self._api.list_objects(pods_path())
        replicasets = await self._api.list_objects(REPLICASETS)
        jobs = await self._api.list_objects(JOBS)
        deployments = await self._api.list_objects(DEPLOYMENTS)
        owners = [*deployments, *replicasets, *jobs]
        if await self._guard(self.gc.collect(owners=owners, dependents=[*replicasets, *pods]), "collect"):
            return True
        wrote = False
        for deployment in deployments:
            if not rules.deleting(deployment):
                step = self._deployment(deployment, rules.owned_by(deployment, replicasets), pods)
                wrote |= await self._guard(step, objects.name(deployment))
        for replicaset in replicasets:
            if not rules.deleting(replicaset):
                step = self._replicaset(replicaset, rules.owned_by(replicaset, pods))
                wrote |= await self._guard(step, objects.name(replicaset))
        for job in jobs:
            if not rules.deleting(job) and not runs_as_process(job):
                wrote |= await self._guard(
                    self.jobs.reconcile(job, rules.owned_by(job, pods)), objects.name(job)
                )
        return wrote

    async def _guard(self, step: Coroutine[Any, Any, bool], what: str) -> bool:
        """One object's step; a refused write (a conflict, an object gone, a webhook's denial) is logged
        and retried on a later pass, the other objects go on."""
        try:
            return await step
        except ApiError as exc:
            logger.info("workloads: %s: %s", what, exc)
            self._refused = True
            return True

    # ---------------------------------------------------------------------------- ReplicaSets

    async def _replicaset(self, replicaset: JsonDict, pods: Sequence[JsonDict]) -> bool:
        wanted = rules.whole(objects.spec(replicaset).get("replicas"), 1)
        live = [p for p in pods if rules.active(p)]
        wrote = False
        if len(live) < wanted:
            await self._writes.create_pods(replicaset, wanted - len(live), {}, RS_COMPONENT)
            wrote = True
        elif len(live) > wanted:
            doomed = rules.scale_down_order(live)[: len(live) - wanted]
            await self._writes.delete_pods(replicaset, doomed, RS_COMPONENT)
            wrote = True
        status = {
            "replicas": len(live),
            "fullyLabeledReplicas": len(live),
            "readyReplicas": sum(rules.ready(p) for p in live),
            "availableReplicas": sum(rules.ready(p) for p in live),
            "observedGeneration": objects.meta(replicaset).get("generation") or 1,
        }
        return await self._writes.status(replicaset, status) or wrote

    # ---------------------------------------------------------------------------- Deployments

    async def _deployment(self, deployment: JsonDict, sets: list[JsonDict], pods: Sequence[JsonDict]) -> bool:
        template = objects.spec(deployment).get("template") or {}
        replicas = rules.whole(objects.spec(deployment).get("replicas"), 1)
        new = next((s for s in sets if rules.without_hash(objects.spec(s).get("template") or {}) ==
                    rules.without_hash(template)), None)  # fmt: skip
        old = sorted(
            (s for s in sets if s is not new), key=lambda s: objects.meta(s).get("creationTimestamp") or ""
        )
        counted = {objects.name(s): self._count(s, pods) for s in sets}
        recreate = (objects.spec(deployment).get("strategy") or {}).get("type") == "Recreate"
        surge, unavailable = rules.surge_and_unavailable(deployment, replicas)
        if new is None:
            if recreate and any(counted[objects.name(s)].spec or counted[objects.name(s)].pods for s in old):
                return await self._scale_all(
                    deployment, {objects.name(s): 0 for s in old if counted[objects.name(s)].spec}, sets
                )
            size = (
                replicas
                if recreate
                else min(replicas, max(replicas + surge - sum(c.spec for c in counted.values()), 0))
            )
            await self._new_replicaset(deployment, template, old, size)
            return True
        name = objects.name(new)
        if recreate:
            if any(counted[objects.name(s)].spec for s in old):
                changes = {objects.name(s): 0 for s in old}
            else:
                changes = {} if any(counted[objects.name(s)].pods for s in old) else {name: replicas}
        else:
            changes = rules.rolling_step(
                replicas, surge, unavailable, counted[name], [counted[objects.name(s)] for s in old]
            )
        changes = {k: v for k, v in changes.items() if counted[k].spec != v}
        wrote = await self._scale_all(deployment, changes, sets)
        return await self._deployment_status(deployment, replicas, unavailable, counted, name) or wrote

    def _count(self, replicaset: JsonDict, pods: Sequence[JsonDict]) -> Counted:
        live = [p for p in rules.owned_by(replicaset, pods) if rules.active(p)]
        return Counted(
            name=objects.name(replicaset),
            spec=rules.whole(objects.spec(replicaset).get("replicas"), 1),
            pods=len(live),
            available=sum(rules.ready(p) for p in live),
        )

    async def _new_replicaset(
        self, deployment: JsonDict, template: Mapping[str, Any], old: Sequence[JsonDict], size: int
    ) -> None:
        collisions = rules.whole(objects.status(deployment).get("collisionCount"), 0)
        digest = rules.template_hash(template, collisions)
        revision = 1 + max(
            (int(objects.annotations(s).get(rules.REVISION, "0") or 0) for s in old), default=0
        )
        labeled = rules.without_hash(template)
        labeled.setdefault("metadata", {}).setdefault("labels", {})[rules.HASH_LABEL] = digest
        selector = dict(objects.spec(deployment).get("selector") or {})
        selector["matchLabels"] = {**(selector.get("matchLabels") or {}), rules.HASH_LABEL: digest}
        name = f"{objects.name(deployment)}-{digest}"
        body = {
            "apiVersion": "apps/v1",
            "kind": "ReplicaSet",
            "metadata": {
                "name": name,
                "namespace": objects.namespace(deployment),
                "labels": dict(labeled["metadata"]["labels"]),
                "annotations": {rules.REVISION: str(revision)},
                "ownerReferences": [rules.owner_reference(deployment)],
            },
            "spec": {"replicas": size, "selector": selector, "template": labeled},
        }
        namespace = objects.namespace(deployment)
        try:
            await self._api.create(f"/apis/apps/v1/namespaces/{namespace}/replicasets", body)
        except ApiError as exc:
            if exc.status != 409:
                raise
            # a set of that name that is not this template's: kube bumps collisionCount and hashes again
            await self._api.merge_patch(
                object_path(deployment, "status"), {"status": {"collisionCount": collisions + 1}}
            )
            return
        notes = {rules.REVISION: str(revision)}
        await self._api.merge_patch(object_path(deployment), {"metadata": {"annotations": notes}})
        logger.info(
            "deployment %s/%s: new ReplicaSet %s",
            namespace,
            objects.name(deployment),
            name,
        )

    async def _scale_all(
        self, deployment: JsonDict, changes: Mapping[str, int], sets: Sequence[JsonDict]
    ) -> bool:
        for replicaset in sets:
            name = objects.name(replicaset)
            if name in changes:
                size = changes[name]
                before = rules.whole(objects.spec(replicaset).get("replicas"), 1)
                await self._api.merge_patch(object_path(replicaset), {"spec": {"replicas": size}})
                way = "up" if size > before else "down"
                message = f"Scaled {way} replica set {name} from {before} to {size}"
                await self._writes.event(
                    deployment, "Normal", "ScalingReplicaSet", message, DEPLOYMENT_COMPONENT
                )
        return bool(changes)

    async def _deployment_status(
        self, deployment: JsonDict, replicas: int, unavailable: int, counted: Mapping[str, Counted], new: str
    ) -> bool:
        total = sum(c.pods for c in counted.values())
        available = sum(c.available for c in counted.values())
        updated = counted[new].pods
        previous = objects.status(deployment).get("conditions") or []
        moment = now()
        done = updated == replicas and total == replicas and available == replicas
        minimum = available >= replicas - unavailable
        status = {
            "observedGeneration": objects.meta(deployment).get("generation") or 1,
            "replicas": total,
            "updatedReplicas": updated,
            "readyReplicas": available,
            "availableReplicas": available,
            "unavailableReplicas": max(replicas - available, 0),
            "conditions": [
                rules.condition("Available", minimum, *AVAILABLE[minimum], previous, moment),
                rules.condition("Progressing", True, *_progressing(done, new), previous, moment),
            ],
        }
        return await self._writes.status(deployment, status)
