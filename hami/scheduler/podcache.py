"""The pod half of the scheduler's live view: what the watch says each pod holds, until when it counts.

Owns :class:`PodCache`: per pod key the :class:`~hami.scheduler.podrecords.PodRecord` the watch last
showed (``hami.scheduler.podrecords`` decodes it; the rule is ``hami.annotations.holding``, shared with
the node agent), the sticky "init containers done" mark, and the *allocating horizon*.

Usage accounting (docs/protocol.md, "Usage"): a pod counts iff it carries ``hami.io/vgpu-node`` and a
readable ``hami.io/vgpu-devices-allocated`` and is not Succeeded/Failed; init containers drop out once
all of them exited 0 (sticky: the mark is never taken back while the pod lives). Deviations, each about
a pod that can hold no card on its ``vgpu-node``: an unbound pod whose bind failed
(``bind-phase=failed``); a pod bound to another node; an unbound pod whose ``bind-phase=allocating``
began (``hami.io/bind-time``) longer than the allocating horizon ago (twice kube-scheduler's bind
timeout, 60 s: no bind is still in flight for it, so it is a leftover of a crash or a write that
landed after its bind gave up; ``allocating_until``). The horizon needs the time: the cache reads its
``clock`` (given by the service; without one the horizon is off) when a pod event arrives, and
:meth:`PodCache.expire` drops the pods whose horizon has passed (a heap: O(log n) per expiry, nothing
walks the pods).

What counts in the end (a bind's booking wins over this) is decided by the composition,
:class:`~hami.scheduler.snapshot.Snapshot`. No I/O; must not import the Kubernetes client, aiohttp or
asyncio.
"""

from __future__ import annotations

import datetime
import heapq
import logging
from collections.abc import Callable, Mapping
from typing import Any

from hami.annotations.holding import ALLOCATING_HORIZON, allocating_until, init_containers_done
from hami.scheduler.podrecords import PodKey, PodRecord, pod_record

logger = logging.getLogger(__name__)


class PodCache:
    """What the watch showed of each pod holding cards; every method runs on the event loop."""

    def __init__(
        self,
        *,
        clock: Callable[[], datetime.datetime] | None = None,
        allocating_horizon: datetime.timedelta = ALLOCATING_HORIZON,
    ) -> None:
        self.clock = clock
        self._horizon = allocating_horizon
        self._observed: dict[PodKey, PodRecord] = {}
        self._init_done: set[PodKey] = set()
        self._until: dict[PodKey, datetime.datetime] = {}  # unbound allocating pods: when they stop
        self._expiries: list[tuple[datetime.datetime, PodKey]] = []  # heap of the same (stale entries kept)

    def observe(self, key: PodKey, obj: Mapping[str, Any]) -> PodRecord | None:
        """A pod as the watch shows it: its record, or None when it holds no card (now)."""
        if key not in self._init_done and init_containers_done(obj):
            self._init_done.add(key)  # sticky: it never re-inflates
        record = pod_record(key, obj, init_done=key in self._init_done)
        self._until.pop(key, None)
        if record is not None and self.clock is not None:
            until = allocating_until(obj, self._horizon)
            if until is not None and until <= self.clock():
                record = None  # its bind is over: a leftover, not a booking
            elif until is not None:
                self._until[key] = until
                heapq.heappush(self._expiries, (until, key))
        if record is None:
            self._observed.pop(key, None)
        else:
            self._observed[key] = record
        return record

    def forget(self, key: PodKey) -> None:
        """The pod is gone."""
        self._until.pop(key, None)
        self._observed.pop(key, None)
        self._init_done.discard(key)

    def expire(self, now: datetime.datetime) -> list[PodKey]:
        """Stop counting the unbound allocating pods whose horizon has passed at ``now``; their keys."""
        gone: list[PodKey] = []
        while self._expiries and self._expiries[0][0] <= now:
            until, key = heapq.heappop(self._expiries)
            if self._until.get(key) == until:  # else stale: the pod changed or went since
                del self._until[key]
                self._observed.pop(key, None)
                logger.info("pod %s/%s no longer counted: bind-phase allocating since %s", *key, until)
                gone.append(key)
        return gone

    def due(self) -> bool:
        """Whether :meth:`expire` may have something to do (a clock is set and a horizon is pending)."""
        return self.clock is not None and bool(self._expiries)

    def get(self, key: PodKey) -> PodRecord | None:
        """The record the watch last showed for ``key`` (None: it holds no card, or is unknown)."""
        return self._observed.get(key)

    def keys(self) -> set[PodKey]:
        return set(self._observed)
