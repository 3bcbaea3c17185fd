"""SIMULATION ONLY: kube-controller-manager's Deployment, ReplicaSet and Job controllers for the
embedded cluster, as far as a demo user needs them.

:class:`WorkloadStandIn` watches Deployments, ReplicaSets, Jobs and pods; any change wakes one loop that
reads the current objects back from the apiserver (so it never acts on a stale cache) and, in one pass:

1. runs the garbage collector (:mod:`hami.sim.garbage_collector`): dependents of deleted owners go;
2. **Deployments**: the ReplicaSet whose template equals the Deployment's (the ``pod-template-hash``
   label ignored) is the new one; a missing one is created (``<deployment>-<hash>``, the hash label on
   its selector, template and labels, ``deployment.kubernetes.io/revision`` one above the old ones').
   ``Recreate`` scales the old sets to 0, waits for their pods to go, then sizes the new one;
   ``RollingUpdate`` (the default) takes kube's ``maxSurge``/``maxUnavailable`` steps
   (:func:`hami.sim.workload_rules.rolling_step`); with no old pods left, ``spec.replicas`` (what
   ``kubectl scale`` writes) is given to the new set at once. Status: ``replicas``, ``updatedReplicas``,
   ``readyReplicas``, ``availableReplicas``, ``unavailableReplicas``, the ``Available`` and
   ``Progressing`` conditions (what ``kubectl rollout status`` reads);
3. **ReplicaSets**: create or delete pods until the active pods it controls equal ``spec.replicas``
   (unscheduled, Pending, not-ready and newest pods deleted first); status ``replicas``,
   ``readyReplicas``, ``availableReplicas``, ``fullyLabeledReplicas``;
4. **Jobs** the process Job stand-in does not run (:func:`hami.sim.jobs.runs_as_process`, the one
   place that decides): up to ``parallelism`` pods at a time until ``completions`` pods succeeded
   (default 1; unset with ``parallelism`` set: the first success ends it), ``backoffLimit`` (default
   6) failed pods fail it, ``suspend`` removes its pods; status ``active``, ``ready``, ``succeeded``,
   ``failed``, ``startTime``, ``completionTime`` and the ``Complete``/``SuccessCriteriaMet`` or
   ``Failed``/``FailureTarget`` conditions. ``completionMode: Indexed``, pod failure policies and
   ``ttlSecondsAfterFinished`` are not played.

**How a Job's pod completes here**: no node of the embedded cluster runs containers (the kubelet
stand-in admits a bound pod, hands it its devices and writes it Running). So this stand-in plays the
kubelet's last part for a Job's pods only: once a Job's pod is Running (scheduled, devices allocated),
its containers are taken to have exited 0 at once, and the pod is written ``Succeeded`` (each container
``terminated``, reason ``Completed``). A Job's pods therefore hold their cards only briefly; a pod that
never starts (no scheduler for it, no room) keeps the Job active.

Every pod is created through the apiserver's create path like kubectl's, so admission runs on it (the
Priority plugin and the mutating webhooks: a GPU pod gets ``schedulerName: hami-scheduler`` from our
webhook). Must not import ``hami.kube``, ``webhook`` or ``monitor``.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import logging
from collections.abc import Coroutine, Mapping, Sequence
from typing import Any

import aiohttp

from hami import objects
from hami.sim import workload_rules as rules
from hami.sim.garbage_collector import GarbageCollector
from hami.sim.jobs import runs_as_process
from hami.sim.kubeapi import ApiError, JsonDict, SimApi, pods_path
from hami.sim.workload_rules import Counted

logger = logging.getLogger("hami.sim.workloads_standin")

DEPLOYMENTS = "/apis/apps/v1/deployments"
REPLICASETS = "/apis/apps/v1/replicasets"
JOBS = "/apis/batch/v1/jobs"
#: the ``source.component`` of each controller's Events (kube's names)
RS_COMPONENT = "replicaset-controller"
JOB_COMPONENT = "job-controller"
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


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _path(obj: Mapping[str, Any], sub: str = "") -> str:
    group = {"Deployment": "apps/v1/", "ReplicaSet": "apps/v1/", "Job": "batch/v1/"}[str(obj.get("kind"))]
    plural = {"Deployment": "deployments", "ReplicaSet": "replicasets", "Job": "jobs"}[str(obj.get("kind"))]
    path = f"/apis/{group}namespaces/{objects.namespace(obj)}/{plural}/{objects.name(obj)}"
    return f"{path}/{sub}" if sub else path


class WorkloadStandIn:
    """Deployments, ReplicaSets and Jobs made into pods (see the module docstring)."""

    def __init__(
        self, api: SimApi, *, max_pass_writes: int = 500, backoff: tuple[float, float] = (0.2, 10.0)
    ) -> None:
        self._api = api
        self._backoff = backoff
        self._refused = False
        self._told: dict[str, str] = {}  # owner uid -> the last Event message (a Warning is said once)
        self._wake = asyncio.Event()
        self._max_writes = max_pass_writes
        self.gc = GarbageCollector(api)
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
                wrote |= await self._guard(self._job(job, rules.owned_by(job, pods)), objects.name(job))
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

    async def _create_pods(
        self, owner: JsonDict, count: int, labels: Mapping[str, str], component: str
    ) -> None:
        """``count`` pods from the owner's template; a refusal (the webhook's, say) is the owner's
        ``FailedCreate`` Warning Event, as kube's controllers report it."""
        template = objects.spec(owner).get("template") or {}
        for _ in range(min(count, self._max_writes)):
            body = rules.pod_from_template(owner, template, labels)
            try:
                pod = await self._api.create(pods_path(objects.namespace(owner)), body)
            except ApiError as exc:
                await self._event(
                    owner, "Warning", "FailedCreate", f"Error creating: {exc.message}", component
                )
                raise
            await self._event(
                owner, "Normal", "SuccessfulCreate", f"Created pod: {objects.name(pod)}", component
            )

    async def _delete_pods(self, owner: JsonDict, pods: Sequence[JsonDict], component: str) -> None:
        for pod in pods:
            await self._delete_pod(pod)
            await self._event(
                owner, "Normal", "SuccessfulDelete", f"Deleted pod: {objects.name(pod)}", component
            )

    async def _event(self, owner: JsonDict, kind: str, reason: str, message: str, component: str) -> None:
        """One Event about ``owner``; the same Warning twice in a row is written once."""
        uid = objects.uid(owner)
        if kind == "Warning" and self._told.get(uid) == message:
            return
        self._told[uid] = message
        now = _now()
        namespace = objects.namespace(owner)
        event = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"generateName": f"{objects.name(owner)}.", "namespace": namespace},
            "involvedObject": {
                "apiVersion": str(owner.get("apiVersion") or ""),
                "kind": str(owner.get("kind") or ""),
                "namespace": namespace,
                "name": objects.name(owner),
                "uid": uid,
            },
            "reason": reason,
            "message": message,
            "type": kind,
            "source": {"component": component},
            "reportingComponent": component,
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }
        with contextlib.suppress(ApiError):  # a lost Event is no failure (kube's recorder drops it too)
            await self._api.create(f"/api/v1/namespaces/{namespace}/events", event)

    # ---------------------------------------------------------------------------- ReplicaSets

    async def _replicaset(self, replicaset: JsonDict, pods: Sequence[JsonDict]) -> bool:
        wanted = rules.whole(objects.spec(replicaset).get("replicas"), 1)
        live = [p for p in pods if rules.active(p)]
        wrote = False
        if len(live) < wanted:
            await self._create_pods(replicaset, wanted - len(live), {}, RS_COMPONENT)
            wrote = True
        elif len(live) > wanted:
            doomed = rules.scale_down_order(live)[: len(live) - wanted]
            await self._delete_pods(replicaset, doomed, RS_COMPONENT)
            wrote = True
        status = {
            "replicas": len(live),
            "fullyLabeledReplicas": len(live),
            "readyReplicas": sum(rules.ready(p) for p in live),
            "availableReplicas": sum(rules.ready(p) for p in live),
            "observedGeneration": objects.meta(replicaset).get("generation") or 1,
        }
        return await self._status(replicaset, status) or wrote

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
                _path(deployment, "status"), {"status": {"collisionCount": collisions + 1}}
            )
            return
        notes = {rules.REVISION: str(revision)}
        await self._api.merge_patch(_path(deployment), {"metadata": {"annotations": notes}})
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
                await self._api.merge_patch(_path(replicaset), {"spec": {"replicas": size}})
                way = "up" if size > before else "down"
                message = f"Scaled {way} replica set {name} from {before} to {size}"
                await self._event(deployment, "Normal", "ScalingReplicaSet", message, DEPLOYMENT_COMPONENT)
        return bool(changes)

    async def _deployment_status(
        self, deployment: JsonDict, replicas: int, unavailable: int, counted: Mapping[str, Counted], new: str
    ) -> bool:
        total = sum(c.pods for c in counted.values())
        available = sum(c.available for c in counted.values())
        updated = counted[new].pods
        previous = objects.status(deployment).get("conditions") or []
        now = _now()
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
                rules.condition("Available", minimum, *AVAILABLE[minimum], previous, now),
                rules.condition("Progressing", True, *_progressing(done, new), previous, now),
            ],
        }
        return await self._status(deployment, status)

    # ---------------------------------------------------------------------------- Jobs

    async def _job(self, job: JsonDict, pods: Sequence[JsonDict]) -> bool:
        spec = objects.spec(job)
        previous = objects.status(job)
        if any(
            isinstance(c, Mapping) and c.get("type") in ("Complete", "Failed") and c.get("status") == "True"
            for c in previous.get("conditions") or []
        ):
            return False  # finished: kube's Job controller leaves its pods as they are
        wrote = False
        for pod in pods:  # the kubelet's part: a started Job pod runs to completion at once (docstring)
            if objects.pod_phase(pod) == "Running" and not rules.deleting(pod):
                await self._succeed(pod)
                wrote = True
        if wrote:
            return True  # count again with the new phases
        completions = spec.get("completions") if rules.whole(spec.get("completions"), -1) >= 0 else None
        parallelism = rules.whole(spec.get("parallelism"), 1)
        backoff = rules.whole(spec.get("backoffLimit"), 6)
        live = [p for p in pods if rules.active(p)]
        succeeded = sum(objects.pod_phase(p) == "Succeeded" for p in pods)
        failed = sum(objects.pod_phase(p) == "Failed" for p in pods)
        now = _now()
        finished: tuple[str, str, str] | None = None
        if spec.get("completionMode") == "Indexed":
            finished = ("Failed", "NotSupported", "the embedded cluster does not run Indexed Jobs")
        elif failed > backoff:
            finished = ("Failed", "BackoffLimitExceeded", "Job has reached the specified backoff limit")
        elif (completions is not None and succeeded >= completions) or (
            completions is None and succeeded and not live
        ):
            finished = ("Complete", "", "")
        if finished is not None or spec.get("suspend") is True:
            want = 0
        elif completions is None:
            want = parallelism if not succeeded else len(live)
        else:
            want = min(parallelism, completions - succeeded)
        if len(live) < want:
            labels = {
                "batch.kubernetes.io/controller-uid": objects.uid(job),
                "batch.kubernetes.io/job-name": objects.name(job),
                "controller-uid": objects.uid(job),
                "job-name": objects.name(job),
            }
            await self._create_pods(job, want - len(live), labels, JOB_COMPONENT)
            wrote = True
        elif len(live) > want:
            await self._delete_pods(job, rules.scale_down_order(live)[: len(live) - want], JOB_COMPONENT)
            wrote = True
        status: JsonDict = {
            "startTime": previous.get("startTime") or now,
            "active": len(live) if finished is None else 0,
            "ready": sum(rules.ready(p) for p in live) if finished is None else 0,
            "succeeded": succeeded,
            "failed": failed,
        }
        if finished is not None:
            kind, reason, message = finished
            criteria = "SuccessCriteriaMet" if kind == "Complete" else "FailureTarget"
            status["conditions"] = [
                rules.condition(kind, True, reason, message, [], now),
                rules.condition(criteria, True, reason, message, [], now),
            ]
            if kind == "Complete":
                status["completionTime"] = now
            logger.info("job %s/%s: %s %s", objects.namespace(job), objects.name(job), kind, message)
        return await self._status(job, status) or wrote

    async def _succeed(self, pod: JsonDict) -> None:
        now = _now()
        containers = objects.containers(pod)
        status = {
            "phase": "Succeeded",
            "conditions": [
                {"type": "Ready", "status": "False", "reason": "PodCompleted", "lastTransitionTime": now},
                {
                    "type": "ContainersReady",
                    "status": "False",
                    "reason": "PodCompleted",
                    "lastTransitionTime": now,
                },
            ],
            "containerStatuses": [
                {
                    "name": str(c.get("name") or ""),
                    "ready": False,
                    "started": False,
                    "restartCount": 0,
                    "image": str(c.get("image") or ""),
                    "state": {"terminated": {"exitCode": 0, "reason": "Completed", "finishedAt": now}},
                }
                for c in containers
            ],
        }
        with contextlib.suppress(ApiError):  # gone meanwhile
            await self._api.merge_patch(pods_path(*objects.pod_key(pod), "status"), {"status": status})

    # ---------------------------------------------------------------------------- writes

    async def _delete_pod(self, pod: JsonDict) -> None:
        try:
            await self._api.delete(pods_path(*objects.pod_key(pod)))
        except ApiError as exc:
            if exc.status != 404:
                raise

    async def _status(self, obj: JsonDict, status: Mapping[str, Any]) -> bool:
        if rules.same_status(objects.status(obj), status):
            return False
        try:
            await self._api.merge_patch(_path(obj, "status"), {"status": dict(status)})
        except ApiError as exc:
            if exc.status != 404:
                raise
        return True
