"""A SIMULATED ``nvidia-cuda-mps-control`` (test kit, not product): the node's MPS control daemon and
its client, speaking the documented command language, so the agent's MPS back end runs without a GPU.

Run as a drop-in binary (``python -m hami_testkit.mps_control``, or the executable wrapper that
:func:`write_wrapper` writes, which the agent's ``--mps-control`` can name):

- ``-d`` starts the daemon in the background (``-f``: in the foreground): a unix socket ``control`` in
  ``CUDA_MPS_PIPE_DIRECTORY``, the pid file ``nvidia-cuda-mps-control.pid`` beside it, ``control.log``
  in ``CUDA_MPS_LOG_DIRECTORY``. ``-p 2|3`` (or ``CUDA_MPS_PROTOCOL_VERSION``, which wins, as
  documented) picks the protocol; ``--card UUID=MIB`` (repeatable; default one 16384 MiB card) the
  simulated cards (or ``HAMI_SIM_MPS_CARDS=GPU-a=8192,...``); ``--mute`` (or
  ``HAMI_SIM_MPS_BEHAVIOUR=mute``) a daemon that accepts connections and never answers;
  ``--garbage`` (``=garbage``) one that answers every command with text no MPS daemon writes;
  ``HAMI_SIM_MPS_DRIVER_PROTOCOL=2`` an older driver (a request for protocol 3 is ignored, and its
  client answers protocol 3 words as driver r580's did: see :func:`_older_client`).
- without arguments it is the client: one command per stdin line (the protocol 2 shell); with
  arguments (``server list``, ``namespace create --server=...``) one protocol 3 command; ``-q`` quits.
  The exit status is 1 when the daemon refused a command or cannot be reached.
- ``cuda-client --alloc-mib N [--card UUID|INDEX] [--hold]`` plays a CUDA program under MPS: it
  connects where a CUDA client would (``$CUDA_MPS_PIPE_DIRECTORY/control``) and asks for N MiB of
  pinned device memory, passing its ``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT`` /
  ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`` / ``NVIDIA_VISIBLE_DEVICES`` as the real client library would.
  Through the main socket the daemon enforces the client's own variables (else the server defaults);
  through a namespace's socket (``<pipe>/<server>/<namespace>/control``, protocol 3) it enforces the
  namespace's limits, summed over the namespace's clients, and ignores the client's variables. Every
  card's capacity holds across all clients. ``--hold`` keeps the allocation until stdin closes.
- ``wrapper DIR`` writes the executable wrapper into DIR and prints its path.

Started through the wrapper, the daemon process looks like the binary: its argv[0] is the wrapper's
path (``/proc/<pid>/cmdline``), which is how the agent tells the daemon from any other process a stale
pid file may name. The daemon re-executes the interpreter under that name (:func:`_named_as_wrapper`),
telling it where the standard library and this package are, as the name no longer leads to them.

Protocol 2 commands: get_server_list, start_server -uid N, get_client_list PID, quit, ps,
set_default_active_thread_percentage P, get_default_active_thread_percentage,
set_default_device_pinned_mem_limit DEV VALUE, get_default_device_pinned_mem_limit DEV. Protocol 3
adds server create|list and namespace create|set|delete|list (options ``--key=value``). Listings are
one item per line, name first, then ``key=value`` words; refusals are lines starting ``Error:``; memory
values are ``<n>M`` / ``<n>G`` (docs/node-agent.md, "MPS mode", says which of this the documentation
leaves open). The socket's own framing (a JSON object per line) is the simulation's, not NVIDIA's.
Must not import ``nodeagent``: it is an independent implementation of the same language.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
import socket
import stat
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

PID_FILE = "nvidia-cuda-mps-control.pid"
CONTROL = "control"
PIPE_ENV, LOG_ENV, PROTOCOL_ENV = (
    "CUDA_MPS_PIPE_DIRECTORY",
    "CUDA_MPS_LOG_DIRECTORY",
    "CUDA_MPS_PROTOCOL_VERSION",
)
MEMORY_ENV, THREADS_ENV = "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"
DEFAULT_PIPE, DEFAULT_LOG = "/tmp/nvidia-mps", "/var/log/nvidia-mps"
DEFAULT_CARDS = {"GPU-sim-0": 16384}
#: The simulation's own knobs for a daemon started as ``<wrapper> -d`` (what the agent runs):
#: ``GPU-a=8192,GPU-b=8192`` and ``mute`` / ``garbage``.
CARDS_ENV, BEHAVIOUR_ENV = "HAMI_SIM_MPS_CARDS", "HAMI_SIM_MPS_BEHAVIOUR"
#: The newest protocol the simulated driver has (2: an older driver, which ignores a request for 3).
DRIVER_PROTOCOL_ENV = "HAMI_SIM_MPS_DRIVER_PROTOCOL"
#: Set by the wrapper to its own path: the daemon process takes it as its argv[0].
WRAPPER_ENV = "HAMI_SIM_MPS_WRAPPER"
_NAMED_ENV = "HAMI_SIM_MPS_NAMED"  # set once the daemon runs under the wrapper's name (no second exec)
#: How long ``-d`` waits for its daemon to answer.
START_BOUND = 120.0
_VALUE = re.compile(r"([0-9]{1,12})([MG])")
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,62}")


class Refused(Exception):
    """A command the daemon refuses; the text becomes its ``Error:`` line."""


def parse_memory(text: str) -> int:
    match = _VALUE.fullmatch(text.strip())
    if match is None:
        raise Refused(f"invalid memory value {text!r} (expected <n>M or <n>G)")
    return int(match.group(1)) * (1024 if match.group(2) == "G" else 1)


def parse_percentage(text: str) -> int:
    if not text.isdigit() or not 1 <= int(text) <= 100:
        raise Refused(f"invalid active thread percentage {text!r}")
    return int(text)


@dataclass
class Namespace:
    memory: dict[str, int]
    threads: int
    listener: asyncio.AbstractServer | None = None


@dataclass
class Server:
    uid: int
    pid: int
    namespaces: dict[str, Namespace] = field(default_factory=dict)


@dataclass
class Client:
    pid: int
    route: tuple[str, str] | None
    memory: dict[str, int] = field(default_factory=dict)
    threads: int = 100


class Daemon:
    """The simulated control daemon's state and command interpreter."""

    def __init__(
        self, pipe: Path, log: Path, *, protocol: int, cards: dict[str, int], mute: bool, garbage: bool
    ) -> None:
        self.pipe, self.log, self.protocol, self.cards = pipe, log, protocol, cards
        self.mute, self.garbage = mute, garbage
        self.default_threads = 100
        self.default_memory: dict[str, int] = {}
        self.uid_servers: dict[int, int] = {}
        self.servers: dict[str, Server] = {}
        self.clients: dict[int, Client] = {}
        self.stopping = asyncio.Event()
        self._next_pid = os.getpid() * 10
        self._main: asyncio.AbstractServer | None = None

    # ----------------------------------------------------------------------------------- serving
    async def serve(self) -> None:
        self.pipe.mkdir(parents=True, exist_ok=True)
        self.log.mkdir(parents=True, exist_ok=True)
        self._main = await self._listen(self.pipe / CONTROL, None)
        (self.pipe / PID_FILE).write_text(f"{os.getpid()}\n")
        self.note(f"daemon started, protocol {self.protocol}, cards {self.cards}")
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, self.stopping.set)
        try:
            await self.stopping.wait()
        finally:
            self._main.close()
            for server in self.servers.values():
                for namespace in server.namespaces.values():
                    if namespace.listener is not None:
                        namespace.listener.close()
            for path in [self.pipe / CONTROL, self.pipe / PID_FILE, *self._namespace_sockets()]:
                with contextlib.suppress(OSError):
                    path.unlink()
            self.note("daemon stopped")

    def _namespace_sockets(self) -> list[Path]:
        return [self.pipe / s / n / CONTROL for s, server in self.servers.items() for n in server.namespaces]

    async def _listen(self, path: Path, route: tuple[str, str] | None) -> asyncio.AbstractServer:
        _unlink_socket(path)
        return await asyncio.start_unix_server(lambda r, w: self._connection(r, w, route), path=str(path))

    async def _connection(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, route: tuple[str, str] | None
    ) -> None:
        key = id(writer)
        try:
            while line := await reader.readline():
                if self.mute:
                    continue
                try:
                    request = json.loads(line)
                except ValueError:
                    break
                if "alloc" in request:
                    reply = self.alloc(key, route, request["alloc"])
                else:
                    reply = self.command(str(request.get("cmd", "")))
                writer.write(json.dumps(reply).encode() + b"\n")
                await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.CancelledError):
            pass  # a client gone, or the daemon stopping under an open connection
        finally:
            self.clients.pop(key, None)
            writer.close()

    def note(self, text: str) -> None:
        with contextlib.suppress(OSError), (self.log / "control.log").open("a") as file:
            file.write(f"{time.strftime('%Y-%m-%d %H:%M:%S')} {text}\n")

    # ---------------------------------------------------------------------------------- commands
    def command(self, text: str) -> dict[str, Any]:
        self.note(f"command: {text}")
        if self.garbage:
            return {"ok": True, "text": "\x1b[31m<<garbage>> \u2603 not an MPS reply\n"}
        try:
            words = text.split()
            if not words:
                return {"ok": True, "text": ""}
            reply = self._dispatch(words)
        except Refused as exc:
            return {"ok": False, "text": f"Error: {exc}\n"}
        return {"ok": True, "text": reply}

    def _dispatch(self, words: list[str]) -> str:
        head, rest = words[0], words[1:]
        v2 = {
            "get_server_list": self._get_server_list,
            "start_server": self._start_server,
            "get_client_list": lambda args: "".join(f"{c.pid}\n" for c in self.clients.values()),
            "quit": self._quit,
            "ps": self._ps,
            "set_default_active_thread_percentage": self._set_default_threads,
            "get_default_active_thread_percentage": lambda args: f"{float(self.default_threads)}\n",
            "set_default_device_pinned_mem_limit": self._set_default_memory,
            "get_default_device_pinned_mem_limit": self._get_default_memory,
        }
        if head in v2:
            return v2[head](rest)
        if self.protocol >= 3 and head in ("server", "namespace") and rest:
            verb, options = rest[0], _options(rest[1:])
            handler = getattr(self, f"_{head}_{verb}", None)
            if handler is not None:
                result: str = handler(options)
                return result
        raise Refused(f"unrecognized command {' '.join(words[:2])!r}")

    def _fake_pid(self) -> int:
        self._next_pid += 1
        return self._next_pid

    def _get_server_list(self, args: list[str]) -> str:
        pids = [*self.uid_servers.values(), *(s.pid for s in self.servers.values())]
        return "".join(f"{pid}\n" for pid in pids)

    def _start_server(self, args: list[str]) -> str:
        if len(args) != 2 or args[0] != "-uid" or not args[1].isdigit():
            raise Refused("usage: start_server -uid <user id>")
        self.uid_servers.setdefault(int(args[1]), self._fake_pid())
        return ""

    def _quit(self, args: list[str]) -> str:
        self.note("quit")
        asyncio.get_running_loop().call_soon(self.stopping.set)
        return ""

    def _ps(self, args: list[str]) -> str:
        lines = []
        for client in self.clients.values():
            where = "/".join(client.route) if client.route else "default"
            memory = ",".join(f"{uuid}={mib}M" for uuid, mib in client.memory.items())
            lines.append(f"{client.pid} namespace={where} memory={memory} threads={client.threads}\n")
        return "".join(lines)

    def _set_default_threads(self, args: list[str]) -> str:
        if len(args) != 1:
            raise Refused("usage: set_default_active_thread_percentage <percentage>")
        self.default_threads = parse_percentage(args[0])
        return ""

    def _set_default_memory(self, args: list[str]) -> str:
        if len(args) != 2:
            raise Refused("usage: set_default_device_pinned_mem_limit <dev> <value>")
        self.default_memory[self._card(args[0], list(self.cards))] = parse_memory(args[1])
        return ""

    def _get_default_memory(self, args: list[str]) -> str:
        if len(args) != 1:
            raise Refused("usage: get_default_device_pinned_mem_limit <dev>")
        mib = self.default_memory.get(self._card(args[0], list(self.cards)))
        return f"{mib}M\n" if mib is not None else "0\n"

    def _card(self, key: str, visible: Sequence[str]) -> str:
        if key.isdigit():
            if int(key) >= len(visible):
                raise Refused(f"no device {key}")
            return visible[int(key)]
        if key not in self.cards:
            raise Refused(f"unknown device {key!r}")
        return key

    def _server(self, options: dict[str, str]) -> tuple[str, Server]:
        name = options.get("server", "")
        if name not in self.servers:
            raise Refused(f"no server named {name!r}")
        return name, self.servers[name]

    def _server_create(self, options: dict[str, str]) -> str:
        name, uid = options.get("name", ""), options.get("uid", "0")
        if _NAME.fullmatch(name) is None or not uid.isdigit():
            raise Refused("usage: server create --name=<name> --uid=<uid>")
        if name in self.servers:
            raise Refused(f"server {name!r} exists")
        (self.pipe / name).mkdir(parents=True, exist_ok=True)
        self.servers[name] = Server(uid=int(uid), pid=self._fake_pid())
        return ""

    def _server_list(self, options: dict[str, str]) -> str:
        return "".join(f"{n} pid={s.pid} uid={s.uid}\n" for n, s in self.servers.items())

    def _limits(self, options: dict[str, str]) -> tuple[dict[str, int], int]:
        memory: dict[str, int] = {}
        for item in filter(None, options.get("pinned-memory-limit", "").split(",")):
            key, equals, value = item.partition("=")
            if not equals:
                raise Refused(f"invalid pinned memory limit {item!r}")
            memory[self._card(key, list(self.cards))] = parse_memory(value)
        return memory, parse_percentage(options.get("active-thread-percentage", "100"))

    def _namespace_create(self, options: dict[str, str]) -> str:
        server_name, server = self._server(options)
        name = options.get("name", "")
        if _NAME.fullmatch(name) is None or name == "default":
            raise Refused(f"invalid namespace name {name!r}")
        if name in server.namespaces:
            raise Refused(f"namespace {name!r} exists on server {server_name!r}")
        memory, threads = self._limits(options)
        namespace = Namespace(memory=memory, threads=threads)
        server.namespaces[name] = namespace
        directory = self.pipe / server_name / name
        directory.mkdir(parents=True, exist_ok=True)
        asyncio.get_running_loop().create_task(self._open(namespace, directory, (server_name, name)))
        return ""

    async def _open(self, namespace: Namespace, directory: Path, route: tuple[str, str]) -> None:
        namespace.listener = await self._listen(directory / CONTROL, route)

    def _namespace_set(self, options: dict[str, str]) -> str:
        _, server = self._server(options)
        namespace = server.namespaces.get(options.get("name", ""))
        if namespace is None:
            raise Refused(f"no namespace named {options.get('name', '')!r}")
        namespace.memory, namespace.threads = self._limits(options)
        return ""

    def _namespace_delete(self, options: dict[str, str]) -> str:
        server_name, server = self._server(options)
        name = options.get("name", "")
        namespace = server.namespaces.pop(name, None)
        if namespace is None:
            raise Refused(f"no namespace named {name!r}")
        if namespace.listener is not None:
            namespace.listener.close()
        with contextlib.suppress(OSError):
            (self.pipe / server_name / name / CONTROL).unlink()
        return ""

    def _namespace_list(self, options: dict[str, str]) -> str:
        _, server = self._server(options)
        return "".join(
            f"{name} pinned_memory_limit={','.join(f'{u}={m}M' for u, m in ns.memory.items())}"
            f" active_thread_percentage={ns.threads}\n"
            for name, ns in server.namespaces.items()
        )

    # ------------------------------------------------------------------------------------ clients
    def alloc(self, key: int, route: tuple[str, str] | None, request: dict[str, Any]) -> dict[str, Any]:
        """A CUDA client's pinned allocation, enforced as MPS would (see the module docstring)."""
        try:
            text = self._alloc(key, route, request)
        except Refused as exc:
            self.note(f"client refused: {exc}")
            return {"ok": False, "text": f"Error: {exc}\n"}
        return {"ok": True, "text": text}

    def _alloc(self, key: int, route: tuple[str, str] | None, request: dict[str, Any]) -> str:
        mib = int(request.get("mib", 0))
        visible = [v for v in str(request.get("visible") or "").split(",") if v] or list(self.cards)
        card = self._card(str(request.get("card") or "0"), visible)
        if card not in visible:
            raise Refused(f"device {card} is not visible to this client")
        client = self.clients.setdefault(key, Client(pid=int(request.get("pid", 0)), route=route))
        if not self.uid_servers and not self.servers:
            self.uid_servers[0] = self._fake_pid()  # the first client starts a server
        if route is not None:
            server = self.servers.get(route[0])
            namespace = server.namespaces.get(route[1]) if server else None
            if namespace is None:
                raise Refused(f"namespace {'/'.join(route)} does not exist")
            limit = namespace.memory.get(card)
            if limit is None:
                raise Refused(f"device {card} is not in namespace {route[1]}")
            used = sum(c.memory.get(card, 0) for c in self.clients.values() if c.route == route)
            if used + mib > limit:
                raise Refused(
                    f"out of memory: namespace {route[1]} limit {limit}M on {card},"
                    f" {used}M in use, {mib}M asked"
                )
            client.threads = namespace.threads  # the daemon's limit; the client's variable is not read
        else:
            env_limits = _env_memory(str(request.get("env_memory") or ""), visible, self)
            limit = env_limits.get(card, self.default_memory.get(card))
            used = client.memory.get(card, 0)
            if limit is not None and used + mib > limit:
                raise Refused(f"out of memory: client limit {limit}M on {card}, {used}M in use, {mib}M asked")
            env_threads = str(request.get("env_threads") or "")
            own = parse_percentage(env_threads) if env_threads else 100
            client.threads = min(own, self.default_threads)
        taken = sum(c.memory.get(card, 0) for c in self.clients.values())
        if taken + mib > self.cards[card]:
            raise Refused(f"out of memory: {card} has {self.cards[card] - taken}M free, {mib}M asked")
        client.memory[card] = client.memory.get(card, 0) + mib
        return f"allocated {mib}M on {card} threads={client.threads}\n"


def _unlink_socket(path: Path) -> None:
    """Remove a socket a killed daemon left (never any other kind of file)."""
    with contextlib.suppress(FileNotFoundError):
        if stat.S_ISSOCK(path.lstat().st_mode):
            path.unlink()


def _env_memory(text: str, visible: Sequence[str], daemon: Daemon) -> dict[str, int]:
    limits: dict[str, int] = {}
    for item in filter(None, text.split(",")):
        key, equals, value = item.partition("=")
        if not equals:
            raise Refused(f"{MEMORY_ENV} entry {item!r} is not <dev>=<value>")
        limits[daemon._card(key, visible)] = parse_memory(value)
    return limits


def _options(words: Sequence[str]) -> dict[str, str]:
    options: dict[str, str] = {}
    pending: str | None = None
    for word in words:
        if pending is not None:
            options[pending], pending = word, None
        elif word.startswith("--"):
            key, equals, value = word[2:].partition("=")
            if equals:
                options[key] = value
            else:
                pending = key
        else:
            raise Refused(f"unexpected argument {word!r}")
    if pending is not None:
        options[pending] = ""
    return options


# ----------------------------------------------------------------------------------- processes
def _pipe() -> Path:
    return Path(os.environ.get(PIPE_ENV) or DEFAULT_PIPE)


def _log() -> Path:
    return Path(os.environ.get(LOG_ENV) or DEFAULT_LOG)


def _request(path: Path, payload: dict[str, Any], timeout: float | None = None) -> dict[str, Any]:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout)
        sock.connect(str(path))
        sock.sendall(json.dumps(payload).encode() + b"\n")
        data = sock.makefile("rb").readline()
    if not data:
        raise ConnectionError("the daemon closed the connection")
    reply: dict[str, Any] = json.loads(data)
    return reply


def _running(pipe: Path) -> bool:
    try:
        return _request(pipe / CONTROL, {"cmd": "get_server_list"}, timeout=5.0).get("ok") is True
    except (OSError, ValueError):
        return False


@dataclass
class DaemonArgs:
    protocol: int = 2
    cards: dict[str, int] = field(default_factory=lambda: dict(DEFAULT_CARDS))
    mute: bool = False
    garbage: bool = False
    background: bool = True


def _daemon_args(argv: Sequence[str]) -> DaemonArgs:
    args, words = DaemonArgs(), list(argv)
    cards: dict[str, int] = {}
    for item in filter(None, os.environ.get(CARDS_ENV, "").split(",")):
        uuid, _, mib = item.partition("=")
        cards[uuid] = int(mib)
    behaviour = os.environ.get(BEHAVIOUR_ENV, "")
    args.mute, args.garbage = behaviour == "mute", behaviour == "garbage"
    while words:
        word = words.pop(0)
        if word in ("-d", "--daemon"):
            args.background = True
        elif word in ("-f", "--foreground"):
            args.background = False
        elif word in ("-p", "--protocol") and words:
            args.protocol = int(words.pop(0))
        elif word == "--card" and words:
            uuid, _, mib = words.pop(0).partition("=")
            cards[uuid] = int(mib)
        elif word == "--mute":
            args.mute = True
        elif word == "--garbage":
            args.garbage = True
        else:
            raise SystemExit(f"nvidia-cuda-mps-control (simulated): unknown option {word!r}")
    if os.environ.get(PROTOCOL_ENV):  # the variable takes precedence over -p, as documented
        args.protocol = int(os.environ[PROTOCOL_ENV])
    args.protocol = min(args.protocol, int(os.environ.get(DRIVER_PROTOCOL_ENV) or 3))
    if args.protocol not in (2, 3):
        raise SystemExit(f"nvidia-cuda-mps-control (simulated): protocol must be 2 or 3, got {args.protocol}")
    if cards:
        args.cards = cards
    return args


def _start(argv: Sequence[str]) -> int:
    args, pipe = _daemon_args(argv), _pipe()
    if _running(pipe):
        print("An instance of this daemon is already running", file=sys.stderr)
        return 1
    if args.background:
        _log().mkdir(parents=True, exist_ok=True)
        foreground = [
            sys.executable,
            "-m",
            "hami_testkit.mps_control",
            "-f",
            *[a for a in argv if a not in ("-d", "--daemon")],
        ]
        with (_log() / "control.stdout").open("ab") as out:
            subprocess.Popen(
                foreground, stdin=subprocess.DEVNULL, stdout=out, stderr=out, start_new_session=True
            )
        deadline = time.monotonic() + START_BOUND
        while not (pipe / PID_FILE).exists():  # written once the socket listens
            if time.monotonic() > deadline:
                print("the daemon did not start", file=sys.stderr)
                return 1
            time.sleep(0.05)
        return 0
    _named_as_wrapper(argv)
    daemon = Daemon(
        pipe, _log(), protocol=args.protocol, cards=args.cards, mute=args.mute, garbage=args.garbage
    )
    asyncio.run(daemon.serve())
    return 0


def _send_commands(lines: Sequence[str]) -> int:
    status = 0
    for line in lines:
        if not line.strip():
            continue
        try:
            reply = _request(_pipe() / CONTROL, {"cmd": line.strip()})
        except (OSError, ValueError) as exc:
            print(f"Cannot reach the MPS control daemon in {_pipe()}: {exc}", file=sys.stderr)
            return 1
        sys.stdout.write(str(reply.get("text", "")))
        if reply.get("ok") is not True:
            status = 1
    sys.stdout.flush()
    return status


def _cuda_client(argv: Sequence[str]) -> int:
    options = _options(argv)
    request = {
        "mib": int(options.get("alloc-mib", "0")),
        "card": options.get("card"),
        "pid": os.getpid(),
        "env_memory": os.environ.get(MEMORY_ENV),
        "env_threads": os.environ.get(THREADS_ENV),
        "visible": os.environ.get("NVIDIA_VISIBLE_DEVICES") or os.environ.get("CUDA_VISIBLE_DEVICES"),
    }
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        try:
            sock.connect(str(_pipe() / CONTROL))
        except OSError as exc:
            print(f"no MPS daemon at {_pipe()}: {exc}", file=sys.stderr)
            return 2
        sock.sendall(json.dumps({"alloc": request}).encode() + b"\n")
        data = sock.makefile("rb").readline()
        reply = (
            json.loads(data) if data else {"ok": False, "text": "Error: the daemon closed the connection\n"}
        )
        sys.stdout.write(str(reply.get("text", "")))
        sys.stdout.flush()
        if reply.get("ok") is True and "hold" in options:
            sys.stdin.read()  # hold the allocation until stdin closes
    return 0 if reply.get("ok") is True else 1


def _named_as_wrapper(argv: Sequence[str]) -> None:
    """The foreground daemon started through the wrapper re-executes itself with the wrapper's path
    as argv[0], as the real binary's daemon has its own name there. Python finds its standard library
    and packages from argv[0], so ``PYTHONHOME`` and ``PYTHONPATH`` say where they are."""
    wrapper = os.environ.get(WRAPPER_ENV)
    if not wrapper or os.environ.get(_NAMED_ENV):
        return
    home = (
        sys.base_prefix
        if sys.base_prefix == sys.base_exec_prefix
        else f"{sys.base_prefix}:{sys.base_exec_prefix}"
    )
    package_root = str(Path(__file__).resolve().parent.parent)  # the directory holding hami_testkit
    paths = [package_root, *[p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]]
    env = {**os.environ, _NAMED_ENV: "1", "PYTHONHOME": home, "PYTHONPATH": os.pathsep.join(paths)}
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, [wrapper, "-m", "hami_testkit.mps_control", *argv], env)


def write_wrapper(directory: Path, name: str = "nvidia-cuda-mps-control") -> Path:
    """An executable ``name`` in ``directory`` running this simulation with this interpreter (its
    daemon named after the wrapper: :func:`_named_as_wrapper`)."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / name
    path.write_text(
        f'#!/bin/sh\n{WRAPPER_ENV}="$0"\nexport {WRAPPER_ENV}\n'
        f"exec '{sys.executable}' -m hami_testkit.mps_control \"$@\"\n"
    )
    path.chmod(0o755)
    return path


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args:
        return _send_commands(sys.stdin.read().splitlines())
    if args[0] in ("-d", "--daemon", "-f", "--foreground") or (
        args[0] in ("-p", "--protocol") and any(a in ("-d", "-f") for a in args)
    ):
        return _start(args)
    if args[0] in ("-q", "--quit"):
        return _send_commands(["quit"])
    if args[0] == "cuda-client":
        return _cuda_client(args[1:])
    if args[0] == "wrapper" and len(args) == 2:
        print(write_wrapper(Path(args[1])))
        return 0
    if args[0] in ("-p", "--protocol"):  # a client follows the running daemon's protocol
        args = args[2:]
    if (os.environ.get(DRIVER_PROTOCOL_ENV) or "3") == "2":
        return _older_client(args)
    return _send_commands([" ".join(args)])


#: What an older driver's client prints for an option it does not know (its usage text follows).
USAGE = (
    "CUDA MPS Control for Linux/Unix/QNX.\n\n"
    "  This program allows multiple CUDA processes to share a single GPU context.\n"
)


def _older_client(args: Sequence[str]) -> int:
    """An older driver's client given protocol 3 words, as driver r580 (580.159.04) answered on an H200:
    an ``--option`` it does not know prints ``Unrecognized option`` and its usage text, exit 0; other
    words are ignored and the commands are read from stdin as ever (none: an empty reply, exit 0)."""
    for word in args:
        if word.startswith("-"):
            sys.stdout.write(f"Unrecognized option {word}\n{USAGE}")
            return 0
    return _send_commands(sys.stdin.read().splitlines())


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
