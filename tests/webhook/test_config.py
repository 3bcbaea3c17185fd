"""Flags, ``HAMI_<FLAG>`` env fallbacks, the device config file, and clear errors for bad values."""

from __future__ import annotations

from pathlib import Path

import pytest

from hami.process.flags import Address
from hami.settings import ConfigError
from webhook.__main__ import main
from webhook.config import WebhookSettings, parse_settings


def test_defaults() -> None:
    settings = parse_settings([], {})
    assert settings == WebhookSettings()
    assert settings.listen == Address(host="0.0.0.0", port=9443)
    assert settings.metrics_listen == Address(host="0.0.0.0", port=8082)
    assert settings.mutation.scheduler_name == "hami-scheduler"
    assert settings.mutation.force_overwrite_default_scheduler is True


def test_env_fallbacks_and_flags_win() -> None:
    env = {
        "HAMI_LISTEN": "127.0.0.1:7443",
        "HAMI_MANAGE_CONFIG": "true",
        "HAMI_SCHEDULER_NAME": "gpu-sched",
        "HAMI_FAILURE_POLICY": "Ignore",
        "HAMI_MAX_CARDS_PER_CONTAINER": "8",
        "HAMI_FORCE_OVERWRITE_DEFAULT_SCHEDULER": "false",
        "HAMI_METRICS_LISTEN": "127.0.0.1:9100",
    }
    settings = parse_settings([], env)
    assert settings.listen == Address(host="127.0.0.1", port=7443)
    assert settings.metrics_listen == Address(host="127.0.0.1", port=9100)
    assert settings.manage_config is True
    assert settings.failure_policy == "Ignore"
    assert settings.mutation.scheduler_name == "gpu-sched"
    assert settings.mutation.max_cards_per_container == 8
    assert settings.mutation.force_overwrite_default_scheduler is False
    flagged = parse_settings(["--listen", "[::1]:8443", "--no-manage-config", "--scheduler-name", "x"], env)
    assert flagged.listen == Address(host="::1", port=8443)
    assert flagged.manage_config is False
    assert flagged.mutation.scheduler_name == "x"
    assert parse_settings(["--metrics-listen", "0.0.0.0:9200"], env).metrics_listen.port == 9200


def test_service_names_become_hostnames() -> None:
    settings = parse_settings(["--service-name", "wh", "--service-namespace", "gpu"], {})
    assert settings.hostnames == (
        "wh",
        "wh.gpu",
        "wh.gpu.svc",
        "wh.gpu.svc.cluster.local",
        "localhost",
        "127.0.0.1",
    )


def test_device_config_file(tmp_path: Path) -> None:
    path = tmp_path / "device.yaml"
    path.write_text("nvidia:\n  runtimeClassName: nvidia\n  defaultGPUNum: 2\n  gpuCorePolicy: force\n")
    device = parse_settings(["--device-config", str(path)], {}).mutation.device
    assert (device.runtime_class_name, device.default_gpu_num, device.gpu_core_policy) == (
        "nvidia",
        2,
        "force",
    )


@pytest.mark.parametrize(
    ("argv", "env", "message"),
    [
        (["--listen", "9443"], {}, "--listen must be HOST:PORT, got '9443'"),
        (["--health-listen", "host:http"], {}, "--health-listen must be HOST:PORT, got 'host:http'"),
        ([], {"HAMI_METRICS_LISTEN": ":x"}, "--metrics-listen must be HOST:PORT, got ':x'"),
        (["--failure-policy", "Never"], {}, "--failure-policy must be Fail or Ignore, got 'Never'"),
        (["--max-cards-per-container", "0"], {}, "--max-cards-per-container must be at least 1, got '0'"),
        (["--cert-check-interval", "soon"], {}, "--cert-check-interval must be a number, got 'soon'"),
        (["--cert-check-interval", "nan"], {}, "--cert-check-interval must be a number, got 'nan'"),
        (
            ["--max-cards-per-container", "two"],
            {},
            "--max-cards-per-container must be a whole number, got 'two'",
        ),
        ([], {"HAMI_MANAGE_CONFIG": "maybe"}, "HAMI_MANAGE_CONFIG must be true or false, got 'maybe'"),
        (
            ["--log-level", "loud"],
            {},
            "--log-level must be one of debug, info, warning, error (any case), got 'loud'",
        ),
    ],
)
def test_bad_values_are_named(argv: list[str], env: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_settings(argv, env)
    assert str(caught.value) == message


def test_bad_device_config_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "device.yaml"
    path.write_text("nvidia:\n  defaultGPUNum: two\n")
    with pytest.raises(
        ConfigError, match=r"device\.yaml: nvidia\.defaultGPUNum must be an integer, got 'two'"
    ):
        parse_settings(["--device-config", str(path)], {})
    with pytest.raises(ConfigError, match=r"missing\.yaml: No such file or directory"):
        parse_settings(["--device-config", str(tmp_path / "missing.yaml")], {})


def test_main_reports_configuration_errors(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--listen", "nowhere"]) == 2
    assert capsys.readouterr().err == "hami-webhook: --listen must be HOST:PORT, got 'nowhere'\n"


@pytest.mark.parametrize(
    ("flag", "text"),
    [
        ("listen", "0.0.0.0:²"),  # str.isdigit says yes, int() raises its own ValueError
        ("health-listen", "0.0.0.0:" + "9" * 5000),  # int() refuses more than 4300 digits
        ("metrics-listen", "0.0.0.0:٨٠٨٢"),  # Arabic-Indic digits: int() reads 8082
        ("listen", "::1:9443"),  # the host ::1 on port 9443, or the address ::1:9443 without a port
    ],
)
def test_hostile_listen_addresses_are_one_line_and_exit_2(
    flag: str, text: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main([f"--{flag}", text]) == 2
    assert capsys.readouterr().err.startswith(f"hami-webhook: --{flag} must be HOST:PORT, got {text!r}")


def test_an_ipv6_listen_address_prints_with_brackets() -> None:
    settings = parse_settings(["--metrics-listen", "[::1]:9100"], {})
    assert str(settings.metrics_listen) == "[::1]:9100"  # passed on as a flag, it parses the same
    assert parse_settings(["--metrics-listen", str(settings.metrics_listen)], {}) == settings
