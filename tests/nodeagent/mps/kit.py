"""The MPS tests' kit: a simulated control daemon's directories and wrapper per test, MpsControl
built on them, the daemon's own client and simulated CUDA clients as real child processes, and the
stop of every daemon a test left running (by the pid its pid file names: only ours, in our tmp dir)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path, PurePath

from hami_testkit.mps_control import BEHAVIOUR_ENV, CARDS_ENV, DRIVER_PROTOCOL_ENV, write_wrapper
from nodeagent.mps.control import MpsControl, pid_alive, read_pid
from nodeagent.mps.protocol import LOG_ENV, PIPE_ENV
from tests.eventually import eventually

CARDS = "GPU-a=8192,GPU-b=8192"
#: Generous bounds: a command is a Python process start on a busy 2-core machine.
COMMAND_BOUND = 60.0
START_BOUND = 120.0


@dataclass
class MpsKit:
    """One test's daemon directory, wrapper and the environment of the simulated driver."""

    base: Path
    driver_protocol: int = 3
    behaviour: str = ""
    seen: set[int] = field(default_factory=set)
    clients: list[asyncio.subprocess.Process] = field(default_factory=list)

    @property
    def root(self) -> Path:
        return self.base / "mps"

    @property
    def pipe(self) -> Path:
        return self.root / "pipe"

    @property
    def binary(self) -> Path:
        path = self.base / "bin" / "nvidia-cuda-mps-control"
        return path if path.exists() else write_wrapper(self.base / "bin")

    def env(self, **extra: str) -> dict[str, str]:
        env = {**os.environ, CARDS_ENV: CARDS, DRIVER_PROTOCOL_ENV: str(self.driver_protocol)}
        env.pop("CUDA_MPS_PROTOCOL_VERSION", None)
        if self.behaviour:
            env[BEHAVIOUR_ENV] = self.behaviour
        return {**env, **extra}

    def control(self, **kw: object) -> MpsControl:
        options: dict[str, object] = {
            "binary": str(self.binary),
            "root": self.root,
            "environ": self.env(),
            "command_timeout": COMMAND_BOUND,
            "start_timeout": START_BOUND,
            "backoff": 0.05,
            **kw,
        }
        return MpsControl(**options)  # type: ignore[arg-type]

    def daemon_pid(self) -> int | None:
        pid = read_pid(self.pipe)
        if pid is not None:
            self.seen.add(pid)
        return pid

    async def client(
        self, *args: str, stdin: str = "", env: Mapping[str, str] | None = None
    ) -> tuple[int, str]:
        """The daemon's own client (``<binary> args`` with ``stdin``): exit status and output."""
        full = {**self.env(), PIPE_ENV: str(self.pipe), LOG_ENV: str(self.root / "log"), **(env or {})}
        process = await asyncio.create_subprocess_exec(
            str(self.binary),
            *args,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            env=full,
        )
        out, _ = await process.communicate(stdin.encode())
        return process.returncode or 0, out.decode()

    async def start_foreground(self) -> asyncio.subprocess.Process:
        """A daemon started by the test itself (``-f``), e.g. one that never answers."""
        self.pipe.mkdir(parents=True, exist_ok=True)
        env = {**self.env(), PIPE_ENV: str(self.pipe), LOG_ENV: str(self.root / "log")}
        process = await asyncio.create_subprocess_exec(
            str(self.binary), "-f", env=env, stdin=asyncio.subprocess.DEVNULL, start_new_session=True
        )
        await eventually(lambda: self.daemon_pid() == process.pid, "the daemon's pid file", within=60)
        return process

    async def stop_all(self) -> None:
        """Every simulated CUDA client killed; SIGTERM, then SIGKILL, every daemon this test's pid file
        ever named."""
        for client in self.clients:
            if client.returncode is None:
                client.kill()
            await client.wait()
        self.daemon_pid()
        for pid in self.seen:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
        for pid in self.seen:
            try:
                await eventually(_dead(pid), f"daemon {pid} to stop", within=30)
            except AssertionError:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)


def _dead(pid: int) -> Callable[[], bool]:
    return lambda: not pid_alive(pid)


class CudaClient:
    """A simulated CUDA program under MPS holding its allocation until :meth:`release`."""

    def __init__(self, process: asyncio.subprocess.Process, first_line: str) -> None:
        self.process, self.reply = process, first_line

    @property
    def ok(self) -> bool:
        return self.reply.startswith("allocated")

    async def release(self) -> int:
        if self.process.stdin is not None and not self.process.stdin.is_closing():
            self.process.stdin.close()
        return await self.process.wait()


async def cuda_client(
    kit: MpsKit, pipe: PurePath | str, mib: int, *, env: Mapping[str, str] | None = None
) -> CudaClient:
    """Run ``cuda-client --alloc-mib mib --hold`` against ``pipe``; returns once it answered."""
    full = {**kit.env(), PIPE_ENV: str(pipe), **(env or {})}
    process = await asyncio.create_subprocess_exec(
        str(kit.binary),
        "cuda-client",
        f"--alloc-mib={mib}",
        "--hold",
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        env=full,
    )
    kit.clients.append(process)
    assert process.stdout is not None
    line = (await process.stdout.readline()).decode()
    return CudaClient(process, line)
