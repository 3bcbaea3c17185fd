"""The node agent on MPS-mode nodes (issue 22 item 2): what the chart gives it when a node is put in MPS
mode (nodeConfig[].operatingmode: mps, or nodeAgent.mps.enabled): the daemon's root at its host path,
its shm/ as the agent's /dev/shm, the --mps-* flags the agent parses, and SETUID/SETGID added to the
capabilities; nothing of it otherwise."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from nodeagent.config import parse_agent_config

from .rendering import container, flags, pod_spec, render, schema_errors

MPS_NODE = {"nodeAgent": {"nodeConfig": [{"name": "gpu-1", "operatingmode": "mps"}]}}


def agent(values: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    workload = render(values).component("DaemonSet", "node-agent")
    return pod_spec(workload), container(workload, "node-agent")


def host_mounts(spec: dict[str, Any], ctr: dict[str, Any]) -> dict[str, tuple[str, str]]:
    """mountPath -> (host path, hostPath type) of the container's hostPath mounts."""
    host = {
        v["name"]: (v["hostPath"]["path"], v["hostPath"].get("type", ""))
        for v in spec["volumes"]
        if "hostPath" in v
    }
    return {m["mountPath"]: host[m["name"]] for m in ctr["volumeMounts"] if m["name"] in host}


@pytest.mark.parametrize(
    "values",
    [MPS_NODE, {"nodeAgent": {"mps": {"enabled": True}}}],
    ids=["a node in mps mode", "enabled"],
)
def test_an_mps_node_gets_the_daemon_root_shared_memory_and_flags(values: dict[str, Any]) -> None:
    spec, ctr = agent(values)
    mounts = host_mounts(spec, ctr)
    assert mounts["/run/hami/mps"] == ("/run/hami/mps", "DirectoryOrCreate")
    assert mounts["/dev/shm"] == ("/run/hami/mps/shm", "DirectoryOrCreate")
    given = flags(ctr)
    assert (given["mps-control"], given["mps-root"], given["mps-protocol"]) == (
        "nvidia-cuda-mps-control",
        "/run/hami/mps",
        "3",
    )
    context = ctr["securityContext"]
    assert context["capabilities"] == {"drop": ["ALL"], "add": ["SETUID", "SETGID"]}
    assert context["readOnlyRootFilesystem"] is True and context["allowPrivilegeEscalation"] is False


@pytest.mark.parametrize("version", ["1.28", "1.32"])
def test_the_mps_daemonset_is_valid_kubernetes(version: str) -> None:
    assert schema_errors(render(MPS_NODE).component("DaemonSet", "node-agent"), version) == []


def test_the_flags_are_the_agents_own() -> None:
    _, ctr = agent(
        {**MPS_NODE, "nodeAgent": {**MPS_NODE["nodeAgent"], "mps": {"root": "/var/run/mps/", "protocol": 2}}}
    )
    config = parse_agent_config(ctr["command"][1:], {"NODE_NAME": "gpu-1"})
    assert (config.mps_root, config.mps_protocol, config.mps_control) == (
        Path("/var/run/mps"),
        2,
        "nvidia-cuda-mps-control",
    )


def test_the_node_config_puts_the_node_in_mps_mode() -> None:
    (config_map,) = [d for d in render(MPS_NODE).of_kind("ConfigMap") if "config.json" in d.get("data", {})]
    assert json.loads(config_map["data"]["config.json"]) == {
        "nodeconfig": [{"name": "gpu-1", "operatingmode": "mps"}]
    }


def test_no_mps_nothing_of_it() -> None:
    spec, ctr = agent({})
    assert not any(name.startswith("mps-") for name in flags(ctr))
    assert "/dev/shm" not in host_mounts(spec, ctr) and not any("mps" in v["name"] for v in spec["volumes"])
    assert ctr["securityContext"]["capabilities"] == {"drop": ["ALL"]}


def test_capabilities_the_user_adds_are_kept() -> None:
    values = {
        "nodeAgent": {
            "mps": {"enabled": True},
            "securityContext": {"capabilities": {"add": ["SYS_PTRACE", "SETUID"]}},
        }
    }
    _, ctr = agent(values)
    assert ctr["securityContext"]["capabilities"]["add"] == ["SYS_PTRACE", "SETUID", "SETGID"]


@pytest.mark.parametrize(
    "mps", [{"root": "relative"}, {"root": "/"}, {"protocol": 4}, {"controlPath": ""}, {"typo": 1}]
)
def test_bad_mps_values_are_refused_by_the_schema(mps: dict[str, Any]) -> None:
    with pytest.raises(Exception, match="mps"):
        render({"nodeAgent": {"mps": mps}})
