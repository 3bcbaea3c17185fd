"""The webhook's settings: its flag schema, folded with HAMi's device-config YAML into one frozen
:class:`WebhookSettings` built once in ``__main__``.

Owns :data:`FLAGS`, every flag of the service declared once (type, default, ``HAMI_<FLAG>`` env variable
and help, as a :class:`~hami.process.flags.Flag`), the settings dataclasses whose defaults are those
flags' own, and the Service DNS names the serving certificate must cover. The schema's machinery and the
``HOST:PORT`` parser are :mod:`hami.process.flags`, reading the device-config file is
:mod:`hami.devicefile`; errors are :class:`hami.settings.ConfigError` naming the flag (or env variable,
or file) and the offending text. Must not import kopf, aiohttp or the Kubernetes client: the pure
mutation reads these settings too.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from hami import devicefile
from hami.process.flags import (
    KUBECONFIG,
    LOG_LEVEL,
    Address,
    Flag,
    Flags,
    Switch,
    add_flags,
    address,
    number,
    optional_text,
    path,
    plain,
    whole,
)
from hami.settings import ConfigError, DeviceConfig

#: The Kopf handler id: Kopf serves each admission handler at ``/<id>``, so this is the URL path.
HANDLER_ID = "webhook"
#: The webhook's name inside the MutatingWebhookConfiguration (HAMi's chart uses the same).
WEBHOOK_NAME = "vgpu.hami.io"
FAILURE_POLICIES = ("Fail", "Ignore")


def _failure_policy(flag: str, text: str) -> str:
    if text not in FAILURE_POLICIES:
        raise ConfigError(f"--{flag} must be Fail or Ignore, got {text!r}")
    return text


LISTEN = Flag(
    name="listen",
    parse=address,
    default="0.0.0.0:9443",
    metavar="HOST:PORT",
    help="where the HTTPS admission endpoint listens (path /webhook)",
)
TLS_DIR = Flag(
    name="tls-dir",
    parse=path,
    default="/etc/hami/tls",
    metavar="DIR",
    help="directory with ca.crt, tls.crt, tls.key (made here if absent and writable)",
)
MANAGE_CONFIG = Switch(
    name="manage-config",
    default="false",
    help="create and keep the MutatingWebhookConfiguration up to date (local runs)",
)
CONFIG_NAME = Flag(
    name="config-name",
    metavar="NAME",
    parse=plain,
    default="hami-webhook",
    help="name of the MutatingWebhookConfiguration written by --manage-config",
)
SERVICE_NAME = Flag(
    name="service-name",
    metavar="NAME",
    parse=plain,
    default="hami-webhook",
    help="Service name (for the certificate SANs)",
)
SERVICE_NAMESPACE = Flag(
    name="service-namespace",
    metavar="NAMESPACE",
    parse=plain,
    default="kube-system",
    help="Service namespace (for the certificate SANs)",
)
SCHEDULER_NAME = Flag(
    name="scheduler-name",
    metavar="NAME",
    parse=plain,
    default="hami-scheduler",
    help="scheduler name set on GPU pods",
)
FORCE_OVERWRITE_DEFAULT_SCHEDULER = Switch(
    name="force-overwrite-default-scheduler",
    default="true",  # HAMi's --force-overwrite-default-scheduler
    help="take over GPU pods that name default-scheduler",
)
DEVICE_CONFIG = Flag(
    name="device-config",
    parse=optional_text,
    metavar="FILE",
    help="HAMi device-config YAML (top-level key nvidia:)",
)
FAILURE_POLICY = Flag(
    name="failure-policy",
    metavar="Fail|Ignore",
    parse=_failure_policy,
    default="Fail",
    help="failurePolicy of the managed webhook: Fail or Ignore",
)
HEALTH_LISTEN = Flag(
    name="health-listen",
    parse=address,
    default="0.0.0.0:8081",
    metavar="HOST:PORT",
    help="where GET /healthz is served",
)
METRICS_LISTEN = Flag(
    name="metrics-listen",
    parse=address,
    default="0.0.0.0:8082",
    metavar="HOST:PORT",
    help="where GET /metrics (Prometheus) is served",
)
MAX_CARDS_PER_CONTAINER = Flag(
    name="max-cards-per-container",
    parse=whole(minimum=1),
    default="16",  # HAMi has no limit; nodes rarely have more
    metavar="N",
    help="refuse containers asking for more cards than this",
)
CERT_CHECK_INTERVAL = Flag(
    name="cert-check-interval",
    parse=number(minimum=0.01),
    default="60",
    metavar="SECONDS",
    help="seconds between re-reads of the certificate files",
)

#: The service's schema, in ``--help`` order.
FLAGS: Flags = (
    KUBECONFIG,
    LISTEN,
    TLS_DIR,
    MANAGE_CONFIG,
    CONFIG_NAME,
    SERVICE_NAME,
    SERVICE_NAMESPACE,
    SCHEDULER_NAME,
    FORCE_OVERWRITE_DEFAULT_SCHEDULER,
    DEVICE_CONFIG,
    FAILURE_POLICY,
    MAX_CARDS_PER_CONTAINER,
    CERT_CHECK_INTERVAL,
    HEALTH_LISTEN,
    METRICS_LISTEN,
    LOG_LEVEL,
)


@dataclass(frozen=True, slots=True, kw_only=True)
class MutationSettings:
    """What the pure mutation needs (docs/protocol.md, "Device config", "Admission")."""

    scheduler_name: str = SCHEDULER_NAME.default_value
    #: HAMi's ``--force-overwrite-default-scheduler``: pods naming ``default-scheduler`` are taken over.
    force_overwrite_default_scheduler: bool = FORCE_OVERWRITE_DEFAULT_SCHEDULER.default_value
    #: More cards than this in one container is refused.
    max_cards_per_container: int = MAX_CARDS_PER_CONTAINER.default_value
    #: The ``--device-config`` file.
    device: DeviceConfig = field(default_factory=DeviceConfig)


@dataclass(frozen=True, slots=True, kw_only=True)
class WebhookSettings:
    """Everything the process needs; each default is its flag's (:data:`FLAGS`, ``docs/webhook.md``)."""

    kubeconfig: str | None = KUBECONFIG.default_value
    listen: Address = LISTEN.default_value
    tls_dir: Path = TLS_DIR.default_value
    manage_config: bool = MANAGE_CONFIG.default_value
    config_name: str = CONFIG_NAME.default_value
    service_name: str = SERVICE_NAME.default_value
    service_namespace: str = SERVICE_NAMESPACE.default_value
    failure_policy: str = FAILURE_POLICY.default_value
    health_listen: Address = HEALTH_LISTEN.default_value
    #: ``GET /metrics`` (Prometheus); its own port because Kopf's liveness server has one fixed route.
    metrics_listen: Address = METRICS_LISTEN.default_value
    #: Seconds between re-reads of the certificate files (Kopf restarts its listener when they change).
    cert_check_interval: float = CERT_CHECK_INTERVAL.default_value
    log_level: str = LOG_LEVEL.default_value
    mutation: MutationSettings = field(default_factory=MutationSettings)

    @property
    def hostnames(self) -> tuple[str, ...]:
        return service_hostnames(self.service_name, self.service_namespace)


def service_hostnames(service: str, namespace: str) -> tuple[str, ...]:
    """Every name the apiserver (or a local client) may use to reach the webhook: the certificate SANs."""
    return (
        service,
        f"{service}.{namespace}",
        f"{service}.{namespace}.svc",
        f"{service}.{namespace}.svc.cluster.local",
        "localhost",
        "127.0.0.1",
    )


def add_arguments(parser: argparse.ArgumentParser, env: Mapping[str, str]) -> None:
    """Declare :data:`FLAGS`; a flag's default comes from its env variable when that is set."""
    add_flags(parser, FLAGS, env)


def settings_from_args(args: argparse.Namespace) -> WebhookSettings:
    """Fold parsed flags into :class:`WebhookSettings`, validating every value."""
    failure_policy = FAILURE_POLICY.read(args)
    log_level = LOG_LEVEL.read(args)
    mutation = MutationSettings(
        scheduler_name=SCHEDULER_NAME.read(args),
        force_overwrite_default_scheduler=FORCE_OVERWRITE_DEFAULT_SCHEDULER.read(args),
        max_cards_per_container=MAX_CARDS_PER_CONTAINER.read(args),
        device=devicefile.load_device_config(DEVICE_CONFIG.read(args)),
    )
    return WebhookSettings(
        kubeconfig=KUBECONFIG.read(args),
        listen=LISTEN.read(args),
        tls_dir=TLS_DIR.read(args),
        manage_config=MANAGE_CONFIG.read(args),
        config_name=CONFIG_NAME.read(args),
        service_name=SERVICE_NAME.read(args),
        service_namespace=SERVICE_NAMESPACE.read(args),
        failure_policy=failure_policy,
        health_listen=HEALTH_LISTEN.read(args),
        metrics_listen=METRICS_LISTEN.read(args),
        cert_check_interval=CERT_CHECK_INTERVAL.read(args),
        log_level=log_level,
        mutation=mutation,
    )


def parse_settings(argv: Sequence[str] | None, env: Mapping[str, str]) -> WebhookSettings:
    """The settings from ``argv`` and ``env``; raises :class:`ConfigError` naming a bad value."""
    parser = argparse.ArgumentParser(
        prog="hami-webhook", description="HAMi mutating admission webhook (Kopf)."
    )
    add_arguments(parser, env)
    return settings_from_args(parser.parse_args(argv))
