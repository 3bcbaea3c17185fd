"""The scheduler's live view of the cluster: per-node cards and usage, kept up to date incrementally.

Owns the state the watches feed (``replace_nodes``/``node_event``, ``replace_pods``/``pod_event``) and
the questions filter, prioritize and bind ask (``candidate``, ``exclusion``). One pod event costs
O(cards of that pod): the pod's previous usage is removed from its node and the new one added with the
core's ``apply_usage``; nothing walks the cluster per request. A node's usage is rebuilt from its own
pods only when its registration text changes.

Usage accounting (docs/protocol.md, "Usage"; the rule is ``hami.annotations.holding``, shared with the node
agent, and ``hami.scheduler.podrecords`` decodes what a pod holds): a pod counts iff
it carries ``hami.io/vgpu-node`` and a readable ``hami.io/vgpu-devices-allocated`` and is not
Succeeded/Failed; init containers drop out once all of them exited 0 (sticky). Deviations, each about
a pod that can hold no card on its ``vgpu-node``: an unbound pod whose bind failed
(``bind-phase=failed``); a pod bound to another node; an unbound pod whose ``bind-phase=allocating``
began (``hami.io/bind-time``) longer than the *allocating horizon* ago (twice kube-scheduler's bind
timeout, 60 s: no bind is still in flight for it, so it is a leftover of a crash or a write that
landed after its bind gave up; ``allocating_until``). The horizon needs the time: the snapshot reads
its ``clock`` (given by the service; without one the horizon is off) when a pod event arrives and
before every query, and drops the pods whose horizon has passed (a heap: O(log n) per expiry, nothing
walks the pods).

Bookings: bind decides on this state and books the allocation at once (before any API write), so a
racing bind sees it. A booking wins over what the watch says about that pod until the watch shows the
same allocation (confirmed), the bind fails (cancelled) or the pod is deleted.

Nominated pods (``nominations``, a :class:`~hami.scheduler.nominations.NominationBook` fed from the
same pod events): a pending pod of ours that kube-scheduler nominated to a node for preemption holds
the cards it will get there (:mod:`hami.core.reservations`) against every pod of equal or lower
priority: ``candidate(..., priority=...)`` counts them as used, for filter and bind alike. A node's
reservations are computed when first asked and kept until its usage, its pods or its cards change.

Namespace quotas (docs/protocol.md, "Quotas"): ``quotas`` (a :class:`~hami.scheduler.quotas.QuotaBook`, fed by
the ResourceQuota watch through ``replace_quotas``/``quota_event``) also receives every change of a pod's
applied usage, so a namespace's used amounts move with the same add/remove as the nodes'.

The ``fragmentation`` policy's learned target workload (``workload``, a
:class:`~hami.scheduler.workload.Workload`) hears every pod the watch shows (each counted once).

Registration (docs/protocol.md, "Registration"): a node without a readable registration is excluded, as a
:class:`~hami.core.rejection.Rejection` whose code says how (``hami.scheduler.reasons``), and so is a
Node of a shape no API server stores (``node_shape_problem``: a field we read of the wrong JSON type,
``Reason.NODE_MALFORMED``), so a list holding one still builds (``hami doctor``, ``hami simulate``);
malformed data is reported once per distinct text through ``on_malformed`` (the app records a Warning
Event on the Node). A node's ``hami.io/node-enforcement`` is read with its registration (each card's
enforcement, ``none`` for a card it does not list; re-read only when the text changes); an unreadable
one does not exclude the node: its cards count as ``none`` and the problem is logged and reported once
per distinct text through ``on_enforcement``. Handshake (docs/protocol.md, "Handshake"): a node whose
``hami.io/node-handshake`` lacks ``Requesting`` is reported through ``on_handshake`` (the app writes
``Requesting_<time>``); a node whose Requesting stamp is older than the window while its allocatable
count is 0 is stale (its device plugin is not registered with the kubelet) and excluded until that
changes. Every change of a node's
``hami.io/mutex.lock`` (``None`` when removed or the node is gone) goes to ``on_lock`` (lock hold
metrics) and wakes the binds waiting for that node's lock.

No I/O here: callbacks are called synchronously and must only schedule work. Must not import the
Kubernetes client or aiohttp.
"""

from __future__ import annotations

import asyncio
import datetime
import heapq
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
    HandshakeKind,
    decode_handshake,
    node_shape_problem,
    read_card_enforcement,
    read_node,
)
from hami.annotations.holding import ALLOCATING_HORIZON, allocating_until, init_containers_done
from hami.core.model import NamespaceQuota, NodeState
from hami.core.rejection import Reason, Rejection, node_rejection
from hami.core.reservations import Occupant, Reservation, held_against, with_reservations
from hami.core.usage import apply_usage
from hami.scheduler.nominations import NominationBook
from hami.scheduler.podrecords import PodKey, pod_record
from hami.scheduler.podrecords import PodRecord as PodRecord
from hami.scheduler.quotas import QuotaBook
from hami.scheduler.reasons import registration_rejection
from hami.scheduler.workload import Workload

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
    allocatable: int = 0
    stale_after: datetime.datetime | None = None  # naive local time, like the handshake stamp
    reported: set[str] = field(default_factory=set)  # malformed texts already reported
    lock: str | None = None  # hami.io/mutex.lock as last seen


def local_time(now: datetime.datetime) -> datetime.datetime:
    """``now`` as naive local wall-clock time: the handshake stamps are written and compared so."""
    return now.astimezone().replace(tzinfo=None)


def _count(text: Any) -> int:
    try:
        return int(str(text))
    except ValueError:
        return 0


class Snapshot:
    """Nodes and tracked pods; every method runs on the event loop (single-threaded, no locks)."""

    def __init__(
        self,
        *,
        count_resource: str = "nvidia.com/gpu",
        handshake_window: datetime.timedelta = datetime.timedelta(seconds=60),
        on_malformed: Callable[[Mapping[str, Any], str], None] | None = None,
        on_enforcement: Callable[[Mapping[str, Any], str], None] | None = None,
        on_handshake: Callable[[str], None] | None = None,
        on_lock: Callable[[str, str | None], None] | None = None,
        quotas: QuotaBook | None = None,
        clock: Callable[[], datetime.datetime] | None = None,
        allocating_horizon: datetime.timedelta = ALLOCATING_HORIZON,
        nominations: NominationBook | None = None,
        workload: Workload | None = None,
    ) -> None:
        self._count_resource = count_resource
        if quotas is None:  # the default resource names (docs/protocol.md, "Device config")
            quotas = QuotaBook(memory_resource="nvidia.com/gpumem", cores_resource="nvidia.com/gpucores")
        self.quotas = quotas
        self.nominations = nominations if nominations is not None else NominationBook()
        self.workload = workload if workload is not None else Workload()  # fragmentation's target
        self._window = handshake_window
        self._on_malformed = on_malformed
        self._on_enforcement = on_enforcement
        self.on_handshake = on_handshake
        self._on_lock = on_lock
        self._nodes: dict[str, NodeEntry] = {}
        self._node_pods: dict[str, set[PodKey]] = {}
        self._observed: dict[PodKey, PodRecord] = {}
        self._bookings: dict[PodKey, PodRecord] = {}
        self._applied: dict[PodKey, PodRecord] = {}
        self._init_done: set[PodKey] = set()
        self._lock_waiters: dict[str, list[asyncio.Future[None]]] = {}
        self._clock = clock
        self._horizon = allocating_horizon
        self._until: dict[PodKey, datetime.datetime] = {}  # unbound allocating pods: when they stop
        self._expiries: list[tuple[datetime.datetime, PodKey]] = []  # heap of the same (stale entries kept)
        self.nodes_synced = False
        self.pods_synced = False
        self.pod_events = 0
        self.node_events = 0

    @property
    def ready(self) -> bool:
        return self.nodes_synced and self.pods_synced and self.quotas.synced

    # ------------------------------------------------------------------------------------- nodes

    def replace_nodes(self, items: Iterable[Mapping[str, Any]]) -> None:
        """A full node list: upsert each, drop the nodes that are gone."""
        listed = list(items)
        for obj in listed:
            self._upsert_node(obj)
        self.nodes_listed(listed)

    def nodes_listed(self, items: Iterable[Mapping[str, Any]]) -> None:
        """A node list is complete and each of ``items`` already came through :meth:`node_event` (the
        watcher's dispatch; a node it skipped is not among them): drop every other node."""
        seen = {objects.name(obj) for obj in items}
        for name in [n for n in self._nodes if n not in seen]:
            del self._nodes[name]
            self.workload.register(name, None)
            self.nominations.touch(name)
            self._lock_changed(name, None)
        self.nodes_synced = True

    def node_event(self, kind: str, obj: Mapping[str, Any]) -> None:
        self.node_events += 1
        if kind == "DELETED":
            name = objects.name(obj)
            self._nodes.pop(name, None)
            self.workload.register(name, None)
            self.nominations.touch(name)
            self._lock_changed(name, None)
        else:
            self._upsert_node(obj)

    def _upsert_node(self, obj: Mapping[str, Any]) -> str:
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
        entry.allocatable = _count(objects.allocatable(obj).get(self._count_resource, "0"))
        handshake_text = annotations.get(NODE_HANDSHAKE)
        handshake = decode_handshake(handshake_text)
        if handshake.kind is not HandshakeKind.REQUESTING:
            if (fresh or handshake_text != entry.handshake) and self.on_handshake is not None:
                self.on_handshake(name)
            entry.stale_after = None
        elif handshake.time is not None and entry.allocatable <= 0:
            entry.stale_after = handshake.time + self._window
        else:
            entry.stale_after = None
        entry.handshake = handshake_text
        lock = annotations.get(NODE_LOCK)
        if lock != entry.lock:
            entry.lock = lock
            self._lock_changed(name, lock)
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

    def _misshapen(self, entry: NodeEntry, obj: Mapping[str, Any], shape: str) -> None:
        """Exclude a node of a shape no API server stores (``node_shape_problem``); the next well-formed
        event of it registers it again."""
        entry.problem = node_rejection(entry.name, Reason.NODE_MALFORMED, detail=shape)
        entry.signature = entry.handshake = None
        entry.stale_after = None
        if entry.lock is not None:
            entry.lock = None
            self._lock_changed(entry.name, None)
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
        self.workload.register(entry.name, base)
        state = entry.base
        if state is not None:
            for key in self._node_pods.get(entry.name, ()):
                state = apply_usage(state, self._applied[key].usage)
        entry.state = state
        self.nominations.touch(entry.name)

    # -------------------------------------------------------------------------------------- pods

    def replace_pods(self, items: Iterable[Mapping[str, Any]]) -> None:
        """A full pod list: recompute every record, forget the pods that are gone."""
        listed = list(items)
        for obj in listed:
            self._upsert_pod(obj)
        self.pods_listed(listed)

    def pods_listed(self, items: Iterable[Mapping[str, Any]]) -> None:
        """A pod list is complete and each of ``items`` already came through :meth:`pod_event`: forget
        every other pod (one the watcher skipped included)."""
        seen = {objects.pod_key(obj) for obj in items}
        for key in [k for k in self._observed.keys() | self._bookings.keys() if k not in seen]:
            self._forget(key)
        self.pods_synced = True

    def pod_event(self, kind: str, obj: Mapping[str, Any]) -> None:
        self.pod_events += 1
        if kind == "DELETED":
            self._forget(objects.pod_key(obj))
        else:
            self._upsert_pod(obj)

    def _forget(self, key: PodKey) -> None:
        self._until.pop(key, None)
        self._observed.pop(key, None)
        self._bookings.pop(key, None)
        self._init_done.discard(key)
        self.nominations.forget(key)
        self._settle(key)

    def _upsert_pod(self, obj: Mapping[str, Any]) -> PodKey:
        self.workload.observe(obj)
        key = objects.pod_key(obj)
        record = self._record(key, obj)
        self._until.pop(key, None)
        if record is not None and self._clock is not None:
            until = allocating_until(obj, self._horizon)
            if until is not None and until <= self._clock():
                record = None  # its bind is over: a leftover, not a booking
            elif until is not None:
                self._until[key] = until
                heapq.heappush(self._expiries, (until, key))
        if record is None:
            self._observed.pop(key, None)
        else:
            self._observed[key] = record
            booking = self._bookings.get(key)
            if booking is not None and (booking.node, booking.allocated) == (record.node, record.allocated):
                del self._bookings[key]  # the API now shows what bind booked
        self.nominations.pod_event(key, obj)
        self._settle(key)
        return key

    def _record(self, key: PodKey, pod: Mapping[str, Any]) -> PodRecord | None:
        if key not in self._init_done and init_containers_done(pod):
            self._init_done.add(key)  # sticky: it never re-inflates
        return pod_record(key, pod, init_done=key in self._init_done)

    def _settle(self, key: PodKey) -> None:
        """Make the applied usage of ``key`` equal its booking, else what the watch says."""
        wanted = self._bookings.get(key) or self._observed.get(key)
        current = self._applied.get(key)
        for record in (wanted, current):  # who it is may have changed even when its usage did not
            self.nominations.touch(record.node if record is not None else None)
        self.nominations.touch(self.nominations.node_of(key))  # counted or not: held or not
        if wanted == current:
            return
        if current is not None:
            self._apply(current, -1)
            self.quotas.add_usage(key[0], current.usage, -1)
            self._node_pods[current.node].discard(key)
            del self._applied[key]
        if wanted is not None:
            self._apply(wanted, 1)
            self.quotas.add_usage(key[0], wanted.usage, 1)
            self._node_pods.setdefault(wanted.node, set()).add(key)
            self._applied[key] = wanted

    def expire(self, now: datetime.datetime) -> None:
        """Stop counting the unbound allocating pods whose horizon has passed at ``now``."""
        while self._expiries and self._expiries[0][0] <= now:
            until, key = heapq.heappop(self._expiries)
            if self._until.get(key) == until:  # else stale: the pod changed or went since
                del self._until[key]
                self._observed.pop(key, None)
                logger.info("pod %s/%s no longer counted: bind-phase allocating since %s", *key, until)
                self._settle(key)

    def _tick(self) -> None:
        if self._clock is not None and self._expiries:
            self.expire(self._clock())

    def _apply(self, record: PodRecord, sign: int) -> None:
        entry = self._nodes.get(record.node)
        if entry is not None and entry.state is not None:
            entry.state = apply_usage(entry.state, record.usage, sign=sign)

    # ------------------------------------------------------------------------------------ quotas

    def replace_quotas(self, items: Iterable[Mapping[str, Any]]) -> None:
        """A full ResourceQuota list (the limits; the used amounts come from the tracked pods)."""
        self.quotas.replace(items)

    def quotas_listed(self, items: Iterable[Mapping[str, Any]]) -> None:
        """A ResourceQuota list is complete, each of ``items`` already applied through :meth:`quota_event`."""
        self.quotas.listed(items)

    def quota_event(self, kind: str, obj: Mapping[str, Any]) -> None:
        self.quotas.event(kind, obj)

    def quotas_for(self, namespace: str, exclude: PodKey | None = None) -> dict[str, NamespaceQuota]:
        """``quotas=`` for the core when deciding a pod of ``namespace`` (without ``exclude``'s own usage)."""
        self._tick()
        own = self._applied.get(exclude) if exclude is not None else None
        return self.quotas.quotas(namespace, own.usage if own is not None else None)

    # ---------------------------------------------------------------------------------- bookings

    def book(self, key: PodKey, record: PodRecord) -> None:
        """Count ``record`` for ``key`` from now on (bind decided it; the API writes follow)."""
        self._bookings[key] = record
        self._settle(key)

    def cancel(self, key: PodKey) -> None:
        """Undo a booking (the bind failed); the pod counts again as the watch last showed it."""
        if self._bookings.pop(key, None) is not None:
            self._settle(key)

    def record(self, key: PodKey) -> PodRecord | None:
        self._tick()
        return self._applied.get(key)

    # ------------------------------------------------------------------------------- node locks

    def lock_of(self, name: str) -> str | None:
        """The node's ``hami.io/mutex.lock`` as the watch last showed it."""
        entry = self._nodes.get(name)
        return entry.lock if entry is not None else None

    def lock_change(self, name: str) -> asyncio.Future[None]:
        """A future resolved the next time the node's lock annotation changes (or the node goes)."""
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._lock_waiters.setdefault(name, []).append(future)
        return future

    def _lock_changed(self, name: str, lock: str | None) -> None:
        if self._on_lock is not None:
            self._on_lock(name, lock)
        for future in self._lock_waiters.pop(name, ()):
            if not future.done():
                future.set_result(None)

    # ----------------------------------------------------------------------------------- queries

    def exclusion(self, name: str, local_now: datetime.datetime) -> Rejection | None:
        """Why ``name`` cannot take GPU pods at ``local_now`` (naive local time, see :func:`local_time`;
        an aware time is converted), or None when it can."""
        self._tick()
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
            detail = f"handshake {entry.handshake!r} unanswered and {self._count_resource} allocatable is 0"
            return node_rejection(name, Reason.HANDSHAKE_UNANSWERED, detail=detail)
        return None

    def problem(self, name: str, local_now: datetime.datetime) -> str | None:
        """HAMi's text of :meth:`exclusion` (for display), or None."""
        found = self.exclusion(name, local_now)
        return None if found is None else found.message

    def candidate(
        self,
        name: str,
        local_now: datetime.datetime,
        exclude: PodKey | None = None,
        priority: int | None = None,
    ) -> NodeState | Rejection:
        """The node's state for deciding a pod (without that pod's own current usage), or its exclusion.
        With the pod's ``priority``, the cards held for pods nominated there of equal or higher
        priority (``exclude`` itself aside) count as used."""
        excluded = self.exclusion(name, local_now)
        if excluded is not None:
            return excluded
        state = self._nodes[name].state
        assert state is not None  # not excluded means registered
        held: tuple[Reservation, ...] = ()
        if priority is not None and self.nominations.on(name):
            held = held_against(self.reservations(name), priority, exclude)
        if exclude is not None:
            own = self._applied.get(exclude)
            if own is not None and own.node == name:
                state = apply_usage(state, own.usage, sign=-1)
        return with_reservations(state, held)

    def reservations(self, name: str) -> tuple[Reservation, ...]:
        """The cards held on node ``name`` for the pods nominated there, highest priority first."""
        self._tick()
        entry = self._nodes.get(name)
        return self.nominations.reservations(
            name,
            entry.state if entry is not None else None,
            self._applied.__contains__,
            lambda: self._occupants(name),
        )

    def _occupants(self, name: str) -> list[Occupant]:
        """The pods counted on ``name`` whose priority is known (the watch showed them)."""
        found = []
        for key in self._node_pods.get(name, ()):
            observed = self._observed.get(key)
            if observed is not None and observed.meta is not None:
                meta = observed.meta
                found.append(
                    Occupant(priority=meta.priority, usage=self._applied[key].usage, leaving=meta.deleting)
                )
        return found

    def needs_handshake(self) -> list[str]:
        """Nodes whose handshake does not (yet) say Requesting."""
        return [
            e.name
            for e in self._nodes.values()
            if decode_handshake(e.handshake).kind is not HandshakeKind.REQUESTING
            and not (e.problem is not None and Reason.NODE_MALFORMED in e.problem.reasons)
        ]

    def entries(self) -> Iterator[NodeEntry]:
        self._tick()
        return iter(list(self._nodes.values()))

    def tracked(self) -> Mapping[PodKey, PodRecord]:
        self._tick()
        return dict(self._applied)

    def tracked_count(self) -> int:
        """How many pods count against cards now (bookings included)."""
        self._tick()
        return len(self._applied)

    def holders(self, name: str) -> list[tuple[PodKey, PodRecord, PodRecord | None]]:
        """The pods counted on node ``name`` (for preemption): key, the record counted (a bind's
        booking included) and the record the watch last showed (None while only booked)."""
        self._tick()
        return [(key, self._applied[key], self._observed.get(key)) for key in self._node_pods.get(name, ())]
