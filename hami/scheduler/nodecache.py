"""The node half of the scheduler's live view: each Node's cards, their usage, and why it is excluded.

Owns :class:`NodeCache` (one :class:`NodeEntry` per Node the watch shows: the registered cards, the
state with every counted pod's usage applied, the exclusion, the handshake, the lock annotation) and
:func:`local_time`. It does not know pods: the composition (:class:`~hami.scheduler.snapshot.Snapshot`)
hands it each change of a pod's counted usage (:meth:`NodeCache.apply`) and, when a node registers
anew, the usages counted there (``usage_on``). A node's usage is rebuilt from its own pods only when
its registration text changes. The changes of a node's usage are folded into its state when it is next
read, all at once (or every ``MAX_PENDING`` changes): booking a list of pods builds each node's state
once.

Registration (docs/protocol.md, "Registration"): a node without a readable registration is excluded, as a
:class:`~hami.core.rejection.Rejection` whose code says how (``hami.scheduler.reasons``), and so is a
Node of a shape no API server stores (``node_shape_problem``: a field we read of the wrong JSON type,
``Reason.NODE_MALFORMED``), so a list holding one still builds (``hami doctor``, ``hami simulate``);
malformed data is reported once per distinct text through ``on_malformed`` (the app records a Warning
Event on the Node). A node's ``hami.io/node-enforcement`` is read with its registration (each card's
enforcement, ``none`` for a card it does not list; re-read only when the text changes); an unreadable
one does not exclude the node: its cards count as ``none`` and the problem is logged and reported once
per distinct text through ``on_enforcement``. Handshake (docs/protocol.md, "Handshake"; decoded once per
distinct text, not on every event nor on every resync pass): a node whose
``hami.io/node-handshake`` lacks ``Requesting`` is reported through ``on_handshake`` (the app writes
``Requesting_<time>``); a node whose Requesting stamp is older than the window while its allocatable
count is 0 is stale (its device plugin is not registered with the kubelet) and excluded until that
changes. Every change of a node's registered cards (``None`` when excluded or gone) goes to
``on_base`` and every change of its ``hami.io/mutex.lock`` (``None`` when removed or the node is gone)
to ``on_lock``; the nodes whose lock is set now are kept apart (:meth:`NodeCache.held_locks`), so a
question about the held locks costs what is held, not what is known.

No I/O: callbacks are called synchronously and must only schedule work. Must not import the
Kubernetes client, aiohttp or asyncio.
"""

from __future__ import annotations

import datetime
import logging
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from hami import objects
from hami.annotations import (
    NO_GPU,
    NODE_DEVICE_CORDON,
    NODE_ENFORCEMENT,
    NODE_HANDSHAKE,
    NODE_LOCK,
    NODE_PAIR_SCORES,
    NODE_REGISTER,
    AnnotationError,
    Handshake,
    HandshakeKind,
    decode_handshake,
    node_shape_problem,
    read_card_enforcement,
    read_node,
)
from hami.core.model import NodeState
from hami.core.rejection import Reason, Rejection, node_rejection
from hami.core.usage import PodUsage, apply_usages
from hami.scheduler.reasons import registration_rejection

logger = logging.getLogger(__name__)


@dataclass(slots=True, kw_only=True)
class NodeEntry:
    name: str
    # register, scores, cordon, enforcement
    signature: tuple[str | None, str | None, str | None, str | None] | None = None
    base: NodeState | None = None  # registered cards, zero usage; None when excluded
    state: NodeState | None = None  # base plus every tracked pod's usage
    problem: Rejection | None = None  # why the node is excluded (set by the first _register)
    handshake: str | None = None
    shake: Handshake | None = None  # ``handshake`` decoded (None: not decoded yet)
    allocatable: int = 0
    stale_after: datetime.datetime | None = None  # naive local time, like the handshake stamp
    reported: set[str] = field(default_factory=set)  # malformed texts already reported
    lock: str | None = None  # hami.io/mutex.lock as last seen


def local_time(now: datetime.datetime) -> datetime.datetime:
    """``now`` as naive local wall-clock time: the handshake stamps are written and compared so."""
    return now.astimezone().replace(tzinfo=None)


#: Usage changes kept for one node before they are folded into its state unasked (:meth:`NodeCache.apply`).
MAX_PENDING = 64


def _count(text: Any) -> int:
    try:
        return int(str(text))
    except ValueError:
        return 0


def _ignore(*_args: object) -> None:
    return None


class NodeCache:
    """The Nodes the watch shows; every method runs on the event loop (single-threaded, no locks)."""

    def __init__(
        self,
        *,
        count_resource: str = "nvidia.com/gpu",
        handshake_window: datetime.timedelta = datetime.timedelta(seconds=60),
        usage_on: Callable[[str], Iterable[PodUsage]] = lambda _name: (),
        on_base: Callable[[str, NodeState | None], None] = _ignore,
        on_lock: Callable[[str, str | None], None] = _ignore,
        on_malformed: Callable[[Mapping[str, Any], str], None] | None = None,
        on_enforcement: Callable[[Mapping[str, Any], str], None] | None = None,
        on_handshake: Callable[[str], None] | None = None,
    ) -> None:
        self.count_resource = count_resource
        self._window = handshake_window
        self._usage_on = usage_on
        self._on_base = on_base
        self._on_lock = on_lock
        self._on_malformed = on_malformed
        self._on_enforcement = on_enforcement
        self.on_handshake = on_handshake
        self._nodes: dict[str, NodeEntry] = {}
        #: per node, the usage changes not yet folded into its state, in order (see :meth:`apply`)
        self._pending: dict[str, list[tuple[PodUsage, int]]] = {}
        self._held: dict[str, str] = {}  # the nodes whose lock annotation is set (not empty) now

    # ---------------------------------------------------------------------------------- changes

    def upsert(self, obj: Mapping[str, Any]) -> str:
        """A Node as the watch or a list shows it; returns its name."""
        name = objects.name(obj)
        entry = self._nodes.get(name)
        fresh = entry is None
        if entry is None:
            entry = self._nodes[name] = NodeEntry(name=name)
        shape = node_shape_problem(obj)
        if shape is not None:
            self._misshapen(entry, obj, shape)
            return name
        annotations = objects.annotations(obj)
        entry.allocatable = _count(objects.allocatable(obj).get(self.count_resource, "0"))
        handshake_text = annotations.get(NODE_HANDSHAKE)
        handshake = entry.shake
        if handshake is None or handshake_text != entry.handshake:  # decoded once per text
            handshake = decode_handshake(handshake_text)
        if handshake.kind is not HandshakeKind.REQUESTING:
            if (fresh or handshake_text != entry.handshake) and self.on_handshake is not None:
                self.on_handshake(name)
            entry.stale_after = None
        elif handshake.time is not None and entry.allocatable <= 0:
            entry.stale_after = handshake.time + self._window
        else:
            entry.stale_after = None
        entry.handshake, entry.shake = handshake_text, handshake
        lock = annotations.get(NODE_LOCK)
        if lock != entry.lock:
            entry.lock = lock
            if lock:
                self._held[name] = lock
            else:
                self._held.pop(name, None)
            self._on_lock(name, lock)
        signature = (
            annotations.get(NODE_REGISTER),
            annotations.get(NODE_PAIR_SCORES),
            annotations.get(NODE_DEVICE_CORDON),
            annotations.get(NODE_ENFORCEMENT),
        )
        if signature != entry.signature:
            entry.signature = signature
            self._register(entry, obj, annotations)
        return name

    def remove(self, name: str) -> None:
        """The node is gone (deleted, or missing from a complete list)."""
        self._nodes.pop(name, None)
        self._pending.pop(name, None)
        self._held.pop(name, None)
        self._on_base(name, None)
        self._on_lock(name, None)

    def keep_only(self, names: set[str]) -> None:
        """A complete list named ``names``: remove every other node."""
        for name in [n for n in self._nodes if n not in names]:
            self.remove(name)

    def apply(self, node: str, usage: PodUsage, sign: int) -> None:
        """Add (``sign`` 1) or take off (-1) one pod's counted usage on ``node`` (nothing when the node
        is unknown or excluded: its usage is rebuilt from ``usage_on`` when it registers).

        The change is kept and folded into the node's state when the state is next read (every query
        does: :meth:`state`, :meth:`usable`, :meth:`entries`), all of a node's changes at once
        (``apply_usages``), or after ``MAX_PENDING`` of them: a list of 50,000 pods builds each node's
        state once, not once per pod."""
        if sign not in (1, -1):
            raise ValueError(f"sign must be 1 or -1, got {sign!r}")
        entry = self._nodes.get(node)
        if entry is not None and entry.state is not None:
            pending = self._pending.setdefault(node, [])
            pending.append((usage, sign))
            if len(pending) >= MAX_PENDING:
                self._fold(entry)

    def _fold(self, entry: NodeEntry) -> None:
        """Bring ``entry.state`` up to date with the changes :meth:`apply` kept for it."""
        changes = self._pending.pop(entry.name, None)
        if changes and entry.state is not None:
            entry.state = apply_usages(entry.state, changes)

    def _misshapen(self, entry: NodeEntry, obj: Mapping[str, Any], shape: str) -> None:
        """Exclude a node of a shape no API server stores (``node_shape_problem``); the next well-formed
        event of it registers it again."""
        entry.problem = node_rejection(entry.name, Reason.NODE_MALFORMED, detail=shape)
        entry.signature = entry.handshake = entry.shake = None
        entry.stale_after = None
        if entry.lock is not None:
            entry.lock = None
            self._on_lock(entry.name, None)
        if entry.name:  # a nameless one cannot be named in an Event
            self._report(entry, obj, shape)
        self._set_base(entry, None)

    def _report(self, entry: NodeEntry, obj: Mapping[str, Any], text: str) -> None:
        """Log and report (``on_malformed``) each distinct problem of a node once."""
        if text in entry.reported:
            return
        entry.reported.add(text)
        logger.warning("node %s excluded: %s", entry.name, text)
        if self._on_malformed is not None:
            self._on_malformed(obj, text)

    def _register(self, entry: NodeEntry, obj: Mapping[str, Any], annotations: Mapping[str, str]) -> None:
        try:
            base = read_node(entry.name, annotations)
            entry.problem = None
            _, unreadable = read_card_enforcement(annotations)
            if unreadable is not None and entry.name and str(unreadable) not in entry.reported:
                entry.reported.add(str(unreadable))
                logger.warning("node %s: its cards count as enforcement none: %s", entry.name, unreadable)
                if self._on_enforcement is not None:
                    self._on_enforcement(obj, str(unreadable))
        except AnnotationError as exc:
            base = None
            entry.problem = registration_rejection(entry.name, exc)
            if exc.text is not None and exc.reason != NO_GPU:
                self._report(entry, obj, str(exc))
        self._set_base(entry, base)

    def _set_base(self, entry: NodeEntry, base: NodeState | None) -> None:
        entry.base = base
        self._pending.pop(entry.name, None)  # the state is rebuilt from every usage counted now
        state = entry.base
        if state is not None:
            state = apply_usages(state, ((usage, 1) for usage in self._usage_on(entry.name)))
        entry.state = state
        self._on_base(entry.name, base)

    # ---------------------------------------------------------------------------------- queries

    def state(self, name: str) -> NodeState | None:
        """The node's cards with every counted pod's usage (None when unknown or excluded)."""
        entry = self._nodes.get(name)
        if entry is None:
            return None
        if self._pending:
            self._fold(entry)
        return entry.state

    def exclusion(self, name: str, local_now: datetime.datetime) -> Rejection | None:
        """Why ``name`` cannot take GPU pods at ``local_now`` (naive local time, see :func:`local_time`;
        an aware time is converted), or None when it can."""
        entry = self._nodes.get(name)
        if entry is None or (entry.state is None and entry.problem is None):
            return node_rejection(name, Reason.NODE_UNREGISTERED)
        if entry.problem is not None:
            return entry.problem
        if entry.stale_after is None:
            return None
        if local_now.tzinfo is not None:
            local_now = local_time(local_now)
        if local_now >= entry.stale_after:
            detail = f"handshake {entry.handshake!r} unanswered and {self.count_resource} allocatable is 0"
            return node_rejection(name, Reason.HANDSHAKE_UNANSWERED, detail=detail)
        return None

    def usable(self, name: str, local_now: datetime.datetime) -> NodeEntry | Rejection:
        """The node's entry when it can take GPU pods at ``local_now`` (naive local time), else why not
        (:meth:`exclusion` in one step, for the walk over every candidate)."""
        entry = self._nodes.get(name)
        if entry is None or entry.state is None:
            found = self.exclusion(name, local_now)
            assert found is not None  # unknown, or registered without a state: excluded
            return found
        if self._pending:
            self._fold(entry)
        stale = entry.stale_after
        if stale is not None and local_now >= stale:
            found = self.exclusion(name, local_now)
            assert found is not None
            return found
        return entry

    def stale_after(self, name: str) -> datetime.datetime | None:
        """When the node turns stale (naive local time) while nothing about it changes; None: never."""
        entry = self._nodes.get(name)
        return entry.stale_after if entry is not None else None

    def lock_of(self, name: str) -> str | None:
        """The node's ``hami.io/mutex.lock`` as the watch last showed it."""
        entry = self._nodes.get(name)
        return entry.lock if entry is not None else None

    def held_locks(self) -> Mapping[str, str]:
        """The nodes whose ``hami.io/mutex.lock`` the watch last showed set (not empty), with its value
        (a live view: not to be kept across an await)."""
        return self._held

    def needs_handshake(self) -> list[str]:
        """Nodes whose handshake does not (yet) say Requesting."""
        return [
            e.name
            for e in self._nodes.values()
            if (e.shake or decode_handshake(e.handshake)).kind is not HandshakeKind.REQUESTING
            and not (e.problem is not None and Reason.NODE_MALFORMED in e.problem.reasons)
        ]

    def entries(self) -> Iterator[NodeEntry]:
        for name in list(self._pending):
            self._fold(self._nodes[name])
        return iter(list(self._nodes.values()))

    def __contains__(self, name: object) -> bool:
        return name in self._nodes
