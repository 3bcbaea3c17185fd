"""The webhook's TLS material, made with ``cryptography``: a CA, a serving certificate, renewal.

Owns the files in the tls dir (``ca.crt``, ``tls.crt``, ``tls.key`` — the names of a cert-manager or
``kubernetes.io/tls`` Secret — plus ``ca.key`` when we made the CA ourselves), how they are made
(EC P-256; the serving certificate carries every Service DNS name, ``localhost`` and ``127.0.0.1``;
a 365-day CA and 90-day serving certificates), when they must be renewed (a third of the lifetime
left), and writing them atomically the way kubelet updates a mounted Secret
(a ``..data`` symlink swapped in one rename), so Kopf's file watcher never reads a certificate with
the wrong key. Kopf's own self-signing (certbuilder/oscrypto) fails on OpenSSL 3 and is not used.
Must not import kopf, the Kubernetes client or :mod:`webhook.certgen` (the certificate command, which
does the API calls and imports this); the clock comes in as ``now``.
"""

from __future__ import annotations

import ipaddress
import os
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

CA_CERT = "ca.crt"
CA_KEY = "ca.key"
TLS_CERT = "tls.crt"
TLS_KEY = "tls.key"
FILES = (CA_CERT, CA_KEY, TLS_CERT, TLS_KEY)
DATA_LINK = "..data"

#: Lifetimes of what this process makes for itself (``--tls-dir`` without ``ca.key`` is someone else's).
CA_VALIDITY = timedelta(days=365)
SERVING_VALIDITY = timedelta(days=90)
#: Renew a certificate when less than this share of its lifetime is left (30 of 90 days), the way
#: cert-manager's default does (renewBefore = 1/3 of duration).
RENEW_FRACTION = 1 / 3
#: A certificate someone else renews (the chart's certgen CronJob, cert-manager: both at a third) is
#: reported as late when less than this share is left.
LATE_FRACTION = 1 / 6
#: Backdating absorbs clock skew between this process and the apiserver.
BACKDATE = timedelta(minutes=5)


class CertificateError(ValueError):
    """A certificate file is unreadable or unusable; the message names the file."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Bundle:
    """PEM bytes of the CA and the serving pair. ``ca_key`` is None when someone else owns the CA."""

    ca_cert: bytes
    cert: bytes
    key: bytes
    ca_key: bytes | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Outcome:
    """What :func:`ensure_certificates` did: ``loaded``, ``generated``, ``renewed`` or ``kept``."""

    action: str
    reason: str = ""


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def make_ca(
    *, now: datetime, common_name: str = "hami-webhook-ca", valid_for: timedelta = CA_VALIDITY
) -> Bundle:
    """A new self-signed CA (without a serving pair yet: ``cert``/``key`` are empty)."""
    key = _key()
    public = key.public_key()
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(common_name))
        .issuer_name(_name(common_name))
        .public_key(public)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - BACKDATE)
        .not_valid_after(now + valid_for)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(public), critical=False)
        .sign(key, hashes.SHA256())
    )
    return Bundle(
        ca_cert=cert.public_bytes(serialization.Encoding.PEM), ca_key=_pem_key(key), cert=b"", key=b""
    )


def _san(hostname: str) -> x509.GeneralName:
    try:
        return x509.IPAddress(ipaddress.ip_address(hostname))
    except ValueError:
        return x509.DNSName(hostname)


def issue(
    ca: Bundle, hostnames: Sequence[str], *, now: datetime, valid_for: timedelta = SERVING_VALIDITY
) -> Bundle:
    """A serving certificate for ``hostnames`` signed by ``ca`` (which must carry its key)."""
    if ca.ca_key is None:
        raise CertificateError("cannot issue a serving certificate without the CA key (ca.key)")
    ca_cert = x509.load_pem_x509_certificate(ca.ca_cert)
    ca_key = serialization.load_pem_private_key(ca.ca_key, password=None)
    if not isinstance(ca_key, ec.EllipticCurvePrivateKey):
        raise CertificateError("ca.key is not an EC private key")
    key = _key()
    public = key.public_key()
    not_after = min(now + valid_for, ca_cert.not_valid_after_utc)
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(hostnames[0]))
        .issuer_name(ca_cert.subject)
        .public_key(public)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - BACKDATE)
        .not_valid_after(not_after)
        .add_extension(x509.SubjectAlternativeName([_san(h) for h in hostnames]), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=False,
                crl_sign=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(public), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False
        )
        .sign(ca_key, hashes.SHA256())
    )
    return Bundle(
        ca_cert=ca.ca_cert,
        ca_key=ca.ca_key,
        cert=cert.public_bytes(serialization.Encoding.PEM),
        key=_pem_key(key),
    )


def generate(hostnames: Sequence[str], *, now: datetime) -> Bundle:
    """A fresh CA and a serving certificate for ``hostnames``."""
    return issue(make_ca(now=now), hostnames, now=now)


def sans(cert_pem: bytes) -> tuple[str, ...]:
    """The DNS names and IP addresses a certificate is valid for, as text."""
    cert = x509.load_pem_x509_certificate(cert_pem)
    try:
        names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return ()
    dns = names.get_values_for_type(x509.DNSName)
    ips = [str(ip) for ip in names.get_values_for_type(x509.IPAddress)]
    return (*dns, *ips)


def expiry(cert_pem: bytes) -> datetime:
    """When a certificate stops being valid (UTC)."""
    return x509.load_pem_x509_certificate(cert_pem).not_valid_after_utc


def lifetime(cert_pem: bytes) -> timedelta:
    """How long a certificate is valid in all (notAfter - notBefore)."""
    cert = x509.load_pem_x509_certificate(cert_pem)
    return cert.not_valid_after_utc - cert.not_valid_before_utc


def renewal_reason(
    bundle: Bundle,
    hostnames: Sequence[str],
    *,
    now: datetime,
    before: timedelta | None = None,
    fraction: float = RENEW_FRACTION,
) -> str:
    """Why the serving certificate must be re-issued ("" when it is fine).

    Due when less than ``before`` is left, by default ``fraction`` of the certificate's own lifetime.
    """
    cert = x509.load_pem_x509_certificate(bundle.cert)
    missing = [h for h in hostnames if h not in sans(bundle.cert)]
    if missing:
        return f"tls.crt does not cover {', '.join(missing)}"
    margin = lifetime(bundle.cert) * fraction if before is None else before
    if cert.not_valid_after_utc - now < margin:
        return f"tls.crt expires {cert.not_valid_after_utc.isoformat()}"
    return ""


def read_bundle(directory: Path) -> Bundle | None:
    """The bundle in ``directory``; None when ``tls.crt`` or ``tls.key`` is absent.

    Without ``ca.crt`` the serving certificate is its own CA bundle (a self-signed certificate).
    """
    cert, key = directory / TLS_CERT, directory / TLS_KEY
    if not cert.exists() or not key.exists():
        return None
    ca, ca_key = directory / CA_CERT, directory / CA_KEY
    try:
        bundle = Bundle(
            ca_cert=(ca if ca.exists() else cert).read_bytes(),
            ca_key=ca_key.read_bytes() if ca_key.exists() else None,
            cert=cert.read_bytes(),
            key=key.read_bytes(),
        )
        x509.load_pem_x509_certificate(bundle.cert)
    except OSError as exc:
        raise CertificateError(f"{exc.filename}: {exc.strerror}") from exc
    except ValueError as exc:
        raise CertificateError(f"{cert}: not a PEM certificate: {exc}") from exc
    return bundle


def write_bundle(directory: Path, bundle: Bundle, *, now: datetime) -> None:
    """Replace the files in one atomic step, the way kubelet updates a mounted Secret.

    The files go into a fresh ``..<timestamp>.<random>`` directory; ``..data`` is re-pointed at it with one
    ``rename``; each visible name is a symlink through ``..data``. A reader sees the old set or the new
    set, never a mix (Kopf re-reads ``tls.crt`` and ``tls.key`` separately).
    """
    directory.mkdir(parents=True, exist_ok=True)
    # a unique name even for two writes at the same ``now`` (mkdtemp also makes it 0700)
    version = Path(tempfile.mkdtemp(prefix=f"..{now.strftime('%Y_%m_%d_%H_%M_%S')}.", dir=directory))
    contents = {CA_CERT: bundle.ca_cert, TLS_CERT: bundle.cert, TLS_KEY: bundle.key}
    if bundle.ca_key is not None:
        contents[CA_KEY] = bundle.ca_key
    for name, data in contents.items():
        path = version / name
        path.write_bytes(data)
        path.chmod(0o600 if name.endswith(".key") else 0o644)
    data_link = directory / DATA_LINK
    previous = Path(os.readlink(data_link)) if data_link.is_symlink() else None
    temporary = directory / f"{DATA_LINK}_tmp"
    temporary.unlink(missing_ok=True)
    temporary.symlink_to(version.name)
    os.replace(temporary, data_link)
    for name in contents:
        link = directory / name
        if link.is_symlink() and os.readlink(link) == f"{DATA_LINK}/{name}":
            continue
        staged = directory / f".{name}.tmp"
        staged.unlink(missing_ok=True)
        staged.symlink_to(f"{DATA_LINK}/{name}")
        os.replace(staged, link)
    if previous is not None and previous.name != version.name:
        old = directory / previous.name
        for child in old.iterdir():
            child.unlink()
        old.rmdir()


def ensure_certificates(directory: Path, hostnames: Sequence[str], *, now: datetime) -> Outcome:
    """Make the tls dir usable: load it, or generate it when absent, or renew it when due and ours.

    A bundle without ``ca.key`` belongs to someone else (cert-manager, the chart's certgen CronJob): it
    is loaded as it is, and one its owner is late to renew (:data:`LATE_FRACTION`) is reported, not
    replaced. Our own CA is replaced (with both certificates) when it could no longer cover a whole
    serving lifetime plus its renewal margin.
    """
    bundle = read_bundle(directory)
    if bundle is None:
        write_bundle(directory, generate(hostnames, now=now), now=now)
        return Outcome(action="generated", reason=f"no {TLS_CERT}/{TLS_KEY} in {directory}")
    if bundle.ca_key is None:
        reason = renewal_reason(bundle, hostnames, now=now, fraction=LATE_FRACTION)
        if not reason:
            return Outcome(action="loaded")
        return Outcome(action="kept", reason=f"{reason}; no {CA_KEY}, so it is left to its owner")
    reason = renewal_reason(bundle, hostnames, now=now)
    if not reason:
        return Outcome(action="loaded")
    ca_cert = x509.load_pem_x509_certificate(bundle.ca_cert)
    needed = SERVING_VALIDITY * (1 + RENEW_FRACTION)
    ca = bundle if ca_cert.not_valid_after_utc - now >= needed else make_ca(now=now)
    write_bundle(directory, issue(ca, hostnames, now=now), now=now)
    return Outcome(action="renewed", reason=reason)
