"""``python -m webhook.certs secret|inject`` (the chart's certificate Jobs) against the embedded API server.

The command's ``main(argv)`` runs in a worker thread (its sync Kubernetes client must never run on the
loop serving kmock); one test runs it as a real subprocess. Every test reads back what the command
wrote and checks the certificates with ``cryptography``.
"""

from __future__ import annotations

import asyncio
import base64
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import kmock
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization

from hami_testkit.restapi import Response  # kmock.Response (exported, not in its __all__)
from webhook import tlsbundle
from webhook.certgen import main
from webhook.config import service_hostnames

NS = "hami-system"
SECRET = "hami-webhook-tls"
SERVICE = "hami-webhook"
MWC = "hami-webhook"
SECRETS = kmock.resource("v1/secrets")
MWCS = kmock.resource("admissionregistration.k8s.io/v1/mutatingwebhookconfigurations")
SECRET_PATH = f"/api/v1/namespaces/{NS}/secrets"
MWC_PATH = "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations"


async def certgen(kubeconfig: Path, *argv: str) -> int:
    return await asyncio.to_thread(main, [argv[0], f"--kubeconfig={kubeconfig}", *argv[1:]], {})


async def make_secret(kubeconfig: Path, *, service: str = SERVICE, days: int = 90, extra: str = "") -> int:
    args = ["secret", f"--namespace={NS}", f"--secret={SECRET}", f"--service={service}", f"--days={days}"]
    return await certgen(kubeconfig, *args, *([extra] if extra else []))


def secret_data(apiserver: kmock.KubernetesEmulator) -> dict[str, bytes]:
    raw = apiserver.objects[SECRETS, NS, SECRET].raw
    return {key: base64.b64decode(value) for key, value in raw["data"].items()}


def writes(apiserver: kmock.KubernetesEmulator) -> list[tuple[str, str]]:
    """(method, path) of every write the command made, in order."""
    done = [(str(r.method.value), r.url.path) for r in list(apiserver)]
    return [(method, path) for method, path in done if method in ("POST", "PATCH", "PUT")]


def load_all(pem: bytes) -> list[x509.Certificate]:
    return x509.load_pem_x509_certificates(pem)


def verifies(cert_pem: bytes, bundle: bytes) -> bool:
    cert = x509.load_pem_x509_certificate(cert_pem)
    for ca in load_all(bundle):
        try:
            cert.verify_directly_issued_by(ca)
        except Exception:
            continue
        return True
    return False


async def put_secret(apiserver: kmock.KubernetesEmulator, data: dict[str, bytes]) -> None:
    body = {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": "kubernetes.io/tls",
        "metadata": {"name": SECRET, "namespace": NS},
        "data": {key: base64.b64encode(value).decode() for key, value in data.items()},
    }
    response = await apiserver.post(SECRET_PATH, json=body)
    assert response.status in (200, 201)


def bundle_data(bundle: tlsbundle.Bundle) -> dict[str, bytes]:
    return {"ca.crt": bundle.ca_cert, "tls.crt": bundle.cert, "tls.key": bundle.key}


async def put_mwc(apiserver: kmock.KubernetesEmulator, webhooks: list[dict[str, Any]]) -> None:
    body = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "MutatingWebhookConfiguration",
        "metadata": {"name": MWC},
        "webhooks": webhooks,
    }
    response = await apiserver.post(MWC_PATH, json=body)
    assert response.status in (200, 201)


def entry(name: str, **client_config: Any) -> dict[str, Any]:
    service = {"name": SERVICE, "namespace": NS, "path": "/webhook", "port": 443}
    return {"name": name, "clientConfig": {"service": service, **client_config}, "sideEffects": "None"}


def ca_bundles(apiserver: kmock.KubernetesEmulator) -> list[bytes | None]:
    hooks = apiserver.objects[MWCS, None, MWC].raw["webhooks"]
    return [
        base64.b64decode(h["clientConfig"]["caBundle"]) if "caBundle" in h["clientConfig"] else None
        for h in hooks
    ]


# ------------------------------------------------------------------------------------------ secret
async def test_secret_is_created_for_the_service_names(
    apiserver: kmock.KubernetesEmulator, kubeconfig: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert await make_secret(kubeconfig, days=400) == 0
    assert f"Secret {NS}/{SECRET} created" in capsys.readouterr().out
    stored = apiserver.objects[SECRETS, NS, SECRET].raw
    assert stored["type"] == "kubernetes.io/tls"
    data = secret_data(apiserver)
    assert set(data) == {"ca.crt", "tls.crt", "tls.key"}  # never the CA key
    assert tlsbundle.sans(data["tls.crt"]) == service_hostnames(SERVICE, NS)
    assert len(load_all(data["ca.crt"])) == 1 and verifies(data["tls.crt"], data["ca.crt"])
    key = serialization.load_pem_private_key(data["tls.key"], password=None)
    cert = x509.load_pem_x509_certificate(data["tls.crt"])
    public = serialization.PublicFormat.SubjectPublicKeyInfo
    assert key.public_key().public_bytes(
        serialization.Encoding.DER, public
    ) == cert.public_key().public_bytes(serialization.Encoding.DER, public)
    left = cert.not_valid_after_utc - datetime.now(UTC)
    assert timedelta(days=399) < left <= timedelta(days=400)


async def test_a_valid_secret_is_kept(apiserver: kmock.KubernetesEmulator, kubeconfig: Path) -> None:
    assert await make_secret(kubeconfig) == 0
    first = secret_data(apiserver)
    before = writes(apiserver)
    assert await make_secret(kubeconfig) == 0
    assert secret_data(apiserver) == first
    assert writes(apiserver) == before  # read only


async def test_renamed_service_reissues_and_keeps_the_old_ca_in_the_bundle(
    apiserver: kmock.KubernetesEmulator, kubeconfig: Path
) -> None:
    assert await make_secret(kubeconfig, service="old-name") == 0
    old = secret_data(apiserver)
    assert await make_secret(kubeconfig) == 0
    new = secret_data(apiserver)
    assert set(new) == {"ca.crt", "tls.crt", "tls.key"}
    assert tlsbundle.sans(new["tls.crt"]) == service_hostnames(SERVICE, NS)
    assert new["tls.key"] != old["tls.key"]
    cas = load_all(new["ca.crt"])
    assert len(cas) == 2 and cas[1] == x509.load_pem_x509_certificate(old["ca.crt"])
    # pods still serving the old certificate verify against the new bundle, and so do new ones
    assert verifies(old["tls.crt"], new["ca.crt"]) and verifies(new["tls.crt"], new["ca.crt"])
    assert not verifies(new["tls.crt"], old["ca.crt"])
    # the bundle does not grow: the next re-issue keeps only the CA of the certificate it replaces
    assert await make_secret(kubeconfig, service="third-name") == 0
    third = secret_data(apiserver)
    assert load_all(third["ca.crt"])[1:] == cas[:1]


async def test_near_expiry_is_reissued_and_an_old_ca_key_dropped(
    apiserver: kmock.KubernetesEmulator, kubeconfig: Path
) -> None:
    hostnames = service_hostnames(SERVICE, NS)
    expiring = tlsbundle.generate(hostnames, now=datetime.now(UTC) - timedelta(days=75))  # 15 days left
    assert expiring.ca_key is not None
    await put_secret(apiserver, {**bundle_data(expiring), "ca.key": expiring.ca_key})
    assert await make_secret(kubeconfig, days=3650) == 0
    new = secret_data(apiserver)
    assert set(new) == {"ca.crt", "tls.crt", "tls.key"}
    assert tlsbundle.expiry(new["tls.crt"]) - datetime.now(UTC) > timedelta(days=3649)
    assert verifies(expiring.cert, new["ca.crt"])


async def test_forty_days_left_is_kept(apiserver: kmock.KubernetesEmulator, kubeconfig: Path) -> None:
    hostnames = service_hostnames(SERVICE, NS)
    fine = tlsbundle.generate(hostnames, now=datetime.now(UTC) - timedelta(days=50))  # 40 of 90 days left
    await put_secret(apiserver, bundle_data(fine))
    assert await make_secret(kubeconfig) == 0
    assert secret_data(apiserver) == bundle_data(fine)


@pytest.mark.parametrize("broken", ["foreign key", "foreign ca", "not pem", "missing key"])
async def test_an_unusable_secret_is_reissued(
    apiserver: kmock.KubernetesEmulator, kubeconfig: Path, broken: str, caplog: pytest.LogCaptureFixture
) -> None:
    hostnames = service_hostnames(SERVICE, NS)
    now = datetime.now(UTC)
    good, other = tlsbundle.generate(hostnames, now=now), tlsbundle.generate(hostnames, now=now)
    data = bundle_data(good)
    if broken == "foreign key":
        data["tls.key"] = other.key
    elif broken == "foreign ca":
        data["ca.crt"] = other.ca_cert
    elif broken == "not pem":
        data["tls.crt"] = b"garbage"
    else:
        del data["tls.key"]
    await put_secret(apiserver, data)
    assert await make_secret(kubeconfig) == 0
    new = secret_data(apiserver)
    assert new["tls.crt"] != data.get("tls.crt") and verifies(new["tls.crt"], new["ca.crt"])
    assert tlsbundle.sans(new["tls.crt"]) == hostnames


async def test_reissue_publishes_the_bundle_before_the_certificate_changes(
    apiserver: kmock.KubernetesEmulator, kubeconfig: Path
) -> None:
    assert await make_secret(kubeconfig, service="old-name") == 0
    old = secret_data(apiserver)
    await put_mwc(apiserver, [entry("vgpu.hami.io", caBundle=base64.b64encode(old["ca.crt"]).decode())])
    assert await make_secret(kubeconfig, extra=f"--webhook-config={MWC}") == 0
    new = secret_data(apiserver)
    assert ca_bundles(apiserver) == [new["ca.crt"]]
    # the configuration trusted both CAs before the Secret (and so any pod) had the new certificate
    mwc_patch = ("PATCH", f"{MWC_PATH}/{MWC}")
    secret_patch = ("PATCH", f"{SECRET_PATH}/{SECRET}")
    done = writes(apiserver)
    assert done.index(mwc_patch) < done.index(secret_patch)


async def test_install_without_a_configuration_yet(
    apiserver: kmock.KubernetesEmulator, kubeconfig: Path
) -> None:
    assert await make_secret(kubeconfig, extra=f"--webhook-config={MWC}") == 0
    assert set(secret_data(apiserver)) == {"ca.crt", "tls.crt", "tls.key"}


def test_bad_days_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as stopped:
        main(["secret", "--namespace=ns", "--secret=s", "--service=svc", "--days=0"], {})
    assert stopped.value.code == 2
    assert "--days: must be at least 1, got '0'" in capsys.readouterr().err


# ------------------------------------------------------------------------------------------ inject
async def test_inject_fills_every_webhook_entry(
    apiserver: kmock.KubernetesEmulator, kubeconfig: Path
) -> None:
    assert await make_secret(kubeconfig) == 0
    ca = secret_data(apiserver)["ca.crt"]
    stale = base64.b64encode(tlsbundle.make_ca(now=datetime.now(UTC)).ca_cert).decode()
    await put_mwc(apiserver, [entry("vgpu.hami.io"), entry("second.hami.io", caBundle=stale)])
    argv = ["inject", f"--namespace={NS}", f"--secret={SECRET}", f"--webhook-config={MWC}"]
    assert await certgen(kubeconfig, *argv) == 0
    assert ca_bundles(apiserver) == [ca, ca]
    hooks = apiserver.objects[MWCS, None, MWC].raw["webhooks"]
    assert [h["clientConfig"]["service"]["name"] for h in hooks] == [SERVICE, SERVICE]  # rest untouched
    before = writes(apiserver)
    assert await certgen(kubeconfig, *argv) == 0
    assert writes(apiserver) == before  # already current: no write


async def test_inject_names_what_is_missing(
    apiserver: kmock.KubernetesEmulator, kubeconfig: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["inject", f"--namespace={NS}", f"--secret={SECRET}", f"--webhook-config={MWC}"]
    assert await certgen(kubeconfig, *argv) == 1
    assert SECRET in capsys.readouterr().err
    assert await make_secret(kubeconfig) == 0
    assert await certgen(kubeconfig, *argv) == 1
    assert MWC in capsys.readouterr().err
    await put_mwc(apiserver, [])
    assert await certgen(kubeconfig, *argv) == 1
    assert f"MutatingWebhookConfiguration {MWC} has no webhooks" in capsys.readouterr().err


async def test_the_module_runs_as_the_chart_calls_it(
    apiserver: kmock.KubernetesEmulator, kubeconfig: Path
) -> None:
    await put_mwc(apiserver, [entry("vgpu.hami.io")])
    for args in (
        ["secret", f"--namespace={NS}", f"--secret={SECRET}", f"--service={SERVICE}", "--days=3650"],
        ["inject", f"--namespace={NS}", f"--secret={SECRET}", f"--webhook-config={MWC}"],
    ):
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "webhook.certs",
            *args,
            env={"HAMI_KUBECONFIG": str(kubeconfig), "PATH": "/usr/bin:/bin"},
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        _, err = await asyncio.wait_for(process.communicate(), 30)
        assert process.returncode == 0, err.decode()
    assert ca_bundles(apiserver) == [secret_data(apiserver)["ca.crt"]]


async def test_losing_a_creation_race_keeps_the_winner_and_publishes_its_ca(
    apiserver: kmock.KubernetesEmulator, kubeconfig: Path
) -> None:
    await put_mwc(apiserver, [entry("vgpu.hami.io")])
    winner = tlsbundle.generate(service_hostnames(SERVICE, NS), now=datetime.now(UTC))
    encoded = {k: base64.b64encode(v).decode() for k, v in bundle_data(winner).items()}

    async def someone_else_first(request: kmock.Request) -> Any:
        # another Job created the Secret between our read and our create
        apiserver.objects[SECRETS, NS, SECRET] = {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": SECRET, "namespace": NS},
            "data": encoded,
        }
        status = {"apiVersion": "v1", "kind": "Status", "reason": "AlreadyExists", "code": 409}
        return Response(status=409, payload=status)

    apiserver["post", SECRETS] << someone_else_first
    assert await make_secret(kubeconfig, extra=f"--webhook-config={MWC}") == 0
    assert secret_data(apiserver) == bundle_data(winner)
    assert ca_bundles(apiserver) == [winner.ca_cert]


# ------------------------------------------------------------------- lifetimes and rotation
def aged(lifetime_days: int, days_left: float) -> tlsbundle.Bundle:
    """A one-shot CA and serving certificate (as certgen makes them) with ``days_left`` to go."""
    issued = datetime.now(UTC) - timedelta(days=lifetime_days - days_left)
    ca = tlsbundle.make_ca(now=issued, valid_for=timedelta(days=lifetime_days))
    return tlsbundle.issue(
        ca, service_hostnames(SERVICE, NS), now=issued, valid_for=timedelta(days=lifetime_days)
    )


async def test_default_certificate_lives_90_days(
    apiserver: kmock.KubernetesEmulator, kubeconfig: Path
) -> None:
    args = ["secret", f"--namespace={NS}", f"--secret={SECRET}", f"--service={SERVICE}"]
    assert await certgen(kubeconfig, *args) == 0
    data = secret_data(apiserver)
    for pem in (data["tls.crt"], data["ca.crt"]):
        left = tlsbundle.expiry(pem) - datetime.now(UTC)
        assert timedelta(days=89) < left <= timedelta(days=90)


async def test_a_certificate_living_longer_than_configured_is_reissued(
    apiserver: kmock.KubernetesEmulator, kubeconfig: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Upgrading from a 10-year certificate: the next run replaces it with a short-lived one."""
    old = aged(3650, 3000)
    await put_secret(apiserver, bundle_data(old))
    assert await make_secret(kubeconfig, days=90) == 0
    assert "renewed: tls.crt is valid until" in capsys.readouterr().out
    new = secret_data(apiserver)
    assert tlsbundle.expiry(new["tls.crt"]) - datetime.now(UTC) <= timedelta(days=90)
    assert verifies(old.cert, new["ca.crt"])  # pods still serving the old one keep working


@pytest.mark.parametrize(("days_left", "renewed"), [(95, True), (105, False)])
async def test_renewed_when_a_third_of_the_lifetime_is_left(
    apiserver: kmock.KubernetesEmulator, kubeconfig: Path, days_left: int, renewed: bool
) -> None:
    old = aged(300, days_left)
    await put_secret(apiserver, bundle_data(old))
    assert await make_secret(kubeconfig, days=300) == 0
    assert (secret_data(apiserver) != bundle_data(old)) is renewed


def rotate_argv(*extra: str) -> list[str]:
    return [
        "rotate",
        f"--namespace={NS}",
        f"--secret={SECRET}",
        f"--service={SERVICE}",
        f"--webhook-config={MWC}",
        *extra,
    ]


async def test_rotation_renews_and_the_ca_bundle_keeps_both_cas_during_the_overlap(
    apiserver: kmock.KubernetesEmulator, kubeconfig: Path
) -> None:
    """The CronJob's command: a certificate near expiry is re-issued with no ``helm upgrade``; the
    configuration trusts the old CA (pods not yet reloaded) and the new one, before the Secret changes."""
    old = aged(90, 20)
    await put_secret(apiserver, bundle_data(old))
    await put_mwc(apiserver, [entry("vgpu.hami.io", caBundle=base64.b64encode(old.ca_cert).decode())])
    assert await certgen(kubeconfig, *rotate_argv("--days=90")) == 0
    new = secret_data(apiserver)
    assert new["tls.crt"] != old.cert
    assert timedelta(days=89) < tlsbundle.expiry(new["tls.crt"]) - datetime.now(UTC) <= timedelta(days=90)
    (published,) = ca_bundles(apiserver)
    assert published == new["ca.crt"] and len(load_all(published)) == 2
    assert verifies(old.cert, published) and verifies(new["tls.crt"], published)
    done = writes(apiserver)
    assert done.index(("PATCH", f"{MWC_PATH}/{MWC}")) < done.index(("PATCH", f"{SECRET_PATH}/{SECRET}"))
    # the next run has nothing to do
    before = writes(apiserver)
    assert await certgen(kubeconfig, *rotate_argv("--days=90")) == 0
    assert writes(apiserver) == before


async def test_rotation_repairs_a_stale_ca_bundle_without_touching_a_valid_secret(
    apiserver: kmock.KubernetesEmulator, kubeconfig: Path
) -> None:
    fine = aged(90, 60)
    await put_secret(apiserver, bundle_data(fine))
    stale = base64.b64encode(tlsbundle.make_ca(now=datetime.now(UTC)).ca_cert).decode()
    await put_mwc(apiserver, [entry("vgpu.hami.io", caBundle=stale)])
    assert await certgen(kubeconfig, *rotate_argv()) == 0
    assert secret_data(apiserver) == bundle_data(fine)
    assert ca_bundles(apiserver) == [fine.ca_cert]
    assert ("PATCH", f"{SECRET_PATH}/{SECRET}") not in writes(apiserver)


async def test_rotation_never_creates_the_secret(
    apiserver: kmock.KubernetesEmulator, kubeconfig: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The CronJob's account may not create Secrets (only the install Job's may): a missing one is an
    error that says what to do."""
    await put_mwc(apiserver, [entry("vgpu.hami.io")])
    assert await certgen(kubeconfig, *rotate_argv()) == 1
    assert f"Secret {NS}/{SECRET} not found" in capsys.readouterr().err
    assert writes(apiserver) == [("POST", MWC_PATH)]  # only the test's own
