"""HAMi's device config (docs/protocol.md, "Device config") read into DeviceConfig."""

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


def test_hamis_list_form_of_the_mig_allowlist_is_read() -> None:
    """HAMi v2.10's own device config writes ``migProfileAllowlist`` as a list of ``{models, profiles}``
    entries (its chart's default): a config copied from HAMi must load, each model keyed to the union of
    the profiles of every entry naming it (HAMi walks every entry whose models match)."""
    config = from_device_config(
        {
            "nvidia": {
                "migProfileAllowlist": [
                    {"models": ["A30"], "profiles": ["1g.6gb", "2g.12gb"]},
                    {"models": ["A100-SXM4-40GB", "A100-PCIE-40GB"], "profiles": ["1g.5gb", "3g.20gb"]},
                    {"models": ["A30"], "profiles": ["2g.12gb", "4g.24gb"]},
                ]
            }
        }
    )
    assert config.mig_profile_allowlist == {
        "A30": ("1g.6gb", "2g.12gb", "4g.24gb"),
        "A100-SXM4-40GB": ("1g.5gb", "3g.20gb"),
        "A100-PCIE-40GB": ("1g.5gb", "3g.20gb"),
    }


@pytest.mark.parametrize(
    "entry",
    [
        {"models": ["A30"]},  # HAMi: "MIG profile allowlist must define models and profiles"
        {"models": [], "profiles": ["1g.6gb"]},
        {"models": "A30", "profiles": ["1g.6gb"]},
        {"models": ["A30"], "profiles": [6]},
        "A30",
    ],
)
def test_a_bad_list_entry_of_the_mig_allowlist_names_the_key(entry: object) -> None:
    with pytest.raises(ConfigError, match=r"nvidia.migProfileAllowlist\[0\]"):
        from_device_config({"nvidia": {"migProfileAllowlist": [entry]}})
