"""Start a process the way a container runtime starts a GPU container from the agent's Allocate answer.

Owns :func:`run_in_container`: the answer's envs over this process's environment (any ``LD_PRELOAD``
and ``CUDA_*`` of ours removed first), and its mounts applied in a private mount namespace
(``unshare --mount --propagation private``, as root): every source bound to a staging directory first
(a later mount may cover a source, as ``<hook>/vgpu`` covers the library), then each destination in
depth order, parents first, re-mounted read-only where the answer says so, exactly as kubelet passes
them to the runtime. So ``/etc/ld.so.preload`` is the agent's file, read-only, and the dynamic loader
preloads HAMi-core the way it does in a pod. Where a mount namespace cannot be had (not root, no
``unshare``), ``LD_PRELOAD`` names the library instead and the result says so (``mechanism``).
Nothing outside the namespace is mounted or written except the directories the answer names.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from monitor.allocate_rules import ContainerAnswer

NAMESPACE = "mount-namespace"
PRELOAD_PATH = "/etc/ld.so.preload"
LD_PRELOAD = "LD_PRELOAD"
#: Variables of the calling environment a container would not inherit (they would steer the probe).
DROPPED_PREFIXES = ("CUDA_", "LD_PRELOAD", "NVIDIA_VISIBLE_DEVICES", "LIBCUDA_")


@dataclass(frozen=True, slots=True)
class Outcome:
    """One process's run: how the preload was applied, its exit status, its JSON (or why none)."""

    mechanism: str
    returncode: int | None
    result: Mapping[str, Any] = field(default_factory=dict)
    stderr_tail: str = ""

    def as_json(self) -> dict[str, Any]:
        return {
            "mechanism": self.mechanism,
            "returncode": self.returncode,
            "result": dict(self.result),
            "stderr_tail": self.stderr_tail,
        }


def namespace_available() -> bool:
    """Whether this process may make a private mount namespace and bind-mount in it."""
    unshare = shutil.which("unshare")
    if unshare is None or os.geteuid() != 0:
        return False
    try:
        done = subprocess.run(
            [unshare, "--mount", "--propagation", "private", "true"],
            capture_output=True,
            timeout=30,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0


def mount_order(container_path: str) -> tuple[bool, int]:
    """Parents before children; ``/etc/ld.so.preload`` last, so the script's own commands (``mount``,
    ``mkdir``) never try to preload a library that is not mounted yet."""
    return container_path == PRELOAD_PATH, container_path.count("/")


def missing_targets(answer: ContainerAnswer) -> list[Path]:
    """Destinations that do not exist yet: the script creates them on this host's file system (a bind
    mount needs its target), and :func:`run_in_container` removes them again when they are still empty."""
    return [Path(m.container_path) for m in answer.mounts if not Path(m.container_path).exists()]


def remove_if_empty(paths: Sequence[Path]) -> None:
    for path in reversed(paths):
        try:
            if path.is_dir():
                path.rmdir()  # only when empty
            elif path.is_file() and path.stat().st_size == 0:
                path.unlink()
        except OSError:
            continue


def mount_script(answer: ContainerAnswer, stage: Path) -> str:
    """The shell lines that apply the answer's mounts inside the namespace, then ``exec "$@"``."""
    lines = ["set -eu"]
    for number, mount in enumerate(answer.mounts):
        staged = shlex.quote(str(stage / str(number)))
        source = shlex.quote(mount.host_path)
        make = f"mkdir -p {staged}" if Path(mount.host_path).is_dir() else f": > {staged}"
        lines += [make, f"mount --bind {source} {staged}"]
    ordered = sorted(enumerate(answer.mounts), key=lambda item: mount_order(item[1].container_path))
    for number, mount in ordered:
        staged = shlex.quote(str(stage / str(number)))
        target = shlex.quote(mount.container_path)
        if Path(mount.host_path).is_dir():
            lines.append(f"mkdir -p {target}")
        else:
            lines.append(f"mkdir -p $(dirname {target}); [ -e {target} ] || : > {target}")
        lines.append(f"mount --bind {staged} {target}")
        if mount.read_only:
            lines.append(f"mount -o remount,bind,ro {target}")
    lines.append('exec "$@"')
    return "\n".join(lines)


def container_env(answer_envs: Mapping[str, str], base: Mapping[str, str]) -> dict[str, str]:
    env = {k: v for k, v in base.items() if not k.startswith(DROPPED_PREFIXES)}
    env.update(answer_envs)
    env["PYTHONUNBUFFERED"] = "1"
    return env


def last_json(text: str) -> dict[str, Any] | None:
    for line in reversed(text.splitlines()):
        if line.startswith("{"):
            try:
                found = json.loads(line)
            except ValueError:
                return None
            return found if isinstance(found, dict) else None
    return None


def run_in_container(
    answer: ContainerAnswer | None,
    argv: Sequence[str],
    *,
    stage: Path,
    library: Path | None = None,
    env_changes: Mapping[str, str] | None = None,
    namespace: bool = True,
    timeout: float = 120.0,
    cwd: Path | None = None,
) -> Outcome:
    """Run ``argv`` as the container the answer describes (None: a bare process, nothing preloaded).

    ``env_changes`` are applied after the answer's envs (what a tenant does to its own environment).
    ``library``: the file ``LD_PRELOAD`` names where no namespace is used."""
    base = container_env(answer.envs if answer else {}, os.environ)
    base.update(env_changes or {})
    command = list(argv)
    mechanism = "none"
    created: list[Path] = []
    if answer is not None and answer.mounts and namespace:
        stage.mkdir(parents=True, exist_ok=True)
        mechanism = NAMESPACE
        created = missing_targets(answer)
        command = [
            "unshare", "--mount", "--propagation", "private",
            "sh", "-c", mount_script(answer, stage), "container", *command,
        ]  # fmt: skip
    elif answer is not None and library is not None:
        mechanism = LD_PRELOAD
        base[LD_PRELOAD] = str(library)
    try:
        done = subprocess.run(
            command, env=base, capture_output=True, text=True, timeout=timeout, check=False, cwd=cwd
        )
    except subprocess.TimeoutExpired as exc:
        remove_if_empty(created)
        tail = exc.stderr.decode(errors="replace") if isinstance(exc.stderr, bytes) else (exc.stderr or "")
        return Outcome(mechanism, None, {"error": f"timed out after {timeout:.0f} s"}, tail[-2000:])
    except OSError as exc:
        remove_if_empty(created)
        return Outcome(mechanism, None, {"error": f"cannot start {command[0]}: {exc}"})
    remove_if_empty(created)
    found = last_json(done.stdout) or {"error": f"no JSON on stdout: {done.stdout[-500:]!r}"}
    return Outcome(mechanism, done.returncode, found, done.stderr[-2000:])


def probe_argv(*sizes: int) -> list[str]:
    """The probe (``tests.gpu.probe``) run by this interpreter, trying ``sizes`` MiB in turn."""
    return [sys.executable, "-m", "tests.gpu.probe", *(str(s) for s in sizes)]
