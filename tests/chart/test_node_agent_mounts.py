"""The node agent's host mounts: only what it writes is writable, and nothing above HAMi-core's directory.

With ``nodeAgent.hookPath`` H the agent needs, on the host: ``H/vgpu/containers`` to make each
container's HAMi-core cache directory (``nodeagent.allocate_call``), ``/tmp/vgpulock`` (the shared lock
directory it creates and hands to containers) and a look into ``H/vgpu`` (is there a ``license``?).
Everything else under ``H/vgpu`` (``libvgpu.so``, ``ld.so.preload``) it only names in Allocate answers,
for kubelet to mount into GPU containers; a writable mount of it would let a compromised agent
replace the library preloaded into every GPU container, and a mount of H itself (``/usr/local``)
would expose the host's whole software tree.
"""

from __future__ import annotations

from pathlib import PurePosixPath
from typing import Any

import pytest

from nodeagent.allocate_rules import hook_mounts

from .rendering import container, pod_spec, render

HOOK = "/usr/local"


def host_mounts(values: dict[str, Any]) -> dict[str, tuple[str, bool]]:
    """hostPath -> (mount path inside the agent, read-only) for the agent container."""
    agent = render(values).component("DaemonSet", "node-agent")
    ours = container(agent, "node-agent")
    volumes = {v["name"]: v["hostPath"]["path"] for v in pod_spec(agent)["volumes"] if "hostPath" in v}
    found: dict[str, tuple[str, bool]] = {}
    for mount in ours["volumeMounts"]:
        if mount["name"] in volumes:
            found[volumes[mount["name"]]] = (mount["mountPath"], bool(mount.get("readOnly", False)))
    return found


def under(path: str, parent: str) -> bool:
    return PurePosixPath(path).is_relative_to(PurePosixPath(parent))


@pytest.mark.parametrize("hook", [HOOK, "/opt/hami"])
def test_hook_path_mounts_only_hami_cores_directory_and_writes_only_the_cache_dirs(hook: str) -> None:
    mounts = host_mounts({"nodeAgent": {"hookPath": hook}})
    vgpu = f"{hook}/vgpu"
    # the same path inside as on the host: the agent hands host paths to kubelet
    assert all(inside == path for path, (inside, _) in mounts.items())
    # nothing above HAMi-core's directory (not H, not /usr)
    assert [p for p in mounts if under(vgpu, p) and p != vgpu] == []
    assert mounts[vgpu] == (vgpu, True)  # read-only: the agent only looks for a license file there
    writable = {path for path, (_, read_only) in mounts.items() if not read_only}
    assert writable == {f"{vgpu}/containers", "/tmp/vgpulock", "/var/lib/kubelet/device-plugins"}

    # what Allocate hands to kubelet: the per-container cache dir the agent makes is writable for it,
    # and the files it only names (library, preload, license) are under the read-only mount
    cache_dir = PurePosixPath(vgpu, "containers", "uid-1_train")
    answer = hook_mounts(PurePosixPath(hook), cache_dir, {}, lock_dir="/tmp/vgpulock", licensed=True)
    for spec in answer:
        host = spec.host_path
        if host in (str(cache_dir), "/tmp/vgpulock"):
            assert any(under(host, w) for w in writable), host
        else:
            assert under(host, vgpu) and not any(under(host, w) for w in writable), host


def test_the_default_hook_path_is_hamis() -> None:
    assert host_mounts({}) == host_mounts({"nodeAgent": {"hookPath": HOOK}})


def test_without_a_hook_path_nothing_of_hami_core_is_mounted() -> None:
    assert set(host_mounts({"nodeAgent": {"hookPath": ""}})) == {"/var/lib/kubelet/device-plugins"}
