"""HAMi's device config (spec-scheduler §2) read into DeviceConfig."""

import pytest

from hami.settings import ConfigError, DeviceConfig, ResourceNames, from_device_config


def test_defaults_match_hami_chart() -> None:
    config = from_device_config(None)
    assert config == DeviceConfig()
    assert config.resources.count == "nvidia.com/gpu"
    assert config.device_split_count == 10
    assert config.default_gpu_num == 1
    assert config.effective_memory_factor == 1


def test_yaml_keys_override_defaults() -> None:
    config = from_device_config(
        {
            "nvidia": {
                "resourceCountName": "example.com/gpu",
                "defaultMemory": 1024,
                "memoryFactor": 0,
                "deviceMemoryScaling": 2,
                "gpuCorePolicy": "force",
                "migProfileAllowlist": {"A100": ["1g.10gb", "3g.40gb"]},
                "someOtherVendorKey": "ignored",
            }
        }
    )
    assert config.resources == ResourceNames(count="example.com/gpu")
    assert config.default_memory == 1024
    assert config.effective_memory_factor == 1  # unset/0 counts as 1
    assert config.device_memory_scaling == 2.0
    assert config.gpu_core_policy == "force"
    assert config.mig_profile_allowlist == {"A100": ("1g.10gb", "3g.40gb")}


@pytest.mark.parametrize(
    ("key", "value"),
    [("defaultMemory", "1Gi"), ("overwriteEnv", "yes"), ("deviceCoreScaling", "x"), ("defaultCores", True)],
)
def test_wrong_types_name_the_key(key: str, value: object) -> None:
    with pytest.raises(ConfigError, match=f"nvidia.{key}"):
        from_device_config({"nvidia": {key: value}})
