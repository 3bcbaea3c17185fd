"""The certificate command of the chart's Jobs: ``python -m webhook.certs secret|inject|rotate``.

Owns the three subcommands and the decisions behind them:

* ``secret`` (install/upgrade hook): make sure the TLS Secret (``ca.crt``, ``tls.crt``, ``tls.key``;
  type ``kubernetes.io/tls``; never ``ca.key``) holds a serving certificate for the Service's DNS
  names. A Secret whose certificate still covers every name, matches its key, is signed by a CA in
  its ``ca.crt``, has more than a third of ``--days`` left and does not outlive ``--days`` (a
  certificate from an older, longer-lived configuration) is kept untouched. Otherwise a new one-shot
  CA and certificate, both valid ``--days`` (90 by default), are issued (the CA key is discarded:
  nothing can ever sign with it again, so no CA key is stored anywhere) and the Secret is patched;
  the CA that signed the previous certificate stays in ``ca.crt`` next to the new one, so pods still
  serving the old certificate keep verifying until they reload. With ``--webhook-config`` the new
  bundle is published into the configuration's ``caBundle`` *before* the Secret changes, so at no
  moment does a webhook pod serve a certificate the API server cannot verify.
* ``inject`` (install/upgrade hook): copy the Secret's ``ca.crt`` into
  ``webhooks[*].clientConfig.caBundle`` of the MutatingWebhookConfiguration (a JSON patch with a
  ``test`` op per entry; no write when it is already there).
* ``rotate`` (the chart's CronJob, no ``helm upgrade`` needed): ``secret`` that never creates the
  Secret (its account may not), then ``inject``. Its API requests say ``hami-cert-rotation``.

API access goes through ``hami.kube`` only (``secrets``, ``admissionconfig``). Must not import kopf.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import binascii
import logging
import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization

from hami import objects
from hami.kube.admissionconfig import (
    get_mutating_webhook_configuration,
    json_patch_mutating_webhook_configuration,
)
from hami.kube.client import Conflict, KubeError, NotFound, load_api_client
from hami.kube.protocol import KubeApi
from hami.kube.secrets import create_secret, get_secret, patch_secret
from hami.process.entry import configure_logging
from hami.process.flags import KUBECONFIG, LOG_LEVEL, add_flags
from hami.settings import ConfigError
from webhook import tlsbundle
from webhook.config import service_hostnames

logger = logging.getLogger("hami.webhook.certgen")

SECRET_TYPE = "kubernetes.io/tls"
SECRET_LABELS = {"app.kubernetes.io/managed-by": "hami-certgen"}
#: A concurrent writer (another Job, Helm) may change an object between our read and our write.
ATTEMPTS = 3
#: Lifetime of a new CA and serving certificate unless ``--days`` says otherwise.
DEFAULT_DAYS = 90
#: A certificate valid this much longer than ``--days`` from now was made under a longer setting.
OUTLIVES_TOLERANCE = timedelta(hours=1)


class CertgenError(Exception):
    """The command cannot do its job; the message names the object and what is wrong with it."""


@dataclass(frozen=True, slots=True, kw_only=True)
class SecretOutcome:
    """What ``secret`` did: ``created``, ``kept`` or ``renewed``; ``reason`` says why."""

    action: str
    reason: str = ""


# ------------------------------------------------------------------------------------ pure parts
def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def decode_data(data: Mapping[str, Any], key: str, where: str) -> bytes:
    """One base64 value of a Secret's ``data``; errors name the Secret and the key."""
    text = data.get(key)
    if not isinstance(text, str) or not text:
        raise CertgenError(f"{where} has no {key}")
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise CertgenError(f"{where}: {key} is not base64: {text[:40]!r}") from None


def _certificates(pem: bytes, what: str) -> list[x509.Certificate]:
    try:
        found = x509.load_pem_x509_certificates(pem)
    except ValueError as exc:
        raise CertgenError(f"{what} is not a PEM certificate bundle: {exc}") from None
    return found


def _public_der(key: Any) -> bytes:
    der: bytes = key.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    return der


def _issued_by(cert: x509.Certificate, ca: x509.Certificate) -> bool:
    try:
        cert.verify_directly_issued_by(ca)
    except (ValueError, TypeError, InvalidSignature):
        return False
    return True


def renewal_needed(
    data: Mapping[str, Any],
    hostnames: Sequence[str],
    *,
    now: datetime,
    validity: timedelta,
    where: str,
) -> str:
    """Why the Secret's certificate must be re-issued ("" when it is fine to keep)."""
    try:
        ca_pem = decode_data(data, tlsbundle.CA_CERT, where)
        cert_pem = decode_data(data, tlsbundle.TLS_CERT, where)
        key_pem = decode_data(data, tlsbundle.TLS_KEY, where)
        (cert, *_) = _certificates(cert_pem, f"{where} {tlsbundle.TLS_CERT}")
        cas = _certificates(ca_pem, f"{where} {tlsbundle.CA_CERT}")
    except CertgenError as exc:
        return str(exc)
    try:
        key = serialization.load_pem_private_key(key_pem, password=None)
    except (ValueError, TypeError) as exc:
        return f"{where}: {tlsbundle.TLS_KEY} is not a PEM private key: {exc}"
    if _public_der(key.public_key()) != _public_der(cert.public_key()):
        return f"{where}: {tlsbundle.TLS_KEY} does not belong to {tlsbundle.TLS_CERT}"
    if not any(_issued_by(cert, ca) for ca in cas):
        return f"{where}: {tlsbundle.TLS_CERT} is not signed by a CA in {tlsbundle.CA_CERT}"
    if cert.not_valid_after_utc - now > validity + OUTLIVES_TOLERANCE:
        days = validity.total_seconds() / 86400
        return (
            f"{tlsbundle.TLS_CERT} is valid until {cert.not_valid_after_utc.isoformat()}, "
            f"longer than the configured {days:g} days"
        )
    bundle = tlsbundle.Bundle(ca_cert=ca_pem, cert=cert_pem, key=key_pem)
    return tlsbundle.renewal_reason(bundle, hostnames, now=now, before=renew_before(validity))


def previous_issuer(data: Mapping[str, Any] | None, *, now: datetime) -> bytes:
    """The PEM of the still-valid CA that signed the Secret's current certificate (b"" if none)."""
    if not data:
        return b""
    try:
        (cert, *_) = _certificates(decode_data(data, tlsbundle.TLS_CERT, "Secret"), tlsbundle.TLS_CERT)
        cas = _certificates(decode_data(data, tlsbundle.CA_CERT, "Secret"), tlsbundle.CA_CERT)
    except CertgenError:
        return b""
    for ca in cas:
        if ca.not_valid_after_utc > now and _issued_by(cert, ca):
            return ca.public_bytes(serialization.Encoding.PEM)
    return b""


def issue_data(
    hostnames: Sequence[str], *, now: datetime, validity: timedelta, previous: Mapping[str, Any] | None
) -> dict[str, str]:
    """A new CA and serving certificate as Secret ``data``; ``ca.crt`` = new CA + previous issuer."""
    ca = tlsbundle.make_ca(now=now, valid_for=validity)
    bundle = tlsbundle.issue(ca, hostnames, now=now, valid_for=validity)
    return {
        tlsbundle.CA_CERT: _b64(bundle.ca_cert + previous_issuer(previous, now=now)),
        tlsbundle.TLS_CERT: _b64(bundle.cert),
        tlsbundle.TLS_KEY: _b64(bundle.key),
    }


def renew_before(validity: timedelta) -> timedelta:
    """Renew when less than a third of the configured validity is left (30 of 90 days)."""
    return validity * tlsbundle.RENEW_FRACTION


def ca_bundle_patch(config: Mapping[str, Any], ca_bundle: str) -> list[dict[str, Any]]:
    """JSON patch setting every webhook's ``caBundle``; [] when all already carry it.

    Each entry is guarded by a ``test`` of its name, so a list reordered meanwhile fails the patch
    instead of writing into the wrong entry.
    """
    name = objects.name(config)
    webhooks = config.get("webhooks") or []
    if not webhooks:
        raise CertgenError(f"MutatingWebhookConfiguration {name} has no webhooks to inject the CA into")
    operations: list[dict[str, Any]] = []
    for index, webhook in enumerate(webhooks):
        client_config = webhook.get("clientConfig") or {}
        if client_config.get("caBundle") == ca_bundle:
            continue
        operations.append({"op": "test", "path": f"/webhooks/{index}/name", "value": webhook.get("name")})
        if "clientConfig" not in webhook:
            operations.append({"op": "add", "path": f"/webhooks/{index}/clientConfig", "value": {}})
        path = f"/webhooks/{index}/clientConfig/caBundle"
        operations.append({"op": "add", "path": path, "value": ca_bundle})
    return operations


# ------------------------------------------------------------------------------------ API parts
async def publish_ca_bundle(api: KubeApi, config_name: str, ca_bundle: str) -> bool:
    """Write ``ca_bundle`` (base64 PEM) into every webhook of the configuration; True when it changed."""
    for attempt in range(1, ATTEMPTS + 1):
        config = await get_mutating_webhook_configuration(api, config_name)
        operations = ca_bundle_patch(config, ca_bundle)
        if not operations:
            return False
        try:
            await json_patch_mutating_webhook_configuration(api, config_name, operations)
        except KubeError as exc:
            # a failed ``test`` op (422; 500 on kmock) means the list changed under us: read again
            if attempt == ATTEMPTS or exc.status not in (409, 422, 500):
                raise
            logger.warning("MutatingWebhookConfiguration %s changed, retrying: %s", config_name, exc)
            continue
        return True
    raise AssertionError("unreachable")  # pragma: no cover


async def ensure_secret(
    api: KubeApi,
    *,
    namespace: str,
    name: str,
    hostnames: Sequence[str],
    validity: timedelta,
    now: datetime,
    webhook_config: str | None = None,
    create: bool = True,
) -> SecretOutcome:
    """Create, keep or re-issue the TLS Secret (see the module docstring); ``create=False``: a missing
    Secret is a :class:`CertgenError` (the rotation CronJob may not create Secrets)."""
    where = f"Secret {namespace}/{name}"
    published_unused = False
    for attempt in range(1, ATTEMPTS + 1):
        try:
            secret = await get_secret(api, namespace, name)
        except NotFound:
            secret = None
        if secret is None and not create:
            raise CertgenError(
                f"{where} not found; the chart's install/upgrade Job creates it (helm upgrade)"
            )
        if secret is None:
            data = issue_data(hostnames, now=now, validity=validity, previous=None)
            await _publish_first(api, webhook_config, data)
            body = {
                "apiVersion": "v1",
                "kind": "Secret",
                "type": SECRET_TYPE,
                "metadata": {"name": name, "namespace": namespace, "labels": dict(SECRET_LABELS)},
                "data": data,
            }
            try:
                await create_secret(api, namespace, body)
            except Conflict:
                if attempt == ATTEMPTS:
                    raise
                published_unused = True
                continue  # another Job made it meanwhile: judge that one
            return SecretOutcome(action="created", reason=f"{where} did not exist")
        old = secret.get("data") or {}
        reason = renewal_needed(old, hostnames, now=now, validity=validity, where=where)
        if not reason:
            if published_unused:  # we published a CA that lost the race: publish the winner's
                await _publish_first(api, webhook_config, old)
            return SecretOutcome(action="kept")
        data = issue_data(hostnames, now=now, validity=validity, previous=old)
        await _publish_first(api, webhook_config, data)
        # ca.key of an older tool is dropped: the Secret never carries a CA key
        ca_key = tlsbundle.CA_KEY
        patch: dict[str, str | None] = {**data, ca_key: None} if ca_key in old else dict(data)
        await patch_secret(api, namespace, name, data=patch, labels=SECRET_LABELS)
        return SecretOutcome(action="renewed", reason=reason)
    raise AssertionError("unreachable")  # pragma: no cover


async def _publish_first(api: KubeApi, webhook_config: str | None, data: Mapping[str, str]) -> None:
    """Publish the new bundle before the certificate changes; absent configuration (install): skip."""
    if not webhook_config:
        return
    try:
        changed = await publish_ca_bundle(api, webhook_config, data[tlsbundle.CA_CERT])
    except NotFound:
        logger.info("MutatingWebhookConfiguration %s does not exist yet; inject will fill it", webhook_config)
        return
    if changed:
        logger.info("published the new CA bundle in MutatingWebhookConfiguration %s", webhook_config)


async def inject(api: KubeApi, *, namespace: str, secret: str, webhook_config: str) -> bool:
    """Copy the Secret's ``ca.crt`` into the configuration; True when something was written."""
    where = f"Secret {namespace}/{secret}"
    try:
        stored = await get_secret(api, namespace, secret)
    except NotFound:
        raise CertgenError(f"{where} not found (run the secret subcommand first)") from None
    data = stored.get("data") or {}
    ca_pem = decode_data(data, tlsbundle.CA_CERT, where)
    _certificates(ca_pem, f"{where} {tlsbundle.CA_CERT}")  # refuse to publish garbage
    try:
        return await publish_ca_bundle(api, webhook_config, _b64(ca_pem))
    except NotFound:
        raise CertgenError(f"MutatingWebhookConfiguration {webhook_config} not found") from None


# ------------------------------------------------------------------------------------ command line
def _days(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a whole number of days, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {text!r}")
    return value


def build_parser(env: Mapping[str, str]) -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    add_flags(common, (KUBECONFIG, LOG_LEVEL), env)  # the services' own declarations
    common.add_argument("--namespace", required=True, help="namespace of the Secret (and the Service)")
    common.add_argument("--secret", required=True, help="name of the TLS Secret")
    parser = argparse.ArgumentParser(
        prog="python -m webhook.certs", description="TLS Secret and caBundle of the HAMi webhook."
    )
    commands = parser.add_subparsers(dest="command", required=True)
    issuing = argparse.ArgumentParser(add_help=False)
    issuing.add_argument("--service", required=True, help="the webhook Service (certificate DNS names)")
    issuing.add_argument(
        "--days",
        type=_days,
        default=DEFAULT_DAYS,
        help=f"validity of a new CA and certificate; renewed with a third left ({DEFAULT_DAYS})",
    )
    secret = commands.add_parser(
        "secret", parents=[common, issuing], help="create, keep or re-issue the TLS Secret"
    )
    secret.add_argument(
        "--webhook-config",
        default=None,
        help="MutatingWebhookConfiguration to publish a re-issued CA bundle in before the Secret changes",
    )
    inject_cmd = commands.add_parser(
        "inject", parents=[common], help="copy ca.crt into the webhook configuration's caBundle"
    )
    inject_cmd.add_argument("--webhook-config", required=True, help="MutatingWebhookConfiguration name")
    rotate = commands.add_parser(
        "rotate",
        parents=[common, issuing],
        help="re-issue the TLS Secret when due (never create it), then inject its ca.crt",
    )
    rotate.add_argument("--webhook-config", required=True, help="MutatingWebhookConfiguration name")
    return parser


async def _run(args: argparse.Namespace, kubeconfig: str | None) -> str:
    component = "hami-cert-rotation" if args.command == "rotate" else "hami-certgen"
    api = load_api_client(kubeconfig, component=component)
    lines: list[str] = []
    try:
        if args.command in ("secret", "rotate"):
            outcome = await ensure_secret(
                api,
                namespace=args.namespace,
                name=args.secret,
                hostnames=service_hostnames(args.service, args.namespace),
                validity=timedelta(days=args.days),
                now=datetime.now(UTC),
                webhook_config=args.webhook_config,
                create=args.command == "secret",
            )
            suffix = f": {outcome.reason}" if outcome.reason else ""
            lines.append(f"Secret {args.namespace}/{args.secret} {outcome.action}{suffix}")
        if args.command in ("inject", "rotate"):
            changed = await inject(
                api, namespace=args.namespace, secret=args.secret, webhook_config=args.webhook_config
            )
            state = "updated" if changed else "already current"
            lines.append(f"caBundle of MutatingWebhookConfiguration {args.webhook_config} {state}")
        return "\n".join(lines)
    finally:
        api.close()


def main(argv: Sequence[str] | None = None, env: Mapping[str, str] | None = None) -> int:
    """Run one subcommand; 0 on success, 1 when the API or the Secret is at fault, 2 on bad flags."""
    parser = build_parser(os.environ if env is None else env)
    args = parser.parse_args(argv)
    try:
        kubeconfig, level = KUBECONFIG.read(args), LOG_LEVEL.read(args)
    except ConfigError as exc:
        parser.error(str(exc))
    configure_logging(level)
    try:
        message = asyncio.run(_run(args, kubeconfig))
    except (KubeError, CertgenError, tlsbundle.CertificateError) as exc:
        print(f"webhook.certs {args.command}: {exc}", file=sys.stderr)
        return 1
    print(message)
    return 0
