"""Child processes of the simulated cluster: start by command line, wait for readiness, always stop.

Owns :class:`Supervisor` (every child in its own process group with its output in a log file; stop =
SIGTERM to the group, a bounded wait, then SIGKILL), :func:`poll_until` (bounded polling that fails
fast when a watched child dies) and :class:`PortReservations` (ports held for the children's listeners,
so no other process takes one before the child binds it). Simulation only. Must not import
``webhook``, ``nodeagent`` or the Kubernetes client: those run as processes started from their command lines.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import sys
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TypeVar

T = TypeVar("T")


class ChildFailed(RuntimeError):
    """A child exited (or never became ready); the message carries the tail of its log."""


class PortReservations:
    """TCP ports held for children that take a fixed ``--listen`` address, until :meth:`close`.

    A port picked by binding port 0 and closing the socket again is free only for a moment: until the
    child binds it, the OS may hand it out again as the local port of any outgoing connection (the
    ephemeral range is shared) or to another bind to port 0. So each port stays bound here, with
    ``SO_REUSEADDR`` and never listening: the OS hands it to nobody else, while the child, binding it
    with ``SO_REUSEADDR`` as aiohttp does, can still listen on it (Linux lets such sockets share a port
    while at most one of them listens). A connection to a held port that nobody listens on is refused.
    """

    def __init__(self, host: str = "127.0.0.1") -> None:
        self.host = host
        self._held: list[socket.socket] = []

    def take(self) -> int:
        """A port held from now until :meth:`close`."""
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((self.host, 0))
        except OSError:
            sock.close()
            raise
        self._held.append(sock)
        port: int = sock.getsockname()[1]
        return port

    def close(self) -> None:
        """Let every held port go (a child listening on one keeps it)."""
        while self._held:
            self._held.pop().close()

    def __enter__(self) -> PortReservations:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def python_argv(*args: str) -> list[str]:
    """A command line running this very interpreter (so children use the same virtualenv)."""
    return [sys.executable, *args]


@dataclass(slots=True)
class Child:
    name: str
    argv: Sequence[str]
    log_path: Path
    process: asyncio.subprocess.Process
    log_file: IO[bytes]

    @property
    def running(self) -> bool:
        return self.process.returncode is None

    def tail(self, lines: int = 25) -> str:
        try:
            text = self.log_path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])


class Supervisor:
    """Starts children in their own process groups and stops every one of them on exit.

    Usable as ``async with Supervisor(log_dir) as sup:``; leaving the block (normally, by an error or
    by cancellation) stops all children.
    """

    def __init__(self, log_dir: Path, *, env: Mapping[str, str] | None = None, stop_timeout: float = 8.0):
        self.log_dir = log_dir
        self._env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
        self._stop_timeout = stop_timeout
        self.children: dict[str, Child] = {}

    async def __aenter__(self) -> Supervisor:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.stop_all()

    async def start(self, name: str, argv: Sequence[str]) -> Child:
        if name in self.children and self.children[name].running:
            raise ChildFailed(f"{name}: already running")
        log_path = self.log_dir / f"{name}.log"
        log_file = log_path.open("ab")
        log_file.write(f"$ {' '.join(argv)}\n".encode())
        log_file.flush()
        try:
            process = await asyncio.create_subprocess_exec(
                *argv,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=log_file,
                stderr=asyncio.subprocess.STDOUT,
                env=self._env,
                start_new_session=True,  # own process group: stopping it takes its children too
            )
        except BaseException:
            log_file.close()
            raise
        child = Child(name=name, argv=tuple(argv), log_path=log_path, process=process, log_file=log_file)
        self.children[name] = child
        return child

    def check(self, *names: str) -> None:
        """Raise :class:`ChildFailed` if one of ``names`` (default: all) has exited."""
        for name in names or tuple(self.children):
            child = self.children[name]
            if not child.running:
                raise ChildFailed(
                    f"{name} exited with code {child.process.returncode}; last lines of {child.log_path}:\n"
                    f"{child.tail()}"
                )

    async def stop(self, name: str, *, sig: int = signal.SIGTERM) -> int | None:
        """Stop one child's process group: ``sig``, a bounded wait, then SIGKILL. Returns its exit code."""
        child = self.children[name]
        try:
            if child.running:
                _signal_group(child.process.pid, sig)
                try:
                    await asyncio.wait_for(child.process.wait(), self._stop_timeout)
                except TimeoutError:
                    _signal_group(child.process.pid, signal.SIGKILL)
                    await asyncio.wait_for(child.process.wait(), self._stop_timeout)
        finally:
            child.log_file.close()
        return child.process.returncode

    async def stop_all(self) -> None:
        """Stop every child concurrently; a failure (or a cancellation) never leaks the others.

        If this task is cancelled while stopping gracefully, every remaining group gets SIGKILL at
        once and the cancellation propagates afterwards.
        """
        try:
            # all at once: each may take a grace period, and none depends on another being up
            await asyncio.gather(*(self.stop(name) for name in self.children), return_exceptions=True)
        finally:
            self.kill_all()

    def kill_all(self) -> None:
        """SIGKILL every child's process group (synchronous backstop; harmless for exited ones)."""
        for child in self.children.values():
            if child.running:  # never signal a reaped pid: the number may belong to someone else now
                _signal_group(child.process.pid, signal.SIGKILL)
            if not child.log_file.closed:
                child.log_file.close()


def _signal_group(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)


async def poll_until(
    probe: Callable[[], Awaitable[T | None]],
    *,
    what: str,
    limit: float,
    interval: float = 0.1,
    alive: Callable[[], None] | None = None,
) -> T:
    """Call ``probe`` until it returns something not None; bounded by ``limit`` seconds.

    ``alive`` is called before every probe and should raise when a process we wait on has died, so a
    crash is reported at once with its log instead of as a timeout.
    """
    deadline = time.monotonic() + limit
    while True:
        if alive is not None:
            alive()
        result = await probe()
        if result is not None:
            return result
        if time.monotonic() >= deadline:
            raise TimeoutError(f"timed out after {limit:.0f}s waiting for {what}")
        await asyncio.sleep(interval)
