"""Helm's own library (helm-python-sdk: Helm 4's Go SDK, no helm binary) installs ``charts/hami`` into the
embedded cluster, hooks included, and ``hami doctor`` then reports on what was installed.

What it takes from the embedded apiserver: a version that satisfies the chart's ``kubeVersion``, Helm's
release Secret in protobuf, server-side apply, streaming-list watches with their bookmark (Helm's wait
for hook readiness), and the Job stand-in running the chart's certificate hooks (``python -m
webhook.certs secret`` before the install, ``inject`` after it) as processes against the cluster.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import sys
from pathlib import Path
from typing import Any

import aiohttp
import helm_python as helm
import pytest

from hami.sim.apiserver import DEFAULT_TOKEN, embedded_apiserver, write_kubeconfig
from hami.sim.jobs import JobStandIn
from hami.sim.kubeapi import MWC_PATH, SimApi

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]

CHART = Path(__file__).resolve().parents[2] / "charts" / "hami"
NAMESPACE = "hami-system"


def _install(kubeconfig: Path) -> dict[str, Any]:
    """``helm install hami charts/hami -n hami-system --create-namespace`` through Helm's library."""
    with helm.Config(kubeconfig_path=kubeconfig, namespace=NAMESPACE) as config:
        release: dict[str, Any] = dict(
            config.install(CHART, "hami", namespace=NAMESPACE, create_namespace=True, timeout=120)
        )
        return release


async def _doctor(kubeconfig: Path) -> tuple[int, str]:
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "hami.cli",
        "doctor",
        "--kubeconfig",
        str(kubeconfig),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    try:
        out, _ = await asyncio.wait_for(process.communicate(), 120)  # a hang guard, not a budget
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    return process.returncode or 0, out.decode()


async def test_helm_installs_the_chart_with_its_hooks_and_doctor_reports_on_it(workdir: Path) -> None:
    async with embedded_apiserver() as emulator, aiohttp.ClientSession() as session:
        url = str(emulator.url).rstrip("/")
        kubeconfig = write_kubeconfig(workdir / "kubeconfig", url)
        api = SimApi(session, url, token=DEFAULT_TOKEN)
        jobs = JobStandIn(api, kubeconfig)
        task = asyncio.create_task(jobs.run(), name="job-standin")
        try:
            release = await asyncio.to_thread(_install, kubeconfig)  # Helm blocks: off the server's loop
            config = await api.get(f"{MWC_PATH}/hami-webhook")
            tls = await api.get(f"/api/v1/namespaces/{NAMESPACE}/secrets/hami-webhook-tls")
            stored = await api.get(f"/api/v1/namespaces/{NAMESPACE}/secrets/sh.helm.release.v1.hami.v1")
            left = await api.list_objects(f"/apis/batch/v1/namespaces/{NAMESPACE}/jobs")
            scheduler = await api.get(f"/apis/apps/v1/namespaces/{NAMESPACE}/deployments/hami-scheduler")
            agents = await api.list_objects(f"/apis/apps/v1/namespaces/{NAMESPACE}/daemonsets")
            code, report = await _doctor(kubeconfig)
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

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
