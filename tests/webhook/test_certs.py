"""Certificates made with ``cryptography``: SANs, chain, renewal, ownership, atomic writes."""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import os
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID
from cryptography.x509.verification import PolicyBuilder, Store

from tests.eventually import eventually
from webhook import tlsbundle
from webhook.config import WebhookSettings, service_hostnames
from webhook.handlers import renew_forever

NOW = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
NAMES = service_hostnames("hami-webhook", "hami-system")


def verify(bundle: tlsbundle.Bundle, name: str, *, at: datetime = NOW) -> None:
    """Raise unless ``bundle.cert`` is a valid server certificate for ``name`` under ``bundle.ca_cert``."""
    ca = x509.load_pem_x509_certificate(bundle.ca_cert)
    leaf = x509.load_pem_x509_certificate(bundle.cert)
    ip = name[0].isdigit()
    subject = x509.IPAddress(ipaddress.ip_address(name)) if ip else x509.DNSName(name)
    verifier = PolicyBuilder().store(Store([ca])).time(at).build_server_verifier(subject)
    verifier.verify(leaf, [])


def test_serving_certificate_names_every_service_name() -> None:
    assert NAMES == (
        "hami-webhook",
        "hami-webhook.hami-system",
        "hami-webhook.hami-system.svc",
        "hami-webhook.hami-system.svc.cluster.local",
        "localhost",
        "127.0.0.1",
    )
    bundle = tlsbundle.generate(NAMES, now=NOW)
    assert tlsbundle.sans(bundle.cert) == NAMES
    for name in NAMES:
        verify(bundle, name)
    with pytest.raises(x509.verification.VerificationError):
        verify(bundle, "evil.example.com")


def test_ca_and_leaf_roles() -> None:
    bundle = tlsbundle.generate(NAMES, now=NOW)
    ca = x509.load_pem_x509_certificate(bundle.ca_cert)
    leaf = x509.load_pem_x509_certificate(bundle.cert)
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca is True
    assert leaf.extensions.get_extension_for_class(x509.BasicConstraints).value.ca is False
    eku = leaf.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert list(eku) == [ExtendedKeyUsageOID.SERVER_AUTH]
    assert leaf.not_valid_after_utc == NOW + tlsbundle.SERVING_VALIDITY
    assert ca.not_valid_after_utc == NOW + tlsbundle.CA_VALIDITY
    # another CA's chain does not verify
    other = tlsbundle.generate(NAMES, now=NOW)
    with pytest.raises(x509.verification.VerificationError):
        verify(tlsbundle.Bundle(ca_cert=other.ca_cert, cert=bundle.cert, key=bundle.key), "localhost")


def test_absent_files_are_generated_then_loaded(tmp_path: Path) -> None:
    tls = tmp_path / "tls"
    assert tlsbundle.ensure_certificates(tls, NAMES, now=NOW).action == "generated"
    first = tlsbundle.read_bundle(tls)
    assert first is not None and first.ca_key is not None
    assert sorted(p.name for p in tls.iterdir() if not p.name.startswith("..")) == sorted(tlsbundle.FILES)
    assert oct((tls / "tls.key").stat().st_mode & 0o777) == "0o600"
    assert tlsbundle.ensure_certificates(tls, NAMES, now=NOW + timedelta(days=1)) == tlsbundle.Outcome(
        action="loaded"
    )
    assert tlsbundle.read_bundle(tls) == first


def test_expiring_serving_certificate_is_renewed_under_the_same_ca(tmp_path: Path) -> None:
    tlsbundle.ensure_certificates(tmp_path, NAMES, now=NOW)
    before = tlsbundle.read_bundle(tmp_path)
    assert before is not None
    later = NOW + tlsbundle.SERVING_VALIDITY - timedelta(days=29)  # inside the 30-day renewal window
    outcome = tlsbundle.ensure_certificates(tmp_path, NAMES, now=later)
    assert outcome.action == "renewed"
    assert outcome.reason.startswith("tls.crt expires 2026-05-30")
    after = tlsbundle.read_bundle(tmp_path)
    assert after is not None
    assert after.ca_cert == before.ca_cert and after.ca_key == before.ca_key  # caBundle stays valid
    assert after.cert != before.cert and after.key != before.key
    verify(after, "hami-webhook.hami-system.svc", at=later)


def test_new_service_name_renews(tmp_path: Path) -> None:
    tlsbundle.ensure_certificates(tmp_path, NAMES, now=NOW)
    names = service_hostnames("hami-webhook", "other")
    outcome = tlsbundle.ensure_certificates(tmp_path, names, now=NOW)
    assert outcome.action == "renewed"
    assert outcome.reason == (
        "tls.crt does not cover hami-webhook.other, hami-webhook.other.svc, "
        "hami-webhook.other.svc.cluster.local"
    )
    bundle = tlsbundle.read_bundle(tmp_path)
    assert bundle is not None and tlsbundle.sans(bundle.cert) == names


def test_a_secret_without_ca_key_is_left_to_its_owner(tmp_path: Path) -> None:
    bundle = tlsbundle.generate(NAMES, now=NOW)
    for name, data in (
        (tlsbundle.CA_CERT, bundle.ca_cert),
        (tlsbundle.TLS_CERT, bundle.cert),
        (tlsbundle.TLS_KEY, bundle.key),
    ):
        (tmp_path / name).write_bytes(data)
    late = NOW + tlsbundle.SERVING_VALIDITY - timedelta(days=1)
    outcome = tlsbundle.ensure_certificates(tmp_path, NAMES, now=late)
    assert outcome.action == "kept"
    assert "no ca.key, so it is left to its owner" in outcome.reason
    assert (tmp_path / tlsbundle.TLS_CERT).read_bytes() == bundle.cert


def test_self_signed_without_ca_crt_is_its_own_bundle(tmp_path: Path) -> None:
    bundle = tlsbundle.generate(NAMES, now=NOW)
    (tmp_path / tlsbundle.TLS_CERT).write_bytes(bundle.cert)
    (tmp_path / tlsbundle.TLS_KEY).write_bytes(bundle.key)
    loaded = tlsbundle.read_bundle(tmp_path)
    assert loaded is not None and loaded.ca_cert == bundle.cert and loaded.ca_key is None


def test_unreadable_certificate_names_the_file(tmp_path: Path) -> None:
    (tmp_path / tlsbundle.TLS_CERT).write_text("not a certificate")
    (tmp_path / tlsbundle.TLS_KEY).write_text("x")
    with pytest.raises(tlsbundle.CertificateError, match=r"tls\.crt: not a PEM certificate"):
        tlsbundle.read_bundle(tmp_path)


def test_writes_swap_one_symlink_like_kubelet(tmp_path: Path) -> None:
    tlsbundle.write_bundle(tmp_path, tlsbundle.generate(NAMES, now=NOW), now=NOW)
    second = tlsbundle.generate(NAMES, now=NOW)
    tlsbundle.write_bundle(tmp_path, second, now=NOW + timedelta(seconds=1))
    for name in tlsbundle.FILES:
        assert os.readlink(tmp_path / name) == f"..data/{name}"
    versions = [p.name for p in tmp_path.iterdir() if p.name.startswith("..") and p.name != "..data"]
    assert len(versions) == 1 and versions[0].startswith("..2026_03_01_12_00_01.")  # the previous one is gone
    assert os.readlink(tmp_path / "..data") == versions[0]
    assert tlsbundle.read_bundle(tmp_path) == second


async def test_renewal_task_reissues_an_expiring_certificate(tmp_path: Path) -> None:
    settings = WebhookSettings(tls_dir=tmp_path)
    issued = datetime.now(UTC) - tlsbundle.SERVING_VALIDITY + timedelta(days=10)  # 10 days left
    tlsbundle.write_bundle(tmp_path, tlsbundle.generate(settings.hostnames, now=issued), now=issued)
    before = tlsbundle.read_bundle(tmp_path)
    assert before is not None
    task = asyncio.create_task(renew_forever(settings, interval=0.01))

    async def renewed() -> tlsbundle.Bundle | None:
        bundle = tlsbundle.read_bundle(tmp_path)
        return bundle if bundle is not None and bundle.cert != before.cert else None

    try:
        after = await eventually(renewed, "the renewed certificate")
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    assert after.ca_cert == before.ca_cert
    assert tlsbundle.expiry(after.cert) > datetime.now(UTC) + tlsbundle.SERVING_VALIDITY - timedelta(days=1)


# ------------------------------------------------------------------------- lifetimes and renewal
def test_self_managed_certificates_are_short_lived() -> None:
    bundle = tlsbundle.generate(NAMES, now=NOW)
    leaf = x509.load_pem_x509_certificate(bundle.cert)
    ca = x509.load_pem_x509_certificate(bundle.ca_cert)
    assert leaf.not_valid_after_utc - NOW == timedelta(days=90)
    assert ca.not_valid_after_utc - NOW == timedelta(days=365)


@pytest.mark.parametrize(("days_left", "renewed"), [(99, True), (101, False)])
def test_renewal_starts_when_a_third_of_the_lifetime_is_left(days_left: int, renewed: bool) -> None:
    """Whatever the certificate's lifetime (here 300 days, e.g. one issued by someone else)."""
    ca = tlsbundle.make_ca(now=NOW, valid_for=timedelta(days=1000))
    bundle = tlsbundle.issue(ca, NAMES, now=NOW, valid_for=timedelta(days=300) - tlsbundle.BACKDATE)
    at = NOW + timedelta(days=300 - days_left) - tlsbundle.BACKDATE
    reason = tlsbundle.renewal_reason(bundle, NAMES, now=at)
    assert bool(reason) is renewed, reason


def test_a_foreign_certificate_is_reported_only_once_its_owner_is_late(tmp_path: Path) -> None:
    """Without ca.key the owner (certgen CronJob, cert-manager) renews at a third of the lifetime left;
    the webhook warns when half of that margin is gone too, not while the owner is still on time."""
    bundle = tlsbundle.generate(NAMES, now=NOW)
    for name, data in (
        (tlsbundle.CA_CERT, bundle.ca_cert),
        (tlsbundle.TLS_CERT, bundle.cert),
        (tlsbundle.TLS_KEY, bundle.key),
    ):
        (tmp_path / name).write_bytes(data)
    on_time = NOW + tlsbundle.SERVING_VALIDITY - timedelta(days=20)  # inside the owner's window, not late
    assert tlsbundle.ensure_certificates(tmp_path, NAMES, now=on_time) == tlsbundle.Outcome(action="loaded")
    late = NOW + tlsbundle.SERVING_VALIDITY - timedelta(days=14)
    outcome = tlsbundle.ensure_certificates(tmp_path, NAMES, now=late)
    assert outcome.action == "kept" and "left to its owner" in outcome.reason


def test_an_ageing_ca_is_replaced_before_it_would_cut_a_serving_certificate_short(tmp_path: Path) -> None:
    tlsbundle.ensure_certificates(tmp_path, NAMES, now=NOW)
    before = tlsbundle.read_bundle(tmp_path)
    assert before is not None
    late = NOW + tlsbundle.CA_VALIDITY - timedelta(days=100)  # less than 90 + 30 days of CA left
    tlsbundle.write_bundle(tmp_path, tlsbundle.issue(before, NAMES, now=late - timedelta(days=80)), now=late)
    assert tlsbundle.ensure_certificates(tmp_path, NAMES, now=late).action == "renewed"
    after = tlsbundle.read_bundle(tmp_path)
    assert after is not None and after.ca_cert != before.ca_cert
    # a whole lifetime under the new CA
    assert tlsbundle.expiry(after.cert) == late + tlsbundle.SERVING_VALIDITY
    verify(after, "localhost", at=late)
