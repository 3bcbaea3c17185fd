"""HAMi-core on every GPU node by default (issue 22, item 1): the node agent's ``hami-core`` initContainer.

The chart renders an initContainer running HAMi's published image, which copies ``libvgpu.so`` into
``<hookPath>/vgpu`` and writes ``ld.so.preload`` naming it. The copy must be atomic: kubelet bind-mounts
the library's inode into each GPU container, so a copy in place would rewrite (truncate, then fill) the
file under running processes. The tests run the RENDERED command with ``sh`` against a temporary
directory standing in for the hostPath, with every external command it calls wrapped to record what the
target looked like at that moment.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
from pathlib import Path
from typing import Any

import pytest

from .rendering import container, flags, pod_spec, render

DEFAULT_IMAGE = "docker.io/projecthami/hami:v2.10.0"


def init_container(values: dict[str, Any]) -> dict[str, Any] | None:
    spec = pod_spec(render(values).component("DaemonSet", "node-agent"))
    found = [c for c in spec.get("initContainers", []) if c["name"] == "hami-core"]
    assert len(found) <= 1
    return found[0] if found else None


def agent_flags(values: dict[str, Any]) -> dict[str, str]:
    return flags(container(render(values).component("DaemonSet", "node-agent"), "node-agent"))


def test_a_default_install_puts_hami_core_on_each_node_and_the_agent_uses_it() -> None:
    init = init_container({})
    assert init is not None
    assert init["image"] == DEFAULT_IMAGE
    assert agent_flags({})["hook-path"] == "/usr/local"
    # it mounts HAMi-core's directory only, at its host path, and runs without any capability
    spec = pod_spec(render({}).component("DaemonSet", "node-agent"))
    host = {v["name"]: v["hostPath"]["path"] for v in spec["volumes"] if "hostPath" in v}
    assert [(host[m["name"]], m["mountPath"]) for m in init["volumeMounts"] if m["name"] in host] == [
        ("/usr/local/vgpu", "/usr/local/vgpu")
    ]
    # and no service-account token: an empty directory lies over the path Kubernetes would mount it at
    empty = {v["name"] for v in spec["volumes"] if "emptyDir" in v}
    others = [(m["mountPath"], m.get("readOnly")) for m in init["volumeMounts"] if m["name"] not in host]
    assert others == [("/var/run/secrets/kubernetes.io/serviceaccount", True)]
    assert all(m["name"] in empty for m in init["volumeMounts"] if m["name"] not in host)
    context = init["securityContext"]
    assert context["capabilities"] == {"drop": ["ALL"]} and context["allowPrivilegeEscalation"] is False
    assert context["readOnlyRootFilesystem"] is True
    assert init["command"][-2:] == ["/k8s-vgpu/lib/nvidia/libvgpu.so.*", "/usr/local/vgpu"]


@pytest.mark.parametrize(
    ("image", "expected"),
    [
        ({"tag": "v2.9.0"}, "docker.io/projecthami/hami:v2.9.0"),
        ({"digest": "sha256:" + "ab" * 32}, DEFAULT_IMAGE + "@sha256:" + "ab" * 32),
        ({"registry": "", "repository": "mirror.local/hami", "tag": "v2"}, "mirror.local/hami:v2"),
    ],
)
def test_the_image_is_one_value_to_override_and_can_be_pinned_by_digest(
    image: dict[str, Any], expected: str
) -> None:
    init = init_container({"nodeAgent": {"hamiCore": {"image": image}}})
    assert init is not None and init["image"] == expected


def test_a_bad_digest_is_refused_by_the_schema() -> None:
    with pytest.raises(Exception, match="digest"):
        render({"nodeAgent": {"hamiCore": {"image": {"digest": "sha256:nothex"}}}})


@pytest.mark.parametrize(
    "values",
    [{"nodeAgent": {"hamiCore": {"enabled": False}}}, {"nodeAgent": {"hookPath": ""}}],
    ids=["copy-disabled", "no-hook-path"],
)
def test_the_copy_can_be_turned_off(values: dict[str, Any]) -> None:
    assert init_container(values) is None
    hook = values["nodeAgent"].get("hookPath", "/usr/local")
    assert agent_flags(values).get("hook-path") == (hook or None)


# -- the rendered command, run ---------------------------------------------------------------------------

#: Each external command the script runs goes through this wrapper: it records its argv and the
#: target's state (absent, or inode and content) before running the real command.
WRAPPER = """#!/bin/sh
{{ printf '%s' "$(basename "$0")"; for a in "$@"; do printf ' %s' "$a"; done; printf '\\n'
  if [ -e "$TARGET" ]; then printf 'state %s ' "$(stat -c %i "$TARGET")"; cksum < "$TARGET"
  else echo 'state absent'; fi; }} >> "$LOG"
exec "{real}" "$@"
"""


def run_install(tmp_path: Path, dest: Path, library: bytes, *, extra: dict[str, str] | None = None) -> Any:
    """Run the rendered initContainer command with ``dest`` as ``<hookPath>/vgpu``; the image's file
    is a fake library under tmp_path, matched by the default glob's shape."""
    init = init_container({})
    assert init is not None
    command = list(init["command"])
    image_dir = tmp_path / "image"
    image_dir.mkdir(exist_ok=True)
    (image_dir / "libvgpu.so.v2.10.0").write_bytes(library)
    command[-2:] = [f"{image_dir}/libvgpu.so.*", str(dest)]
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    for tool in ("cp", "chmod", "mv", "sync", "rm"):
        real = shutil.which(tool)
        assert real is not None
        wrapper = bin_dir / tool
        wrapper.write_text(WRAPPER.format(real=real))
        wrapper.chmod(0o755)
    log = tmp_path / "log"
    env = {
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "LOG": str(log),
        "TARGET": str(dest / "libvgpu.so"),
        **(extra or {}),
    }
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=60, check=False)
    return done, log.read_text() if log.exists() else ""


def cksum(data: bytes) -> str:
    return subprocess.run(["cksum"], input=data, capture_output=True, check=True).stdout.decode().strip()


def test_the_rendered_command_installs_the_library_and_its_preload(tmp_path: Path) -> None:
    dest = tmp_path / "usr-local" / "vgpu"
    dest.mkdir(parents=True)
    done, _ = run_install(tmp_path, dest, b"\x7fELF new library")
    assert done.returncode == 0, done.stderr
    assert (dest / "libvgpu.so").read_bytes() == b"\x7fELF new library"
    assert (dest / "ld.so.preload").read_text() == f"{dest}/libvgpu.so\n"
    assert stat.S_IMODE((dest / "libvgpu.so").stat().st_mode) == 0o755
    assert sorted(p.name for p in dest.iterdir()) == ["ld.so.preload", "libvgpu.so"]  # no temp left


def test_a_replacement_is_a_rename_and_running_readers_keep_the_old_library(tmp_path: Path) -> None:
    dest = tmp_path / "vgpu"
    dest.mkdir()
    old, new = b"\x7fELF old" * 4096, b"\x7fELF NEW" * 8192
    (dest / "libvgpu.so").write_bytes(old)
    old_inode = (dest / "libvgpu.so").stat().st_ino
    with (dest / "libvgpu.so").open("rb") as running:  # what a container that started earlier holds
        done, log = run_install(tmp_path, dest, new)
        assert done.returncode == 0, done.stderr
        assert running.read() == old  # its inode was never written to
    assert (dest / "libvgpu.so").read_bytes() == new
    assert (dest / "libvgpu.so").stat().st_ino != old_inode
    lines = log.splitlines()
    commands, states = lines[0::2], lines[1::2]
    # before every command the target was the whole old file (same inode) or, after the rename, the
    # whole new one: never absent, never a part
    whole = {f"state {old_inode} {cksum(old)}", f"state {(dest / 'libvgpu.so').stat().st_ino} {cksum(new)}"}
    assert states and set(states) <= whole, states
    # and the only command that names the target is the rename from a temporary file in the same dir
    naming = [c for c in commands if f"{dest}/libvgpu.so" in c.split()]
    assert len(naming) == 1 and naming[0].startswith(f"mv -f {dest}/.libvgpu.so.tmp."), commands


def test_a_killed_run_s_temporary_files_are_cleared(tmp_path: Path) -> None:
    dest = tmp_path / "vgpu"
    dest.mkdir()
    (dest / ".libvgpu.so.tmp.7").write_bytes(b"half a libr")  # SIGKILL: no trap ran
    (dest / ".ld.so.preload.tmp.7").write_bytes(b"")
    done, _ = run_install(tmp_path, dest, b"\x7fELF whole")
    assert done.returncode == 0, done.stderr
    assert sorted(p.name for p in dest.iterdir()) == ["ld.so.preload", "libvgpu.so"]


def test_no_match_or_two_matches_in_the_image_fail_and_change_nothing(tmp_path: Path) -> None:
    dest = tmp_path / "vgpu"
    dest.mkdir()
    (dest / "libvgpu.so").write_bytes(b"kept")
    (tmp_path / "image").mkdir()
    (tmp_path / "image" / "libvgpu.so.v2.9.0").write_bytes(b"second")
    done, _ = run_install(tmp_path, dest, b"first")  # two files match the glob now
    assert done.returncode != 0 and "exactly one file" in done.stderr
    assert (dest / "libvgpu.so").read_bytes() == b"kept"
    assert sorted(p.name for p in dest.iterdir()) == ["libvgpu.so"]
