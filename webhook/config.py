"""The webhook's settings: command-line flags (each with an ``HAMI_<FLAG>`` env fallback) and HAMi's
device-config YAML, folded into one frozen :class:`WebhookSettings` built once in ``__main__``.

Owns the flags and the Service DNS names the serving certificate must cover; the env fallback and the
``HOST:PORT`` parser (:class:`Address`) are :mod:`hami.process.flags`, shared with the other services.
Errors name the flag (or env variable, or file) and the offending text. Must not import kopf, aiohttp
or the Kubernetes client: the pure mutation reads these settings too.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from hami import devicefile
from hami.process.flags import (
    Address,
    env_default,
    env_name,
    parse_address,
    parse_bool,
    parse_number,
    parse_whole,
)
from hami.settings import DeviceConfig

#: The Kopf handler id: Kopf serves each admission handler at ``/<id>``, so this is the URL path.
HANDLER_ID = "webhook"
#: The webhook's name inside the MutatingWebhookConfiguration (HAMi's chart uses the same).
WEBHOOK_NAME = "vgpu.hami.io"
FAILURE_POLICIES = ("Fail", "Ignore")


class ConfigError(ValueError):
    """A flag, env value or config file is wrong; the message names it and the offending text."""


@dataclass(frozen=True, slots=True, kw_only=True)
class MutationSettings:
    """What the pure mutation needs (docs/protocol.md, "Device config", "Admission")."""

    scheduler_name: str = "hami-scheduler"
    #: HAMi's ``--force-overwrite-default-scheduler``: pods naming ``default-scheduler`` are taken over.
    force_overwrite_default_scheduler: bool = True
    #: More cards than this in one container is refused (HAMi has no limit; nodes rarely have more).
    max_cards_per_container: int = 16
    device: DeviceConfig = field(default_factory=DeviceConfig)


@dataclass(frozen=True, slots=True, kw_only=True)
class WebhookSettings:
    """Everything the process needs; see ``docs/webhook.md`` for each knob."""

    kubeconfig: str | None = None
    listen: Address = field(default_factory=lambda: Address(host="0.0.0.0", port=9443))
    tls_dir: Path = Path("/etc/hami/tls")
    manage_config: bool = False
    config_name: str = "hami-webhook"
    service_name: str = "hami-webhook"
    service_namespace: str = "kube-system"
    failure_policy: str = "Fail"
    health_listen: Address = field(default_factory=lambda: Address(host="0.0.0.0", port=8081))
    #: ``GET /metrics`` (Prometheus); its own port because Kopf's liveness server has one fixed route.
    metrics_listen: Address = field(default_factory=lambda: Address(host="0.0.0.0", port=8082))
    #: Seconds between re-reads of the certificate files (Kopf restarts its listener when they change).
    cert_check_interval: float = 60.0
    log_level: str = "INFO"
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


# flag -> (default text, help). Booleans are listed in _BOOL_FLAGS.
_FLAGS: dict[str, tuple[str | None, str]] = {
    "kubeconfig": (None, "kubeconfig file (default: in-cluster, then ~/.kube/config)"),
    "listen": ("0.0.0.0:9443", "HOST:PORT the HTTPS admission endpoint listens on (path /webhook)"),
    "tls-dir": (
        "/etc/hami/tls",
        "directory with ca.crt, tls.crt, tls.key (made here if absent and writable)",
    ),
    "config-name": ("hami-webhook", "name of the MutatingWebhookConfiguration written by --manage-config"),
    "service-name": ("hami-webhook", "Service name (for the certificate SANs)"),
    "service-namespace": ("kube-system", "Service namespace (for the certificate SANs)"),
    "scheduler-name": ("hami-scheduler", "scheduler name set on GPU pods"),
    "device-config": (None, "HAMi device-config YAML (top-level key nvidia:)"),
    "failure-policy": ("Fail", "failurePolicy of the managed webhook: Fail or Ignore"),
    "health-listen": ("0.0.0.0:8081", "HOST:PORT serving GET /healthz"),
    "metrics-listen": ("0.0.0.0:8082", "HOST:PORT serving GET /metrics (Prometheus)"),
    "max-cards-per-container": ("16", "refuse containers asking for more cards than this"),
    "cert-check-interval": ("60", "seconds between re-reads of the certificate files"),
    "log-level": ("INFO", "DEBUG, INFO, WARNING or ERROR"),
}
_BOOL_FLAGS: dict[str, tuple[bool, str]] = {
    "manage-config": (False, "create and keep the MutatingWebhookConfiguration up to date (local runs)"),
    "force-overwrite-default-scheduler": (True, "take over GPU pods that name default-scheduler"),
}


def add_arguments(parser: argparse.ArgumentParser, env: Mapping[str, str]) -> None:
    """Declare every flag; a flag's default comes from ``HAMI_<FLAG>`` when that is set."""
    for flag, (default, help_text) in _FLAGS.items():
        name = env_name(flag)
        default = env_default(flag, default, env)
        parser.add_argument(f"--{flag}", default=default, help=f"{help_text} [env {name}]")
    for flag, (default_bool, help_text) in _BOOL_FLAGS.items():
        name = env_name(flag)
        value = parse_bool(name, env[name], ConfigError) if name in env else default_bool
        parser.add_argument(
            f"--{flag}",
            action=argparse.BooleanOptionalAction,
            default=value,
            help=f"{help_text} [env {name}]",
        )


def load_device_config(path: str | None) -> DeviceConfig:
    """Read HAMi's device-config YAML; errors name the file."""
    try:
        return devicefile.load_device_config(path)
    except devicefile.DeviceConfigFileError as exc:
        raise ConfigError(str(exc)) from exc


def settings_from_args(args: argparse.Namespace) -> WebhookSettings:
    """Fold parsed flags into :class:`WebhookSettings`, validating every value."""
    if args.failure_policy not in FAILURE_POLICIES:
        raise ConfigError(f"--failure-policy must be Fail or Ignore, got {args.failure_policy!r}")
    if args.log_level.upper() not in ("DEBUG", "INFO", "WARNING", "ERROR"):
        raise ConfigError(f"--log-level must be DEBUG, INFO, WARNING or ERROR, got {args.log_level!r}")
    mutation = MutationSettings(
        scheduler_name=args.scheduler_name,
        force_overwrite_default_scheduler=args.force_overwrite_default_scheduler,
        max_cards_per_container=parse_whole(
            "max-cards-per-container", args.max_cards_per_container, minimum=1, error=ConfigError
        ),
        device=load_device_config(args.device_config),
    )
    return WebhookSettings(
        kubeconfig=args.kubeconfig or None,
        listen=parse_address("listen", args.listen, ConfigError),
        tls_dir=Path(args.tls_dir),
        manage_config=args.manage_config,
        config_name=args.config_name,
        service_name=args.service_name,
        service_namespace=args.service_namespace,
        failure_policy=args.failure_policy,
        health_listen=parse_address("health-listen", args.health_listen, ConfigError),
        metrics_listen=parse_address("metrics-listen", args.metrics_listen, ConfigError),
        cert_check_interval=parse_number(
            "cert-check-interval", args.cert_check_interval, minimum=0.01, error=ConfigError
        ),
        log_level=args.log_level.upper(),
        mutation=mutation,
    )


def parse_settings(argv: Sequence[str] | None, env: Mapping[str, str]) -> WebhookSettings:
    parser = argparse.ArgumentParser(
        prog="hami-webhook", description="HAMi mutating admission webhook (Kopf)."
    )
    add_arguments(parser, env)
    return settings_from_args(parser.parse_args(argv))
