"""The node agent's pods: one node-scoped cache fed by a watch, instead of a list of the node's pods per call.

Owns :class:`PodCache` (list + watch of the Pods with ``fieldSelector=spec.nodeName=<node>`` through
:class:`hami.kube.watch.ListWatcher`: the watch resumes from the last resourceVersion, a ``410 Gone`` or
an error relists after a backoff; ``synced`` from the first complete list until a relist is needed),
:class:`ListedPods` (the same surface with a fresh list on every read: what the agent did before, and
what a caller without a cache gets), :class:`PodView` (what a reader gets: an immutable tuple of the
pods and whether it is a fresh list) and :class:`PodCacheCollector` (its Prometheus families).

Readers call :meth:`view`: the cache's snapshot while synced (no API request), else one fresh list;
:meth:`listed` is always one fresh list, for a reader that must decide on the API server's state now
(Allocate's fallback, the MPS sweep before closing a namespace, MIG's claims; docs/node-agent.md, "Pod
cache"). A pod that is not bound to the node (an API server that ignores the field selector) is never
kept. Pod objects are replaced whole on each event and never changed in place, so a snapshot stays as
it was when read. :class:`PodFanout` feeds many nodes' caches from one list + watch of every pod, split
by ``spec.nodeName`` (the fleet of simulated nodes in one process: one watch, not one per node; each
cache reads as if it ran its own). Imports ``hami.kube``, :mod:`hami.objects` and prometheus-client;
must not import grpc, pynvml or the Kubernetes client.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol, cast

from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric

from hami import objects
from hami.kube.pods import list_pods
from hami.kube.protocol import KubeApi
from hami.kube.watch import ERROR, GONE, ListWatcher
from hami.objects import RawPod

#: Why a fresh list of the node's pods was made (the ``reason`` label of ``hami_node_pod_lists_total``).
FALLBACK = "fallback"  # a reader asked for one (not synced, or a decision the cache cannot settle)
RELIST = "cache"  # the cache's own list: at start and after 410 Gone or an error
LIST_REASONS = (FALLBACK, RELIST)


@dataclass(frozen=True, slots=True)
class PodView:
    """The node's pods as one reader sees them; ``fresh``: a list made for this read."""

    pods: tuple[RawPod, ...]
    fresh: bool


class NodePods(Protocol):
    """Where the agent reads its node's pods from (:class:`PodCache` or :class:`ListedPods`)."""

    async def view(self) -> PodView:
        """The node's pods: the cache's snapshot while synced, else one fresh list."""
        ...

    async def listed(self) -> PodView:
        """One fresh list of the node's pods (raises :class:`~hami.kube.client.KubeError`)."""
        ...


class ListedPods:
    """No cache: every read is one list of the node's pods."""

    def __init__(self, api: KubeApi, node_name: str) -> None:
        self._api, self._node = api, node_name
        self.lists = 0

    async def listed(self) -> PodView:
        pods = await list_pods(self._api, node_name=self._node)
        self.lists += 1
        return PodView(tuple(pods), fresh=True)

    async def view(self) -> PodView:
        return await self.listed()


class PodCache:
    """The pods bound to one node, kept by a list + watch (module docstring). Start with :meth:`run`
    (a task: cancel it to stop the watch thread) or :meth:`start` / :meth:`stop`; read on the loop."""

    def __init__(
        self, api: KubeApi, node_name: str, *, watch_seconds: int = 300, backoff: float = 1.0
    ) -> None:
        self._api, self._node = api, node_name
        self._watch_seconds, self._backoff = watch_seconds, backoff
        self._pods: dict[tuple[str, str], RawPod] = {}
        self._snapshot: tuple[RawPod, ...] | None = ()
        self._watcher: ListWatcher | None = None
        self._synced_event = asyncio.Event()
        #: True from a complete list until a relist is needed (410 Gone, an error); read on the loop
        self.synced = False
        #: reads answered from the cache (each one a list of the node's pods the agent did not make)
        self.reads_cached = 0
        #: fresh lists by reason (:data:`LIST_REASONS`)
        self.lists: dict[str, int] = dict.fromkeys(LIST_REASONS, 0)

    # ------------------------------------------------------------------------------- readers
    @property
    def pods(self) -> tuple[RawPod, ...]:
        """The cached pods now (whatever ``synced`` says); a tuple that never changes."""
        if self._snapshot is None:
            self._snapshot = tuple(self._pods.values())
        return self._snapshot

    @property
    def size(self) -> int:
        """How many pods are cached (safe from any thread)."""
        return len(self._pods)

    async def view(self) -> PodView:
        if self.synced:
            self.reads_cached += 1
            return PodView(self.pods, fresh=False)
        return await self.listed()

    async def listed(self) -> PodView:
        pods = await list_pods(self._api, node_name=self._node)
        self.lists[FALLBACK] += 1
        return PodView(tuple(pods), fresh=True)

    async def wait_synced(self) -> None:
        """Return once the cache has had its first complete list."""
        await self._synced_event.wait()

    # ------------------------------------------- the watch's callbacks (on the loop; a test may feed them)
    def on_list(self, applied: list[dict[str, Any]]) -> None:
        self.lists[RELIST] += 1
        self._pods = {
            objects.pod_key(p): cast("RawPod", p) for p in applied if objects.node_name(p) == self._node
        }
        self._snapshot = None
        self.synced = True
        self._synced_event.set()

    def on_event(self, kind: str, obj: dict[str, Any]) -> None:
        key = objects.pod_key(obj)
        if kind == "DELETED" or objects.node_name(obj) != self._node:
            if self._pods.pop(key, None) is not None:
                self._snapshot = None
            return
        self._pods[key] = cast("RawPod", obj)
        self._snapshot = None

    def on_restart(self, cause: str) -> None:
        if cause in (GONE, ERROR):  # events may have been missed: lists until the next complete list
            self.synced = False

    # ------------------------------------------------------------------------------- lifecycle
    def start(self) -> None:
        """Start the watch thread (on the running loop)."""
        self._watcher = ListWatcher(
            self._api,
            "pods",
            loop=asyncio.get_running_loop(),
            on_list=self.on_list,
            on_event=self.on_event,
            on_restart=self.on_restart,
            watch_seconds=self._watch_seconds,
            backoff=self._backoff,
            field_selector=f"spec.nodeName={self._node}",
        )
        self._watcher.start()

    async def stop(self) -> None:
        """Stop the watch thread and wait for it; the cache then lists on every read."""
        watcher, self._watcher = self._watcher, None
        self.synced = False
        if watcher is not None:
            await asyncio.to_thread(watcher.stop)

    async def run(self) -> None:
        """Keep the cache until this task is cancelled, then stop the watch thread."""
        self.start()
        try:
            await asyncio.Event().wait()
        finally:
            await self.stop()


class PodFanout:
    """One list + watch of every pod feeding the :class:`PodCache` of each node in ``caches`` (by node
    name; never started themselves): a complete list gives each cache its node's pods, an event goes to
    the cache of the pod's ``spec.nodeName`` (a pod bound elsewhere, or not yet, is dropped), a restart
    to every cache. Start with :meth:`start` / :meth:`stop` on the loop, as a cache."""

    def __init__(
        self, api: KubeApi, caches: Mapping[str, PodCache], *, watch_seconds: int = 300, backoff: float = 1.0
    ) -> None:
        self._api, self._caches = api, dict(caches)
        self._watch_seconds, self._backoff = watch_seconds, backoff
        self._watcher: ListWatcher | None = None

    def on_list(self, applied: list[dict[str, Any]]) -> None:
        by_node: dict[str, list[dict[str, Any]]] = {}
        for pod in applied:
            by_node.setdefault(objects.node_name(pod), []).append(pod)
        for name, cache in self._caches.items():
            cache.on_list(by_node.get(name, []))

    def on_event(self, kind: str, obj: dict[str, Any]) -> None:
        cache = self._caches.get(objects.node_name(obj))
        if cache is not None:
            cache.on_event(kind, obj)

    def on_restart(self, cause: str) -> None:
        for cache in self._caches.values():
            cache.on_restart(cause)

    def start(self) -> None:
        """Start the one watch thread (on the running loop)."""
        self._watcher = ListWatcher(
            self._api,
            "pods",
            loop=asyncio.get_running_loop(),
            on_list=self.on_list,
            on_event=self.on_event,
            on_restart=self.on_restart,
            watch_seconds=self._watch_seconds,
            backoff=self._backoff,
        )
        self._watcher.start()

    async def stop(self) -> None:
        """Stop the watch thread and wait for it; every cache then lists on every read."""
        watcher, self._watcher = self._watcher, None
        for cache in self._caches.values():
            cache.synced = False
        if watcher is not None:
            await asyncio.to_thread(watcher.stop)


class PodCacheCollector:
    """``hami_node_pod_cache_pods``, ``hami_node_pod_cache_synced``, ``hami_node_pod_reads_cached_total``
    and ``hami_node_pod_lists_total{reason}`` of one node's :class:`PodCache`, at scrape time."""

    def __init__(self, cache: PodCache, node_name: str, zone: str = "vGPU") -> None:
        self._cache, self._labels = cache, [node_name, zone]

    def describe(self) -> Iterable[Metric]:
        return self._families(None)

    def collect(self) -> Iterable[Metric]:
        return self._families(self._cache)

    def _families(self, cache: PodCache | None) -> list[Metric]:
        labels = ["node", "zone"]
        pods = GaugeMetricFamily(
            "hami_node_pod_cache_pods", "Pods bound to the node in the agent's pod cache.", labels=labels
        )
        synced = GaugeMetricFamily(
            "hami_node_pod_cache_synced",
            "1 while the pod cache is synced (its reads need no API request), else 0.",
            labels=labels,
        )
        cached = CounterMetricFamily(
            "hami_node_pod_reads_cached",
            "Reads of the node's pods answered from the cache: lists of the node's pods not made.",
            labels=labels,
        )
        lists = CounterMetricFamily(
            "hami_node_pod_lists",
            "Lists of the node's pods: the cache's own (reason=cache: start, 410 Gone, errors) and a "
            "reader's fresh list (reason=fallback).",
            labels=[*labels, "reason"],
        )
        if cache is not None:
            pods.add_metric(self._labels, cache.size)
            synced.add_metric(self._labels, 1 if cache.synced else 0)
            cached.add_metric(self._labels, cache.reads_cached)
            for reason in LIST_REASONS:
                lists.add_metric([*self._labels, reason], cache.lists[reason])
        return [pods, synced, cached, lists]
