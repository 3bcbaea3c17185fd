"""The workload stand-in turns Deployments, ReplicaSets and Jobs into pods on the embedded apiserver, and its
garbage collector cascades deletes over ownerReferences.

No scheduler or kubelet runs here: the test plays the kubelet (:func:`_start`, a pod written Running and
Ready) where a pod has to become available, so each step of a rollout is the test's to take.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import aiohttp
import pytest

from hami_testkit.apiserver import embedded_apiserver
from hami_testkit.kubeapi import SimApi, pods_path
from hami_testkit.workload_rules import HASH_LABEL, REVISION, Counted, rolling_step, surge_and_unavailable
from hami_testkit.workloads_standin import WorkloadStandIn
from tests.eventually import eventually

NS = "default"
DEPLOYMENTS = f"/apis/apps/v1/namespaces/{NS}/deployments"
REPLICASETS = f"/apis/apps/v1/namespaces/{NS}/replicasets"
JOBS = f"/apis/batch/v1/namespaces/{NS}/jobs"


@dataclass
class Cluster:
    api: SimApi
    standin: WorkloadStandIn

    async def pods(self, prefix: str = "") -> list[dict[str, Any]]:
        found = await self.api.list_objects(pods_path(NS))
        return [p for p in found if p["metadata"]["name"].startswith(prefix)]

    async def until(self, probe: Callable[[], Any], what: str) -> Any:
        return await eventually(probe, what, within=10, progress=lambda: self.standin.passes)


@pytest.fixture
async def cluster() -> AsyncIterator[Cluster]:
    async with embedded_apiserver(call_webhooks=True) as emulator, aiohttp.ClientSession() as session:
        api = SimApi(session, str(emulator.url))
        standin = WorkloadStandIn(api)
        task = asyncio.create_task(standin.run())
        try:
            yield Cluster(api, standin)
        finally:
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task


def _template(image: str = "x", **labels: str) -> dict[str, Any]:
    return {
        "metadata": {"labels": {"app": "web", **labels}},
        "spec": {"containers": [{"name": "c", "image": image}]},
    }


def _deployment(name: str, replicas: int, image: str = "x", **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "namespace": NS},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": "web"}},
            "template": _template(image),
            **spec,
        },
    }


def _job(name: str, **spec: Any) -> dict[str, Any]:
    template = {"spec": {"restartPolicy": "Never", "containers": [{"name": "c", "image": "x"}]}}
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "namespace": NS},
        "spec": {"template": template, **spec},
    }


async def _start(api: SimApi, pod: dict[str, Any]) -> None:
    """What the kubelet stand-in writes once a pod is admitted: Running and Ready."""
    condition = {"type": "Ready", "status": "True"}
    body = {"status": {"phase": "Running", "conditions": [condition]}}
    await api.merge_patch(pods_path(NS, pod["metadata"]["name"], "status"), body)


async def _start_all(cluster: Cluster, prefix: str = "") -> None:
    for pod in await cluster.pods(prefix):
        if pod["status"].get("phase") == "Pending" and not pod["metadata"].get("deletionTimestamp"):
            await _start(cluster.api, pod)


def _owner(obj: dict[str, Any]) -> tuple[str, str, bool]:
    (ref,) = obj["metadata"]["ownerReferences"]
    return ref["kind"], ref["name"], ref["controller"]


async def test_a_deployment_gets_a_replicaset_and_pods_through_admission(cluster: Cluster) -> None:
    await cluster.api.create(DEPLOYMENTS, _deployment("web", 3))

    async def three() -> list[dict[str, Any]] | None:
        pods = await cluster.pods("web-")
        return pods if len(pods) == 3 else None

    pods = await cluster.until(three, "three pods")
    (replicaset,) = await cluster.api.list_objects(REPLICASETS)
    digest = replicaset["metadata"]["labels"][HASH_LABEL]
    assert replicaset["metadata"]["name"] == f"web-{digest}"
    assert _owner(replicaset) == ("Deployment", "web", True)
    assert replicaset["spec"]["selector"]["matchLabels"] == {"app": "web", HASH_LABEL: digest}
    assert replicaset["metadata"]["annotations"][REVISION] == "1"
    for pod in pods:
        assert pod["metadata"]["generateName"] == f"web-{digest}-"
        assert pod["metadata"]["labels"] == {"app": "web", HASH_LABEL: digest}
        assert _owner(pod) == ("ReplicaSet", f"web-{digest}", True)
        # created through the apiserver's create path: admission defaulted what the template left out
        assert pod["spec"]["schedulerName"] == "default-scheduler"
        assert pod["spec"]["restartPolicy"] == "Always"
    await _start_all(cluster)

    async def available() -> dict[str, Any] | None:
        found = await cluster.api.get(f"{DEPLOYMENTS}/web")
        return found if found is not None and found["status"].get("availableReplicas") == 3 else None

    status = (await cluster.until(available, "the Deployment's status"))["status"]
    assert (status["replicas"], status["updatedReplicas"], status["readyReplicas"]) == (3, 3, 3)
    assert status["unavailableReplicas"] == 0
    conditions = {c["type"]: (c["status"], c["reason"]) for c in status["conditions"]}
    assert conditions == {
        "Available": ("True", "MinimumReplicasAvailable"),
        "Progressing": ("True", "NewReplicaSetAvailable"),
    }
    rs = await cluster.api.get(f"{REPLICASETS}/web-{digest}")
    assert rs is not None and (rs["status"]["replicas"], rs["status"]["readyReplicas"]) == (3, 3)


async def test_scaling_a_deployment_down_and_up(cluster: Cluster) -> None:
    await cluster.api.create(DEPLOYMENTS, _deployment("web", 3))
    await cluster.until(lambda: _count(cluster, "web-", 3), "three pods")
    await _start_all(cluster)
    started = sorted(p["metadata"]["name"] for p in await cluster.pods("web-"))
    await cluster.api.merge_patch(f"{DEPLOYMENTS}/web", {"spec": {"replicas": 1}})
    await cluster.until(lambda: _count(cluster, "web-", 1), "one pod left")
    await cluster.api.merge_patch(f"{DEPLOYMENTS}/web", {"spec": {"replicas": 2}})
    await cluster.until(lambda: _count(cluster, "web-", 2), "two pods")
    names = [p["metadata"]["name"] for p in await cluster.pods("web-")]
    assert len(set(names) & set(started)) == 1  # one of the first three kept, one new
    assert len(await cluster.api.list_objects(REPLICASETS)) == 1  # scaling is no rollout


async def _count(cluster: Cluster, prefix: str, wanted: int) -> bool:
    live = [p for p in await cluster.pods(prefix) if not p["metadata"].get("deletionTimestamp")]
    return len(live) == wanted


async def test_a_changed_template_rolls_out_one_surge_pod_at_a_time(cluster: Cluster) -> None:
    """maxSurge 25 % of 3 = 1, maxUnavailable 0: never more than four pods, never fewer than three
    available while the old ones are ready; the old set ends at 0 and stays (revision history)."""
    await cluster.api.create(DEPLOYMENTS, _deployment("web", 3))
    await cluster.until(lambda: _count(cluster, "web-", 3), "three pods")
    await _start_all(cluster)
    (old,) = await cluster.api.list_objects(REPLICASETS)
    await cluster.api.merge_patch(f"{DEPLOYMENTS}/web", {"spec": {"template": _template("y")}})
    most = 0

    async def done() -> bool:
        nonlocal most
        pods = await cluster.pods("web-")
        most = max(most, len(pods))
        await _start_all(cluster)  # the kubelet's part: every new pod becomes ready
        images = {p["spec"]["containers"][0]["image"] for p in pods}
        return images == {"y"} and len(pods) == 3

    await cluster.until(done, "the rollout to finish")
    sets = {rs["metadata"]["name"]: rs for rs in await cluster.api.list_objects(REPLICASETS)}
    (new,) = [rs for name, rs in sets.items() if name != old["metadata"]["name"]]
    assert sets[old["metadata"]["name"]]["spec"]["replicas"] == 0
    assert new["spec"]["replicas"] == 3 and new["metadata"]["annotations"][REVISION] == "2"
    assert most <= 4
    deployment = await cluster.api.get(f"{DEPLOYMENTS}/web")
    assert deployment is not None and deployment["metadata"]["annotations"][REVISION] == "2"


async def test_recreate_removes_the_old_pods_before_making_new_ones(cluster: Cluster) -> None:
    await cluster.api.create(DEPLOYMENTS, _deployment("web", 2, strategy={"type": "Recreate"}))
    await cluster.until(lambda: _count(cluster, "web-", 2), "two pods")
    await _start_all(cluster)
    images: list[set[str]] = []
    await cluster.api.merge_patch(f"{DEPLOYMENTS}/web", {"spec": {"template": _template("y")}})

    async def done() -> bool:
        pods = await cluster.pods("web-")
        images.append({p["spec"]["containers"][0]["image"] for p in pods})
        return images[-1] == {"y"} and len(pods) == 2

    await cluster.until(done, "the new pods")
    assert {"x", "y"} not in images  # never old and new side by side


def test_rolling_step_follows_kubes_arithmetic() -> None:
    assert surge_and_unavailable({"spec": {}}, 3) == (1, 0)
    assert surge_and_unavailable({"spec": {}}, 10) == (3, 2)
    rolling = {"spec": {"strategy": {"rollingUpdate": {"maxSurge": 0, "maxUnavailable": "0%"}}}}
    assert surge_and_unavailable(rolling, 4) == (0, 1)  # both 0: one may be unavailable
    old = Counted("old", spec=3, pods=3, available=3)
    assert rolling_step(3, 1, 0, Counted("new", 0, 0, 0), [old]) == {"new": 1}
    # the surge pod is not available yet: nothing may go
    assert rolling_step(3, 1, 0, Counted("new", 1, 1, 0), [old]) == {}
    # it is: one old pod goes
    assert rolling_step(3, 1, 0, Counted("new", 1, 1, 1), [old]) == {"old": 2}
    # old pods that never became available go first, whatever maxUnavailable says
    stuck = Counted("old", spec=3, pods=3, available=0)
    assert rolling_step(3, 1, 0, Counted("new", 1, 1, 1), [stuck]) == {"old": 2}
    # no old pods left: the new set takes spec.replicas (a scale)
    assert rolling_step(5, 1, 0, Counted("new", 3, 3, 3), [Counted("old", 0, 0, 0)]) == {"new": 5}


async def test_a_job_runs_its_pods_to_completion_within_its_parallelism(cluster: Cluster) -> None:
    await cluster.api.create(JOBS, _job("batch", completions=3, parallelism=2))
    most = 0

    async def complete() -> dict[str, Any] | None:
        nonlocal most
        pods = await cluster.pods("batch-")
        most = max(most, sum(p["status"].get("phase") in ("Pending", "Running") for p in pods))
        await _start_all(cluster, "batch-")  # scheduled and started: the stand-in then completes it
        job = await cluster.api.get(f"{JOBS}/batch")
        conditions = (job or {}).get("status", {}).get("conditions") or []
        return job if any(c["type"] == "Complete" for c in conditions) else None

    job = await cluster.until(complete, "the Job to complete")
    pods = await cluster.pods("batch-")
    assert len(pods) == 3 and {p["status"]["phase"] for p in pods} == {"Succeeded"}
    assert 1 <= most <= 2  # never more than parallelism at once
    for pod in pods:
        assert _owner(pod) == ("Job", "batch", True)
        assert pod["metadata"]["labels"]["batch.kubernetes.io/job-name"] == "batch"
        (state,) = [s["state"] for s in pod["status"]["containerStatuses"]]
        assert state["terminated"]["exitCode"] == 0 and state["terminated"]["reason"] == "Completed"
    status = job["status"]
    assert (status["succeeded"], status["failed"], status["active"]) == (3, 0, 0)
    assert status["startTime"] and status["completionTime"]
    assert {c["type"] for c in status["conditions"]} == {"Complete", "SuccessCriteriaMet"}


async def test_a_job_whose_pods_fail_past_its_backoff_limit_fails(cluster: Cluster) -> None:
    await cluster.api.create(JOBS, _job("flaky", backoffLimit=1))

    async def failed() -> dict[str, Any] | None:
        for pod in await cluster.pods("flaky-"):
            if pod["status"].get("phase") == "Pending":
                body = {"status": {"phase": "Failed", "reason": "UnexpectedAdmissionError"}}
                await cluster.api.merge_patch(pods_path(NS, pod["metadata"]["name"], "status"), body)
        job = await cluster.api.get(f"{JOBS}/flaky")
        conditions = (job or {}).get("status", {}).get("conditions") or []
        return job if any(c["type"] == "Failed" for c in conditions) else None

    job = await cluster.until(failed, "the Job to fail")
    assert job["status"]["failed"] == 2 and job["status"]["active"] == 0
    reasons = {c["type"]: c["reason"] for c in job["status"]["conditions"]}
    assert reasons == {"Failed": "BackoffLimitExceeded", "FailureTarget": "BackoffLimitExceeded"}
    assert len(await cluster.pods("flaky-")) == 2  # a new pod for the first failure, none after the second


async def test_the_charts_own_jobs_get_no_pods(cluster: Cluster) -> None:
    """``python -m webhook.certs`` Jobs are the process Job stand-in's (hami_testkit.jobs): no pods here."""
    chart = _job("hami-certgen-create")
    chart["spec"]["template"]["spec"]["containers"][0]["command"] = [
        "python",
        "-m",
        "webhook.certs",
        "secret",
    ]
    await cluster.api.create(JOBS, chart)
    await cluster.api.create(JOBS, _job("other"))
    await cluster.until(lambda: _count(cluster, "other-", 1), "the other Job's pod")
    assert await cluster.pods("hami-certgen-create-") == []
    stored = await cluster.api.get(f"{JOBS}/hami-certgen-create")
    assert stored is not None and "conditions" not in (stored.get("status") or {})


async def test_deleting_a_deployment_deletes_its_replicasets_and_pods(cluster: Cluster) -> None:
    await cluster.api.create(DEPLOYMENTS, _deployment("web", 2))
    await cluster.api.create(DEPLOYMENTS, _deployment("keep", 1))
    await cluster.until(lambda: _count(cluster, "web-", 2), "two pods")
    await cluster.until(lambda: _count(cluster, "keep-", 1), "the other Deployment's pod")
    await cluster.api.delete(f"{DEPLOYMENTS}/web")

    async def gone() -> bool:
        sets = [rs["metadata"]["name"] for rs in await cluster.api.list_objects(REPLICASETS)]
        return not await cluster.pods("web-") and not [s for s in sets if s.startswith("web-")]

    await cluster.until(gone, "web's ReplicaSet and pods to be collected")
    assert len(await cluster.pods("keep-")) == 1
    kinds = sorted(kind for _, _, kind in cluster.standin.gc.deleted)
    assert kinds == ["Pod", "Pod", "ReplicaSet"]


async def test_orphan_and_foreground_deletion_follow_their_finalizers(cluster: Cluster) -> None:
    """The apiserver marks an owner deleted with ``propagationPolicy`` Orphan or Foreground by its
    finalizer (here put there by the test): orphaned pods lose the reference and stay, a foreground
    owner goes only after its pods."""
    spec = {"replicas": 2, "selector": {"matchLabels": {"app": "web"}}, "template": _template()}
    orphan = {"metadata": {"name": "orphan", "namespace": NS, "finalizers": ["orphan"]}, "spec": spec}
    foreground = {**orphan, "metadata": {"name": "fg", "namespace": NS, "finalizers": ["foregroundDeletion"]}}
    for body in (orphan, foreground):
        await cluster.api.create(REPLICASETS, {"apiVersion": "apps/v1", "kind": "ReplicaSet", **body})
    await cluster.until(lambda: _count(cluster, "orphan-", 2), "the orphan set's pods")
    await cluster.until(lambda: _count(cluster, "fg-", 2), "the foreground set's pods")
    await cluster.api.delete(f"{REPLICASETS}/orphan")
    await cluster.api.delete(f"{REPLICASETS}/fg")

    async def settled() -> bool:
        names = {rs["metadata"]["name"] for rs in await cluster.api.list_objects(REPLICASETS)}
        return not names and not await cluster.pods("fg-")

    await cluster.until(settled, "both sets gone, the foreground set's pods first")
    kept = await cluster.pods("orphan-")
    assert len(kept) == 2 and all(not p["metadata"].get("ownerReferences") for p in kept)
    # the collector deleted the foreground set's pods; the apiserver deleted the sets themselves
    assert sorted(kind for _, name, kind in cluster.standin.gc.deleted) == ["Pod", "Pod"]


async def test_kubectl_delete_cascade_orphan_and_foreground_reach_the_collector() -> None:
    """``DELETE ...?propagationPolicy=Orphan`` (``kubectl delete --cascade=orphan``) and ``Foreground``:
    the apiserver marks the owner with the policy's finalizer, the collector finishes the delete."""
    async with embedded_apiserver(call_webhooks=True) as emulator, aiohttp.ClientSession() as session:
        emulator.collects_garbage = True  # type: ignore[attr-defined]
        cluster = Cluster(
            SimApi(session, str(emulator.url)), WorkloadStandIn(SimApi(session, str(emulator.url)))
        )
        task = asyncio.create_task(cluster.standin.run())
        try:
            await cluster.api.create(DEPLOYMENTS, _deployment("orphan", 2))
            await cluster.until(lambda: _count(cluster, "orphan-", 2), "two pods")
            await cluster.api.delete(f"{DEPLOYMENTS}/orphan?propagationPolicy=Orphan")

            async def orphaned() -> bool:
                sets = await cluster.api.list_objects(REPLICASETS)
                gone = await cluster.api.get(f"{DEPLOYMENTS}/orphan") is None
                return gone and len(sets) == 1 and not sets[0]["metadata"].get("ownerReferences")

            await cluster.until(orphaned, "the Deployment gone, its ReplicaSet kept without owner")
            (replicaset,) = await cluster.api.list_objects(REPLICASETS)
            name = replicaset["metadata"]["name"]
            await cluster.api.delete(f"{REPLICASETS}/{name}?propagationPolicy=Foreground")

            async def collected() -> bool:
                return not await cluster.api.list_objects(REPLICASETS) and not await cluster.pods("orphan-")

            await cluster.until(collected, "the ReplicaSet gone after its pods")
        finally:
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
    assert [kind for _, _, kind in cluster.standin.gc.deleted] == ["Pod", "Pod"]
