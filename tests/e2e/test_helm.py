"""Helm's own library (helm-python-sdk: Helm 4's Go SDK, no helm binary) installs ``charts/hami`` into a
bare embedded cluster (:class:`hami_testkit.bare.BareCluster`, what ``hami demo --bare`` runs), hooks
included, and ``hami doctor`` then reports on what was installed; the release is upgraded and uninstalled
there too.

What it takes from the embedded apiserver: a version that satisfies the chart's ``kubeVersion``, Helm's
release Secret in protobuf, server-side apply, streaming-list watches with their bookmark (Helm's wait
for hook readiness), the Job stand-in running the chart's certificate hooks (``python -m
webhook.certs secret`` before the install, ``inject`` after it) as processes against the cluster, and
DeleteOptions in protobuf (Helm purges its release Secrets with them on uninstall).
"""

from __future__ import annotations

import asyncio
import base64
from pathlib import Path
from typing import Any

import helm_python as helm
import pytest
import yaml

from hami import objects
from hami_testkit.apiserver import AdmittingEmulator
from hami_testkit.bare import BareCluster
from hami_testkit.cluster import load_cluster
from hami_testkit.kubeapi import MWC_PATH
from tests.e2e.commands import run_doctor

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]

CHART = Path(__file__).resolve().parents[2] / "charts" / "hami"
NAMESPACE = "hami-system"
#: the chart needs an image registry; any name does here (no image is pulled)
VALUES: dict[str, Any] = {"image": {"registry": "registry.example.com"}}


def _install(kubeconfig: Path) -> dict[str, Any]:
    """``helm install hami charts/hami -n hami-system --create-namespace`` through Helm's library."""
    with helm.Config(kubeconfig_path=kubeconfig, namespace=NAMESPACE) as config:
        release: dict[str, Any] = dict(
            config.install(CHART, "hami", VALUES, namespace=NAMESPACE, create_namespace=True, timeout=120)
        )
        return release


async def test_helm_installs_the_chart_with_its_hooks_and_doctor_reports_on_it(workdir: Path) -> None:
    async with BareCluster(None, workdir) as bare:
        api, kubeconfig, jobs = bare.api, bare.kubeconfig, bare.jobs
        release = await asyncio.to_thread(_install, kubeconfig)  # Helm blocks: off the server's loop
        config = await api.get(f"{MWC_PATH}/hami-webhook")
        tls = await api.get(f"/api/v1/namespaces/{NAMESPACE}/secrets/hami-webhook-tls")
        stored = await api.get(f"/api/v1/namespaces/{NAMESPACE}/secrets/sh.helm.release.v1.hami.v1")
        left = await api.list_objects(f"/apis/batch/v1/namespaces/{NAMESPACE}/jobs")
        scheduler = await api.get(f"/apis/apps/v1/namespaces/{NAMESPACE}/deployments/hami-scheduler")
        agents = await api.list_objects(f"/apis/apps/v1/namespaces/{NAMESPACE}/daemonsets")
        code, report = await run_doctor(kubeconfig)

    assert release["status"] == "deployed" and release["revision"] == 1
    # the pre-install hook made the serving certificate, the post-install hook put its CA in the config
    assert set(jobs.output) == {f"{NAMESPACE}/hami-certgen-create", f"{NAMESPACE}/hami-certgen-inject"}
    assert tls is not None and config is not None
    (hook,) = config["webhooks"]
    assert base64.b64decode(hook["clientConfig"]["caBundle"]) == base64.b64decode(tls["data"]["ca.crt"])
    assert left == []  # hook-delete-policy hook-succeeded: Helm deleted both Jobs
    # Helm's release record (a protobuf Secret) says deployed; the chart's workloads are stored
    assert stored is not None and stored["metadata"]["labels"]["status"] == "deployed"
    assert stored["type"] == "helm.sh/release.v1" and stored["data"]["release"]
    assert scheduler is not None and [d["metadata"]["name"] for d in agents] == ["hami-node-agent"]
    lines = report.splitlines()
    assert code == 0, report
    assert any(
        line.startswith("OK") and "mutatingwebhookconfiguration hami-webhook" in line for line in lines
    )
    assert "service hami-system/hami-webhook" in report


def _helm(kubeconfig: Path, step: str) -> dict[str, Any]:
    """One Helm step (``install``, ``upgrade`` or ``uninstall``) of release ``hami`` through the library."""
    with helm.Config(kubeconfig_path=kubeconfig, namespace=NAMESPACE) as config:
        if step == "install":
            return dict(
                config.install(CHART, "hami", VALUES, namespace=NAMESPACE, create_namespace=True, timeout=120)
            )
        if step == "upgrade":
            values = {**VALUES, "scheduler": {"replicas": 2}}
            return dict(config.upgrade(CHART, "hami", values, namespace=NAMESPACE, timeout=120))
        return dict(config.uninstall("hami", timeout=120))


def _stored(emulator: AdmittingEmulator) -> set[tuple[str, str]]:
    """(kind, name) of every object the embedded apiserver holds."""
    return {
        (str(obj.raw.get("kind")), objects.name(obj.raw))
        for obj in list(emulator.objects.values())
        if not obj.deleted
    }


async def test_helm_installs_upgrades_and_uninstalls_the_chart(workdir: Path) -> None:
    async with BareCluster(load_cluster(), workdir) as bare:
        api = bare.api
        deployment = f"/apis/apps/v1/namespaces/{NAMESPACE}/deployments/hami-scheduler"
        secrets = f"/api/v1/namespaces/{NAMESPACE}/secrets"

        installed = await asyncio.to_thread(_helm, bare.kubeconfig, "install")
        manifest = {
            (str(doc["kind"]), objects.name(doc))
            for doc in yaml.safe_load_all(installed["manifest"])
            if isinstance(doc, dict)
        }
        assert (installed["status"], installed["revision"]) == ("deployed", 1)
        assert ("Deployment", "hami-scheduler") in manifest and manifest <= _stored(bare.emulator)
        before = await api.get(deployment)
        assert before is not None and before["spec"]["replicas"] == 1

        upgraded = await asyncio.to_thread(_helm, bare.kubeconfig, "upgrade")
        assert (upgraded["status"], upgraded["revision"]) == ("deployed", 2)
        after = await api.get(deployment)
        assert after is not None and after["spec"]["replicas"] == 2
        records = {objects.name(s): objects.labels(s).get("status") for s in await api.list_objects(secrets)}
        assert records["sh.helm.release.v1.hami.v1"] == "superseded"
        assert records["sh.helm.release.v1.hami.v2"] == "deployed"
        # the upgrade ran the certificate hooks again (pre-upgrade, post-upgrade)
        assert bare.jobs.output and all("Traceback" not in text for text in bare.jobs.output.values())

        removed = await asyncio.to_thread(_helm, bare.kubeconfig, "uninstall")
        assert removed["release"]["status"] == "uninstalled"
        assert manifest & _stored(bare.emulator) == set()
        left = [objects.name(s) for s in await api.list_objects(secrets)]
        assert not [name for name in left if name.startswith("sh.helm.release.v1.hami.")], left
        bare.check()
