"""Settings of the ``hami scheduler`` service: command-line flags with ``HAMI_<FLAG>`` env fallbacks.

Owns :class:`SchedulerSettings` (frozen, built once in :func:`hami.scheduler.main.run` and passed
down), the argparse flags, and reading HAMi's device-config YAML (top key ``nvidia:``). Precedence:
flag, then env ``HAMI_<FLAG_IN_UPPER_SNAKE>`` (e.g. ``HAMI_LISTEN``), then the default (the fallback
and the ``HOST:PORT`` parser are :mod:`hami.process.flags`, shared with the other services). Two listeners:
``--listen`` (the extender verbs, loopback by default: kube-scheduler runs in the same pod) and
``--metrics-listen`` (``/healthz``, ``/readyz``, ``/metrics`` for the kubelet's probes and Prometheus).
Must not import the Kubernetes client or aiohttp.
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
from hami.process.flags import Address, env_default, parse_address, parse_number, parse_whole
from hami.scheduler.workload import DEFAULT_FALLBACK, DEFAULT_HALF_LIFE, DEFAULT_MIN_PODS, parse_fallback
from hami.settings import DeviceConfig

POLICIES = ("binpack", "spread", "fragmentation")
LOG_LEVELS = ("debug", "info", "warning", "error")
#: HAMi's env var for the node lock's expiry (a Go duration), read when --node-lock-timeout is not given.
NODELOCK_EXPIRE = "HAMI_NODELOCK_EXPIRE"
DEFAULT_LOCK_TIMEOUT = datetime.timedelta(minutes=5)
#: HAMi reads extender request bodies up to 1 MiB.
MAX_BODY_BYTES = 1024 * 1024


@dataclass(frozen=True, slots=True, kw_only=True)
class SchedulerSettings:
    kubeconfig: str | None = None
    host: str = "127.0.0.1"  # the verbs: only kube-scheduler beside us calls them
    port: int = 8080
    metrics_host: str = "0.0.0.0"  # probes and scraping reach the pod IP
    metrics_port: int = 9395  # HAMi's --metrics-bind-address
    max_body_bytes: int = MAX_BODY_BYTES
    tls_cert: str | None = None
    tls_key: str | None = None
    scheduler_name: str = "hami-scheduler"
    node_policy: str = "binpack"
    gpu_policy: str = "spread"
    # the least enforcement every granted card must have (pods may raise it): docs/scheduler.md
    require_enforcement: Level = Level.NONE
    # the fragmentation policy's learned target workload (hami.scheduler.workload)
    fragmentation_half_life: float = DEFAULT_HALF_LIFE  # seconds
    fragmentation_min_pods: float = DEFAULT_MIN_PODS
    fragmentation_fallback: tuple[TargetClass, ...] = field(
        default_factory=lambda: parse_fallback(DEFAULT_FALLBACK)
    )
    node_lock_timeout: datetime.timedelta = DEFAULT_LOCK_TIMEOUT
    node_lock_wait: float = 0.0  # seconds a bind waits for a busy node lock; 0 = fail at once (HAMi)
    # seconds a PodGroup member's bind waits for a busy node lock (HAMi's retry); 0 = like other pods
    node_lock_retry_timeout: float = 28.0
    # seconds kube-scheduler waits for /bind (its extender httpTimeout): a bind past it writes no more
    bind_timeout: float = 30.0
    api_timeout: float = 30.0  # seconds one API request may take
    resync_seconds: float = 15.0  # the registration pass: handshakes and stale nodes
    handshake_window: datetime.timedelta = datetime.timedelta(seconds=60)
    device_config: DeviceConfig = field(default_factory=DeviceConfig)
    log_level: str = "info"

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
    """Register the flags; each default comes from ``HAMI_<FLAG>`` when that env var is set."""
    env = os.environ if environ is None else environ

    def flag(name: str, default: str | None, help_text: str, **kwargs: object) -> None:
        parser.add_argument(f"--{name}", default=env_default(name, default, env), help=help_text, **kwargs)  # type: ignore[arg-type]

    flag("kubeconfig", None, "kubeconfig file (default: in-cluster, then ~/.kube/config)")
    flag("listen", "127.0.0.1:8080", "HOST:PORT of the extender verbs (/filter /prioritize /bind)")
    flag("metrics-listen", "0.0.0.0:9395", "HOST:PORT of /healthz, /readyz and /metrics")
    flag("max-body-bytes", str(MAX_BODY_BYTES), "largest request body accepted; larger ones get HTTP 413")
    flag("tls-cert", None, "serve HTTPS with this certificate (PEM); needs --tls-key")
    flag("tls-key", None, "private key (PEM) for --tls-cert")
    flag("scheduler-name", "hami-scheduler", "scheduler name; also the Events' component")
    flag("node-scheduler-policy", "binpack", "default node policy: binpack, spread or fragmentation")
    flag(
        "gpu-scheduler-policy",
        "spread",
        "default GPU policy: binpack, spread, topology-aware, fragmentation, ...",
    )
    flag(
        "require-enforcement",
        "none",
        "least enforcement of every granted card: none, cooperative (hami-core, mps) or isolated "
        "(mps-namespaced, mig); a pod's hami.io/require-enforcement may raise it, never lower it",
    )
    flag(
        "fragmentation-half-life",
        str(int(DEFAULT_HALF_LIFE)),
        "seconds after which a pod counts half in the fragmentation policy's learned workload",
    )
    flag(
        "fragmentation-min-pods",
        str(int(DEFAULT_MIN_PODS)),
        "pods (decayed) to see before the fragmentation policy uses the learned workload",
    )
    flag(
        "fragmentation-fallback",
        DEFAULT_FALLBACK,
        "the fragmentation policy's workload until then: CARDS:MEMORY[%%]:CORES[:WEIGHT],...",
    )
    flag(
        "node-lock-timeout",
        None,
        "seconds (or a Go duration: 5m) after which a node lock may be taken over "
        f"(default: HAMi's {NODELOCK_EXPIRE}, else 300)",
    )
    parser.set_defaults(nodelock_expire=env.get(NODELOCK_EXPIRE) or None)
    flag("node-lock-wait", "0", "seconds a bind waits for another pod's node lock (0: fail at once)")
    flag(
        "node-lock-retry-timeout",
        "28",
        "seconds a PodGroup member's bind waits for another pod's node lock (0: as --node-lock-wait)",
    )
    flag(
        "bind-timeout",
        "30",
        "seconds (or a Go duration) kube-scheduler waits for /bind (its extender httpTimeout); a bind past it"
        " writes no more",
    )
    flag("api-timeout", "30", "seconds one Kubernetes API request may take")
    flag("resync-seconds", "15", "seconds between registration passes (handshakes, stale nodes)")
    flag("device-config", None, "HAMi device-config YAML (top key 'nvidia:')")
    flag("resource-name", None, "count resource name (overrides the device config)")
    flag("resource-mem", None, "memory resource name (overrides the device config)")
    flag("resource-mem-percentage", None, "memory-percentage resource name (overrides the device config)")
    flag("resource-cores", None, "cores resource name (overrides the device config)")
    flag("log-level", "info", "debug, info, warning or error")


class SettingsError(ValueError):
    """A flag or env value is invalid; the message names the flag and the value."""


def _lock_timeout(args: argparse.Namespace) -> datetime.timedelta:
    """``--node-lock-timeout`` (seconds, or a Go duration like HAMi's flag), else HAMi's
    ``HAMI_NODELOCK_EXPIRE`` (a Go duration, as HAMi's node-lock library reads it), else 5 minutes."""
    text = args.node_lock_timeout
    if text is None:
        expire = getattr(args, "nodelock_expire", None)
        if expire is None:
            return DEFAULT_LOCK_TIMEOUT
        try:
            value = parse_go_duration(expire)
        except ValueError as exc:
            raise SettingsError(f"{NODELOCK_EXPIRE} must be a positive Go duration: {exc}") from None
        if value <= datetime.timedelta(0):
            raise SettingsError(f"{NODELOCK_EXPIRE} must be a positive Go duration, got {expire!r}")
        return value
    return _duration("node-lock-timeout", text)


def _duration(name: str, text: str) -> datetime.timedelta:
    """A positive time: a number of seconds, or a Go duration (``30s``, ``5m``) as HAMi's flags and
    kube-scheduler's configuration write them."""
    try:
        value = datetime.timedelta(seconds=float(text))
    except (ValueError, OverflowError):
        try:
            value = parse_go_duration(text)
        except ValueError:
            raise SettingsError(
                f"--{name} must be a number of seconds, got {text!r} (or a Go duration: 5m, 90s)"
            ) from None
    if value <= datetime.timedelta(0):
        raise SettingsError(f"--{name} must be positive, got {text!r}")
    return value


def _fallback(text: str) -> tuple[TargetClass, ...]:
    try:
        return parse_fallback(text)
    except ValueError as exc:
        raise SettingsError(f"--fragmentation-fallback: {exc}") from None


def _seconds(name: str, text: str) -> float:
    return parse_number(name, text, unit="seconds", positive=True, error=SettingsError)


def _wait(name: str, text: str) -> float:
    """A lock wait: 0..28 s, so a bind answers within kube-scheduler's 30 s extender timeout."""
    return parse_number(name, text, unit="seconds", minimum=0, maximum=28, error=SettingsError)


def _level(text: str) -> Level:
    level = parse_level(str(text))
    if level is None:
        raise SettingsError(f"--require-enforcement must be one of {', '.join(LEVEL_WORDS)}, got {text!r}")
    return level


def load_device_config(path: str | None) -> DeviceConfig:
    try:
        return devicefile.load_device_config(path)
    except devicefile.DeviceConfigFileError as exc:
        raise SettingsError(str(exc)) from exc


def from_args(args: argparse.Namespace) -> SchedulerSettings:
    """Validate the parsed flags into settings; raises :class:`SettingsError` naming the flag."""
    listen = parse_address("listen", args.listen, SettingsError)
    metrics = parse_address("metrics-listen", args.metrics_listen, SettingsError)
    if listen.port == metrics.port != 0:
        raise SettingsError(f"--listen and --metrics-listen must use different ports, both are {listen.port}")
    for name, value in (("node-scheduler-policy", args.node_scheduler_policy),):
        if value not in POLICIES:
            raise SettingsError(f"--{name} must be one of {', '.join(POLICIES)}, got {value!r}")
    if bool(args.tls_cert) != bool(args.tls_key):
        raise SettingsError("--tls-cert and --tls-key must be given together")
    level = str(args.log_level).lower()
    if level not in LOG_LEVELS:
        raise SettingsError(f"--log-level must be one of {', '.join(LOG_LEVELS)}, got {args.log_level!r}")
    device_config = load_device_config(args.device_config)
    overrides = {
        "count": args.resource_name,
        "memory": args.resource_mem,
        "memory_percentage": args.resource_mem_percentage,
        "cores": args.resource_cores,
    }
    names = {k: v for k, v in overrides.items() if v}
    if names:
        device_config = replace(device_config, resources=replace(device_config.resources, **names))
    return SchedulerSettings(
        kubeconfig=args.kubeconfig or None,
        host=listen.host,
        port=listen.port,
        metrics_host=metrics.host,
        metrics_port=metrics.port,
        max_body_bytes=parse_whole(
            "max-body-bytes",
            args.max_body_bytes,
            unit="bytes",
            minimum=1024,
            maximum=1024**3,
            error=SettingsError,
        ),
        tls_cert=args.tls_cert or None,
        tls_key=args.tls_key or None,
        scheduler_name=args.scheduler_name,
        node_policy=args.node_scheduler_policy,
        gpu_policy=args.gpu_scheduler_policy,
        require_enforcement=_level(args.require_enforcement),
        fragmentation_half_life=parse_number(
            "fragmentation-half-life",
            args.fragmentation_half_life,
            unit="seconds",
            minimum=1,
            maximum=10**9,
            error=SettingsError,
        ),
        fragmentation_min_pods=parse_number(
            "fragmentation-min-pods",
            args.fragmentation_min_pods,
            minimum=0,
            maximum=10**9,
            error=SettingsError,
        ),
        fragmentation_fallback=_fallback(args.fragmentation_fallback),
        node_lock_timeout=_lock_timeout(args),
        node_lock_wait=_wait("node-lock-wait", args.node_lock_wait),
        node_lock_retry_timeout=_wait("node-lock-retry-timeout", args.node_lock_retry_timeout),
        bind_timeout=_duration("bind-timeout", args.bind_timeout).total_seconds(),
        api_timeout=_seconds("api-timeout", args.api_timeout),
        resync_seconds=_seconds("resync-seconds", args.resync_seconds),
        device_config=device_config,
        log_level=level,
    )
