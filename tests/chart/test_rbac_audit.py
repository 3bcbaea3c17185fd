"""RBAC audit: the chart's roles allow every API call the running system makes, and nothing more.

The whole system runs once, as the e2e tests run it (``EmbeddedSystem``: the embedded apiserver in
this process, every component a child process), except that the webhook side is installed the way
the chart installs it: the rendered certificate Job ``create`` makes the Secret, the webhook runs with
the rendered Deployment's flags (``--no-manage-config``) and the Secret's files as its TLS directory,
"Helm" creates the rendered MutatingWebhookConfiguration (pointed at the loopback address: there is no
Service routing here) and the Job ``inject`` fills its ``caBundle``. Then a representative workload:
every example pod (placed ones, ones that fit nowhere, a refused one, MIG ones), the deletion of a
running pod (its release reaches the scheduler through its watch), a ``helm upgrade`` whose
certificate is about to expire (the Jobs re-issue and re-inject it), and a certificate coming due
between upgrades: the rotation CronJob's command re-issues it, the Secret's files are swapped as the
kubelet swaps them, and the running webhook serves the new certificate, which the published
``caBundle`` verifies.

The apiserver recorded every request; the User-Agent says who made it (``hami.kube.client`` names each
component; the webhook process's requests are Kopf's own). Each request maps to the permission it
needs (``grant_for_request``) and, per component, the test asserts that

* the rendered roles of that component allow every one of them (the chart covers every call), and
* every rule of those roles is needed by at least one of them, or is listed in ``UNEXERCISED`` with
  the reason it cannot be exercised here (nothing more).
"""

from __future__ import annotations

import asyncio
import base64
import copy
import shutil
import ssl
import tempfile
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from cryptography import x509
from cryptography.hazmat.primitives.serialization import Encoding
from prometheus_client.parser import text_string_to_metric_families

from hami_testkit.cluster import ClusterSpec, load_cluster
from hami_testkit.demo_session import default_examples_dir, load_examples, submit_all, wait_decided
from hami_testkit.kubeapi import MWC_PATH, pods_path
from hami_testkit.processes import python_argv
from hami_testkit.system import WEBHOOK, EmbeddedSystem
from tests.eventually import eventually
from webhook import tlsbundle
from webhook.config import service_hostnames

from .rendering import (
    NAMESPACE,
    Grant,
    Rendered,
    allows,
    argv,
    container,
    flags,
    grant_for_request,
    grants,
    is_resource_path,
    render,
)

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]

#: User-Agent product -> the chart component (app.kubernetes.io/component) whose roles it runs under
COMPONENTS = {
    "hami-scheduler": "scheduler",
    "hami-node-agent": "node-agent",
    "hami-webhook": "webhook",
    "kopf": "webhook",  # Kopf's own requests: the webhook process is a Kopf operator
    "hami-certgen": "certgen",
    "hami-cert-rotation": "cert-rotation",
}
#: User-Agent products of the simulated cluster itself, which the chart does not install: the kubelet
#: stand-in, kmock's own reactions (the binding), and this process (aiohttp: the test, the admission
#: and kube-scheduler stand-ins)
CLUSTER_SIDE = {"kubelet-standin", "kmock", "Python"}

#: Rules no request made here can use, each with the reason. A listed rule must exist in the chart and
#: must really go unused (so this list cannot hide a rule the system does use, or outlive one).
UNEXERCISED: dict[str, dict[Grant, str]] = {
    "kube-scheduler": {
        # The stock kube-scheduler container is not run here (an in-process stand-in calls our
        # extender instead); these are its leader-election Lease calls (client-go's leaderelection).
        Grant("coordination.k8s.io", "leases", "create"): "stock kube-scheduler: first leader creates it",
        Grant("coordination.k8s.io", "leases", "get", "hami-scheduler"): "stock kube-scheduler: reads it",
        Grant("coordination.k8s.io", "leases", "update", "hami-scheduler"): "stock kube-scheduler: renews",
    },
}

EXPIRING_AGE = tlsbundle.SERVING_VALIDITY - timedelta(days=10)  # 10 days left: due for renewal
JOB_LIMIT = 60.0  # seconds one certificate Job may take


@dataclass(frozen=True)
class Call:
    """One recorded API request: who made it (User-Agent product) and the permission it needs."""

    agent: str
    method: str
    path: str
    needed: Grant | None  # None: API discovery, which needs no role


@dataclass(frozen=True)
class Recording:
    calls: tuple[Call, ...]
    rendered: Rendered


def agent(user_agent: str) -> str:
    """The product token of a User-Agent: ``hami-scheduler/0.1.0 (...)`` -> ``hami-scheduler``."""
    return user_agent.split("/", 1)[0].strip()


# ------------------------------------------------------------------------------ the installation
def certgen_job(rendered: Rendered, job: str) -> dict[str, Any]:
    """The rendered certificate Job ``create`` or ``inject``."""
    (found,) = [j for j in rendered.of_kind("Job") if j["metadata"]["name"].endswith(f"-{job}")]
    return found


def job_argv(rendered: Rendered, job: str, kubeconfig: Path) -> list[str]:
    """The rendered certificate Job's command line (``python -m webhook.certs ...``) for this cluster."""
    command = argv(container(certgen_job(rendered, job), "certgen"))
    assert command[:3] == ["python", "-m", "webhook.certs"], command
    return python_argv(*command[1:], f"--kubeconfig={kubeconfig}")


async def run_job(command: list[str]) -> str:
    """Run one Job's command to completion (bounded); its output, or a failure showing it."""
    process = await asyncio.create_subprocess_exec(
        *command,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    try:
        output, _ = await asyncio.wait_for(process.communicate(), JOB_LIMIT)
    finally:
        if process.returncode is None:  # timed out or cancelled: never leave it behind
            process.kill()
            await process.wait()
    text = output.decode(errors="replace")
    assert process.returncode == 0, f"{' '.join(command)} exited {process.returncode}:\n{text}"
    return text


async def listening(port: int) -> bool | None:
    try:
        _, writer = await asyncio.open_connection("127.0.0.1", port)
    except OSError:
        return None
    writer.close()
    await writer.wait_closed()
    return True


class ChartSystem(EmbeddedSystem):
    """The embedded system with the webhook side installed from the rendered chart (module docstring).

    The scheduler and the node agents run as ``EmbeddedSystem`` starts them: their flags there differ
    from the chart's only in addresses, paths and the simulated backend, none of which changes which
    API calls they make. The webhook's ``--manage-config`` (``EmbeddedSystem``'s local mode) does:
    Kopf then writes the configuration itself, which the chart's webhook never does.
    """

    def __init__(self, cluster: ClusterSpec, workdir: Path, rendered: Rendered) -> None:
        super().__init__(cluster, workdir)
        self.rendered = rendered
        self.webhook_config = rendered.component("MutatingWebhookConfiguration", "webhook")
        self.secret = flags(container(certgen_job(rendered, "create"), "certgen"))["secret"]

    def job(self, name: str) -> list[str]:
        return job_argv(self.rendered, name, self.kubeconfig)

    async def _start_webhook(self) -> None:
        await run_job(self.job("create"))  # pre-install hook
        secret = await self.api.get(f"/api/v1/namespaces/{NAMESPACE}/secrets/{self.secret}")
        assert secret is not None, "the create Job made no Secret"
        self.tls = tls = self.workdir / "tls"  # what the kubelet would mount from the Secret
        self.mount_secret(secret)

        port, health = self.ports.take(), self.ports.take()
        local = {
            "listen": f"127.0.0.1:{port}",
            "tls-dir": str(tls),
            "device-config": str(self.device_config),
            "health-listen": f"127.0.0.1:{health}",
            "metrics-listen": f"127.0.0.1:{self.ports.take()}",
        }
        chart_argv = argv(container(self.rendered.component("Deployment", "webhook"), "webhook"))
        assert chart_argv[0] == "hami-webhook" and set(local) <= set(flags({"args": chart_argv})), chart_argv
        args = [
            f"--{name}={local[name]}" if (name := part[2:].partition("=")[0]) in local else part
            for part in chart_argv[1:]
        ]
        assert "--no-manage-config" in args
        self.webhook_port = port
        args.append("--cert-check-interval=0.2")  # not a chart flag (60 s there): a quick test
        await self.supervisor.start(
            WEBHOOK, python_argv("-m", "webhook", *args, "--kubeconfig", str(self.kubeconfig))
        )
        await self._wait(
            lambda: self._http_ok(f"http://127.0.0.1:{health}/healthz"), "the webhook's /healthz", WEBHOOK
        )
        # Kopf reports healthy before its admission server listens (--manage-config runs wait for the
        # configuration it publishes instead; here the chart owns the configuration)
        await self._wait(lambda: listening(port), "the webhook's admission port", WEBHOOK)

        # Helm creates the chart's objects; only the address differs (no Service routing here)
        config = copy.deepcopy(self.webhook_config)
        for hook in config["webhooks"]:
            path = hook["clientConfig"]["service"].get("path", "")
            hook["clientConfig"] = {"url": f"https://127.0.0.1:{port}{path}"}
        await self.api.create(MWC_PATH, config)
        await run_job(self.job("inject"))  # post-install hook
        stored = await self.api.get(f"{MWC_PATH}/{config['metadata']['name']}")
        assert stored is not None and all(h["clientConfig"].get("caBundle") for h in stored["webhooks"])

    async def upgrade_with_expiring_certificate(self) -> None:
        """``helm upgrade`` when the certificate is about to expire: the Jobs re-issue and re-inject."""
        hostnames = service_hostnames(
            self.rendered.component("Service", "webhook")["metadata"]["name"], NAMESPACE
        )
        expiring = tlsbundle.generate(hostnames, now=datetime.now(UTC) - EXPIRING_AGE)
        data = {
            tlsbundle.CA_CERT: expiring.ca_cert,
            tlsbundle.TLS_CERT: expiring.cert,
            tlsbundle.TLS_KEY: expiring.key,
        }
        encoded = {key: base64.b64encode(value).decode() for key, value in data.items()}
        await self.api.merge_patch(f"/api/v1/namespaces/{NAMESPACE}/secrets/{self.secret}", {"data": encoded})
        assert "renewed" in await run_job(self.job("create"))
        await run_job(self.job("inject"))

    def mount_secret(self, secret: dict[str, Any]) -> None:
        """Write the Secret's data into the webhook's TLS directory as the kubelet does (one swap)."""
        data = {key: base64.b64decode(value) for key, value in secret["data"].items()}
        bundle = tlsbundle.Bundle(
            ca_cert=data[tlsbundle.CA_CERT], cert=data[tlsbundle.TLS_CERT], key=data[tlsbundle.TLS_KEY]
        )
        tlsbundle.write_bundle(self.tls, bundle, now=datetime.now(UTC))

    async def rotate_due_certificate(self) -> None:
        """Between upgrades the certificate comes due: the CronJob re-issues it, the kubelet swaps the
        webhook's files, and the running webhook serves the new one, trusted by the published caBundle."""
        hostnames = service_hostnames(
            self.rendered.component("Service", "webhook")["metadata"]["name"], NAMESPACE
        )
        due = tlsbundle.generate(hostnames, now=datetime.now(UTC) - EXPIRING_AGE)
        data = {tlsbundle.CA_CERT: due.ca_cert, tlsbundle.TLS_CERT: due.cert, tlsbundle.TLS_KEY: due.key}
        encoded = {key: base64.b64encode(value).decode() for key, value in data.items()}
        path = f"/api/v1/namespaces/{NAMESPACE}/secrets/{self.secret}"
        await self.api.merge_patch(path, {"data": encoded})
        (cron,) = self.rendered.of_kind("CronJob")
        command = argv(container(cron["spec"]["jobTemplate"], "cert-rotation"))
        assert command[:4] == ["python", "-m", "webhook.certs", "rotate"], command
        assert "renewed" in await run_job(python_argv(*command[1:], f"--kubeconfig={self.kubeconfig}"))
        secret = await self.api.get(path)
        assert secret is not None
        self.mount_secret(secret)
        renewed = base64.b64decode(secret["data"][tlsbundle.TLS_CERT])
        stored = await self.api.get(f"{MWC_PATH}/{self.webhook_config['metadata']['name']}")
        assert stored is not None
        ca_bundle = base64.b64decode(stored["webhooks"][0]["clientConfig"]["caBundle"])

        async def serves_renewed() -> bool | None:
            context = ssl.create_default_context(cadata=ca_bundle.decode())
            try:
                _, writer = await asyncio.open_connection(
                    "127.0.0.1", self.webhook_port, ssl=context, server_hostname="localhost"
                )
            except ssl.SSLCertVerificationError:  # still the certificate of before the rotation
                return None
            der = writer.get_extra_info("ssl_object").getpeercert(binary_form=True)
            writer.close()
            return True if der == x509.load_pem_x509_certificate(renewed).public_bytes(Encoding.DER) else None

        await eventually(serves_renewed, "the webhook to serve the rotated certificate", within=30)

    async def pods_tracked(self) -> float:
        """The scheduler's count of pods holding GPU grants in its live view."""
        async with self.session.get(f"{self.scheduler_metrics_url}/metrics") as response:
            assert response.status == 200
            text = await response.text()
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name == "hami_scheduler_snapshot_pods_tracked":
                    return float(sample.value)
        raise AssertionError("the scheduler exports no hami_scheduler_snapshot_pods_tracked")


# --------------------------------------------------------------------------------- the recording
@pytest.fixture(scope="module")
def workdir() -> Iterator[Path]:
    """A short directory under /tmp (device-plugin unix socket paths are limited to 107 bytes)."""
    path = Path(tempfile.mkdtemp(prefix="hami-rbac-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def recording(workdir: Path) -> AsyncIterator[Recording]:
    """Install, run the workload, and return every request the apiserver saw (the system is stopped)."""
    rendered = render()
    system = ChartSystem(load_cluster(), workdir, rendered)
    async with system:  # (``as`` would type it as the base class)
        names, refused = await submit_all(system, load_examples(default_examples_dir()))
        assert list(refused) == ["default/privileged-gpu"], refused  # the webhook's refusal
        undecided = await wait_decided(system, names, refused, limit=120)
        assert undecided == [], undecided
        nodes = {key: pod["spec"].get("nodeName") for key, pod in system.scheduler.pods.items()}
        assert None in nodes.values(), "no pod was left unschedulable"
        assert "gpu-mig" in nodes.values(), "no MIG pod was placed"

        # a deletion: the scheduler releases the pod's grants when its watch delivers it, and the
        # pods left unschedulable are filtered again (their FilteringFailed Events get a count of 2,
        # written by the scheduler's final flush at shutdown: `events` patch)
        before, filters = await system.pods_tracked(), system.scheduler.calls["filter"]
        await system.api.delete(pods_path("default", "a10-shared"))

        async def released() -> bool | None:
            return True if await system.pods_tracked() < before else None

        async def filtered_again() -> bool | None:
            return True if system.scheduler.calls["filter"] > filters else None

        await eventually(released, "the scheduler to release the deleted pod", within=30)
        await eventually(filtered_again, "the unschedulable pods to be filtered again", within=90)
        await system.upgrade_with_expiring_certificate()
        await system.rotate_due_certificate()
        assert system.emulator is not None
        emulator = system.emulator
    requests = list(emulator)  # after the components stopped: their shutdown requests included
    calls = tuple(
        Call(
            agent=agent(request.headers.get("User-Agent", "")),
            method=str(request.method.value),
            path=request.url.path,
            needed=(
                grant_for_request(str(request.method.value), request.url.path, dict(request.params))
                if is_resource_path(request.url.path)
                else None
            ),
        )
        for request in requests
    )
    yield Recording(calls=calls, rendered=rendered)


def component_calls(recording: Recording, component: str) -> list[Call]:
    return [c for c in recording.calls if COMPONENTS.get(c.agent) == component]


# ------------------------------------------------------------------------------------- the audit
def test_every_request_comes_from_a_known_party(recording: Recording) -> None:
    unknown = {c.agent for c in recording.calls} - set(COMPONENTS) - CLUSTER_SIDE
    assert unknown == set(), f"requests from unknown User-Agents (add them to COMPONENTS?): {unknown}"
    made = {COMPONENTS[c.agent] for c in recording.calls if c.agent in COMPONENTS}
    assert made == {"scheduler", "node-agent", "webhook", "certgen", "cert-rotation"}, made


AUDITED = ["scheduler", "node-agent", "webhook", "certgen", "cert-rotation", "kube-scheduler"]


@pytest.mark.parametrize("component", AUDITED)
def test_the_roles_allow_every_request_the_component_made(recording: Recording, component: str) -> None:
    granted = grants(recording.rendered, component)
    denied = sorted(
        {
            f"{c.method} {c.path} needs {c.needed}"
            for c in component_calls(recording, component)
            if c.needed is not None and not allows(granted, c.needed)
        }
    )
    assert denied == [], f"{component}: the chart's roles do not allow:\n" + "\n".join(denied)


@pytest.mark.parametrize("component", AUDITED)
def test_every_rule_is_needed_by_a_request_or_explained(recording: Recording, component: str) -> None:
    needed = {c.needed for c in component_calls(recording, component) if c.needed is not None}
    explained = UNEXERCISED.get(component, {})
    unused = {g for g in grants(recording.rendered, component) if not any(allows({g}, n) for n in needed)}
    assert unused == set(explained), (
        f"{component}: rules no request needed and UNEXERCISED does not explain: "
        f"{sorted(unused - set(explained))}; explained but used or not in the chart: "
        f"{sorted(set(explained) - unused)}"
    )
