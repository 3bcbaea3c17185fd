"""Reading the device-config file: defaults without a path, errors naming the file and the problem."""

from pathlib import Path

import pytest

from hami.devicefile import load_device_config
from hami.settings import ConfigError, DeviceConfig


def test_no_path_means_hami_defaults() -> None:
    assert load_device_config(None) == DeviceConfig()


def test_reads_the_nvidia_section(tmp_path: Path) -> None:
    path = tmp_path / "device-config.yaml"
    path.write_text("nvidia:\n  deviceSplitCount: 4\n  resourceMemoryName: example.com/mem\n")
    config = load_device_config(path)
    assert config.device_split_count == 4
    assert config.resources.memory == "example.com/mem"


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("nvidia: [", "not valid YAML"),
        ("- a list\n", "the top level must be a mapping"),
        ("nvidia:\n  defaultMemory: lots\n", "nvidia.defaultMemory must be an integer"),
    ],
)
def test_errors_name_the_file_and_the_problem(tmp_path: Path, text: str, problem: str) -> None:
    path = tmp_path / "device-config.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=problem) as caught:
        load_device_config(path)
    assert str(caught.value).startswith(f"--device-config {path}:")


def test_missing_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"--device-config .*absent\.yaml"):
        load_device_config(tmp_path / "absent.yaml")
