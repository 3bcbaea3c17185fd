"""Each service's settings declared once (issue 23, finding 3): its schema (``FLAGS``) holds every flag
its config module declares, once; the frozen settings it builds from no flags at all are the settings
dataclass's own defaults; and a bad value anywhere, in any service, is the one
:class:`hami.settings.ConfigError` naming the flag or the file."""

from __future__ import annotations

import argparse
from pathlib import Path
from types import ModuleType

import pytest

from hami.process.flags import Flag
from hami.scheduler import config as scheduler_config
from hami.settings import ConfigError
from nodeagent import config as agent_config
from webhook import config as webhook_config

MODULES = [
    pytest.param(scheduler_config, id="scheduler"),
    pytest.param(webhook_config, id="webhook"),
    pytest.param(agent_config, id="node-agent"),
]


def _scheduler(argv: list[str]) -> scheduler_config.SchedulerSettings:
    parser = argparse.ArgumentParser()
    scheduler_config.add_arguments(parser, {})
    return scheduler_config.from_args(parser.parse_args(argv))


@pytest.mark.parametrize("module", MODULES)
def test_the_schema_holds_each_declared_flag_once(module: ModuleType) -> None:
    declared = {id(v): v for v in vars(module).values() if isinstance(v, Flag)}
    assert sorted(f.name for f in module.FLAGS) == sorted(f.name for f in declared.values())
    assert len({f.name for f in module.FLAGS}) == len(module.FLAGS)


def test_no_flags_give_each_settings_dataclass_its_defaults() -> None:
    assert _scheduler([]) == scheduler_config.SchedulerSettings()
    assert webhook_config.parse_settings([], {}) == webhook_config.WebhookSettings()
    assert agent_config.parse_agent_config(["--node-name=n1"], {}) == agent_config.AgentConfig(node_name="n1")


def test_a_bad_value_is_the_one_configuration_error_in_every_service() -> None:
    for parse in (
        lambda: _scheduler(["--metrics-listen", "x"]),
        lambda: webhook_config.parse_settings(["--metrics-listen", "x"], {}),
        lambda: agent_config.parse_agent_config(["--node-name=n1", "--metrics-listen", "x"], {}),
    ):
        with pytest.raises(ConfigError, match=r"^--metrics-listen must be HOST:PORT, got 'x'$"):
            parse()


def test_every_service_reads_the_device_config_file_the_same_way(tmp_path: Path) -> None:
    """One reader (hami.devicefile) for all three: the node agent's errors name the flag and the file as
    the others' do, and a file whose top level is not a mapping is refused, not a crash."""
    listed = tmp_path / "device.yaml"
    listed.write_text("- nvidia\n")
    message = rf"^--device-config {listed}: the top level must be a mapping with key 'nvidia'$"
    with pytest.raises(ConfigError, match=message):
        _scheduler(["--device-config", str(listed)])
    with pytest.raises(ConfigError, match=message):
        webhook_config.parse_settings(["--device-config", str(listed)], {})
    agent = agent_config.parse_agent_config(["--node-name=n1", "--device-config", str(listed)], {})
    with pytest.raises(ConfigError, match=message):
        agent_config.load_node_settings(agent)
    with pytest.raises(ConfigError, match=rf"^--device-config {tmp_path / 'absent.yaml'}: "):
        agent_config.load_node_settings(
            agent_config.AgentConfig(node_name="n1", device_config=tmp_path / "absent.yaml")
        )
