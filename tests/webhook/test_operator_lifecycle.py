"""The operator with a non-default configuration: configured mutations over HTTPS, an OS-chosen port,
certificate rotation picked up without a restart (new CA published, scoping re-applied), and the
webhook removed from its configuration on shutdown.
"""

from __future__ import annotations

import asyncio
import base64
import json
import signal
import ssl
import sys
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiohttp
import jsonpatch
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization

from hami.process.flags import Address
from hami.settings import DeviceConfig
from tests.eventually import eventually
from webhook import tlsbundle
from webhook.config import MutationSettings

from .webhook_cases import GPU, MEM, ctr, make_pod
from .webhook_harness import (
    MWC_PATH,
    Cluster,
    Operator,
    Webhook,
    api_get,
    operator_settings,
    running_operator,
    scoped_mwc,
    served_certificate,
)


@pytest.fixture(scope="module")
def operator_overrides() -> dict[str, Any]:
    device = DeviceConfig(runtime_class_name="nvidia", gpu_core_policy="force", overwrite_env=True)
    return {
        "listen": Address(host="127.0.0.1", port=0),
        "failure_policy": "Ignore",
        "config_name": "hami-webhook-configured",
        "mutation": MutationSettings(device=device),
    }


async def test_configured_mutations_golden_patch(webhook: Webhook) -> None:
    pod = make_pod(ctr(limits={GPU: "1", MEM: "1000"}), ctr("sidecar", limits={"cpu": "1"}))
    response = await webhook.admit(pod)
    assert response["allowed"] is True
    ops = json.loads(base64.b64decode(response["patch"]))
    assert ops == [
        {"op": "add", "path": "/spec/schedulerName", "value": "hami-scheduler"},
        {"op": "add", "path": "/spec/runtimeClassName", "value": "nvidia"},
        {
            "op": "add",
            "path": "/spec/containers/0/env",
            "value": [{"name": "GPU_CORE_UTILIZATION_POLICY", "value": "force"}],
        },
        {
            "op": "add",
            "path": "/spec/containers/1/env",
            "value": [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "none"}],
        },
    ]
    assert jsonpatch.apply_patch(pod, ops)["spec"]["runtimeClassName"] == "nvidia"


async def test_failure_policy_and_chosen_port_are_published(operator: Operator) -> None:
    (hook,) = (await scoped_mwc(operator))["webhooks"]
    assert hook["failurePolicy"] == "Ignore"
    port = int(hook["clientConfig"]["url"].rsplit(":", 1)[1].split("/")[0])
    assert port > 0


async def test_rotation_is_picked_up_without_restart(operator: Operator, webhook: Webhook) -> None:
    old_der = await served_certificate(webhook.url, webhook.ca)
    settings = operator.settings
    fresh = tlsbundle.generate(settings.hostnames, now=datetime.now(UTC))
    tlsbundle.write_bundle(settings.tls_dir, fresh, now=datetime.now(UTC))

    # Kopf re-reads the files, restarts its listener (on a new OS-chosen port) and republishes the CA;
    # our handler scopes the rewritten configuration again.
    mwc = await scoped_mwc(operator, ca=fresh.ca_cert)
    url = mwc["webhooks"][0]["clientConfig"]["url"]
    served = await served_certificate(url, fresh.ca_cert)
    assert served == x509.load_pem_x509_certificate(fresh.cert).public_bytes(serialization.Encoding.DER)
    assert served != old_der
    with pytest.raises(ssl.SSLCertVerificationError):
        await served_certificate(url, webhook.ca)  # the old CA no longer verifies it

    context = ssl.create_default_context(cadata=fresh.ca_cert.decode())
    rotated = Webhook(
        url=url, ca=fresh.ca_cert, session=aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=context))
    )
    async with rotated.session:
        response = await rotated.admit(make_pod(ctr(limits={GPU: "1"})))
    assert response["allowed"] is True


async def test_shutdown_removes_the_webhook(cluster: Cluster, tmp_path: Path) -> None:
    settings = replace(operator_settings(cluster, tmp_path / "tls"), config_name="hami-webhook-shutdown")
    path = f"{MWC_PATH}/{settings.config_name}"
    with running_operator(settings):
        await scoped_mwc(Operator(settings=settings, cluster=cluster))
    # Kopf empties its managed webhooks on a graceful exit; our scoping handler must not put them back.
    mwc = await eventually(lambda: api_get(cluster, path), "the configuration")
    assert mwc["webhooks"] == []


async def test_console_script_runs_and_exits_cleanly(cluster: Cluster, tmp_path: Path) -> None:
    """`python -m webhook ... --manage-config` as a process: publishes, admits, exits 0 on SIGINT."""
    settings = replace(operator_settings(cluster, tmp_path / "tls"), config_name="hami-webhook-process")
    command = [
        sys.executable, "-m", "webhook", "--kubeconfig", str(cluster.kubeconfig),
        "--listen", str(settings.listen), "--tls-dir", str(settings.tls_dir), "--manage-config",
        "--config-name", settings.config_name, "--health-listen", str(settings.health_listen),
        "--metrics-listen", str(settings.metrics_listen),
    ]  # fmt: skip
    process = await asyncio.create_subprocess_exec(*command, stderr=asyncio.subprocess.PIPE)
    try:
        mwc = await scoped_mwc(Operator(settings=settings, cluster=cluster))
        config = mwc["webhooks"][0]["clientConfig"]
        assert config["url"] == f"https://{settings.listen}/webhook"
        ca = base64.b64decode(config["caBundle"])
        assert ca == (settings.tls_dir / "ca.crt").read_bytes()  # made by the process, published as is
        context = ssl.create_default_context(cadata=ca.decode())
        connector = aiohttp.TCPConnector(ssl=context)
        async with aiohttp.ClientSession(connector=connector) as session:
            response = await Webhook(url=config["url"], ca=ca, session=session).admit(
                make_pod(ctr(limits={GPU: "1"}))
            )
        assert response["allowed"] is True and "patch" in response
    finally:
        process.send_signal(signal.SIGINT)
        _, stderr = await asyncio.wait_for(process.communicate(), 20)
    assert process.returncode == 0, stderr.decode()[-2000:]
    stored = await api_get(cluster, f"{MWC_PATH}/{settings.config_name}")
    assert stored is not None and stored["webhooks"] == []
