"""The scheduler's live view of the cluster: the composition of its parts, and the questions the verbs ask.

Owns :class:`Snapshot`, a thin composition that routes the watch's events to the parts and answers
filter, prioritize, bind and preempt (``candidate``, ``candidates``, ``exclusion``, ``holders``):

- :class:`~hami.scheduler.nodecache.NodeCache`: each Node's registered cards, its state with the counted
  usage applied, its exclusion (registration, shape, stale handshake) and its lock annotation;
- :class:`~hami.scheduler.podcache.PodCache`: what the watch says each pod holds, and the allocating
  horizon of unbound allocations;
- :class:`~hami.scheduler.ledger.BookingLedger`: the allocations bind booked before the watch shows them;
- :class:`~hami.scheduler.lockwaiters.LockWaiters`: the binds waiting for a node's lock to change;
- the feeds, each its own module: ``quotas`` (:class:`~hami.scheduler.quotas.QuotaBook`, docs/protocol.md,
  "Quotas", fed by the ResourceQuota watch), ``nominations``
  (:class:`~hami.scheduler.nominations.NominationBook`, fed from the pod events) and ``workload``
  (:class:`~hami.scheduler.workload.Workload`, the ``fragmentation`` policy's learned target, hearing
  every pod the watch shows and every node's registered cards).

What it owns itself is the join: which record each pod counts with now (its booking, else what the
watch shows: ``_settle``), the pods counted per node, and ``generation``, a number that changes with
every change of anything a decision reads (so a scheduling cycle may reuse an evaluation made at the
same generation: :mod:`hami.scheduler.cycle`). One pod event costs O(cards of that pod): the pod's
previous usage is taken off its node and the new one added with the core's ``apply_usage``, and the
namespace's quota usage moves with the same add/remove; nothing walks the cluster per request. The
clock (given by the service) is read before every query, and the pods whose allocating horizon has
passed stop counting then.

Nominated pods: a pending pod of ours that kube-scheduler nominated to a node for preemption holds the
cards it will get there (:mod:`hami.core.reservations`) against every pod of equal or lower priority:
``candidate(..., priority=...)`` counts them as used, for filter and bind alike. A node's reservations
are computed when first asked and kept until its usage, its pods or its cards change.

No I/O here: callbacks are called synchronously and must only schedule work. Must not import the
Kubernetes client or aiohttp.
"""

from __future__ import annotations

import asyncio
import datetime
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from hami import objects
from hami.annotations.holding import ALLOCATING_HORIZON
from hami.core.model import NamespaceQuota, NodeState
from hami.core.rejection import Rejection
from hami.core.reservations import Occupant, Reservation, held_against, with_reservations
from hami.core.usage import PodUsage, apply_usage
from hami.scheduler.ledger import BookingLedger
from hami.scheduler.lockwaiters import LockWaiters
from hami.scheduler.nodecache import NodeCache, NodeEntry
from hami.scheduler.nodecache import local_time as local_time
from hami.scheduler.nominations import NominationBook
from hami.scheduler.podcache import PodCache
from hami.scheduler.podrecords import PodKey
from hami.scheduler.podrecords import PodRecord as PodRecord
from hami.scheduler.quotas import QuotaBook
from hami.scheduler.workload import Workload


@dataclass(frozen=True, slots=True)
class Candidates:
    """The candidate nodes' states for deciding one pod, as :meth:`Snapshot.candidates` found them.

    ``reserved``: some state counts cards held for nominated pods (without ``priority`` the states
    would differ); ``valid_until``: the first time (naive local) a node counted fit turns stale with
    nothing else changing (None: never)."""

    states: list[NodeState]
    excluded: dict[str, Rejection]
    reserved: bool
    valid_until: datetime.datetime | None


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
        if quotas is None:  # the default resource names (docs/protocol.md, "Device config")
            quotas = QuotaBook(memory_resource="nvidia.com/gpumem", cores_resource="nvidia.com/gpucores")
        self.quotas = quotas
        self.nominations = nominations if nominations is not None else NominationBook()
        self.workload = workload if workload is not None else Workload()  # fragmentation's target
        self._on_lock = on_lock
        #: told the node's name whenever usage leaves a node or its registered cards change (cards may
        #: have been freed there: :mod:`hami.scheduler.wakeup`); called synchronously, must only schedule
        self.on_freed: Callable[[str], None] | None = None
        #: told the node's name when it goes or loses its usable state (what is kept for it can go)
        self.on_node_gone: Callable[[str], None] | None = None
        self.locks = LockWaiters()
        self.nodes = NodeCache(
            count_resource=count_resource,
            handshake_window=handshake_window,
            usage_on=self._usage_on,
            on_base=self._base_changed,
            on_lock=self._lock_changed,
            on_malformed=on_malformed,
            on_enforcement=on_enforcement,
            on_handshake=on_handshake,
        )
        self.pods = PodCache(clock=clock, allocating_horizon=allocating_horizon)
        self.bookings = BookingLedger()
        self._applied: dict[PodKey, PodRecord] = {}  # what each pod counts with now
        #: bookings a pod list kept only because they were made after it was taken, each with the time by
        #: which the watch must have shown its pod (else the pod went before the list: forgotten)
        self._unseen: dict[PodKey, datetime.datetime] = {}
        self._allocating_horizon = allocating_horizon
        self._node_pods: dict[str, set[PodKey]] = {}  # the same, by node
        self.generation = 0  # bumped by every change a decision may read
        self.nodes_synced = False
        self.pods_synced = False
        #: the bookings made before the pod list being taken now (None: no list in flight)
        self._listing_mark: int | None = None
        self.pod_events = 0
        self.node_events = 0

    @property
    def ready(self) -> bool:
        return self.nodes_synced and self.pods_synced and self.quotas.synced

    @property
    def on_handshake(self) -> Callable[[str], None] | None:
        return self.nodes.on_handshake

    @on_handshake.setter
    def on_handshake(self, callback: Callable[[str], None] | None) -> None:
        self.nodes.on_handshake = callback

    def _usage_on(self, name: str) -> Iterator[PodUsage]:
        return (self._applied[key].usage for key in self._node_pods.get(name, ()))

    def _base_changed(self, name: str, base: NodeState | None) -> None:
        if base is None and self.on_node_gone is not None:
            self.on_node_gone(name)
        self.workload.register(name, base)
        self.nominations.touch(name)
        if base is not None and self.on_freed is not None:
            self.on_freed(name)

    def _lock_changed(self, name: str, lock: str | None) -> None:
        if self._on_lock is not None:
            self._on_lock(name, lock)
        self.locks.changed(name)

    def current(self) -> int:
        """:attr:`generation` after the pods whose horizon passed by now stopped counting."""
        self._tick()
        return self.generation

    # ------------------------------------------------------------------------------------- nodes

    def replace_nodes(self, items: Iterable[Mapping[str, Any]]) -> None:
        """A full node list: upsert each, drop the nodes that are gone."""
        listed = list(items)
        for obj in listed:
            self.generation += 1
            self.nodes.upsert(obj)
        self.nodes_listed(listed)

    def nodes_listed(self, items: Iterable[Mapping[str, Any]]) -> None:
        """A node list is complete and each of ``items`` already came through :meth:`node_event` (the
        watcher's dispatch; a node it skipped is not among them): drop every other node."""
        self.generation += 1
        self.nodes.keep_only({objects.name(obj) for obj in items})
        self.nodes_synced = True

    def node_event(self, kind: str, obj: Mapping[str, Any]) -> None:
        self.node_events += 1
        self.generation += 1
        if kind == "DELETED":
            self.nodes.remove(objects.name(obj))
        else:
            self.nodes.upsert(obj)

    # -------------------------------------------------------------------------------------- pods

    def replace_pods(self, items: Iterable[Mapping[str, Any]]) -> None:
        """A full pod list: recompute every record, forget the pods that are gone."""
        listed = list(items)
        for obj in listed:
            self._upsert_pod(obj)
        self.pods_listed(listed)

    def pods_listing(self) -> None:
        """A pod list is about to be taken: the bookings made from now on are newer than it."""
        self._listing_mark = self.bookings.mark()

    def pods_listed(self, items: Iterable[Mapping[str, Any]]) -> None:
        """A pod list is complete and each of ``items`` already came through :meth:`pod_event`: forget
        every other pod (one the watcher skipped included), but for the pods bind booked after the list
        was taken (:meth:`pods_listing`): a pod created after the list is not in it, and the watch that
        follows the list shows it (confirming or forgetting its booking). Forgotten at the list's
        arrival, its cards and its namespace's quota counted as free until that watch caught up. Such a
        booking is kept for one allocating horizon: a pod deleted before the list was taken is never
        shown by that watch (it starts after the deletion), and its booking must not count forever."""
        seen = {objects.pod_key(obj) for obj in items}
        if self._listing_mark is not None:
            kept = self.bookings.booked_since(self._listing_mark) - seen
            self._listing_mark = None
            seen |= kept
            if kept and self.pods.clock is not None:
                until = self.pods.clock() + self._allocating_horizon
                self._unseen.update(dict.fromkeys(kept, until))
        for key in [k for k in self.pods.keys() | self.bookings.keys() if k not in seen]:
            self._forget(key)
        self.pods_synced = True

    def pod_event(self, kind: str, obj: Mapping[str, Any]) -> None:
        self.pod_events += 1
        if kind == "DELETED":
            self._forget(objects.pod_key(obj))
        else:
            self._upsert_pod(obj)

    def _forget(self, key: PodKey) -> None:
        self._unseen.pop(key, None)
        self.generation += 1
        self.pods.forget(key)
        self.bookings.forget(key)
        self.nominations.forget(key)
        self._settle(key)

    def _upsert_pod(self, obj: Mapping[str, Any]) -> PodKey:
        self.generation += 1
        self.workload.defer(obj)  # read later, before the target is
        key = objects.pod_key(obj)
        self._unseen.pop(key, None)  # the watch shows it: an ordinary booking again
        record = self.pods.observe(key, obj)
        if record is not None:
            self.bookings.confirm(key, record)
        self.nominations.pod_event(key, obj)
        self._settle(key)
        return key

    def _settle(self, key: PodKey) -> None:
        """Make the applied usage of ``key`` equal its booking, else what the watch says."""
        wanted = self.bookings.get(key) or self.pods.get(key)
        current = self._applied.get(key)
        for record in (wanted, current):  # who it is may have changed even when its usage did not
            self.nominations.touch(record.node if record is not None else None)
        self.nominations.touch(self.nominations.node_of(key))  # counted or not: held or not
        if wanted == current:
            return
        if current is not None:
            if self.on_freed is not None and (wanted is None or wanted.node != current.node):
                self.on_freed(current.node)
            self.nodes.apply(current.node, current.usage, -1)
            self.quotas.add_usage(key[0], current.usage, -1)
            self._node_pods[current.node].discard(key)
            del self._applied[key]
        if wanted is not None:
            self.nodes.apply(wanted.node, wanted.usage, 1)
            self.quotas.add_usage(key[0], wanted.usage, 1)
            self._node_pods.setdefault(wanted.node, set()).add(key)
            self._applied[key] = wanted

    def expire(self, now: datetime.datetime) -> None:
        """Stop counting the unbound allocating pods whose horizon has passed at ``now``."""
        for key in self.pods.expire(now):
            self.generation += 1
            self._settle(key)

    def _tick(self) -> None:
        if self.pods.due():
            assert self.pods.clock is not None
            self.expire(self.pods.clock())
        if self._unseen:
            assert self.pods.clock is not None  # only filled with a clock
            now = self.pods.clock()
            for key in [k for k, until in self._unseen.items() if until <= now]:
                self._forget(key)  # its pod went before the list was taken

    # ------------------------------------------------------------------------------------ quotas

    def replace_quotas(self, items: Iterable[Mapping[str, Any]]) -> None:
        """A full ResourceQuota list (the limits; the used amounts come from the tracked pods)."""
        self.generation += 1
        self.quotas.replace(items)

    def quotas_listed(self, items: Iterable[Mapping[str, Any]]) -> None:
        """A ResourceQuota list is complete, each of ``items`` already applied through :meth:`quota_event`."""
        self.generation += 1
        self.quotas.listed(items)

    def quota_event(self, kind: str, obj: Mapping[str, Any]) -> None:
        self.generation += 1
        self.quotas.event(kind, obj)

    def quotas_for(self, namespace: str, exclude: PodKey | None = None) -> dict[str, NamespaceQuota]:
        """``quotas=`` for the core when deciding a pod of ``namespace`` (without ``exclude``'s own usage)."""
        self._tick()
        own = self._applied.get(exclude) if exclude is not None else None
        return self.quotas.quotas(namespace, own.usage if own is not None else None)

    # ---------------------------------------------------------------------------------- bookings

    def book(self, key: PodKey, record: PodRecord) -> None:
        """Count ``record`` for ``key`` from now on (bind decided it; the API writes follow)."""
        self.generation += 1
        self.bookings.book(key, record)
        self._settle(key)

    def cancel(self, key: PodKey) -> None:
        """Undo a booking (the bind failed); the pod counts again as the watch last showed it."""
        if self.bookings.cancel(key):
            self.generation += 1
            self._settle(key)

    def record(self, key: PodKey) -> PodRecord | None:
        self._tick()
        return self._applied.get(key)

    # ------------------------------------------------------------------------------- node locks

    def lock_of(self, name: str) -> str | None:
        """The node's ``hami.io/mutex.lock`` as the watch last showed it."""
        return self.nodes.lock_of(name)

    def held_locks(self) -> Mapping[str, str]:
        """The nodes whose lock the watch last showed set, with its value (:meth:`NodeCache.held_locks`)."""
        return self.nodes.held_locks()

    def lock_change(self, name: str) -> asyncio.Future[None]:
        """A future resolved the next time the node's lock annotation changes (or the node goes)."""
        return self.locks.change(name)

    # ----------------------------------------------------------------------------------- queries

    def exclusion(self, name: str, local_now: datetime.datetime) -> Rejection | None:
        """Why ``name`` cannot take GPU pods at ``local_now`` (naive local time, see :func:`local_time`;
        an aware time is converted), or None when it can."""
        self._tick()
        return self.nodes.exclusion(name, local_now)

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
        state = self.nodes.state(name)
        assert state is not None  # not excluded means registered
        held: tuple[Reservation, ...] = ()
        if priority is not None and self.nominations.on(name):
            held = held_against(self.reservations(name), priority, exclude)
        if exclude is not None:
            own = self._applied.get(exclude)
            if own is not None and own.node == name:
                state = apply_usage(state, own.usage, sign=-1)
        return with_reservations(state, held)

    def candidates(
        self,
        names: Iterable[str],
        local_now: datetime.datetime,
        exclude: PodKey | None = None,
        priority: int | None = None,
    ) -> Candidates:
        """:meth:`candidate` for each of ``names``: the states in order, the exclusions by name (one
        walk: the view is brought to ``local_now`` once, each node looked up once)."""
        self._tick()
        if local_now.tzinfo is not None:
            local_now = local_time(local_now)
        own = self._applied.get(exclude) if exclude is not None else None
        usable = self.nodes.usable
        nominated = self.nominations.on
        states: list[NodeState] = []
        excluded: dict[str, Rejection] = {}
        reserved = False
        valid_until: datetime.datetime | None = None
        for name in names:
            found = usable(name, local_now)
            if isinstance(found, Rejection):
                excluded[name] = found
                continue
            state = found.state
            assert state is not None  # usable means registered
            if own is not None and own.node == name:
                state = apply_usage(state, own.usage, sign=-1)
            if priority is not None and nominated(name):
                held = held_against(self.reservations(name), priority, exclude)
                if held:
                    state = with_reservations(state, held)
                    reserved = True
            states.append(state)
            stale = found.stale_after
            if stale is not None and (valid_until is None or stale < valid_until):
                valid_until = stale
        return Candidates(states=states, excluded=excluded, reserved=reserved, valid_until=valid_until)

    def reservations(self, name: str) -> tuple[Reservation, ...]:
        """The cards held on node ``name`` for the pods nominated there, highest priority first."""
        self._tick()
        return self.nominations.reservations(
            name,
            self.nodes.state(name),
            self._applied.__contains__,
            lambda: self._occupants(name),
        )

    def _occupants(self, name: str) -> list[Occupant]:
        """The pods counted on ``name`` whose priority is known (the watch showed them)."""
        found = []
        for key in self._node_pods.get(name, ()):
            observed = self.pods.get(key)
            if observed is not None and observed.meta is not None:
                meta = observed.meta
                found.append(
                    Occupant(priority=meta.priority, usage=self._applied[key].usage, leaving=meta.deleting)
                )
        return found

    def needs_handshake(self) -> list[str]:
        """Nodes whose handshake does not (yet) say Requesting."""
        return self.nodes.needs_handshake()

    def entries(self) -> Iterator[NodeEntry]:
        self._tick()
        return self.nodes.entries()

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
        return [(key, self._applied[key], self.pods.get(key)) for key in self._node_pods.get(name, ())]
