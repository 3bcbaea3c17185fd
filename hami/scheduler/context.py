"""What every handler needs, built once in :func:`hami.scheduler.main.build_context` and passed down.

Owns :class:`Context`, the service's wiring: the settings, the API client, the live view (``snapshot``),
the PodDisruptionBudgets /preempt reads (``disruptions``), the wall clock, the monotonic ``ticker`` for
bind deadlines, the metrics, the registration writes, and ``background``: the service's one
:class:`~hami.process.tasks.TaskSet` of fire-and-forget tasks, Events and handshakes, that must not
delay an extender answer and are drained on shutdown. The mutable parts each have their own owner:
``cycles`` (:class:`~hami.scheduler.cycle.Cycles`, one scheduling cycle per pod version, shared by the
verbs) and ``binds`` (:class:`~hami.scheduler.coordination.BindCoordination`: the nodes' decision
queues, the lines of binds waiting for a node lock, the binds in progress, the lock times written) and
``rejections`` (:class:`~hami.core.allocate.RejectionMemo`: filter's rejections kept across pods).
Must not import the Kubernetes client (only ``hami.kube``) or aiohttp.
"""

from __future__ import annotations

import datetime
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from hami import objects
from hami.core.allocate import RejectionMemo
from hami.kube.events import record_event
from hami.kube.protocol import KubeApi
from hami.objects import RawPod
from hami.process.tasks import TaskSet
from hami.scheduler.config import SchedulerSettings
from hami.scheduler.coordination import BindCoordination
from hami.scheduler.cycle import Cycle, Cycles
from hami.scheduler.disruption import DisruptionBook
from hami.scheduler.metrics import Metrics
from hami.scheduler.registration import Registration
from hami.scheduler.snapshot import Snapshot
from hami.scheduler.wakeup import WakeUp


def utc_now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


@dataclass(slots=True, kw_only=True, eq=False)
class Context:
    """The collaborators of one service (not a value: compared by identity)."""

    settings: SchedulerSettings
    api: KubeApi  # used only through hami.kube
    snapshot: Snapshot
    metrics: Metrics
    background: TaskSet
    registration: Registration
    clock: Callable[[], datetime.datetime] = utc_now
    ticker: Callable[[], float] = time.monotonic  # seconds; measures each bind's deadline
    disruptions: DisruptionBook = field(default_factory=DisruptionBook)  # PDBs, for /preempt
    cycles: Cycles = field(default_factory=Cycles)  # one scheduling cycle per pod version
    binds: BindCoordination = field(default_factory=BindCoordination)  # queues, lines, binds in progress
    rejections: RejectionMemo = field(default_factory=RejectionMemo)  # filter's, kept across pods
    wakeup: WakeUp | None = None  # the pending pods to wake when cards are freed (--wake-pending)

    def __post_init__(self) -> None:
        self.snapshot.on_node_gone = self.rejections.forget  # a departed node's rejections go with it

    def cycle(self, pod: Mapping[str, Any]) -> Cycle:
        """The scheduling cycle of this pod version (its request read once: :mod:`hami.scheduler.cycle`)."""
        return self.cycles.of(pod, self.settings.device_config)

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
