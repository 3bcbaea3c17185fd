"""Settings of the ``hami scheduler`` service: its flag schema and the frozen settings built from it.

Owns :data:`FLAGS`, every flag of the service declared once (type, default, ``HAMI_<FLAG>`` env
variable and help, as a :class:`~hami.process.flags.Flag`), :class:`SchedulerSettings` (frozen, its
defaults the flags' own, built once in :func:`hami.scheduler.main.run` and passed down) and
:func:`from_args`, which reads the flags and checks what no single flag can (the two listeners' ports,
the TLS pair, the device config with its resource-name overrides). Precedence: flag, then env
``HAMI_<FLAG_IN_UPPER_SNAKE>`` (e.g. ``HAMI_LISTEN``), then (``--node-lock-timeout`` only) HAMi's
``HAMI_NODELOCK_EXPIRE``, then the default. Two listeners: ``--listen`` (the extender verbs, loopback by
default: kube-scheduler runs in the same pod) and ``--metrics-listen`` (``/healthz``, ``/readyz``,
``/metrics`` for the kubelet's probes and Prometheus). Bad values raise
:class:`hami.settings.ConfigError` naming the flag (or variable) and the text; the device-config file is
:mod:`hami.devicefile`'s. Must not import the Kubernetes client or aiohttp.
"""

from __future__ import annotations

import argparse
import datetime
import os
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from hami import devicefile
from hami.annotations.lock import parse_go_duration
from hami.core.allocate import Policy
from hami.core.enforcement import LEVEL_WORDS, Level, parse_level
from hami.core.fragmentation import TargetClass
from hami.process.flags import (
    KUBECONFIG,
    LOG_LEVEL,
    Address,
    Flag,
    Flags,
    add_flags,
    address,
    boolean,
    number,
    optional_text,
    plain,
    whole,
)
from hami.scheduler.workload import DEFAULT_FALLBACK, DEFAULT_HALF_LIFE, DEFAULT_MIN_PODS, parse_fallback
from hami.settings import ConfigError, DeviceConfig

POLICIES = ("binpack", "spread", "fragmentation")
#: HAMi's env var for the node lock's expiry (a Go duration), read when --node-lock-timeout is not given.
NODELOCK_EXPIRE = "HAMI_NODELOCK_EXPIRE"


def _policy(flag: str, text: str) -> str:
    if text not in POLICIES:
        raise ConfigError(f"--{flag} must be one of {', '.join(POLICIES)}, got {text!r}")
    return text


def _level(flag: str, text: str) -> Level:
    level = parse_level(text)
    if level is None:
        raise ConfigError(f"--{flag} must be one of {', '.join(LEVEL_WORDS)}, got {text!r}")
    return level


def _fallback(flag: str, text: str) -> tuple[TargetClass, ...]:
    try:
        return parse_fallback(text)
    except ValueError as exc:
        raise ConfigError(f"--{flag}: {exc}") from None


def _duration(flag: str, text: str) -> datetime.timedelta:
    """A positive time: a number of seconds, or a Go duration (``30s``, ``5m``) as HAMi's flags and
    kube-scheduler's configuration write them."""
    try:
        value = datetime.timedelta(seconds=float(text))
    except (ValueError, OverflowError):
        try:
            value = parse_go_duration(text)
        except ValueError:
            raise ConfigError(
                f"--{flag} must be a number of seconds, got {text!r} (or a Go duration: 5m, 90s)"
            ) from None
    if value <= datetime.timedelta(0):
        raise ConfigError(f"--{flag} must be positive, got {text!r}")
    return value


def _duration_seconds(flag: str, text: str) -> float:
    return _duration(flag, text).total_seconds()


def _go_duration(variable: str, text: str) -> datetime.timedelta:
    """HAMi's ``HAMI_NODELOCK_EXPIRE``: a positive Go duration, as HAMi's node-lock library reads it."""
    try:
        value = parse_go_duration(text)
    except ValueError as exc:
        raise ConfigError(f"{variable} must be a positive Go duration: {exc}") from None
    if value <= datetime.timedelta(0):
        raise ConfigError(f"{variable} must be a positive Go duration, got {text!r}")
    return value


_SECONDS = number(unit="seconds", positive=True)
#: A lock wait: 0..28 s, so a bind answers within kube-scheduler's 30 s extender timeout.
_LOCK_WAIT = number(unit="seconds", minimum=0, maximum=28)

LISTEN = Flag(
    name="listen",
    parse=address,
    default="127.0.0.1:8080",  # the verbs: only kube-scheduler beside us calls them
    metavar="HOST:PORT",
    help="where the extender verbs are served (/filter /prioritize /bind)",
)
METRICS_LISTEN = Flag(
    name="metrics-listen",
    parse=address,
    default="0.0.0.0:9395",  # HAMi's --metrics-bind-address; probes and scraping reach the pod IP
    metavar="HOST:PORT",
    help="where /healthz, /readyz and /metrics are served",
)
MAX_BODY_BYTES = Flag(
    name="max-body-bytes",
    parse=whole(unit="bytes", minimum=1024, maximum=1024**3),
    default=str(1024 * 1024),  # HAMi reads extender request bodies up to 1 MiB
    metavar="N",
    help="largest request body accepted; larger ones get HTTP 413",
)
TLS_CERT = Flag(
    name="tls-cert",
    parse=optional_text,
    metavar="FILE",
    help="serve HTTPS with this certificate (PEM); needs --tls-key",
)
TLS_KEY = Flag(name="tls-key", parse=optional_text, metavar="FILE", help="private key (PEM) for --tls-cert")
SCHEDULER_NAME = Flag(
    name="scheduler-name",
    metavar="NAME",
    parse=plain,
    default="hami-scheduler",
    help="scheduler name; also the Events' component",
)
NODE_SCHEDULER_POLICY = Flag(
    name="node-scheduler-policy",
    metavar="POLICY",
    parse=_policy,
    default="binpack",
    help="default node policy: binpack, spread or fragmentation",
)
GPU_SCHEDULER_POLICY = Flag(
    name="gpu-scheduler-policy",
    metavar="POLICY",
    parse=plain,
    default="spread",
    help="default GPU policy: binpack, spread, topology-aware, fragmentation, ...",
)
REQUIRE_ENFORCEMENT = Flag(
    name="require-enforcement",
    parse=_level,
    default="none",
    metavar="LEVEL",
    help="least enforcement of every granted card: none, cooperative (hami-core, mps) or isolated "
    "(mps-namespaced, mig); a pod's hami.io/require-enforcement may raise it, never lower it",
)
FRAGMENTATION_HALF_LIFE = Flag(
    name="fragmentation-half-life",
    parse=number(unit="seconds", minimum=1, maximum=10**9),
    default=f"{DEFAULT_HALF_LIFE:g}",
    metavar="SECONDS",
    help="seconds after which a pod counts half in the fragmentation policy's learned workload",
)
FRAGMENTATION_MIN_PODS = Flag(
    name="fragmentation-min-pods",
    parse=number(minimum=0, maximum=10**9),
    default=f"{DEFAULT_MIN_PODS:g}",
    metavar="N",
    help="pods (decayed) to see before the fragmentation policy uses the learned workload",
)
FRAGMENTATION_FALLBACK = Flag(
    name="fragmentation-fallback",
    parse=_fallback,
    default=DEFAULT_FALLBACK,
    metavar="CLASSES",
    help="the fragmentation policy's workload until then: CARDS:MEMORY[%]:CORES[:WEIGHT],...",
)
NODE_LOCK_TIMEOUT = Flag(
    name="node-lock-timeout",
    parse=_duration,
    default="300",
    metavar="SECONDS",
    help="seconds (or a Go duration: 5m) after which a node lock may be taken over",
    also_env=(NODELOCK_EXPIRE,),
    parse_also=_go_duration,
)
NODE_LOCK_WAIT = Flag(
    name="node-lock-wait",
    parse=_LOCK_WAIT,
    default="0",  # HAMi fails at once
    metavar="SECONDS",
    help="seconds a bind waits for another pod's node lock (0: fail at once)",
)
NODE_LOCK_RETRY_TIMEOUT = Flag(
    name="node-lock-retry-timeout",
    parse=_LOCK_WAIT,
    default="28",  # HAMi's retry of a PodGroup member's bind
    metavar="SECONDS",
    help="seconds a PodGroup member's bind waits for another pod's node lock (0: as --node-lock-wait)",
)
BIND_TIMEOUT = Flag(
    name="bind-timeout",
    parse=_duration_seconds,
    default="30",
    metavar="SECONDS",
    help="seconds (or a Go duration) kube-scheduler waits for /bind (its extender httpTimeout); a bind "
    "past it writes no more",
)
API_TIMEOUT = Flag(
    name="api-timeout",
    parse=_SECONDS,
    default="30",
    metavar="SECONDS",
    help="seconds one Kubernetes API request may take",
)
RESYNC_SECONDS = Flag(
    name="resync-seconds",
    parse=_SECONDS,
    default="15",
    metavar="SECONDS",
    help="seconds between registration passes (handshakes, stale nodes)",
)
WAKE_PENDING = Flag(
    name="wake-pending",
    metavar="true|false",
    parse=boolean,
    default="true",
    help="when cards are freed on a node, touch the pending pods filter rejected that fit there now, so "
    "kube-scheduler retries them (true/false)",
)
DEVICE_CONFIG = Flag(
    name="device-config",
    parse=optional_text,
    metavar="FILE",
    help="HAMi device-config YAML (top key 'nvidia:')",
)
RESOURCE_NAME = Flag(
    name="resource-name",
    metavar="NAME",
    parse=optional_text,
    help="count resource name (overrides the device config)",
)
RESOURCE_MEM = Flag(
    name="resource-mem",
    metavar="NAME",
    parse=optional_text,
    help="memory resource name (overrides the device config)",
)
RESOURCE_MEM_PERCENTAGE = Flag(
    name="resource-mem-percentage",
    metavar="NAME",
    parse=optional_text,
    help="memory-percentage resource name (overrides the device config)",
)
RESOURCE_CORES = Flag(
    name="resource-cores",
    metavar="NAME",
    parse=optional_text,
    help="cores resource name (overrides the device config)",
)

#: The service's schema, in ``--help`` order.
FLAGS: Flags = (
    KUBECONFIG,
    LISTEN,
    METRICS_LISTEN,
    MAX_BODY_BYTES,
    TLS_CERT,
    TLS_KEY,
    SCHEDULER_NAME,
    NODE_SCHEDULER_POLICY,
    GPU_SCHEDULER_POLICY,
    REQUIRE_ENFORCEMENT,
    FRAGMENTATION_HALF_LIFE,
    FRAGMENTATION_MIN_PODS,
    FRAGMENTATION_FALLBACK,
    NODE_LOCK_TIMEOUT,
    NODE_LOCK_WAIT,
    NODE_LOCK_RETRY_TIMEOUT,
    BIND_TIMEOUT,
    API_TIMEOUT,
    RESYNC_SECONDS,
    WAKE_PENDING,
    DEVICE_CONFIG,
    RESOURCE_NAME,
    RESOURCE_MEM,
    RESOURCE_MEM_PERCENTAGE,
    RESOURCE_CORES,
    LOG_LEVEL,
)


@dataclass(frozen=True, slots=True, kw_only=True)
class SchedulerSettings:
    """What the service runs with; each default is its flag's (:data:`FLAGS`)."""

    kubeconfig: str | None = KUBECONFIG.default_value
    host: str = LISTEN.default_value.host
    port: int = LISTEN.default_value.port
    metrics_host: str = METRICS_LISTEN.default_value.host
    metrics_port: int = METRICS_LISTEN.default_value.port
    max_body_bytes: int = MAX_BODY_BYTES.default_value
    tls_cert: str | None = TLS_CERT.default_value
    tls_key: str | None = TLS_KEY.default_value
    scheduler_name: str = SCHEDULER_NAME.default_value
    node_policy: str = NODE_SCHEDULER_POLICY.default_value
    gpu_policy: str = GPU_SCHEDULER_POLICY.default_value
    # the least enforcement every granted card must have (pods may raise it): docs/scheduler.md
    require_enforcement: Level = REQUIRE_ENFORCEMENT.default_value
    # the fragmentation policy's learned target workload (hami.scheduler.workload)
    fragmentation_half_life: float = FRAGMENTATION_HALF_LIFE.default_value  # seconds
    fragmentation_min_pods: float = FRAGMENTATION_MIN_PODS.default_value
    fragmentation_fallback: tuple[TargetClass, ...] = FRAGMENTATION_FALLBACK.default_value
    node_lock_timeout: datetime.timedelta = NODE_LOCK_TIMEOUT.default_value
    node_lock_wait: float = NODE_LOCK_WAIT.default_value  # seconds a bind waits for a busy node lock
    # seconds a PodGroup member's bind waits for a busy node lock (HAMi's retry); 0 = like other pods
    node_lock_retry_timeout: float = NODE_LOCK_RETRY_TIMEOUT.default_value
    # seconds kube-scheduler waits for /bind (its extender httpTimeout): a bind past it writes no more
    bind_timeout: float = BIND_TIMEOUT.default_value
    api_timeout: float = API_TIMEOUT.default_value  # seconds one API request may take
    resync_seconds: float = RESYNC_SECONDS.default_value  # the registration pass: handshakes and stale nodes
    handshake_window: datetime.timedelta = datetime.timedelta(seconds=60)
    wake_pending: bool = WAKE_PENDING.default_value  # wake parked pods when cards are freed (wakeup)
    # the --device-config file with the --resource-* names over it
    device_config: DeviceConfig = field(default_factory=DeviceConfig)
    log_level: str = LOG_LEVEL.default_value

    @property
    def allocating_horizon(self) -> datetime.timedelta:
        """How long an unbound pod's ``bind-phase=allocating`` counts: twice the bind timeout."""
        return datetime.timedelta(seconds=2 * self.bind_timeout)

    @property
    def policy(self) -> Policy:
        return Policy(
            node_policy=self.node_policy, gpu_policy=self.gpu_policy, enforcement=self.require_enforcement
        )

    @property
    def listen(self) -> Address:
        """Where the verbs are served."""
        return Address(host=self.host, port=self.port)

    @property
    def metrics_listen(self) -> Address:
        """Where the probes and metrics are served."""
        return Address(host=self.metrics_host, port=self.metrics_port)


def add_arguments(parser: argparse.ArgumentParser, environ: Mapping[str, str] | None = None) -> None:
    """Register :data:`FLAGS`; each default comes from its env variable when that is set."""
    add_flags(parser, FLAGS, os.environ if environ is None else environ)


def from_args(args: argparse.Namespace) -> SchedulerSettings:
    """Validate the parsed flags into settings; raises :class:`ConfigError` naming the flag."""
    listen = LISTEN.read(args)
    metrics = METRICS_LISTEN.read(args)
    if listen.port == metrics.port != 0:
        raise ConfigError(f"--listen and --metrics-listen must use different ports, both are {listen.port}")
    node_policy = NODE_SCHEDULER_POLICY.read(args)
    tls_cert, tls_key = TLS_CERT.read(args), TLS_KEY.read(args)
    if bool(tls_cert) != bool(tls_key):
        raise ConfigError("--tls-cert and --tls-key must be given together")
    log_level = LOG_LEVEL.read(args)
    return SchedulerSettings(
        kubeconfig=KUBECONFIG.read(args),
        host=listen.host,
        port=listen.port,
        metrics_host=metrics.host,
        metrics_port=metrics.port,
        max_body_bytes=MAX_BODY_BYTES.read(args),
        tls_cert=tls_cert,
        tls_key=tls_key,
        scheduler_name=SCHEDULER_NAME.read(args),
        node_policy=node_policy,
        gpu_policy=GPU_SCHEDULER_POLICY.read(args),
        require_enforcement=REQUIRE_ENFORCEMENT.read(args),
        fragmentation_half_life=FRAGMENTATION_HALF_LIFE.read(args),
        fragmentation_min_pods=FRAGMENTATION_MIN_PODS.read(args),
        fragmentation_fallback=FRAGMENTATION_FALLBACK.read(args),
        node_lock_timeout=NODE_LOCK_TIMEOUT.read(args),
        node_lock_wait=NODE_LOCK_WAIT.read(args),
        node_lock_retry_timeout=NODE_LOCK_RETRY_TIMEOUT.read(args),
        bind_timeout=BIND_TIMEOUT.read(args),
        api_timeout=API_TIMEOUT.read(args),
        resync_seconds=RESYNC_SECONDS.read(args),
        wake_pending=WAKE_PENDING.read(args),
        device_config=_device_config(args),
        log_level=log_level,
    )


def _device_config(args: argparse.Namespace) -> DeviceConfig:
    """The ``--device-config`` file with the ``--resource-*`` names over it."""
    config = devicefile.load_device_config(DEVICE_CONFIG.read(args))
    overrides = {
        "count": RESOURCE_NAME.read(args),
        "memory": RESOURCE_MEM.read(args),
        "memory_percentage": RESOURCE_MEM_PERCENTAGE.read(args),
        "cores": RESOURCE_CORES.read(args),
    }
    names = {key: name for key, name in overrides.items() if name}
    if not names:
        return config
    return replace(config, resources=replace(config.resources, **names))
