"""Flags, HAMI_<FLAG> env fallbacks and the device-config file of ``hami scheduler``."""

from __future__ import annotations

import argparse
import datetime
from pathlib import Path

import pytest

from hami.scheduler.config import add_arguments, from_args
from hami.scheduler.main import run
from hami.settings import ConfigError


def _parse(argv: list[str], environ: dict[str, str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_arguments(parser, environ or {})
    return parser.parse_args(argv)


def test_defaults_match_the_interface() -> None:
    settings = from_args(_parse([]))
    # the verbs on loopback only (kube-scheduler is in the same pod); probes and scraping on the pod IP
    assert (settings.host, settings.port) == ("127.0.0.1", 8080)
    assert (settings.metrics_host, settings.metrics_port) == ("0.0.0.0", 9395)
    assert settings.max_body_bytes == 1024 * 1024  # HAMi's limit
    assert settings.scheduler_name == "hami-scheduler"
    assert (settings.node_policy, settings.gpu_policy) == ("binpack", "spread")
    assert settings.node_lock_timeout == datetime.timedelta(minutes=5)
    assert settings.node_lock_wait == 0.0
    assert settings.node_lock_retry_timeout == 28.0  # HAMi's PodGroup retry
    assert settings.device_config.resources.count == "nvidia.com/gpu"


def test_env_fills_in_and_flags_win() -> None:
    env = {
        "HAMI_LISTEN": "127.0.0.1:9000",
        "HAMI_NODE_SCHEDULER_POLICY": "spread",
        "HAMI_NODE_LOCK_TIMEOUT": "60",
        "HAMI_NODE_LOCK_RETRY_TIMEOUT": "0",
    }
    settings = from_args(_parse([], env))
    assert settings.node_lock_retry_timeout == 0.0
    assert from_args(_parse(["--node-lock-retry-timeout", "5"], env)).node_lock_retry_timeout == 5.0
    assert (settings.host, settings.port, settings.node_policy) == ("127.0.0.1", 9000, "spread")
    assert settings.node_lock_timeout == datetime.timedelta(seconds=60)
    assert from_args(_parse(["--listen", "[::1]:81"], env)).port == 81
    moved = from_args(_parse(["--max-body-bytes", "4096"], {"HAMI_METRICS_LISTEN": "127.0.0.1:9100"}))
    assert (moved.metrics_host, moved.metrics_port, moved.max_body_bytes) == ("127.0.0.1", 9100, 4096)


def test_device_config_and_resource_overrides(tmp_path: Path) -> None:
    path = tmp_path / "device-config.yaml"
    path.write_text("nvidia:\n  resourceCountName: example.com/gpu\n  deviceSplitCount: 4\n")
    settings = from_args(_parse(["--device-config", str(path), "--resource-mem", "example.com/mem"]))
    assert settings.device_config.resources.count == "example.com/gpu"
    assert settings.device_config.resources.memory == "example.com/mem"
    assert settings.device_config.device_split_count == 4


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--listen", "nowhere"], "--listen must be HOST:PORT, got 'nowhere'"),
        (["--metrics-listen", "9395"], "--metrics-listen must be HOST:PORT, got '9395'"),
        (
            ["--listen", "127.0.0.1:9000", "--metrics-listen", "0.0.0.0:9000"],
            "--listen and --metrics-listen must use different ports, both are 9000",
        ),
        (["--max-body-bytes", "1MiB"], "--max-body-bytes must be a whole number of bytes, got '1MiB'"),
        (["--max-body-bytes", "10"], "--max-body-bytes must be between 1024 and 1073741824 bytes"),
        (["--node-scheduler-policy", "random"], "--node-scheduler-policy must be one of binpack, spread"),
        (["--node-lock-timeout", "soon"], "--node-lock-timeout must be a number of seconds, got 'soon'"),
        (["--node-lock-wait", "60"], "--node-lock-wait must be between 0 and 28 seconds, got '60'"),
        (
            ["--node-lock-retry-timeout", "-1"],
            "--node-lock-retry-timeout must be between 0 and 28 seconds, got '-1'",
        ),
        (
            ["--node-lock-retry-timeout", "28s"],
            "--node-lock-retry-timeout must be a number of seconds, got '28s'",
        ),
        (["--tls-cert", "c.pem"], "--tls-cert and --tls-key must be given together"),
        # not finite: a NaN deadline never passes (every comparison with it is false), an infinite one
        # never ends
        (["--bind-timeout", "nan"], "--bind-timeout must be a number of seconds, got 'nan'"),
        (["--api-timeout", "inf"], "--api-timeout must be a number of seconds, got 'inf'"),
        (["--node-lock-wait", "nan"], "--node-lock-wait must be a number of seconds, got 'nan'"),
        (
            ["--fragmentation-half-life", "nan"],
            "--fragmentation-half-life must be a number of seconds, got 'nan'",
        ),
        (
            ["--fragmentation-half-life", "inf"],
            "--fragmentation-half-life must be a number of seconds, got 'inf'",
        ),
        (
            ["--fragmentation-half-life", "0.5"],
            "--fragmentation-half-life must be between 1 and 1000000000 seconds, got '0.5'",
        ),
        (
            ["--fragmentation-min-pods", "-1"],
            "--fragmentation-min-pods must be between 0 and 1000000000, got '-1'",
        ),
        (
            ["--fragmentation-fallback", "1:50%"],
            "--fragmentation-fallback: '1:50%': expected CARDS:MEMORY:CORES",
        ),
        (["--fragmentation-fallback", "1:50%:50:nan"], "WEIGHT must be a positive number"),
        (["--device-config", "/nonexistent/x.yaml"], "--device-config /nonexistent/x.yaml"),
    ],
)
def test_bad_values_are_named(argv: list[str], message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace("[", r"\[")):
        from_args(_parse(argv))


def test_the_fragmentation_policy_and_its_workload_flags() -> None:
    env = {"HAMI_FRAGMENTATION_MIN_PODS": "50"}
    argv = ["--node-scheduler-policy", "fragmentation", "--gpu-scheduler-policy", "fragmentation"]
    argv += ["--fragmentation-half-life", "600", "--fragmentation-fallback", "2:100%:100:3, 1:4000:30"]
    settings = from_args(_parse(argv, env))
    assert (settings.node_policy, settings.gpu_policy) == ("fragmentation", "fragmentation")
    assert (settings.fragmentation_half_life, settings.fragmentation_min_pods) == (600.0, 50.0)
    assert [
        (c.nums, c.memory_mib, c.percentage, c.cores, c.weight) for c in settings.fragmentation_fallback
    ] == [
        (2, 0, 100, 100, 3.0),
        (1, 4000, 101, 30, 1.0),
    ]
    defaults = from_args(_parse([]))
    assert (defaults.fragmentation_half_life, defaults.fragmentation_min_pods) == (21600.0, 20.0)
    assert len(defaults.fragmentation_fallback) == 3


def test_run_refuses_bad_flags_with_exit_code_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert run(_parse(["--listen", "nowhere"])) == 2
    assert "--listen must be HOST:PORT" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("flag", "text"),
    [
        ("listen", "127.0.0.1:²"),  # str.isdigit says yes, int() raises its own ValueError
        ("listen", "127.0.0.1:" + "9" * 5000),  # int() refuses more than 4300 digits
        ("metrics-listen", "0.0.0.0:٩٣٩٥"),  # Arabic-Indic digits: int() reads 9395
        ("listen", "::1:9000"),  # the host ::1 on port 9000, or the address ::1:9000 without a port
    ],
)
def test_hostile_listen_addresses_are_one_line_and_exit_2(
    flag: str, text: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run(_parse([f"--{flag}", text])) == 2
    assert capsys.readouterr().err.startswith(f"hami scheduler: --{flag} must be HOST:PORT, got {text!r}")


def test_bind_timeout_sets_the_deadline_and_the_allocating_horizon() -> None:
    default = from_args(_parse([]))
    # kube-scheduler's extender httpTimeout (its default and the chart's): 30 s; the horizon is twice it
    assert default.bind_timeout == 30.0
    assert default.allocating_horizon == datetime.timedelta(seconds=60)
    longer = from_args(_parse(["--bind-timeout", "45"], {"HAMI_BIND_TIMEOUT": "10"}))
    assert (longer.bind_timeout, longer.allocating_horizon) == (45.0, datetime.timedelta(seconds=90))
    assert from_args(_parse([], {"HAMI_BIND_TIMEOUT": "10"})).bind_timeout == 10.0
    with pytest.raises(ConfigError, match="--bind-timeout must be positive, got '0'"):
        from_args(_parse(["--bind-timeout", "0"]))
    # the chart passes kube-scheduler's httpTimeout as written there: a Go duration
    assert from_args(_parse(["--bind-timeout", "1m30s"])).bind_timeout == 90.0
    with pytest.raises(ConfigError, match="--bind-timeout must be a number of seconds, got '30 s'"):
        from_args(_parse(["--bind-timeout", "30 s"]))
