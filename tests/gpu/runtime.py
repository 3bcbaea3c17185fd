"""Start a process the way a container runtime starts a GPU container from the agent's Allocate answer.

Owns :func:`launch` / :func:`run_in_container` (and :class:`Held`, a process kept running): the
answer's envs over this process's environment (any ``LD_PRELOAD`` and ``CUDA_*`` of ours removed
first), and its mounts applied in a private mount namespace (``unshare --mount --propagation
private``, as root): every source bound to a staging directory first (a later mount may cover a
source, as ``<hook>/vgpu`` covers the library), then each destination in depth order, parents first,
``/etc/ld.so.preload`` last, re-mounted read-only where the answer says so, as kubelet passes them to
the runtime. So ``/etc/ld.so.preload`` is the agent's file, read-only, and the dynamic loader preloads
HAMi-core the way it does in a pod; on an MPS node the pipe directory and ``/dev/shm`` are the
daemon's. Where a mount namespace cannot be had (not root, no ``unshare``), ``LD_PRELOAD`` names the
library instead and the result says so (``mechanism``). Outside the namespace nothing is mounted, and
nothing written but the directories the answer names and the mount targets the script had to create
(removed again when still empty).
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nodeagent.allocate_rules import ContainerAnswer

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


@dataclass(frozen=True, slots=True)
class Launch:
    """How to start one container process: its command line, environment and preload mechanism, and
    the mount targets the namespace script will create on this host (removed again afterwards)."""

    command: list[str]
    env: dict[str, str]
    mechanism: str
    created: list[Path]


def launch(
    answer: ContainerAnswer | None,
    argv: Sequence[str],
    *,
    stage: Path,
    library: Path | None = None,
    env_changes: Mapping[str, str] | None = None,
    namespace: bool = True,
) -> Launch:
    """``argv`` as the container the answer describes (None: a bare process, nothing preloaded).

    ``env_changes`` are applied after the answer's envs (what a tenant does to its own environment).
    ``library``: the file ``LD_PRELOAD`` names where no namespace is used (HAMi-core mode)."""
    env = container_env(answer.envs if answer else {}, os.environ)
    env.update(env_changes or {})
    if answer is not None and answer.mounts and namespace:
        stage.mkdir(parents=True, exist_ok=True)
        command = [
            "unshare", "--mount", "--propagation", "private",
            "sh", "-c", mount_script(answer, stage), "container", *argv,
        ]  # fmt: skip
        return Launch(command, env, NAMESPACE, missing_targets(answer))
    if answer is not None and library is not None:
        env[LD_PRELOAD] = str(library)
        return Launch(list(argv), env, LD_PRELOAD, [])
    return Launch(list(argv), env, "none", [])


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
    """Run ``argv`` to its end as the container the answer describes (:func:`launch`)."""
    how = launch(answer, argv, stage=stage, library=library, env_changes=env_changes, namespace=namespace)
    try:
        done = subprocess.run(
            how.command, env=how.env, capture_output=True, text=True, timeout=timeout, check=False, cwd=cwd
        )
    except subprocess.TimeoutExpired as exc:
        tail = exc.stderr.decode(errors="replace") if isinstance(exc.stderr, bytes) else (exc.stderr or "")
        return Outcome(how.mechanism, None, {"error": f"timed out after {timeout:.0f} s"}, tail[-2000:])
    except OSError as exc:
        return Outcome(how.mechanism, None, {"error": f"cannot start {how.command[0]}: {exc}"})
    finally:
        remove_if_empty(how.created)
    found = last_json(done.stdout) or {"error": f"no JSON on stdout: {done.stdout[-500:]!r}"}
    return Outcome(how.mechanism, done.returncode, found, done.stderr[-2000:])


class Held:
    """A container process that holds something until released (the probe's ``--hold``): started
    by :meth:`start`, its first JSON line read with a bound, then :meth:`release` closes its stdin
    and reads its last line. Always release (or kill) what you start."""

    def __init__(self, how: Launch, process: subprocess.Popen[str]) -> None:
        self.how, self.process = how, process

    @classmethod
    def start(cls, how: Launch, *, cwd: Path | None = None) -> Held:
        process = subprocess.Popen(
            how.command,
            env=how.env,
            cwd=cwd,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        return cls(how, process)

    def first(self, timeout: float) -> dict[str, Any]:
        """The first JSON line it prints (within ``timeout`` seconds), or why there is none."""
        assert self.process.stdout is not None
        with ThreadPoolExecutor(max_workers=1) as pool:
            pending = pool.submit(self.process.stdout.readline)
            try:
                line = pending.result(timeout=timeout)
            except FutureTimeout:
                self.kill()
                return {"error": f"no line within {timeout:.0f} s"}
        return last_json(line) or {"error": f"not a JSON line: {line[-300:]!r}"}

    def release(self, timeout: float) -> Outcome:
        """Close its stdin, wait for its end (killed past ``timeout``), and read its last line."""
        try:
            out, err = self.process.communicate(input="", timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            return Outcome(self.how.mechanism, None, {"error": f"did not end within {timeout:.0f} s"})
        finally:
            remove_if_empty(self.how.created)
        found = last_json(out) or {"error": f"no JSON on stdout: {out[-500:]!r}"}
        return Outcome(self.how.mechanism, self.process.returncode, found, err[-2000:])

    def kill(self) -> None:
        """Kill it if it still runs (nothing when :meth:`release` already saw its end)."""
        if self.process.poll() is None:
            self.process.kill()
            self.process.communicate()
        remove_if_empty(self.how.created)


def probe_argv(*sizes: int, hold: bool = False) -> list[str]:
    """The probe (``tests.gpu.probe``) run by this interpreter, trying ``sizes`` MiB in turn (with
    ``hold``: keeping one size until released)."""
    return [sys.executable, "-m", "tests.gpu.probe", *(["--hold"] if hold else []), *(str(s) for s in sizes)]
