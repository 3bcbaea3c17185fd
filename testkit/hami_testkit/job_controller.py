"""SIMULATION ONLY: kube-controller-manager's Job controller for the embedded cluster, as far as a demo
user needs it; one step of the workload stand-in's pass (:mod:`hami_testkit.workloads_standin` reads the
objects and calls :meth:`JobController.reconcile` for each Job the process Job stand-in does not run:
:func:`hami_testkit.jobs.runs_as_process` is the one place that decides).

A Job gets up to ``parallelism`` pods at a time until ``completions`` pods succeeded (default 1; unset
with ``parallelism`` set: the first success ends it), ``backoffLimit`` (default 6) failed pods fail it,
``suspend`` removes its pods; status ``active``, ``ready``, ``succeeded``, ``failed``, ``startTime``,
``completionTime`` and the ``Complete``/``SuccessCriteriaMet`` or ``Failed``/``FailureTarget``
conditions. ``completionMode: Indexed``, pod failure policies and ``ttlSecondsAfterFinished`` are not
played.

**How a Job's pod completes here**: no node of the embedded cluster runs containers (the kubelet
stand-in admits a bound pod, hands it its devices and writes it Running). So this controller plays the
kubelet's last part for a Job's pods only: once a Job's pod is Running (scheduled, devices allocated),
its containers are taken to have exited 0 at once, and the pod is written ``Succeeded`` (each container
``terminated``, reason ``Completed``). A Job's pods therefore hold their cards only briefly; a pod that
never starts (no scheduler for it, no room) keeps the Job active.

Its pods are created and deleted through :class:`hami_testkit.controller_writes.ControllerWrites` (the
apiserver's create path: admission runs on each). Must not import ``hami.kube``, ``webhook`` or
``nodeagent``.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Mapping, Sequence

from hami import objects
from hami_testkit import workload_rules as rules
from hami_testkit.controller_writes import ControllerWrites, now
from hami_testkit.kubeapi import ApiError, JsonDict, SimApi, pods_path

logger = logging.getLogger("hami_testkit.job_controller")

#: the ``source.component`` of the Job controller's Events (kube's name)
JOB_COMPONENT = "job-controller"


class JobController:
    """Jobs made into pods, run to completion (see the module docstring)."""

    def __init__(self, api: SimApi, writes: ControllerWrites) -> None:
        self._api = api
        self._writes = writes

    async def reconcile(self, job: JsonDict, pods: Sequence[JsonDict]) -> bool:
        """One pass over ``job`` and its ``pods``; True when it wrote anything."""
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
        moment = now()
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
            await self._writes.create_pods(job, want - len(live), labels, JOB_COMPONENT)
            wrote = True
        elif len(live) > want:
            await self._writes.delete_pods(
                job, rules.scale_down_order(live)[: len(live) - want], JOB_COMPONENT
            )
            wrote = True
        status: JsonDict = {
            "startTime": previous.get("startTime") or moment,
            "active": len(live) if finished is None else 0,
            "ready": sum(rules.ready(p) for p in live) if finished is None else 0,
            "succeeded": succeeded,
            "failed": failed,
        }
        if finished is not None:
            kind, reason, message = finished
            criteria = "SuccessCriteriaMet" if kind == "Complete" else "FailureTarget"
            status["conditions"] = [
                rules.condition(kind, True, reason, message, [], moment),
                rules.condition(criteria, True, reason, message, [], moment),
            ]
            if kind == "Complete":
                status["completionTime"] = moment
            logger.info("job %s/%s: %s %s", objects.namespace(job), objects.name(job), kind, message)
        return await self._writes.status(job, status) or wrote

    async def _succeed(self, pod: JsonDict) -> None:
        moment = now()
        containers = objects.containers(pod)
        status = {
            "phase": "Succeeded",
            "conditions": [
                {"type": "Ready", "status": "False", "reason": "PodCompleted", "lastTransitionTime": moment},
                {
                    "type": "ContainersReady",
                    "status": "False",
                    "reason": "PodCompleted",
                    "lastTransitionTime": moment,
                },
            ],
            "containerStatuses": [
                {
                    "name": str(c.get("name") or ""),
                    "ready": False,
                    "started": False,
                    "restartCount": 0,
                    "image": str(c.get("image") or ""),
                    "state": {"terminated": {"exitCode": 0, "reason": "Completed", "finishedAt": moment}},
                }
                for c in containers
            ],
        }
        with contextlib.suppress(ApiError):  # gone meanwhile
            await self._api.merge_patch(pods_path(*objects.pod_key(pod), "status"), {"status": status})
