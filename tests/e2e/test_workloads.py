"""A user tries GPU sharing on the demo cluster with a Deployment, using real kubectl: ``kubectl create
deployment`` and ``kubectl create job`` (protobuf bodies) make workloads, the workload stand-in makes their
pods, the apiserver sends them through HAMi's webhook, the scheduler shares cards, ``kubectl scale``
scales, ``kubectl delete`` cascades; a plain pod nobody schedules is told so."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from hami.annotations import POD_DEVICES_ALLOCATED, decode_pod_devices
from hami_testkit.cluster import load_cluster
from hami_testkit.system import EmbeddedSystem
from tests.e2e.commands import run_kubectl
from tests.eventually import eventually

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(300)]

CLUSTER = load_cluster()
GPU_DEPLOYMENT = """\
apiVersion: apps/v1
kind: Deployment
metadata:
  name: gpu
  namespace: default
spec:
  replicas: 3
  selector:
    matchLabels: {app: gpu}
  template:
    metadata:
      labels: {app: gpu}
    spec:
      nodeSelector: {hami.io/demo-node: gpu-a10}   # two cards for three pods: some card is shared
      containers:
        - name: x   # the name `kubectl create deployment --image=x` gives it: apply changes that container
          image: x
          command: ["sleep", "infinity"]
          resources:
            limits: {nvidia.com/gpu: 1, nvidia.com/gpumem: 3000}
"""


async def kubectl(system: EmbeddedSystem, *args: str) -> str:
    """The command's output; it must succeed."""
    code, out, err = await run_kubectl(system.kubeconfig, system.workdir / "kube-cache", *args)
    assert code == 0, f"kubectl {' '.join(args)}: {err}"
    return out


async def _json(system: EmbeddedSystem, *args: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = json.loads(await kubectl(system, "get", *args, "-o", "json"))["items"]
    return items


async def test_a_gpu_deployment_shares_cards_scales_and_cascades(workdir: Path) -> None:
    async with EmbeddedSystem(CLUSTER, workdir) as system:

        async def wait(probe: Any, what: str) -> Any:
            return await eventually(probe, what, within=60, alive=system.check_standin)

        # kubectl's typed create sends the Deployment as protobuf (it was refused with 415): no GPU asked
        created = await kubectl(system, "create", "deployment", "gpu", "--image=x", "--replicas=3")
        assert created.strip() == "deployment.apps/gpu created"
        created = await kubectl(system, "create", "job", "once", "--image=x", "--", "true")
        assert created.strip() == "job.batch/once created"

        async def job_pod() -> dict[str, Any] | None:
            found = await _json(system, "pods", "-l", "job-name=once")
            return found[0] if len(found) == 1 else None

        job_pod_made = await wait(job_pod, "the pod of the Job kubectl created")

        async def told() -> list[dict[str, Any]] | None:
            events = [
                e
                for e in await _json(system, "events")
                if e["reason"] == "NoScheduler" and e["involvedObject"]["name"].startswith("gpu-")
            ]
            return events if len(events) == 3 else None

        # no GPU asked: the webhook leaves the pods to default-scheduler, which does not run here
        warnings = await wait(told, "a NoScheduler Warning for each plain pod")
        assert {e["type"] for e in warnings} == {"Warning"}
        (manifest := workdir / "gpu.yaml").write_text(GPU_DEPLOYMENT)
        await kubectl(system, "apply", "-f", str(manifest))

        async def rolled_out() -> list[dict[str, Any]] | None:
            pods = await _json(system, "pods", "-l", "app=gpu")
            running = [p for p in pods if p["status"].get("phase") == "Running"]
            return running if len(pods) == 3 and len(running) == 3 else None

        pods = await wait(rolled_out, "three Running GPU pods, the plain ones replaced")
        await kubectl(system, "rollout", "status", "deployment/gpu", "--timeout=60s")
        table = await kubectl(system, "get", "deployment", "gpu")
        sets = await _json(system, "replicasets", "-l", "app=gpu")

        await kubectl(system, "scale", "deployment", "gpu", "--replicas=1")

        async def one_left() -> list[dict[str, Any]] | None:
            left = await _json(system, "pods", "-l", "app=gpu")
            return left if len(left) == 1 else None

        (kept,) = await wait(one_left, "one pod after kubectl scale")
        await kubectl(system, "delete", "deployment", "gpu")

        async def collected() -> bool:
            rest = await _json(system, "replicasets,pods", "-l", "app=gpu")
            return not rest

        await wait(collected, "the Deployment's ReplicaSets and pods collected")

    uuids: list[str] = []
    for pod in pods:
        assert (
            pod["spec"]["schedulerName"] == "hami-scheduler"
        )  # the webhook, called on the stand-in's create
        assert pod["spec"]["nodeName"] == "gpu-a10"
        assert pod["metadata"]["ownerReferences"][0]["kind"] == "ReplicaSet"
        ((grant,),) = decode_pod_devices(pod["metadata"]["annotations"][POD_DEVICES_ALLOCATED])
        assert grant.memory_mib == 3000
        uuids.append(grant.uuid)
    assert len(set(uuids)) < len(uuids)  # three pods on two cards: at least one card shared
    header, row = table.splitlines()
    assert header.split()[:4] == ["NAME", "READY", "UP-TO-DATE", "AVAILABLE"] and row.split()[:4] == [
        "gpu",
        "3/3",
        "3",
        "3",
    ]
    assert sorted(rs["spec"]["replicas"] for rs in sets) == [0, 3]  # the plain set scaled to 0, kept
    assert kept["metadata"]["name"] in {p["metadata"]["name"] for p in pods}
    assert [(o["kind"], o["name"]) for o in job_pod_made["metadata"]["ownerReferences"]] == [("Job", "once")]
    assert job_pod_made["spec"]["containers"][0]["command"] == ["true"]
    assert [c["name"] for c in pods[0]["spec"]["containers"]] == ["x"]  # the template applied over it
