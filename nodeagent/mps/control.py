"""The node's CUDA MPS control daemon, run and spoken to by the agent (``operatingmode: mps``).

Owns :class:`MpsControl`: the daemon's directories under ``--mps-root`` (``pipe/`` = the daemon's
``CUDA_MPS_PIPE_DIRECTORY``, ``log/`` = ``CUDA_MPS_LOG_DIRECTORY``, ``shm/`` = what the containers and
the agent mount as ``/dev/shm``), its life (start with ``<binary> -d``; ADOPT a daemon that already
answers, found by the pid file it writes in the pipe directory: one the host runs, or one that outlived
the agent's process; a pid file naming a process whose argv[0] is not the binary's name is stale;
restart with backoff when it died; ``quit`` at agent stop only when this agent started it and
``quit_on_stop`` says so; never a signal to the daemon), its health (a command answered within
``command_timeout``) and the per-container namespaces of protocol 3 (daemon-side limits, re-created
after a daemon restart; a daemon's namespaces are adopted only when named ``<pod uid>-<index>``, and
:attr:`MpsState.restored` says whether the node's running pods' namespaces were rebuilt on this daemon,
``nodeagent.mps.keeper.restore``). Every command goes through the binary's client mode as a child
process with a bounded wait (killed when over), so nothing blocks the event loop; the command language
is :mod:`nodeagent.mps.protocol`. Commands are serialised (one lock). Must not import ``hami_testkit``,
grpc, pynvml or the Kubernetes client.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import stat
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path, PurePosixPath

from nodeagent.mps.protocol import (
    CONTROL_SOCKET,
    LOG_ENV,
    NAMESPACE_PROTOCOL,
    PID_FILE,
    PIPE_ENV,
    PROTOCOL_ENV,
    REPLY_LIMIT,
    SERVER_NAME,
    CardLimit,
    Command,
    MpsError,
    MpsReplyError,
    MpsState,
    checked_limits,
    expect_empty,
    get_server_list,
    namespace_create,
    namespace_delete,
    namespace_list,
    namespace_name,
    namespace_set,
    not_understood,
    parse_listing,
    parse_namespace_limits,
    parse_server_list,
    pod_namespace,
    protocol_query,
    quit_daemon,
    refusal,
    server_create,
    set_default_active_thread_percentage,
    set_default_device_pinned_mem_limit,
)

log = logging.getLogger(__name__)

DEFAULT_BINARY = "nvidia-cuda-mps-control"
DEFAULT_ROOT = Path("/run/hami/mps")
DOWN = MpsState(running=False, detail="not checked yet")


def read_pid(pipe_dir: Path) -> int | None:
    """The PID in the daemon's pid file, or None (no file, unreadable, not a PID)."""
    try:
        with (pipe_dir / PID_FILE).open("rb") as file:
            text = file.read(32).decode("ascii", "replace").strip()
    except OSError:
        return None
    return int(text) if text.isdigit() and 0 < int(text) < 2**22 else None


def pid_alive(pid: int) -> bool:
    """Whether ``pid`` is a live process (a zombie is not: nobody may have reaped the daemon yet)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat", "rb") as file:
            fields = file.read(4096).rsplit(b")", 1)[-1].split()
    except OSError:
        return True  # no /proc: the signal said it exists
    return not fields or fields[0] not in (b"Z", b"X")


def pid_is_daemon(pid: int, binary: str) -> bool:
    """Whether ``pid`` may be the control daemon: alive, not this agent (the process or one of its
    threads), and its argv[0] named as ``binary`` (the basename: ``/usr/bin/nvidia-cuda-mps-control``
    and ``nvidia-cuda-mps-control`` are the same daemon; ``mpstat`` is not). A pid file outlives its
    daemon when the agent's container restarts (the daemon ends with it); its number may since belong
    to any process, the new agent's own threads included, and such a pid file must not stop the node's
    daemon starting. Without a readable ``/proc`` the signal's answer (alive) is taken."""
    if pid == os.getpid() or os.path.exists(f"/proc/self/task/{pid}") or not pid_alive(pid):
        return False
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as file:
            cmdline = file.read(4096)
    except OSError:
        return True  # no /proc to read: the signal said it exists
    argv0 = cmdline.split(b"\0", 1)[0].decode("utf-8", "replace")
    return bool(argv0) and PurePosixPath(argv0).name == PurePosixPath(binary).name


class MpsControl:
    """One node's MPS control daemon, as the agent sees it (see the module docstring)."""

    def __init__(
        self,
        *,
        binary: str = DEFAULT_BINARY,
        root: Path = DEFAULT_ROOT,
        protocol: int = NAMESPACE_PROTOCOL,
        quit_on_stop: bool = False,
        command_timeout: float = 10.0,
        start_timeout: float = 60.0,
        backoff: float = 1.0,
        max_backoff: float = 60.0,
        default_limits: Sequence[CardLimit] = (),
        environ: Mapping[str, str] | None = None,
    ) -> None:
        if protocol not in (2, 3):
            raise ValueError(f"MPS protocol must be 2 or 3, got {protocol!r}")
        self._binary, self._root, self._wanted = binary, Path(root), protocol
        self._quit_on_stop = quit_on_stop
        self._timeout, self._start_timeout = command_timeout, start_timeout
        self._backoff, self._max_backoff = backoff, max_backoff
        self._defaults = tuple(default_limits)
        self._environ = dict(os.environ if environ is None else environ)
        self._state = DOWN
        self._lock = asyncio.Lock()
        self._namespaces: dict[str, tuple[CardLimit, ...]] = {}
        self._known_pid: int | None = None  # the daemon whose protocol and namespaces we read
        self._protocol: int | None = None
        self._server_ready = False
        self._live_pid: int | None = None  # a live daemon process, answering or not
        self._started_here = False
        self._restored_for: int | None = None  # the daemon the pods' namespaces were restored on
        self.restarts = 0

    # ------------------------------------------------------------------------------- properties
    @property
    def state(self) -> MpsState:
        """The last known state (from the latest check, start or watch pass)."""
        return self._state

    @property
    def pipe_dir(self) -> Path:
        return self._root / "pipe"

    @property
    def log_dir(self) -> Path:
        return self._root / "log"

    @property
    def shm_dir(self) -> Path:
        return self._root / "shm"

    @property
    def started_here(self) -> bool:
        """True when this agent started the daemon it talks to (False: adopted, or none)."""
        return self._started_here

    @property
    def namespaces(self) -> tuple[str, ...]:
        """The namespaces open on the daemon (pod UIDs), sorted."""
        return tuple(sorted(self._namespaces))

    @property
    def daemon_pid(self) -> int | None:
        """The daemon process the last check read (None when down)."""
        return self._known_pid

    def mark_restored(self, pid: int) -> bool:
        """Record that the node's running pods' namespaces are open on daemon ``pid``; False (nothing
        recorded) when another daemon answers by now, whose namespaces are still to be restored."""
        if pid != self._known_pid:
            return False
        self._restored_for = pid
        self._state = replace(self._state, restored=True)
        return True

    def namespace_dir(self, name: str) -> PurePosixPath:
        """The host pipe directory of namespace ``name``: what the pod's containers mount."""
        return PurePosixPath(self.pipe_dir) / SERVER_NAME / namespace_name(name)

    # -------------------------------------------------------------------------------- lifecycle
    async def start(self) -> MpsState:
        """Adopt the daemon that answers, else start one; never a second beside a live one."""
        async with self._lock:
            await asyncio.to_thread(self._make_dirs)
            state = await self._check()
            if state.running:
                log.info("MPS: adopted the running control daemon (pid %s): %s", self._live_pid, state.detail)
                await self._apply_defaults()
                return state
            if self._live_pid is not None:
                log.warning("MPS: %s; not starting a second daemon beside it", state.detail)
                return state
            try:
                state = await self._launch()
            except MpsError as exc:
                log.error("MPS: cannot start the control daemon: %s", exc)
                self._state = MpsState(running=False, detail=str(exc))
            return self._state

    async def stop(self) -> None:
        """``quit`` the daemon when this agent started it and ``quit_on_stop`` is set; else leave it."""
        async with self._lock:
            if not (self._started_here and self._quit_on_stop):
                return
            try:
                expect_empty(quit_daemon(), await self._send(quit_daemon()))
            except MpsError as exc:
                log.warning("MPS: quit was not taken: %s", exc)
                return
            self._state = MpsState(running=False, detail="quit at agent stop")
            self._namespaces.clear()
            self._started_here = False

    async def check(self) -> MpsState:
        """Ask the daemon now; the answer becomes :attr:`state`."""
        async with self._lock:
            return await self._check()

    async def watch(self, interval: float, restore: Callable[[], Awaitable[object]] | None = None) -> None:
        """Check every ``interval`` seconds; a daemon that died (no live process) is started again,
        attempts spaced by a doubling backoff. After each check that finds a running daemon on which
        the pods' namespaces are not restored yet (a new one: restarted here, or by someone else),
        ``restore`` is awaited (``nodeagent.mps.keeper.restore``; it must not raise; it is tried again at
        the next pass until it marks the daemon restored). Never returns; cancel it to stop."""
        delay, next_try = self._backoff, 0.0
        loop = asyncio.get_running_loop()
        while True:
            async with self._lock:
                state = await self._check()
                if not state.running and self._live_pid is None and loop.time() >= next_try:
                    try:
                        await self._launch()
                    except MpsError as exc:
                        log.warning("MPS: restart failed, next try in %gs: %s", delay, exc)
                        self._state = MpsState(running=False, detail=str(exc))
                        next_try, delay = loop.time() + delay, min(delay * 2, self._max_backoff)
                    else:
                        self.restarts += 1
                        delay = self._backoff
                        log.warning("MPS: control daemon restarted (%d so far)", self.restarts)
            if restore is not None and self._state.running and not self._state.restored:
                await restore()
            await asyncio.sleep(interval if self._state.running else min(interval, delay))

    # ------------------------------------------------------------------------------- namespaces
    async def open_namespace(self, name: str, limits: Sequence[CardLimit]) -> PurePosixPath:
        """Create (or update) namespace ``name`` with daemon-side limits; returns the HOST pipe
        directory the pod's containers mount. Raises :class:`MpsError` without namespaces."""
        name, found = namespace_name(name), checked_limits(limits)
        async with self._lock:
            if not self._state.namespaces:
                await self._check()
            if not self._state.namespaces:
                raise MpsError(
                    f"MPS namespaces are not available on this node (protocol {self._state.protocol}): "
                    f"{self._state.detail}"
                )
            await asyncio.to_thread(Path(self.namespace_dir(name)).mkdir, parents=True, exist_ok=True)
            command = (namespace_set if name in self._namespaces else namespace_create)(name, found)
            expect_empty(command, await self._send(command))
            self._namespaces[name] = found
        log.info("MPS: namespace %s open: %s", name, ", ".join(f"{c.uuid} {c.memory_mib}MiB" for c in found))
        return self.namespace_dir(name)

    async def close_namespace(self, name: str) -> None:
        """Delete namespace ``name`` (nothing when it is not open); its directory goes when empty."""
        name = namespace_name(name)
        async with self._lock:
            if name not in self._namespaces:
                return
            if self._state.running:
                command = namespace_delete(name)
                expect_empty(command, await self._send(command))
            del self._namespaces[name]
            await asyncio.to_thread(_remove_dir, Path(self.namespace_dir(name)))
        log.info("MPS: namespace %s closed", name)

    async def leftover_dirs(self) -> tuple[str, ...]:
        """The directories under ``<pipe>/hami`` that name no namespace open here (a previous daemon's,
        or another's), sorted."""
        async with self._lock:
            found = await asyncio.to_thread(_subdirs, Path(self.pipe_dir) / SERVER_NAME)
            return tuple(sorted(set(found) - set(self._namespaces)))

    async def remove_leftover_dirs(self, names: Sequence[str]) -> list[str]:
        """Remove the directories ``names`` under ``<pipe>/hami`` (the caller judged their pods gone)
        when no namespace of that name is open, here or on the daemon (asked now): a socket a dead
        daemon left in one goes with it, anything else keeps it. Nothing without a daemon that
        answers with namespaces. Returns the names removed."""
        removed: list[str] = []
        async with self._lock:
            if not self._state.running or not self._state.namespaces:
                return removed
            listing = namespace_list()
            daemon = parse_listing(listing, await self._send(listing))
            parent = Path(self.pipe_dir) / SERVER_NAME
            for name in names:
                if name in self._namespaces or name in daemon or "/" in name or name in ("", ".", ".."):
                    continue
                if await asyncio.to_thread(_remove_leftover, parent, name):
                    removed.append(name)
        if removed:
            log.info("MPS: removed the directories of namespaces gone: %s", ", ".join(removed))
        return removed

    # --------------------------------------------------------------------------------- internals
    def _make_dirs(self) -> None:
        for path in (self.pipe_dir, self.log_dir, self.shm_dir):
            path.mkdir(parents=True, exist_ok=True)
        # shm/ is every MPS container's /dev/shm: writable by the users they run as, each file its
        # owner's (sticky), as a host's /dev/shm is
        self.shm_dir.chmod(0o1777)

    def _env(self, *, start: bool = False) -> dict[str, str]:
        env = {**self._environ, PIPE_ENV: str(self.pipe_dir), LOG_ENV: str(self.log_dir)}
        if start:  # an older daemon ignores the variable and speaks protocol 2
            env[PROTOCOL_ENV] = str(self._wanted)
        return env

    async def _check(self) -> MpsState:
        pid = await asyncio.to_thread(read_pid, self.pipe_dir)
        alive = pid is not None and await asyncio.to_thread(pid_is_daemon, pid, self._binary)
        self._live_pid = pid if alive else None
        if pid is None:
            state = MpsState(running=False, detail=f"no control daemon (no pid file in {self.pipe_dir})")
        elif not alive:
            state = MpsState(running=False, detail=f"pid file names {pid}, not a live daemon")
        else:
            try:
                parse_server_list(get_server_list(), await self._send(get_server_list()))
            except MpsError as exc:
                state = MpsState(running=False, detail=f"control daemon pid {pid} does not answer: {exc}")
            else:
                state = await self._read_daemon(pid)
        if not state.running:
            self._known_pid = None
        self._state = state
        return state

    async def _read_daemon(self, pid: int) -> MpsState:
        """Protocol, our named server and the namespaces, read once per daemon process."""
        if self._known_pid != pid:
            self._known_pid, self._protocol, self._server_ready = pid, None, False
            try:
                self._protocol = await self._probe_protocol()
                if self._protocol >= NAMESPACE_PROTOCOL and self._wanted >= NAMESPACE_PROTOCOL:
                    if await self._ensure_server():
                        await self._sync_namespaces()
                        self._server_ready = True
                    else:  # an older driver's client: its empty "listing" was no answer at all
                        self._protocol = 2
            except MpsError as exc:
                self._known_pid = None  # read it again at the next check
                return MpsState(running=True, protocol=self._protocol, detail=f"pid {pid}: {exc}")
        namespaced = self._server_ready
        kind = "namespaces (daemon-side limits)" if namespaced else "per-client limits"
        return MpsState(
            running=True,
            protocol=self._protocol,
            namespaces=namespaced,
            detail=f"pid {pid}, {kind}",
            restored=self._restored_for == pid,
        )

    async def _probe_protocol(self) -> int:
        status, reply = await self._run(protocol_query())
        if status != 0 or refusal(reply) is not None or not_understood(reply):
            return 2
        parse_listing(protocol_query(), reply)  # answered, so it must be a listing
        return NAMESPACE_PROTOCOL

    async def _ensure_server(self) -> bool:
        """Our named server exists (created here when missing); False when the client does not know
        ``server create``, i.e. the daemon speaks protocol 2 after all."""
        servers = parse_listing(protocol_query(), await self._send(protocol_query()))
        if SERVER_NAME in servers:
            return True
        create = server_create()
        status, reply = await self._run(create)
        if not_understood(reply):
            return False
        if status != 0:
            raise MpsReplyError(create, reply, refusal(reply) or f"client exited with status {status}")
        expect_empty(create, reply)
        if SERVER_NAME not in parse_listing(protocol_query(), await self._send(protocol_query())):
            raise MpsReplyError(create, "", f"server {SERVER_NAME!r} is not listed after its creation")
        return True

    async def _sync_namespaces(self) -> None:
        """Adopt the daemon's namespaces named as ours (``<pod uid>-<index>``; any other is left alone,
        never deleted); re-create the ones we hold that it lost (it restarted)."""
        listing = namespace_list()
        daemon = parse_listing(listing, await self._send(listing))
        for name, fields in daemon.items():
            if name not in self._namespaces and pod_namespace(name):
                with contextlib.suppress(MpsError):
                    self._namespaces[namespace_name(name)] = parse_namespace_limits(listing, name, fields)
        for name, limits in self._namespaces.items():
            if name not in daemon:
                await asyncio.to_thread(Path(self.namespace_dir(name)).mkdir, parents=True, exist_ok=True)
                command = namespace_create(name, limits)
                expect_empty(command, await self._send(command))
                log.info("MPS: namespace %s re-created on the new daemon", name)

    async def _apply_defaults(self) -> None:
        if not self._defaults:
            return
        commands = [set_default_active_thread_percentage(min(c.thread_percentage for c in self._defaults))]
        commands += [set_default_device_pinned_mem_limit(c.uuid, c.memory_mib) for c in self._defaults]
        for command in commands:
            expect_empty(command, await self._send(command))

    async def _launch(self) -> MpsState:
        """``<binary> -d``, then wait (bounded) until it answers; the new daemon is ours."""
        await asyncio.to_thread(self._make_dirs)
        start_log = self.log_dir / "hami-agent-start.log"
        with start_log.open("ab") as output:  # a file, not a pipe: the forked daemon may keep it open
            try:
                process = await asyncio.create_subprocess_exec(
                    self._binary,
                    "-d",
                    stdin=asyncio.subprocess.DEVNULL,
                    stdout=output,
                    stderr=output,
                    env=self._env(start=True),
                    start_new_session=True,
                )
            except OSError as exc:
                raise MpsError(f"cannot run {self._binary!r}: {exc}") from exc
            status = await self._wait(process, self._start_timeout, f"{self._binary} -d")
        if status != 0:
            tail = await asyncio.to_thread(_tail, start_log)
            raise MpsError(f"{self._binary} -d exited with status {status}: {tail}")
        loop = asyncio.get_running_loop()
        deadline, pause = loop.time() + self._start_timeout, 0.05
        while not (state := await self._check()).running:
            if loop.time() >= deadline:
                raise MpsError(
                    f"the control daemon did not answer within {self._start_timeout:g}s: {state.detail}"
                )
            await asyncio.sleep(pause)
            pause = min(pause * 2, 1.0)
        self._started_here = True
        await self._apply_defaults()
        log.info("MPS: control daemon started: %s", state.detail)
        return state

    async def _send(self, command: Command) -> str:
        """Run ``command``; its reply, or :class:`MpsReplyError` when the client exits non-zero."""
        status, reply = await self._run(command)
        if status != 0:
            raise MpsReplyError(command, reply, refusal(reply) or f"client exited with status {status}")
        return reply

    async def _run(self, command: Command) -> tuple[int, str]:
        argv = [self._binary, *command.words] if command.verb else [self._binary]
        try:
            process = await asyncio.create_subprocess_exec(
                *argv,
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.STDOUT,
                env=self._env(),
                start_new_session=True,
            )
        except OSError as exc:
            raise MpsError(f"cannot run {self._binary!r}: {exc}") from exc
        assert process.stdin is not None and process.stdout is not None
        stdin, stdout = process.stdin, process.stdout

        async def exchange() -> bytes:
            if not command.verb:
                stdin.write(command.text.encode())
            with contextlib.suppress(ConnectionError):
                await stdin.drain()
            stdin.close()
            data = b""
            while len(data) <= REPLY_LIMIT and (chunk := await stdout.read(65536)):
                data += chunk
            return data

        try:
            data = await asyncio.wait_for(exchange(), self._timeout)
        except TimeoutError:
            await self._kill(process)
            raise MpsError(f"MPS command {str(command)!r}: no answer within {self._timeout:g}s") from None
        if len(data) > REPLY_LIMIT:
            await self._kill(process)
            raise MpsError(f"MPS command {str(command)!r}: reply longer than {REPLY_LIMIT} bytes")
        status = await self._wait(process, self._timeout, str(command))
        return status, data.decode("utf-8", "replace")

    async def _wait(self, process: asyncio.subprocess.Process, bound: float, what: str) -> int:
        try:
            return await asyncio.wait_for(process.wait(), bound)
        except TimeoutError:
            await self._kill(process)
            raise MpsError(f"{what}: did not finish within {bound:g}s") from None

    @staticmethod
    async def _kill(process: asyncio.subprocess.Process) -> None:
        """Kill the client process we ran (only it: a daemon it forked is never signalled), then reap it."""
        with contextlib.suppress(ProcessLookupError):
            process.kill()
        await process.wait()


def _remove_dir(path: Path) -> None:
    """Remove a closed namespace's directory: a socket left in it, then the directory when empty."""
    socket_path = path / CONTROL_SOCKET
    with contextlib.suppress(OSError):
        if stat.S_ISSOCK(socket_path.lstat().st_mode):
            socket_path.unlink()
    with contextlib.suppress(OSError):
        path.rmdir()


def _subdirs(parent: Path) -> list[str]:
    try:
        with os.scandir(parent) as entries:
            return [e.name for e in entries if e.is_dir(follow_symlinks=False)]
    except OSError:
        return []


def _remove_leftover(parent: Path, name: str) -> bool:
    """Remove ``parent/name`` when it is a real directory (never through a link) holding nothing or
    only a ``control`` socket; True when it is gone."""
    try:
        fd = os.open(parent / name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except OSError:
        return False
    try:
        with contextlib.suppress(OSError):
            if stat.S_ISSOCK(os.stat(CONTROL_SOCKET, dir_fd=fd, follow_symlinks=False).st_mode):
                os.unlink(CONTROL_SOCKET, dir_fd=fd)
    finally:
        os.close(fd)
    try:
        os.rmdir(parent / name)
    except OSError:
        return False
    return True


def _tail(path: Path, limit: int = 2000) -> str:
    try:
        data = path.read_bytes()[-limit:]
    except OSError:
        return ""
    return data.decode("utf-8", "replace").strip()
