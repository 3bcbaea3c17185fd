"""SIMULATION ONLY: the writes kube-controller-manager's controllers make, shared by the workload
stand-in's controllers (:mod:`hami_testkit.workloads_standin` for Deployments and ReplicaSets,
:mod:`hami_testkit.job_controller` for Jobs).

Owns :class:`ControllerWrites`: pods created from an owner's template through the apiserver's create
path (so admission runs on each: the Priority plugin and the mutating webhooks) with kube's
``SuccessfulCreate`` / ``FailedCreate`` Events, pods deleted with ``SuccessfulDelete``, Events about an
owner (the same Warning twice in a row written once), and an owner's status written only when it
changed. Must not import ``hami.kube``, ``webhook`` or ``nodeagent``.
"""

from __future__ import annotations

import contextlib
import datetime
from collections.abc import Mapping, Sequence
from typing import Any

from hami import objects
from hami_testkit import workload_rules as rules
from hami_testkit.kubeapi import ApiError, JsonDict, SimApi, pods_path


def now() -> str:
    """The current time as Kubernetes writes it (RFC 3339, seconds, UTC)."""
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def object_path(obj: Mapping[str, Any], sub: str = "") -> str:
    """The REST path of a Deployment, ReplicaSet or Job (``sub``: a subresource of it)."""
    group = {"Deployment": "apps/v1/", "ReplicaSet": "apps/v1/", "Job": "batch/v1/"}[str(obj.get("kind"))]
    plural = {"Deployment": "deployments", "ReplicaSet": "replicasets", "Job": "jobs"}[str(obj.get("kind"))]
    path = f"/apis/{group}namespaces/{objects.namespace(obj)}/{plural}/{objects.name(obj)}"
    return f"{path}/{sub}" if sub else path


class ControllerWrites:
    """A controller's writes through ``api``, at most ``max_writes`` pods created per call."""

    def __init__(self, api: SimApi, max_writes: int) -> None:
        self._api = api
        self._max_writes = max_writes
        self._told: dict[str, str] = {}  # owner uid -> the last Event message (a Warning is said once)

    async def create_pods(
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
                await self.event(
                    owner, "Warning", "FailedCreate", f"Error creating: {exc.message}", component
                )
                raise
            await self.event(
                owner, "Normal", "SuccessfulCreate", f"Created pod: {objects.name(pod)}", component
            )

    async def delete_pods(self, owner: JsonDict, pods: Sequence[JsonDict], component: str) -> None:
        for pod in pods:
            await self.delete_pod(pod)
            await self.event(
                owner, "Normal", "SuccessfulDelete", f"Deleted pod: {objects.name(pod)}", component
            )

    async def event(self, owner: JsonDict, kind: str, reason: str, message: str, component: str) -> None:
        """One Event about ``owner``; the same Warning twice in a row is written once."""
        uid = objects.uid(owner)
        if kind == "Warning" and self._told.get(uid) == message:
            return
        self._told[uid] = message
        moment = now()
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
            "firstTimestamp": moment,
            "lastTimestamp": moment,
            "count": 1,
        }
        with contextlib.suppress(ApiError):  # a lost Event is no failure (kube's recorder drops it too)
            await self._api.create(f"/api/v1/namespaces/{namespace}/events", event)

    async def delete_pod(self, pod: JsonDict) -> None:
        try:
            await self._api.delete(pods_path(*objects.pod_key(pod)))
        except ApiError as exc:
            if exc.status != 404:
                raise

    async def status(self, obj: JsonDict, status: Mapping[str, Any]) -> bool:
        if rules.same_status(objects.status(obj), status):
            return False
        try:
            await self._api.merge_patch(object_path(obj, "status"), {"status": dict(status)})
        except ApiError as exc:
            if exc.status != 404:
                raise
        return True
