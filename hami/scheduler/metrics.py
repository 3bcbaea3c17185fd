"""Prometheus metrics of the scheduler, in a registry owned by the service (no module globals).

Owns the request counters and latency histograms of the extender verbs, the filter's rejections by
reason (labels from the closed vocabulary of ``hami.scheduler.reasons``) and unschedulable pods, bind
outcomes, the nodes ``/prioritize`` demoted for a busy node lock, watch restarts, node-lock hold
times (:class:`LockHolds`: from a bind's acquire until the node watch shows the lock gone or held by
another pod), and a collector that derives HAMi's allocation gauges (docs/metrics.md, "Scheduler":
``hami_gpu_memory_limit_bytes``, ``hami_gpu_memory_allocated_bytes``, ``hami_gpu_shared_count``,
...) and the snapshot's sizes from the snapshot on each scrape. Every labelled counter starts with
all its label values at 0. Must not import the Kubernetes client or aiohttp.
"""

from __future__ import annotations

import collections
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Protocol

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from hami.core.model import NodeState
from hami.kube.nodelock import TAKEOVER_REASONS
from hami.kube.watch import RESTART_CAUSES
from hami.scheduler.reasons import VOCABULARY

MIB = 1048576
_CARD_LABELS = ["node", "device_uuid", "device_index", "device_type"]
#: ``hami_scheduler_binds_total{result}``: bound; already bound here by an earlier attempt (nothing
#: written); refused (bound, another scheduler's, not Pending, being deleted, bind in progress:
#: nothing written); kube-scheduler's bind deadline passed; the node lock busy; the pod no longer
#: fits the node (or the node is excluded); the pod gone or recreated; an API failure; an unreadable
#: request or pod.
BIND_RESULTS = (
    "success",
    "already_bound",
    "refused",
    "deadline",
    "lock_busy",
    "no_fit",
    "pod_missing",
    "api_error",
    "invalid",
)
#: Label values that exist from start-up (at 0): every verb and outcome of a request, every resource
#: the scheduler lists and watches, every kind of watch event.
VERBS = ("filter", "prioritize", "bind", "preempt")
OUTCOMES = ("ok", "error")
WATCHED = ("nodes", "pods", "resourcequotas", "poddisruptionbudgets")
EVENT_KINDS = ("node", "pod", "quota", "pdb")


class NodeSource(Protocol):
    """What the collector reads: (node name, state or None, exclusion problem or None) per node."""

    def __call__(self) -> Iterable[tuple[str, NodeState | None, str | None]]: ...


class SnapshotCollector(Collector):
    def __init__(self, source: NodeSource, pods_tracked: Callable[[], int]) -> None:
        self._source = source
        self._pods_tracked = pods_tracked

    def collect(self) -> Iterator[Metric]:
        memory_limit = GaugeMetricFamily(
            "hami_gpu_memory_limit_bytes", "registered device memory", labels=_CARD_LABELS
        )
        core_limit = GaugeMetricFamily(
            "hami_gpu_core_limit_ratio", "registered device cores", labels=_CARD_LABELS
        )
        memory_allocated = GaugeMetricFamily(
            "hami_gpu_memory_allocated_bytes",
            "memory allocated on the device",
            labels=["node", "device_uuid", "device_index", "device_cores", "device_type"],
        )
        shared = GaugeMetricFamily(
            "hami_gpu_shared_count", "container allocations on the device", labels=_CARD_LABELS
        )
        core_allocated = GaugeMetricFamily(
            "hami_gpu_core_allocated_ratio", "cores allocated on the device (0-100)", labels=_CARD_LABELS
        )
        memory_ratio = GaugeMetricFamily(
            "hami_node_gpu_memory_allocated_ratio", "allocated/total memory (0-1)", labels=_CARD_LABELS
        )
        usable = GaugeMetricFamily(
            "hami_scheduler_node_usable",
            "1 when the node can take GPU pods, 0 when excluded",
            labels=["node"],
        )
        nodes = cards = 0
        for name, state, problem in self._source():
            nodes += 1
            usable.add_metric([name], 0.0 if problem or state is None else 1.0)
            if state is None:
                continue
            cards += len(state.devices)
            for card in state.devices:
                dev = card.device
                labels = [name, dev.uuid, str(dev.index), dev.type]
                memory_limit.add_metric(labels, float(dev.memory_mib * MIB))
                core_limit.add_metric(labels, float(dev.cores))
                memory_allocated.add_metric(
                    [name, dev.uuid, str(dev.index), str(dev.cores), dev.type], float(card.used_mem * MIB)
                )
                shared.add_metric(labels, float(card.used))
                core_allocated.add_metric(labels, float(card.used_cores))
                if dev.memory_mib > 0:
                    memory_ratio.add_metric(labels, card.used_mem / dev.memory_mib)
        yield from (memory_limit, core_limit, memory_allocated, shared, core_allocated, memory_ratio, usable)
        yield GaugeMetricFamily("hami_scheduler_snapshot_nodes", "nodes in the live view", value=nodes)
        yield GaugeMetricFamily(
            "hami_scheduler_snapshot_cards", "cards of the registered nodes in the live view", value=cards
        )
        yield GaugeMetricFamily(
            "hami_scheduler_snapshot_pods_tracked",
            "pods whose GPU grants count in the live view (bookings included)",
            value=self._pods_tracked(),
        )


@dataclass(slots=True)
class _Hold:
    started: float
    seen: bool  # the watch has shown the lock with this value


class LockHolds:
    """Node-lock hold times, measured between a bind's acquire and what the node watch shows next.

    A hold ends when the watch shows the lock removed, held by another value, or the node gone, after
    it has shown this bind's value (earlier events still in flight are ignored). Everything runs on
    the event loop. At most ``per_node`` unfinished holds are kept per node (the oldest go first), so a
    broken watch cannot grow memory without bound.
    """

    def __init__(self, histogram: Histogram, clock: Callable[[], float], per_node: int = 16) -> None:
        self._histogram = histogram
        self._clock = clock
        self._per_node = per_node
        self._held: dict[str, dict[str, _Hold]] = {}

    def acquired(self, node: str, value: str, current: str | None) -> None:
        """A bind stored ``value`` as the lock; ``current`` is what the watch has shown so far."""
        holds = self._held.setdefault(node, {})
        if value in holds:  # re-entrant acquire by the same pod: the hold goes on
            holds[value].seen = holds[value].seen or current == value
            return
        holds[value] = _Hold(started=self._clock(), seen=current == value)
        while len(holds) > self._per_node:
            del holds[next(iter(holds))]

    def seen(self, node: str, value: str | None) -> None:
        """The node watch shows the lock now at ``value`` (``None``: removed, or the node is gone)."""
        holds = self._held.get(node)
        if not holds:
            return
        now = self._clock()
        for held, hold in list(holds.items()):
            if held == value:
                hold.seen = True
            elif hold.seen:
                self._histogram.observe(max(0.0, now - hold.started))
                del holds[held]
        if not holds:
            del self._held[node]

    def pending(self) -> int:
        return sum(len(holds) for holds in self._held.values())


class Metrics:
    """The service's registry: verb counters and latencies, plus the snapshot gauges once attached."""

    def __init__(self, *, monotonic: Callable[[], float] = time.monotonic) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter(
            "hami_scheduler_requests",
            "extender requests by verb and outcome",
            ["verb", "outcome"],
            registry=self.registry,
        )
        self.latency = Histogram(
            "hami_scheduler_request_seconds",
            "extender request latency",
            ["verb"],
            buckets=(0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.5, 1.0, 5.0, 30.0),
            registry=self.registry,
        )
        self.watch_events = Counter(
            "hami_scheduler_watch_events",
            "watch events applied to the snapshot",
            ["kind"],
            registry=self.registry,
        )
        self.rejections = Counter(
            "hami_scheduler_node_rejections",
            "nodes rejected by filter, once per reason per node and filter call",
            ["reason"],
            registry=self.registry,
        )
        self.unschedulable = Counter(
            "hami_scheduler_unschedulable",
            "filter calls for a GPU pod that fits no candidate node",
            registry=self.registry,
        )
        self.binds = Counter("hami_scheduler_binds", "bind outcomes", ["result"], registry=self.registry)
        self.watch_restarts = Counter(
            "hami_scheduler_watch_restarts",
            "list/watch restarts by resource and cause",
            ["resource", "cause"],
            registry=self.registry,
        )
        self.lock_hold = Histogram(
            "hami_scheduler_node_lock_hold_seconds",
            "node lock held: from a bind's acquire until the watch shows it released or taken over",
            buckets=(0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0),
            registry=self.registry,
        )
        self.lock_holds = LockHolds(self.lock_hold, monotonic)
        self.lock_takeovers = Counter(
            "hami_scheduler_node_lock_takeovers",
            "node locks a bind took over from a holder that can never be allocated there, by reason",
            ["reason"],
            registry=self.registry,
        )
        self.prioritize_demoted = Counter(
            "hami_scheduler_prioritize_demoted_nodes",
            "candidate nodes /prioritize scored 0 because their node lock was busy for the pod "
            "(another pod's, or a bind in progress here) while another candidate was free",
            registry=self.registry,
        )
        self.preemptions = Counter(
            "hami_scheduler_preemption_attempts",
            "answered /preempt calls (kube-scheduler preempting for a pod that fits nowhere)",
            registry=self.registry,
        )
        self.preemption_nodes = Counter(
            "hami_scheduler_preemption_nodes",
            "candidate nodes offered to /preempt, by result: kept (with victims) or dropped",
            ["result"],
            registry=self.registry,
        )
        self.preemption_victims = Counter(
            "hami_scheduler_preemption_victims",
            "victims in /preempt answers, by source: kube-scheduler's own or added for the GPU cards",
            ["source"],
            registry=self.registry,
        )
        for result in ("kept", "dropped"):
            self.preemption_nodes.labels(result)
        for source in ("kube_scheduler", "gpu"):
            self.preemption_victims.labels(source)
        for reason in TAKEOVER_REASONS:
            self.lock_takeovers.labels(reason)
        for reason in VOCABULARY:
            self.rejections.labels(reason)
        for result in BIND_RESULTS:
            self.binds.labels(result)
        for resource in WATCHED:
            for cause in RESTART_CAUSES:
                self.watch_restarts.labels(resource, cause)
        for verb in VERBS:
            self.latency.labels(verb)
            for outcome in OUTCOMES:
                self.requests.labels(verb, outcome)
        for kind in EVENT_KINDS:
            self.watch_events.labels(kind)

    def attach(self, source: NodeSource, pods_tracked: Callable[[], int]) -> None:
        self.registry.register(SnapshotCollector(source, pods_tracked))

    def rejected(self, nodes: Iterable[Iterable[str]]) -> None:
        """Count each failed node's distinct reason words (one set per node)."""
        tally = collections.Counter(word for words in nodes for word in set(words))
        for word, count in tally.items():  # one counter update per reason, not per node
            self.rejections.labels(word).inc(count)

    def bound(self, result: str) -> None:
        self.binds.labels(result).inc()

    def preempted(self, offered: int, kept: int, proposed: int, added: int) -> None:
        """One answered ``/preempt``: nodes offered and kept, victims kube-scheduler's and added."""
        self.preemptions.inc()
        self.preemption_nodes.labels("kept").inc(kept)
        self.preemption_nodes.labels("dropped").inc(offered - kept)
        self.preemption_victims.labels("kube_scheduler").inc(proposed)
        self.preemption_victims.labels("gpu").inc(added)

    def watch_restarted(self, resource: str) -> Callable[[str], None]:
        """The ``on_restart`` callback of one ListWatcher."""
        counter = self.watch_restarts

        def restarted(cause: str) -> None:
            counter.labels(resource, cause).inc()

        return restarted

    def observe(self, verb: str, outcome: str, seconds: float) -> None:
        self.requests.labels(verb, outcome).inc()
        self.latency.labels(verb).observe(seconds)

    def render(self) -> bytes:
        return generate_latest(self.registry)
