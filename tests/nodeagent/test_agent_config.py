"""Agent settings: flags over HAMI_<FLAG> env over defaults, the device-config YAML, per-node overrides,
and errors naming the key; the entry point refuses bad config with exit code 2."""

from __future__ import annotations

from pathlib import Path

import pytest

from hami.settings import ConfigError
from nodeagent.__main__ import main
from nodeagent.config import node_settings, parse_agent_config


def test_flags_env_and_defaults() -> None:
    config = parse_agent_config([], {"NODE_NAME": "n1"})
    assert (config.node_name, config.backend, config.register_interval, config.retry_interval) == (
        "n1",
        "auto",
        30.0,
        5.0,
    )
    assert config.kubelet_dir == Path("/var/lib/kubelet/device-plugins") and config.hook_path is None
    env = {
        "NODE_NAME": "n1",
        "HAMI_NODE_NAME": "n2",
        "HAMI_BACKEND": "sim",
        "HAMI_REGISTER_INTERVAL": "10",
        "HAMI_SIM_DEVICES": "/x.yaml",
        "HAMI_TOPOLOGY_SCORE": "true",
    }
    config = parse_agent_config([], env)
    assert (config.node_name, config.backend, config.register_interval) == ("n2", "sim", 10.0)
    assert config.sim_devices == Path("/x.yaml") and config.topology_score
    config = parse_agent_config(["--backend", "nvml", "--register-interval", "3"], env)
    assert (config.backend, config.register_interval) == ("nvml", 3.0)


def test_the_lock_dir_is_hamis_unless_given() -> None:
    """HAMi-core's shared lock directory: /tmp/vgpulock on the host (HAMi's), or where --lock-dir says
    (the embedded cluster gives each node its own, so no run needs the host's /tmp/vgpulock)."""
    assert parse_agent_config([], {"NODE_NAME": "n1"}).lock_dir == Path("/tmp/vgpulock")
    given = parse_agent_config(["--lock-dir", "/run/n1/vgpulock"], {"NODE_NAME": "n1"})
    assert given.lock_dir == Path("/run/n1/vgpulock")
    assert parse_agent_config([], {"NODE_NAME": "n1", "HAMI_LOCK_DIR": "/x"}).lock_dir == Path("/x")


def test_health_recovery_defaults_to_300_and_0_means_never() -> None:
    assert parse_agent_config([], {"NODE_NAME": "n1"}).health_recovery == 300.0
    env = {"NODE_NAME": "n1", "HAMI_HEALTH_RECOVERY": "0"}
    assert parse_agent_config([], env).health_recovery == 0.0
    assert parse_agent_config(["--health-recovery", "45.5"], env).health_recovery == 45.5


@pytest.mark.parametrize(
    ("argv", "env", "message"),
    [
        ([], {}, "--node-name is required"),
        ([], {"NODE_NAME": "n", "HAMI_BACKEND": "gpu"}, "HAMI_BACKEND must be auto, nvml or sim, got 'gpu'"),
        (["--register-interval", "0"], {"NODE_NAME": "n"}, "--register-interval must be positive"),
        # not finite: the loop would sleep(NaN) (an error) or forever
        (
            ["--register-interval", "nan"],
            {"NODE_NAME": "n"},
            "--register-interval must be a number, got 'nan'",
        ),
        (
            [],
            {"NODE_NAME": "n", "HAMI_HEALTH_INTERVAL": "inf"},
            "--health-interval must be a number, got 'inf'",
        ),
        (
            [],
            {"NODE_NAME": "n", "HAMI_RETRY_INTERVAL": "soon"},
            "--retry-interval must be a number, got 'soon'",
        ),
        ([], {"NODE_NAME": "n", "HAMI_TOPOLOGY_SCORE": "maybe"}, "--topology-score must be true or false"),
        (
            ["--health-recovery", "-1"],
            {"NODE_NAME": "n"},
            r"--health-recovery must be 0 \(never\) or positive",
        ),
        (
            [],
            {"NODE_NAME": "n", "HAMI_HEALTH_RECOVERY": "nan"},
            "--health-recovery must be a number, got 'nan'",
        ),
        (
            [],
            {"NODE_NAME": "n", "HAMI_HEALTH_RECOVERY": "soon"},
            "--health-recovery must be a number, got 'soon'",
        ),
    ],
)
def test_bad_flags_name_the_flag(argv: list[str], env: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_agent_config(argv, env)


DEVICE_YAML = {
    "nvidia": {
        "deviceSplitCount": 5,
        "deviceMemoryScaling": 1,
        "deviceCoreScaling": 1,
        "libCudaLogLevel": 1,
        "enableNumaTopology": True,
    }
}


def test_node_overrides_apply_only_to_the_named_node() -> None:
    overrides = {
        "nodeconfig": [
            {"name": "other", "devicesplitcount": 99},
            {
                "name": "n1",
                "devicesplitcount": 3,
                "devicememoryscaling": 1.5,
                "operatingmode": "mig",
                "filterdevices": {"uuid": ["GPU-x"], "index": [2]},
                "enablegetpreferredallocation": True,
                "enablenumatopology": False,
            },
        ]
    }
    base = node_settings(DEVICE_YAML, overrides, "n2")
    assert (base.split_count, base.numa_topology, base.lib_cuda_log_level, base.mode) == (
        5,
        True,
        "1",
        "hami-core",
    )
    mine = node_settings(DEVICE_YAML, overrides, "n1")
    assert (mine.split_count, mine.memory_scaling, mine.mode, mine.preferred_allocation) == (
        3,
        1.5,
        "mig",
        True,
    )
    assert mine.filter_uuids == {"GPU-x"} and mine.filter_indexes == {2} and not mine.numa_topology
    assert node_settings(None, None, "n1").split_count == 10  # HAMi chart default


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ({"devicesplitcount": "3"}, "nodeconfig[name=n1].devicesplitcount must be an integer, got '3'"),
        ({"devicememoryscaling": True}, "devicememoryscaling must be a number, got True"),
        ({"operatingmode": "turbo"}, "operatingmode must be hami-core, mig or mps, got 'turbo'"),
        ({"filterdevices": {"index": ["0"]}}, "filterdevices.index must be a list of integers"),
        ({"devicesplitcount": 0}, "deviceSplitCount must be at least 1, got 0"),
    ],
)
def test_bad_overrides_name_the_key(entry: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        node_settings(None, {"nodeconfig": [{"name": "n1", **entry}]}, "n1", source="config.json")
    assert message in str(caught.value) and "config.json" in str(caught.value)


@pytest.mark.parametrize(
    "text",
    [
        "0.0.0.0:٩٣٩٤",  # Arabic-Indic digits: int() reads 9394
        "::1:9394",  # the host ::1 on port 9394, or the address ::1:9394 without a port
    ],
)
def test_hostile_metrics_addresses_are_refused_at_start(text: str) -> None:
    with pytest.raises(ConfigError, match=r"^--metrics-listen must be HOST:PORT"):
        parse_agent_config(["--metrics-listen", text], {"NODE_NAME": "n1"})


def test_main_refuses_bad_config_with_exit_code_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--node-name", "n1", "--register-interval", "-1"]) == 2
    assert "--register-interval must be positive" in capsys.readouterr().err
    bad = tmp_path / "config.json"
    bad.write_text("{not json")
    assert main(["--node-name", "n1", "--config", str(bad), "--backend", "sim"]) == 2
    assert "cannot read config file" in capsys.readouterr().err
