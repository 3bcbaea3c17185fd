"""What every handler needs, built once in :func:`hami.scheduler.main.build_context` and passed down.

Owns :class:`Context` (settings, API client, snapshot, ``disruptions``: the PodDisruptionBudgets
/preempt reads, wall clock, monotonic ``ticker`` for bind
deadlines, metrics, the registration writes, and ``background``: the service's one
:class:`~hami.process.tasks.TaskSet` of fire-and-forget tasks, Events and handshakes, that must not
delay an extender answer and are drained on shutdown), and the in-process coordination of
binds: :class:`NodeQueues` (per node: deciding and booking one bind at a time — never held while
waiting for a node lock), the per-node lines of binds waiting for a busy node lock (only the head of
a line polls the API), and the set of pods with a bind in progress (a second bind of the same pod
in this process is refused). Must not import the Kubernetes client (only ``hami.kube``) or aiohttp.
"""

from __future__ import annotations

import asyncio
import datetime
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from hami import objects
from hami.kube.events import record_event
from hami.kube.protocol import KubeApi
from hami.objects import RawPod
from hami.process.tasks import TaskSet
from hami.scheduler.config import SchedulerSettings
from hami.scheduler.disruption import DisruptionBook
from hami.scheduler.metrics import Metrics
from hami.scheduler.registration import Registration
from hami.scheduler.snapshot import Snapshot


def utc_now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


class NodeQueues:
    """One asyncio lock per node: binds to the same node in this process decide one at a time (also
    used for the lines of binds waiting for a node lock: a separate instance)."""

    def __init__(self) -> None:
        self._locks: dict[str, asyncio.Lock] = {}

    def __call__(self, node: str) -> asyncio.Lock:
        lock = self._locks.get(node)
        if lock is None:
            lock = self._locks[node] = asyncio.Lock()
        return lock


@dataclass(frozen=True, slots=True, kw_only=True)
class Context:
    settings: SchedulerSettings
    api: KubeApi  # used only through hami.kube
    snapshot: Snapshot
    metrics: Metrics
    background: TaskSet
    registration: Registration
    clock: Callable[[], datetime.datetime] = utc_now
    ticker: Callable[[], float] = time.monotonic  # seconds; measures each bind's deadline
    node_queue: NodeQueues = field(default_factory=NodeQueues)
    lock_line: NodeQueues = field(default_factory=NodeQueues)
    binding: set[tuple[str, str]] = field(default_factory=set)  # pods with a bind in progress
    disruptions: DisruptionBook = field(default_factory=DisruptionBook)  # PDBs, for /preempt
    # (node, namespace, pod) -> the time of the last node lock this process wrote for that pod there
    lock_stamps: dict[tuple[str, str, str], datetime.datetime] = field(default_factory=dict)

    def event(self, involved: Mapping[str, Any], reason: str, message: str, *, warning: bool = False) -> None:
        """Record an Event in the background (an Event must never delay or fail an answer)."""
        kind = "Warning" if warning else "Normal"
        coroutine = record_event(
            self.api,
            involved=involved,
            reason=reason,
            message=message,
            type=kind,
            component=self.settings.scheduler_name,
        )
        name = objects.name(involved)
        self.background.spawn(coroutine, f"record the {reason} event on {name}")


def pod_ref(namespace: str, name: str, uid: str = "") -> RawPod:
    """A minimal Pod object for Events when only the names are known."""
    pod: RawPod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": namespace}}
    if uid:
        pod["metadata"]["uid"] = uid
    return pod
