"""The chart renews the webhook's certificate with no ``helm upgrade``: the rotation CronJob.

It runs ``python -m webhook.certs rotate`` with the install Job's Secret, Service, lifetime and webhook
configuration, under its own account, which may read and patch that one Secret and that one
configuration and nothing else (not even create a Secret). Its command line runs here against the
embedded API server after an install made by the rendered hook Jobs, and the requests it makes need
exactly its grants.
"""

from __future__ import annotations

import asyncio
import base64
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import kmock
from cryptography import x509
from cryptography.exceptions import InvalidSignature

from webhook import tlsbundle
from webhook.certgen import main as certgen_main
from webhook.config import service_hostnames

from .rendering import NAMESPACE, argv, container, flags, grant_for_request, grants, labels, pod_spec, render
from .test_rbac import CERT_ROTATION, MWC_COLLECTION


def cron_job(values: dict[str, Any] | None = None) -> dict[str, Any]:
    (found,) = render(values).of_kind("CronJob")
    return found


def rotation_container(cron: dict[str, Any]) -> dict[str, Any]:
    return container(cron["spec"]["jobTemplate"], "cert-rotation")


def test_the_cronjob_rotates_with_the_install_jobs_settings() -> None:
    rendered = render()
    cron = cron_job()
    (create,) = [j for j in rendered.of_kind("Job") if j["metadata"]["name"].endswith("-create")]
    command = argv(rotation_container(cron))
    assert command[:4] == ["python", "-m", "webhook.certs", "rotate"]
    assert flags(rotation_container(cron)) == flags(container(create, "certgen"))
    assert flags(rotation_container(cron))["days"] == "90"
    spec = cron["spec"]
    assert spec["schedule"] == "23 3 * * *" and spec["concurrencyPolicy"] == "Forbid"
    # its own account, bound to the cert-rotation roles only
    account = pod_spec(cron["spec"]["jobTemplate"])["serviceAccountName"]
    bound = {
        b["roleRef"]["name"]
        for b in rendered.of_kind("RoleBinding") + rendered.of_kind("ClusterRoleBinding")
        if any(s["name"] == account for s in b["subjects"])
    }
    roles = rendered.of_kind("Role") + rendered.of_kind("ClusterRole")
    assert {labels(r)["app.kubernetes.io/component"] for r in roles if r["metadata"]["name"] in bound} == {
        "cert-rotation"
    }
    assert account != pod_spec(create)["serviceAccountName"]


def test_schedule_lifetime_and_switch_come_from_values() -> None:
    values = {"webhook": {"certgen": {"days": 30, "rotation": {"schedule": "0 */6 * * *"}}}}
    cron = cron_job(values)
    assert cron["spec"]["schedule"] == "0 */6 * * *"
    assert flags(rotation_container(cron))["days"] == "30"
    assert render({"webhook": {"certgen": {"rotation": {"enabled": False}}}}).of_kind("CronJob") == []
    assert render({"webhook": {"certManager": {"enabled": True}}}).of_kind("CronJob") == []


async def test_the_cronjob_renews_a_due_certificate_with_exactly_its_grants(
    apiserver: kmock.KubernetesEmulator, kubeconfig: Path
) -> None:
    """Install (hook Jobs), let the certificate come due, run the CronJob's command: it re-issues, the
    configuration trusts the old and the new CA, and its requests need exactly the cert-rotation grants."""
    rendered = render()
    jobs = {job["metadata"]["name"].rpartition("-")[2]: job for job in rendered.of_kind("Job")}
    create, inject = (argv(container(jobs[k], "certgen"))[3:] for k in ("create", "inject"))
    rotate = argv(rotation_container(cron_job()))[3:]
    secret = flags(container(jobs["create"], "certgen"))["secret"]

    async def run(command: list[str]) -> None:
        assert await asyncio.to_thread(certgen_main, [*command, f"--kubeconfig={kubeconfig}"], {}) == 0

    await run(create)
    response = await apiserver.post(
        MWC_COLLECTION, json=rendered.component("MutatingWebhookConfiguration", "webhook")
    )
    assert response.status in (200, 201)
    await run(inject)
    await run(rotate)  # nothing due: reads only
    assert {method for method, _, _ in rotation_requests(apiserver)} == {"GET"}

    # 20 of 90 days left (issued as the Job issues it: a one-shot CA with the same lifetime)
    hostnames = service_hostnames(rendered.component("Service", "webhook")["metadata"]["name"], NAMESPACE)
    issued = datetime.now(UTC) - timedelta(days=70)
    old = tlsbundle.issue(
        tlsbundle.make_ca(now=issued, valid_for=timedelta(days=90)),
        hostnames,
        now=issued,
        valid_for=timedelta(days=90),
    )
    data = {"ca.crt": old.ca_cert, "tls.crt": old.cert, "tls.key": old.key}
    encoded = {key: base64.b64encode(value).decode() for key, value in data.items()}
    response = await apiserver.patch(
        f"/api/v1/namespaces/{NAMESPACE}/secrets/{secret}", json={"data": encoded}
    )
    assert response.status == 200
    await run(inject)
    await run(rotate)

    stored = apiserver.objects[kmock.resource("v1/secrets"), NAMESPACE, secret].raw["data"]
    new_cert = base64.b64decode(stored["tls.crt"])
    assert new_cert != old.cert
    config = rendered.component("MutatingWebhookConfiguration", "webhook")["metadata"]["name"]
    mwc = apiserver.objects[
        kmock.resource("admissionregistration.k8s.io/v1/mutatingwebhookconfigurations"), None, config
    ].raw
    bundle = x509.load_pem_x509_certificates(base64.b64decode(mwc["webhooks"][0]["clientConfig"]["caBundle"]))
    for pem in (old.cert, new_cert):  # pods not yet reloaded, and reloaded ones, both verify
        leaf = x509.load_pem_x509_certificate(pem)
        assert any(leaf.issuer == ca.subject and _signed(leaf, ca) for ca in bundle)

    made = {grant_for_request(method, path, params) for method, path, params in rotation_requests(apiserver)}
    assert made == grants(rendered, "cert-rotation") == CERT_ROTATION


def rotation_requests(apiserver: kmock.KubernetesEmulator) -> list[tuple[str, str, dict[str, str]]]:
    """(method, path, query) of every request the CronJob's command made (its User-Agent)."""
    return [
        (str(r.method.value), r.url.path, dict(r.params))
        for r in list(apiserver)
        if r.headers.get("User-Agent", "").startswith("hami-cert-rotation/")
    ]


def _signed(leaf: x509.Certificate, ca: x509.Certificate) -> bool:
    try:
        leaf.verify_directly_issued_by(ca)
    except (ValueError, TypeError, InvalidSignature):
        return False
    return True
