"""Prometheus metrics of the scheduler, in a registry owned by the service (no module globals).

Owns the request counters and latency histograms of the extender verbs, and a collector that derives
HAMi's allocation gauges (spec-node-chart §B.5: ``hami_gpu_memory_limit_bytes``,
``hami_gpu_memory_allocated_bytes``, ``hami_gpu_shared_count``, ...) from the snapshot on each scrape.
Must not import the Kubernetes client or aiohttp.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Protocol

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from hami.core.model import NodeState

MIB = 1048576
_CARD_LABELS = ["node", "device_uuid", "device_index", "device_type"]


class NodeSource(Protocol):
    """What the collector reads: (node name, state or None, exclusion problem or None) per node."""

    def __call__(self) -> Iterable[tuple[str, NodeState | None, str | None]]: ...


class SnapshotCollector(Collector):
    def __init__(self, source: NodeSource) -> None:
        self._source = source

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
        for name, state, problem in self._source():
            usable.add_metric([name], 0.0 if problem or state is None else 1.0)
            if state is None:
                continue
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


class Metrics:
    """The service's registry: verb counters and latencies, plus the snapshot gauges once attached."""

    def __init__(self) -> None:
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

    def attach(self, source: NodeSource) -> None:
        self.registry.register(SnapshotCollector(source))

    def observe(self, verb: str, outcome: str, seconds: float) -> None:
        self.requests.labels(verb, outcome).inc()
        self.latency.labels(verb).observe(seconds)

    def render(self) -> bytes:
        return generate_latest(self.registry)
