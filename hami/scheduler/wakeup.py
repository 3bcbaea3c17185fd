"""Waking the pending pods that fit a node where cards were freed (docs/scheduler.md, "Waking pending pods").

Owns :class:`WakeUp`. kube-scheduler parks a pod our ``/filter`` rejected in its unschedulable pool
and retries it on a cluster event its queueing hints accept, or after ``podMaxInUnschedulablePodsDuration``
(5 minutes). Cards freed by something it does not see (a grant released on a running pod, a booking
cancelled, an allocation past its horizon, and any freeing on a cluster whose kube-scheduler does not
count node annotations as an event) leave such a pod waiting. The signal its queue acts on, with queueing
hints on or off, is an update of the pending pod itself: :data:`~hami.annotations.POD_WAKE_UP`,
written by this service only (a merge patch of one annotation; its value is this process's own
counter and is never read back).

What is remembered: each pod ``/filter`` found no node for (``rejected``: its uid, request, priority,
when), at most ``capacity`` of them (the least recently rejected go first), until the pod is bound,
finishes or is deleted (``pod_event``). Not the nodes kube-scheduler asked about: above 100 nodes it
sends extenders only a sample of the feasible ones, so a card freed outside the sample must wake the pod
too; every node is a candidate and ``fits`` decides. What wakes: ``freed(node)``, called by the live
view whenever usage leaves a node or its registered cards change; a pass over that node runs at most
once per ``node_interval`` seconds (changes in between are coalesced into it). A pass asks ``fits`` (the
filter's own decision on the live view) for at most ``checks_per_pass`` pods, the least recently
checked first (then the highest priority, then the longest waiting), so thousands of parked pods that
never fit cost a bounded amount per pass and every pod gets its turn; of those that fit it wakes the
highest priority first, then the longest waiting, at most ``per_pass``. No pod is woken again within its
interval: ``pod_interval`` seconds, doubled (up to ``max_pod_interval``) by each wake that was not
followed by a new rejection from ``/filter`` (kube-scheduler rejects it for another reason and never
asks us: waking it is useless), back to ``pod_interval`` when ``/filter`` rejects it again; whatever its
owner does meanwhile (editing the annotation changes nothing here). The writes go through
``wake(key, uid, value)`` (the service writes only to the pod with that uid, in its background task
set, itself bounded). No I/O here; must not import the Kubernetes client or aiohttp.
"""

from __future__ import annotations

import asyncio
import heapq
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from hami import objects
from hami.core.model import PodRequest

PodKey = tuple[str, str]


@dataclass(slots=True)
class Parked:
    """One pod ``/filter`` found no node for."""

    uid: str
    request: PodRequest
    priority: int
    rejected_at: float
    woken_at: float = float("-inf")
    checked_at: float = float("-inf")  # when ``fits`` was last asked about it
    interval: float = 0.0  # the least time from its last wake to its next one
    answered: bool = True  # /filter rejected it again since its last wake (or it was never woken)


class WakeUp:
    """The pending pods to wake when cards are freed (see the module docstring)."""

    def __init__(
        self,
        *,
        fits: Callable[[PodRequest, int, str], bool],
        wake: Callable[[PodKey, str, str], None],
        ticker: Callable[[], float] = time.monotonic,
        node_interval: float = 1.0,
        pod_interval: float = 10.0,
        max_pod_interval: float = 300.0,
        per_pass: int = 8,
        checks_per_pass: int = 32,
        capacity: int = 4096,
    ) -> None:
        self._fits = fits
        self._wake = wake
        self._ticker = ticker
        self._node_interval = node_interval
        self._pod_interval = pod_interval
        self._max_pod_interval = max(max_pod_interval, pod_interval)
        self._per_pass = per_pass
        self._checks_per_pass = checks_per_pass
        self._capacity = capacity
        self._parked: OrderedDict[PodKey, Parked] = OrderedDict()
        self._dirty: set[str] = set()
        self._passed: dict[str, float] = {}  # node -> when its last pass ran
        self._timer: asyncio.TimerHandle | None = None
        self._counter = 0
        self.woken = 0  # pods woken, for the metrics and the tests
        self.passes = 0
        self.checks = 0  # ``fits`` calls, for the tests

    def __len__(self) -> int:
        return len(self._parked)

    # ------------------------------------------------------------------------------- what filter saw

    def rejected(self, request: PodRequest, priority: int, nodes: Iterable[str] = ()) -> None:
        """``/filter`` found none of ``nodes`` fit this pod: remember it (when it was last woken and
        checked stay; its interval is back to ``pod_interval``). ``nodes`` is not kept: it may be
        kube-scheduler's sample, and every node is a candidate (the module docstring)."""
        del nodes
        key = (request.namespace, request.name)
        previous = self._parked.pop(key, None)
        same = previous is not None and previous.uid == request.uid
        self._parked[key] = Parked(
            uid=request.uid,
            request=request,
            priority=priority,
            rejected_at=self._ticker(),
            woken_at=previous.woken_at if same and previous is not None else float("-inf"),
            checked_at=previous.checked_at if same and previous is not None else float("-inf"),
            interval=self._pod_interval,
        )
        while len(self._parked) > self._capacity:
            self._parked.popitem(last=False)

    def placed(self, key: PodKey) -> None:
        """``/filter`` found a node for the pod: nothing to wake it for."""
        self._parked.pop(key, None)

    def pod_event(self, kind: str, obj: Mapping[str, Any]) -> None:
        """The pod watch's event: a bound, finished or deleted pod is forgotten."""
        key = objects.pod_key(obj)
        if key not in self._parked:
            return
        if (
            kind == "DELETED"
            or objects.node_name(obj)
            or objects.pod_phase(obj) in objects.FINISHED_PHASES
            or objects.uid(obj) != self._parked[key].uid
        ):
            del self._parked[key]

    # ------------------------------------------------------------------------------- freed cards

    def freed(self, node: str) -> None:
        """Cards may have been freed on ``node``: a pass over it soon (coalesced, rate-bounded).

        Called synchronously by the live view; without a running event loop (an offline snapshot)
        nothing happens."""
        if not self._parked:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return
        self._dirty.add(node)
        self._arm(loop)

    def _arm(self, loop: asyncio.AbstractEventLoop) -> None:
        if self._timer is not None or not self._dirty:
            return
        now = self._ticker()
        due = min(self._passed.get(n, float("-inf")) + self._node_interval for n in self._dirty)
        self._timer = loop.call_later(max(due - now, 0.0), self._run_pass)

    def _run_pass(self) -> None:
        self._timer = None
        now = self._ticker()
        due = {n for n in self._dirty if self._passed.get(n, float("-inf")) + self._node_interval <= now}
        self._dirty -= due
        # a node's last pass matters only within node_interval: older entries (gone nodes too) go
        self._passed = {n: t for n, t in self._passed.items() if t + self._node_interval > now}
        for node in sorted(due):
            self._passed[node] = now
            self.wake_for(node, now)
        self._arm(asyncio.get_running_loop())

    def wake_for(self, node: str, now: float | None = None) -> list[PodKey]:
        """One pass over ``node``: ask ``fits`` about at most ``checks_per_pass`` parked pods (the least
        recently checked first), wake those that fit it now (at most ``per_pass``); the keys woken."""
        now = self._ticker() if now is None else now
        self.passes += 1
        waiting = (
            (key, parked) for key, parked in self._parked.items() if now - parked.woken_at >= parked.interval
        )
        turn = heapq.nsmallest(
            self._checks_per_pass,
            waiting,
            key=lambda item: (item[1].checked_at, -item[1].priority, item[1].rejected_at),
        )
        fitting: list[tuple[PodKey, Parked]] = []
        for key, parked in turn:
            parked.checked_at = now
            self.checks += 1
            if self._fits(parked.request, parked.priority, node):
                fitting.append((key, parked))
        fitting.sort(key=lambda item: (-item[1].priority, item[1].rejected_at))
        woken: list[PodKey] = []
        for key, parked in fitting[: self._per_pass]:
            # a wake that brought no new rejection from /filter: the next one waits twice as long
            parked.interval = (
                self._pod_interval if parked.answered else min(parked.interval * 2, self._max_pod_interval)
            )
            parked.answered = False
            parked.woken_at = now
            self._counter += 1
            self._wake(key, parked.uid, str(self._counter))
            woken.append(key)
        self.woken += len(woken)
        return woken

    def close(self) -> None:
        """Stop the pending pass (the service is stopping)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
