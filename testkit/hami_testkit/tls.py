"""A throwaway certificate authority and serving certificate for the embedded apiserver's HTTPS listener.

kubectl and Helm (client-go's kubeconfig loader) send a kubeconfig's credentials only to an ``https``
server: over plain HTTP every request of theirs is ``system:anonymous``. Owns :class:`ServingTLS`: a
new CA and a certificate for one IP address signed by it (``cryptography``; ECDSA P-256, valid for a
day), the server's ``ssl.SSLContext`` and the CA in PEM for the kubeconfig's
``certificate-authority-data``. Nothing is written to disk except through a private temporary file the
``ssl`` module needs, removed at once. Simulation only. Must not import ``webhook``, ``nodeagent`` or the
Kubernetes client.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
import ssl
import tempfile
from dataclasses import dataclass

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID


@dataclass(frozen=True, slots=True)
class ServingTLS:
    """A CA (``ca_pem``) and a serving pair for ``address`` signed by it."""

    address: str
    ca_pem: bytes
    cert_pem: bytes
    key_pem: bytes

    @classmethod
    def new(cls, address: str = "127.0.0.1") -> ServingTLS:
        now = datetime.datetime.now(datetime.UTC)
        ca_key = ec.generate_private_key(ec.SECP256R1())
        ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "hami embedded cluster CA")])
        ca = (
            x509.CertificateBuilder()
            .subject_name(ca_name)
            .issuer_name(ca_name)
            .public_key(ca_key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .sign(ca_key, hashes.SHA256())
        )
        key = ec.generate_private_key(ec.SECP256R1())
        names = x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address(address))])
        cert = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "kube-apiserver")]))
            .issuer_name(ca_name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(names, critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .sign(ca_key, hashes.SHA256())
        )
        pem = serialization.Encoding.PEM
        key_pem = key.private_bytes(pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
        return cls(address, ca.public_bytes(pem), cert.public_bytes(pem), key_pem)

    def server_context(self) -> ssl.SSLContext:
        """The listener's context (``ssl`` loads a chain only from a file: a private one, removed at once)."""
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        descriptor, path = tempfile.mkstemp(prefix="hami-sim-tls-", suffix=".pem")
        try:
            with os.fdopen(descriptor, "wb") as handle:
                handle.write(self.cert_pem + self.key_pem)
            context.load_cert_chain(path)
        finally:
            os.unlink(path)
        return context
