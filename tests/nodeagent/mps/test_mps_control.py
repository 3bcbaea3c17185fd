"""MpsControl against the simulated control daemon, as real processes: start, adopt, health, restart
after a kill, quit, protocol 2 against 3, namespaces with their limits, and hostile daemons (garbage
replies, one that never answers) answered within the bounds."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import stat
from pathlib import Path

import pytest

from nodeagent.mps.control import MpsControl, pid_alive, pid_is_daemon
from nodeagent.mps.protocol import PID_FILE, CardLimit, MpsError, MpsNameError
from tests.eventually import eventually

from .kit import MpsKit

UID = "0c9f5a4e-6a53-4b1e-9d8e-2f1c3b4a5d6e"


async def test_start_runs_the_daemon_with_namespaces_on_protocol_3(mps_kit: MpsKit) -> None:
    control = mps_kit.control()
    state = await control.start()
    assert state.running and state.protocol == 3 and state.namespaces, state
    assert control.started_here
    pid = mps_kit.daemon_pid()
    assert pid is not None and pid_alive(pid)
    assert (control.pipe_dir / "control").is_socket()
    assert control.shm_dir.is_dir() and control.log_dir.is_dir()
    status, listing = await mps_kit.client("server", "list")
    assert status == 0 and listing.startswith("hami "), listing  # our named server, created once


async def test_an_older_driver_speaks_protocol_2_without_namespaces(mps_kit: MpsKit) -> None:
    mps_kit.driver_protocol = 2
    control = mps_kit.control()
    state = await control.start()
    assert state.running and state.protocol == 2 and not state.namespaces, state
    with pytest.raises(MpsError, match="namespaces are not available"):
        await control.open_namespace(UID, [CardLimit("GPU-a", 1024, 50)])


async def test_protocol_2_asked_of_a_newer_driver_uses_no_namespaces(mps_kit: MpsKit) -> None:
    state = await mps_kit.control(protocol=2).start()
    assert state.running and state.protocol == 2 and not state.namespaces, state


async def test_a_restarted_agent_adopts_the_daemon_and_its_namespaces(mps_kit: MpsKit) -> None:
    first = mps_kit.control(quit_on_stop=True)
    await first.start()
    pid = mps_kit.daemon_pid()
    await first.open_namespace(f"{UID}-0", [CardLimit("GPU-a", 2048, 40)])
    second = mps_kit.control(quit_on_stop=True)  # the agent after a restart
    state = await second.start()
    assert state.running and state.namespaces
    assert mps_kit.daemon_pid() == pid and not second.started_here  # adopted, not a second daemon
    assert second.namespaces == (f"{UID}-0",)  # named <pod uid>-<container index>: ours
    await second.stop()  # not started by this agent: never quit, whatever the flag says
    assert pid is not None and pid_alive(pid)
    assert (await second.check()).running


async def test_quit_at_stop_only_when_started_here_and_asked(mps_kit: MpsKit) -> None:
    control = mps_kit.control()
    await control.start()
    pid = mps_kit.daemon_pid()
    assert pid is not None
    await control.stop()  # quit_on_stop off: the daemon serves on
    assert (await control.check()).running
    quitting = mps_kit.control(quit_on_stop=True)
    quitting._started_here = True  # as if it had started this very daemon
    await quitting.check()
    await quitting.stop()
    await eventually(lambda: not pid_alive(pid), "the daemon to quit", within=60)
    state = await control.check()
    assert not state.running and "no pid file" in state.detail


async def test_a_killed_daemon_is_restarted_and_its_namespaces_come_back(mps_kit: MpsKit) -> None:
    control = mps_kit.control()
    await control.start()
    limits = [CardLimit("GPU-a", 2048, 40), CardLimit("GPU-b", 1024, 60)]
    await control.open_namespace(UID, limits)
    old = mps_kit.daemon_pid()
    assert old is not None
    os.kill(old, signal.SIGKILL)
    watch = asyncio.create_task(control.watch(0.05))
    try:
        await eventually(lambda: control.restarts == 1 and control.state.running, "a restart", within=120)
    finally:
        watch.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watch
    new = mps_kit.daemon_pid()
    assert new is not None and new != old
    assert control.state.namespaces and control.namespaces == (UID,)
    status, listing = await mps_kit.client("namespace", "list", "--server=hami")
    assert status == 0
    assert f"{UID} pinned_memory_limit=GPU-a=2048M,GPU-b=1024M active_thread_percentage=40" in listing


async def test_a_namespace_opens_with_its_limits_updates_and_closes(mps_kit: MpsKit) -> None:
    control = mps_kit.control()
    await control.start()
    path = await control.open_namespace(UID, [CardLimit("GPU-a", 3000, 30)])
    assert Path(path) == control.pipe_dir / "hami" / UID
    await eventually(lambda: (Path(path) / "control").is_socket(), "the namespace's socket", within=60)
    assert control.namespaces == (UID,)
    await control.open_namespace(UID, [CardLimit("GPU-a", 1000, 20)])  # the same pod again: updated
    _, listing = await mps_kit.client("namespace", "list", "--server=hami")
    assert listing == f"{UID} pinned_memory_limit=GPU-a=1000M active_thread_percentage=20\n"
    await control.close_namespace(UID)
    assert not control.namespaces and not await asyncio.to_thread(Path(path).exists)
    _, listing = await mps_kit.client("namespace", "list", "--server=hami")
    assert listing == ""
    await control.close_namespace(UID)  # closing twice is nothing


async def test_a_namespace_name_with_a_slash_is_refused_before_any_command(mps_kit: MpsKit) -> None:
    control = mps_kit.control()
    await control.start()
    for name in ("../etc", "a/b", "default", "UPPER"):
        with pytest.raises(MpsNameError, match="namespace name"):
            await control.open_namespace(name, [CardLimit("GPU-a", 1, 1)])
        with pytest.raises(MpsNameError):
            await control.close_namespace(name)
    assert not (control.pipe_dir / "etc").exists() and sorted(os.listdir(control.pipe_dir / "hami")) == []


async def test_a_daemon_answering_garbage_is_not_healthy(mps_kit: MpsKit) -> None:
    mps_kit.behaviour = "garbage"
    process = await mps_kit.start_foreground()
    control = mps_kit.control()
    state = await control.start()
    assert not state.running
    assert "get_server_list" in state.detail and "garbage" in state.detail  # names command and reply
    assert mps_kit.daemon_pid() == process.pid and control.restarts == 0  # no second daemon beside it
    with pytest.raises(MpsError):
        await control.open_namespace(UID, [CardLimit("GPU-a", 1, 1)])


async def test_a_daemon_that_never_answers_costs_one_bounded_wait(mps_kit: MpsKit) -> None:
    mps_kit.behaviour = "mute"
    process = await mps_kit.start_foreground()
    control = mps_kit.control(command_timeout=1.0)  # the bound under test: a mute daemon never answers
    state = await control.start()
    assert not state.running and "no answer within 1s" in state.detail, state
    assert mps_kit.daemon_pid() == process.pid  # never killed, never a second one
    assert pid_alive(process.pid)


async def test_a_missing_binary_is_a_clear_state_not_a_crash(mps_kit: MpsKit) -> None:
    control = MpsControl(binary=str(mps_kit.base / "absent"), root=mps_kit.root)
    state = await control.start()
    assert not state.running and "cannot run" in state.detail and "absent" in state.detail


async def test_the_directories_are_made_under_the_root(mps_kit: MpsKit) -> None:
    control = mps_kit.control()
    await control.start()
    for path in (control.pipe_dir, control.log_dir, control.shm_dir):
        assert stat.S_ISDIR(path.stat().st_mode)
    assert (control.log_dir / "control.log").read_text().count("daemon started") == 1


async def test_a_daemon_that_will_not_start_is_retried_with_a_doubling_backoff(mps_kit: MpsKit) -> None:
    attempts = mps_kit.base / "attempts"
    failing = mps_kit.base / "failing-mps-control"
    failing.write_text(f"#!/bin/sh\ndate +%s.%N >> {attempts}\necho 'no such device' >&2\nexit 3\n")
    failing.chmod(0o755)
    control = MpsControl(binary=str(failing), root=mps_kit.root, backoff=0.05, max_backoff=10.0)
    state = await control.start()
    assert not state.running and "exited with status 3" in state.detail and "no such device" in state.detail

    def starts() -> list[float]:
        return [float(line) for line in attempts.read_text().split()] if attempts.exists() else []

    watch = asyncio.create_task(control.watch(0.01))
    try:
        await eventually(
            lambda: len(starts()) >= 6, "five more start attempts", within=60, progress=lambda: len(starts())
        )
    finally:
        watch.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watch
    gaps = [b - a for a, b in zip(starts()[1:], starts()[2:], strict=False)]
    for i, gap in enumerate(gaps):  # lower bounds only: a slow machine only widens the gaps
        assert gap >= 0.05 * 2**i * 0.9, (i, gaps)
    assert control.restarts == 0 and not control.state.running


async def test_a_stale_pid_file_naming_another_process_does_not_stop_the_start(mps_kit: MpsKit) -> None:
    """After the agent's container restarts, the pid file outlives its daemon and its number may name
    any process: the agent's own, or an unrelated one. Neither is adopted or waited on."""
    mps_kit.pipe.mkdir(parents=True, exist_ok=True)
    (mps_kit.pipe / PID_FILE).write_text(f"{os.getpid()}\n")  # the agent itself
    control = mps_kit.control()
    state = await control.start()
    assert state.running and control.started_here, state
    daemon = mps_kit.daemon_pid()
    assert daemon is not None and daemon != os.getpid()
    await control.stop()

    other = mps_kit.base / "other"
    other.mkdir()
    unrelated = await asyncio.create_subprocess_exec("sleep", "600", stdin=asyncio.subprocess.DEVNULL)
    try:
        kit = MpsKit(base=other)
        kit.pipe.mkdir(parents=True)
        (kit.pipe / PID_FILE).write_text(f"{unrelated.pid}\n")
        try:
            state = await kit.control().start()
            assert state.running and kit.daemon_pid() != unrelated.pid, state
        finally:
            await kit.stop_all()
    finally:
        unrelated.kill()
        await unrelated.wait()


async def test_the_shared_memory_directory_is_everyones_like_dev_shm(mps_kit: MpsKit) -> None:
    control = mps_kit.control()
    await control.start()
    assert stat.S_IMODE(control.shm_dir.stat().st_mode) == 0o1777


async def test_a_pid_file_naming_a_process_with_mps_in_its_name_is_stale(mps_kit: MpsKit) -> None:
    """``mpstat`` has "mps" in its command line and is not the daemon: only a process whose argv[0] is
    the configured binary's name is taken for the daemon."""
    fake = mps_kit.base / "mpstat"
    shutil.copy(shutil.which("sleep") or "/bin/sleep", fake)
    impostor = await asyncio.create_subprocess_exec(str(fake), "600", stdin=asyncio.subprocess.DEVNULL)
    try:
        assert not pid_is_daemon(impostor.pid, str(mps_kit.binary))
        mps_kit.pipe.mkdir(parents=True, exist_ok=True)
        (mps_kit.pipe / PID_FILE).write_text(f"{impostor.pid}\n")
        control = mps_kit.control()
        state = await control.start()
        assert state.running and control.started_here, state
        daemon = mps_kit.daemon_pid()
        assert daemon is not None and daemon != impostor.pid
        assert pid_is_daemon(daemon, str(mps_kit.binary))  # the simulated daemon looks like the binary
        assert pid_is_daemon(daemon, "/usr/bin/nvidia-cuda-mps-control")  # by name, wherever it lies
        assert not pid_is_daemon(daemon, "/usr/bin/other-mps-control")
    finally:
        impostor.kill()
        await impostor.wait()
