"""The CUDA MPS control daemon's command language, as text, and the parsing of its replies (pure).

Owns the commands the agent sends to ``nvidia-cuda-mps-control`` and what it reads back, with the
documented command names (NVIDIA's "Legacy MPS v2 Interface" and "MPS v3 Interface" pages):

- protocol 2, the interactive shell (one command per line on the client's stdin): ``get_server_list``,
  ``start_server -uid <uid>``, ``set_default_active_thread_percentage <pct>``,
  ``set_default_device_pinned_mem_limit <dev> <value>``, ``quit``;
- protocol 3 (driver r615 / CUDA 13.4), the scriptable ``<module> <verb> --option=value`` syntax given
  as the client's arguments: ``server list``, ``server create``, ``namespace create|set|delete|list``.

Where the documentation is silent we chose, and docs/node-agent.md ("MPS mode") says so: the
protocol-version query is the v3 verb ``server list`` (a daemon that answers it with a server listing
speaks protocol 3; one that refuses it speaks protocol 2; an older driver's client ignores the words and
answers nothing, so that first verdict stands only once ``server create`` is understood:
:func:`not_understood`); the namespace options are
``--server=``, ``--name=``, ``--pinned-memory-limit=<card>=<value>,...`` (the client variable
``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT``'s ``<dev>=<value>`` list, keyed by card UUID) and
``--active-thread-percentage=``; listings are one item per line, its name first and then
``key=value`` words; a reply line starting with ``Error`` (any case) is a refusal. Memory values are
an integer and ``M`` or ``G`` (MiB, GiB), the documented form.

Every parse error is a :class:`MpsReplyError` naming the command and quoting the reply. Stdlib only:
no I/O, no asyncio, must not import ``hami_testkit``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

#: The control daemon's files in the pipe directory.
PID_FILE = "nvidia-cuda-mps-control.pid"
CONTROL_SOCKET = "control"
#: The protocol 3 named server that holds the pods' namespaces (``<pipe>/<server>/<namespace>/control``).
SERVER_NAME = "hami"
#: The variables the daemon, its clients and the servers read.
PIPE_ENV = "CUDA_MPS_PIPE_DIRECTORY"
LOG_ENV = "CUDA_MPS_LOG_DIRECTORY"
PROTOCOL_ENV = "CUDA_MPS_PROTOCOL_VERSION"
CLIENT_MEMORY_ENV = "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"
CLIENT_THREADS_ENV = "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"
#: The protocol that brings namespaces (daemon-side limits per group of clients).
NAMESPACE_PROTOCOL = 3
#: Longest reply read (a listing of every pod on a node fits many times over).
REPLY_LIMIT = 256 * 1024

_NAME = re.compile(r"[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?")
#: A namespace the agent makes for a container: ``<Kubernetes pod UID>-<container index>``.
_POD_NAMESPACE = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}-[0-9]{1,6}")
_CARD = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,127}")
_VALUE = re.compile(r"([0-9]{1,12})([MG])")
_WORD = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")


class MpsError(Exception):
    """The MPS daemon cannot do what was asked (down, no namespaces, a refused command, a bad name)."""


class MpsNameError(MpsError, ValueError):
    """A namespace name or a card UUID that cannot be written into a command."""


class MpsReplyError(MpsError):
    """The daemon refused a command or answered something we cannot read; names both."""

    def __init__(self, command: Command, reply: str, why: str) -> None:
        self.command, self.reply, self.why = command, reply, why
        shown = reply if len(reply) <= 200 else reply[:200] + "..."
        super().__init__(f"MPS command {str(command)!r}: {why} (reply {shown!r})")


@dataclass(frozen=True, slots=True)
class MpsState:
    """What the daemon answered at the last check (never what the config asks for)."""

    running: bool
    protocol: int | None = None
    namespaces: bool = False  # protocol >= 3 and our named server answers
    detail: str = ""
    #: the namespaces of the pods running on the node were opened on this daemon process (after the
    #: agent's or the daemon's restart a new daemon has none of them: ``nodeagent.mps.keeper.restore``)
    restored: bool = False


@dataclass(frozen=True, slots=True)
class CardLimit:
    """One card of a slice: memory in MiB and compute as a percentage of the card's threads."""

    uuid: str
    memory_mib: int
    thread_percentage: int

    def __post_init__(self) -> None:
        card_uuid(self.uuid)
        if isinstance(self.memory_mib, bool) or not isinstance(self.memory_mib, int) or self.memory_mib < 1:
            raise MpsNameError(
                f"card {self.uuid}: memory_mib must be a positive integer, got {self.memory_mib!r}"
            )
        pct = self.thread_percentage
        if isinstance(pct, bool) or not isinstance(pct, int) or not 1 <= pct <= 100:
            raise MpsNameError(f"card {self.uuid}: thread_percentage must be 1..100, got {pct!r}")


@dataclass(frozen=True, slots=True)
class Command:
    """One control command: ``words`` joined by spaces. A ``verb`` command (protocol 3) is given as the
    client's arguments; a shell command (protocol 2) is written to its stdin."""

    words: tuple[str, ...]
    verb: bool = False

    @property
    def text(self) -> str:
        return " ".join(self.words) + "\n"

    def __str__(self) -> str:
        return " ".join(self.words)


# ------------------------------------------------------------------------------------------ names
def namespace_name(name: str) -> str:
    """``name`` when it is a plain safe namespace name (a pod UID: lowercase letters, digits and ``-``,
    at most 63, not ``default``, the server's own); raises :class:`MpsNameError`."""
    if not isinstance(name, str) or _NAME.fullmatch(name) is None:
        raise MpsNameError(
            f"MPS namespace name {name!r} must be 1-63 lowercase letters, digits or '-' (a pod UID)"
        )
    if name == "default":
        raise MpsNameError("MPS namespace name 'default' is the server's own namespace")
    return name


def pod_namespace(name: str) -> bool:
    """Whether ``name`` is shaped as the namespace of a pod's container: ``<pod uid>-<index>``, the UID
    as Kubernetes writes it (8-4-4-4-12 lowercase hex). Only such a namespace found on a daemon is
    taken for the agent's own (adopted, and deleted once its pod is gone)."""
    return isinstance(name, str) and _POD_NAMESPACE.fullmatch(name) is not None


def card_uuid(uuid: str) -> str:
    """``uuid`` when it can be written into a command (no separator, space or control character)."""
    if not isinstance(uuid, str) or _CARD.fullmatch(uuid) is None:
        raise MpsNameError(f"card UUID {uuid!r} cannot be written into an MPS command")
    return uuid


def memory_value(mib: int) -> str:
    """The documented value form: ``2048M``."""
    return f"{int(mib)}M"


def parse_memory(text: str) -> int:
    """``2048M`` / ``2G`` -> MiB; raises ValueError."""
    match = _VALUE.fullmatch(text.strip())
    if match is None:
        raise ValueError(f"memory value {text!r} is not <integer>M or <integer>G")
    number, unit = int(match.group(1)), match.group(2)
    return number * 1024 if unit == "G" else number


def memory_spec(limits: Sequence[CardLimit]) -> str:
    """``GPU-a=2048M,GPU-b=1024M``: the per-card list of ``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT``'s form."""
    return ",".join(f"{card_uuid(limit.uuid)}={memory_value(limit.memory_mib)}" for limit in limits)


def thread_percentage(limits: Sequence[CardLimit]) -> int:
    """MPS takes one active-thread percentage per client or namespace, not per card: the smallest grant
    of the slice, so no card gets more than its grant."""
    return min(limit.thread_percentage for limit in limits)


def checked_limits(limits: Sequence[CardLimit]) -> tuple[CardLimit, ...]:
    """At least one card, each once."""
    found = tuple(limits)
    if not found:
        raise MpsNameError("an MPS namespace needs the limits of at least one card")
    uuids = [limit.uuid for limit in found]
    if len(set(uuids)) != len(uuids):
        raise MpsNameError(f"a card is listed twice in the MPS limits: {', '.join(uuids)}")
    return found


# --------------------------------------------------------------------------------------- commands
def get_server_list() -> Command:
    return Command(("get_server_list",))


def start_server(uid: int) -> Command:
    return Command(("start_server", "-uid", str(int(uid))))


def set_default_active_thread_percentage(percentage: int) -> Command:
    if not 1 <= int(percentage) <= 100:
        raise MpsNameError(f"active thread percentage must be 1..100, got {percentage!r}")
    return Command(("set_default_active_thread_percentage", str(int(percentage))))


def set_default_device_pinned_mem_limit(device: str, mib: int) -> Command:
    return Command(("set_default_device_pinned_mem_limit", card_uuid(device), memory_value(mib)))


def quit_daemon() -> Command:
    return Command(("quit",))


def protocol_query() -> Command:
    """The protocol-version query: the v3 verb ``server list`` (see the module docstring)."""
    return Command(("server", "list"), verb=True)


def server_create(name: str = SERVER_NAME, uid: int = 0) -> Command:
    return Command(("server", "create", f"--name={namespace_name(name)}", f"--uid={int(uid)}"), verb=True)


def namespace_create(name: str, limits: Sequence[CardLimit], server: str = SERVER_NAME) -> Command:
    return _namespace_limits("create", name, limits, server)


def namespace_set(name: str, limits: Sequence[CardLimit], server: str = SERVER_NAME) -> Command:
    return _namespace_limits("set", name, limits, server)


def _namespace_limits(verb: str, name: str, limits: Sequence[CardLimit], server: str) -> Command:
    found = checked_limits(limits)
    return Command(
        (
            "namespace",
            verb,
            f"--server={namespace_name(server)}",
            f"--name={namespace_name(name)}",
            f"--pinned-memory-limit={memory_spec(found)}",
            f"--active-thread-percentage={thread_percentage(found)}",
        ),
        verb=True,
    )


def namespace_delete(name: str, server: str = SERVER_NAME) -> Command:
    return Command(
        ("namespace", "delete", f"--server={namespace_name(server)}", f"--name={namespace_name(name)}"),
        verb=True,
    )


def namespace_list(server: str = SERVER_NAME) -> Command:
    return Command(("namespace", "list", f"--server={namespace_name(server)}"), verb=True)


# ---------------------------------------------------------------------------------------- replies
def refusal(reply: str) -> str | None:
    """The daemon's refusal line, or None when the reply is not one."""
    for line in reply.splitlines():
        if line.strip().lower().startswith("error"):
            return line.strip()
    return None


def not_understood(reply: str) -> bool:
    """The client did not know a protocol 3 word: an older driver's client (r580 on an H200) prints
    ``Unrecognized option`` and its usage text for ``--key=value`` and exits 0, and ignores plain words
    (reading its commands from stdin instead), so only such a reply tells it from a protocol 3 one."""
    return any(line.startswith("Unrecognized option") for line in reply.splitlines())


def expect_empty(command: Command, reply: str) -> None:
    """A setting command answers nothing when it took effect."""
    if reply.strip():
        raise MpsReplyError(command, reply, refusal(reply) or "expected no reply")


def parse_server_list(command: Command, reply: str) -> tuple[int, ...]:
    """``get_server_list``: one server PID per line (none when no server runs yet)."""
    if (why := refusal(reply)) is not None:
        raise MpsReplyError(command, reply, why)
    pids: list[int] = []
    for line in reply.splitlines():
        word = line.strip()
        if not word:
            continue
        if not word.isascii() or not word.isdigit() or len(word) > 10 or int(word) < 1:
            raise MpsReplyError(command, reply, f"line {line!r} is not a server PID")
        pids.append(int(word))
    return tuple(pids)


def parse_listing(command: Command, reply: str) -> dict[str, dict[str, str]]:
    """A v3 listing: per line a name, then ``key=value`` words -> {name: {key: value}}."""
    if (why := refusal(reply)) is not None:
        raise MpsReplyError(command, reply, why)
    found: dict[str, dict[str, str]] = {}
    for line in reply.splitlines():
        words = line.split()
        if not words:
            continue
        name, fields = words[0], {}
        if _WORD.fullmatch(name) is None:
            raise MpsReplyError(command, reply, f"line {line!r} does not start with a name")
        for word in words[1:]:
            key, equals, value = word.partition("=")
            if not equals or _WORD.fullmatch(key) is None:
                raise MpsReplyError(command, reply, f"line {line!r}: {word!r} is not key=value")
            fields[key] = value
        if name in found:
            raise MpsReplyError(command, reply, f"{name!r} is listed twice")
        found[name] = fields
    return found


def parse_namespace_limits(command: Command, name: str, fields: Mapping[str, str]) -> tuple[CardLimit, ...]:
    """One ``namespace list`` entry's limits, read back as :class:`CardLimit` per card."""
    reply = " ".join(f"{k}={v}" for k, v in fields.items())
    try:
        threads = int(fields.get("active_thread_percentage", "100"))
        limits = []
        for item in filter(None, fields.get("pinned_memory_limit", "").split(",")):
            uuid, equals, value = item.partition("=")
            if not equals:
                raise ValueError(f"{item!r} is not <card>=<value>")
            limits.append(CardLimit(uuid=uuid, memory_mib=parse_memory(value), thread_percentage=threads))
    except (ValueError, MpsNameError) as exc:
        raise MpsReplyError(command, reply, f"namespace {name}: {exc}") from None
    return tuple(limits)
