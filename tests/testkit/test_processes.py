"""The child-process supervisor: every child stopped on exit, stubborn ones killed, crashes reported."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import sys
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web

from hami_testkit.processes import ChildFailed, PortReservations, Supervisor, poll_until
from tests.eventually import eventually

SLEEPER = "import time; print('up', flush=True); time.sleep(60)"
# ignores SIGTERM and starts a grandchild in the same process group, then reports both pids
STUBBORN = (
    "import signal, subprocess, sys, time\n"
    "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
    "kid = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
    "print('grandchild-pid', kid.pid, flush=True)\n"
    "time.sleep(60)\n"
)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


async def _line(path: Path, prefix: str) -> str:
    async def probe() -> str | None:
        for line in (await asyncio.to_thread(path.read_text)).splitlines():
            if line.startswith(prefix):
                return line
        return None

    return await eventually(probe, f"{prefix!r} in {path}", within=10)


async def test_leaving_the_block_stops_every_child(tmp_path: Path) -> None:
    async with Supervisor(tmp_path) as supervisor:
        first = await supervisor.start("one", [sys.executable, "-c", SLEEPER])
        second = await supervisor.start("two", [sys.executable, "-c", SLEEPER])
        await _line(first.log_path, "up")
        await _line(second.log_path, "up")
    assert first.process.returncode == -signal.SIGTERM
    assert second.process.returncode == -signal.SIGTERM


async def test_a_child_ignoring_sigterm_is_killed_with_its_group(tmp_path: Path) -> None:
    supervisor = Supervisor(tmp_path, stop_timeout=0.5)
    async with supervisor:
        child = await supervisor.start("stubborn", [sys.executable, "-c", STUBBORN])
        grandchild = int((await _line(child.log_path, "grandchild-pid ")).split()[1])
        assert _alive(grandchild)
    assert child.process.returncode == -signal.SIGKILL

    async def gone() -> bool | None:
        return True if not _alive(grandchild) else None

    await eventually(gone, "the grandchild to die", within=5)


async def test_an_error_inside_the_block_still_stops_children(tmp_path: Path) -> None:
    supervisor = Supervisor(tmp_path)
    with pytest.raises(RuntimeError, match="boom"):
        async with supervisor:
            child = await supervisor.start("one", [sys.executable, "-c", SLEEPER])
            raise RuntimeError("boom")
    assert not child.running


async def test_a_crashed_child_is_reported_with_its_log(tmp_path: Path) -> None:
    async with Supervisor(tmp_path) as supervisor:
        child = await supervisor.start(
            "crash", [sys.executable, "-c", "print('bad flag --x'); raise SystemExit(3)"]
        )
        await asyncio.wait_for(child.process.wait(), 10)
        with pytest.raises(ChildFailed) as caught:
            supervisor.check("crash")
    assert "crash exited with code 3" in str(caught.value)
    assert "bad flag --x" in str(caught.value)


async def test_poll_until_is_bounded_and_fails_fast_on_a_dead_child(tmp_path: Path) -> None:
    async def never() -> None:
        return None

    with pytest.raises(TimeoutError, match="waiting for nothing"):
        await poll_until(never, what="nothing", limit=0.3, interval=0.05)

    def dead() -> None:
        raise ChildFailed("x exited")

    with pytest.raises(ChildFailed):
        await poll_until(never, what="nothing", limit=30, alive=dead)


async def test_a_held_port_is_for_the_child_alone(tmp_path: Path) -> None:
    """The port handed to a child stays out of everyone else's reach until the child listens on it:
    an OS-chosen port is never it, a plain bind is refused, a connection before the child listens is
    refused; the child (aiohttp, SO_REUSEADDR) binds it and serves; after close() it is free again."""
    with PortReservations() as ports:
        held = {ports.take() for _ in range(20)}
        assert len(held) == 20
        chosen = set()
        for _ in range(2000):
            with socket.socket() as other:
                other.bind(("127.0.0.1", 0))
                chosen.add(other.getsockname()[1])
        assert not chosen & held
        port = min(held)
        with socket.socket() as other, pytest.raises(OSError):
            other.bind(("127.0.0.1", port))
        with pytest.raises(ConnectionRefusedError):
            await asyncio.open_connection("127.0.0.1", port)

        async def mine(_: web.Request) -> web.Response:
            return web.Response(text="mine")

        app = web.Application()
        app.router.add_get("/", mine)
        runner = web.AppRunner(app)
        await runner.setup()
        try:
            await web.TCPSite(runner, "127.0.0.1", port).start()
            async with aiohttp.ClientSession() as http, http.get(f"http://127.0.0.1:{port}/") as answer:
                assert await answer.text() == "mine"
        finally:
            await runner.cleanup()
    with socket.socket() as other:
        other.bind(("127.0.0.1", port))  # let go
