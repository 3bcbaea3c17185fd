"""The scheduler's live feeds: list+watch of Nodes, Pods and ResourceQuotas into the snapshot, and of
PodDisruptionBudgets into ``ctx.disruptions`` (/preempt's); a deleted pod's scheduling cycle leaves
``ctx.cycles``.

Owns the four :class:`~hami.kube.watch.ListWatcher` s (threads feeding the event loop) and their
callbacks: the snapshot's list and event handlers, the ``hami_scheduler_watch_events_total`` and
restart counters, and ``SkippedByGPUScheduler``, a Warning Event on an object the watch skipped
because handling it failed (once per object and reason); :func:`follow`, one watcher as an asyncio
task (started with it, stopped when it is cancelled); and :func:`start_sync`, the service's sync
loops as named tasks: ``watch-nodes``, ``watch-pods``, ``watch-resourcequotas``,
``watch-poddisruptionbudgets``, ``registration-resync`` (:mod:`hami.scheduler.registration`) and
``workload-learning`` (:func:`learn_workload`: the pods the snapshot deferred to the ``fragmentation``
policy's workload, read a chunk at a time), or :func:`keep_synced`, the same in a
task group of their own. Must not import the Kubernetes client
(only ``hami.kube``) or aiohttp.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from hami import objects
from hami.kube.events import record_event
from hami.kube.watch import EventCallback, Kind, ListCallback, ListWatcher, SkipCallback
from hami.scheduler.context import Context
from hami.scheduler.workload import Workload

#: The Event reason on an object the watch skipped because handling it failed.
SKIPPED_OBJECT = "SkippedByGPUScheduler"
#: Deferred pods the workload reads per turn of the event loop (some 4 ms of CPU: a verb waits no longer; at
#: 500, /filter's p99 over 5,000 nodes tripled while 50,000 listed pods were read).
LEARNING_CHUNK = 100
#: Seconds between two looks at whether the first lists are in, before the workload reads any pod.
READY_POLL = 0.05
#: The apiVersion of the kinds watched outside the core group (for the Event's involvedObject).
API_VERSIONS = {"PodDisruptionBudget": "policy/v1"}


def _skip_reporter(ctx: Context) -> SkipCallback:
    """ListWatcher's ``on_skip``: a Warning Event on the object, in the background."""

    def report(kind: str, obj: dict[str, Any], error: Exception) -> None:
        event = record_event(
            ctx.api,
            involved={
                "apiVersion": API_VERSIONS.get(kind, "v1"),
                "kind": kind,
                "metadata": objects.meta(obj),
            },
            reason=SKIPPED_OBJECT,
            message=f"{ctx.settings.scheduler_name} could not handle this {kind} and skipped it (one "
            f"skipped while listing is left out of GPU scheduling): {type(error).__name__}: {error}",
            type="Warning",
            component=ctx.settings.scheduler_name,
        )
        ctx.background.spawn(event, f"record the {SKIPPED_OBJECT} event on {kind} {objects.name(obj)}")

    return report


def _counted(ctx: Context, kind: str, handler: EventCallback) -> EventCallback:
    counter = ctx.metrics.watch_events.labels(kind)

    def apply(event: str, obj: dict[str, Any]) -> None:
        counter.inc()
        handler(event, obj)

    return apply


def _pod_feed(ctx: Context) -> EventCallback:
    """A pod event into the snapshot, and a deleted pod's scheduling cycle out of ``ctx.cycles``."""

    def apply(event: str, obj: dict[str, Any]) -> None:
        ctx.snapshot.pod_event(event, obj)
        ctx.cycles.pod_event(event, obj)
        if ctx.wakeup is not None:
            ctx.wakeup.pod_event(event, obj)

    return apply


def watchers(ctx: Context, loop: asyncio.AbstractEventLoop) -> dict[Kind, ListWatcher]:
    """The four list+watch feeds by resource (not started)."""
    snapshot = ctx.snapshot
    feeds: tuple[tuple[Kind, str, ListCallback, EventCallback], ...] = (
        ("nodes", "node", snapshot.nodes_listed, snapshot.node_event),
        ("pods", "pod", snapshot.pods_listed, _pod_feed(ctx)),
        ("resourcequotas", "quota", snapshot.quotas_listed, snapshot.quota_event),
        ("poddisruptionbudgets", "pdb", ctx.disruptions.listed, ctx.disruptions.event),
    )
    on_skip = _skip_reporter(ctx)
    return {
        resource: ListWatcher(
            ctx.api,
            resource,
            loop=loop,
            on_list=on_list,
            on_event=_counted(ctx, kind, on_event),
            on_restart=ctx.metrics.watch_restarted(resource),
            on_skip=on_skip,
            on_listing=snapshot.pods_listing if resource == "pods" else None,
        )
        for resource, kind, on_list, on_event in feeds
    }


async def follow(watcher: ListWatcher) -> None:
    """Run ``watcher`` (its thread) until this task is cancelled, then stop it."""
    watcher.start()
    try:
        await asyncio.Event().wait()
    finally:
        await asyncio.to_thread(watcher.stop)


async def learn_workload(workload: Workload, ready: Callable[[], bool] = lambda: True) -> None:
    """Read the pods deferred to ``workload``, :data:`LEARNING_CHUNK` per turn of the event loop, whenever
    there are some, until cancelled; not before ``ready()`` (the first lists: read earlier, the pods would
    only take the GIL from the threads decoding the other lists and delay ``/readyz``). Anything that
    reads the workload reads the rest first itself."""
    wake = asyncio.Event()
    workload.on_pending = wake.set
    if workload.pending:
        wake.set()
    try:
        while not ready():  # noqa: ASYNC110 (a few seconds at the start; the snapshot has no event for it)
            await asyncio.sleep(READY_POLL)
        while True:
            await wake.wait()
            wake.clear()
            while True:
                if not workload.learn_pending(LEARNING_CHUNK):
                    break
                await asyncio.sleep(0)  # a turn of the loop for the verbs and the watches
    finally:
        workload.on_pending = None


def start_sync(ctx: Context, tasks: asyncio.TaskGroup) -> None:
    """Start the snapshot's feeds, the registration pass and the workload's learning in ``tasks``, each a
    named task."""
    for resource, watcher in watchers(ctx, asyncio.get_running_loop()).items():
        tasks.create_task(follow(watcher), name=f"watch-{resource}")
    tasks.create_task(ctx.registration.resync(ctx.snapshot), name="registration-resync")
    snapshot = ctx.snapshot
    tasks.create_task(learn_workload(snapshot.workload, lambda: snapshot.ready), name="workload-learning")


async def keep_synced(ctx: Context) -> None:
    """The same tasks in a group of their own, until cancelled (a service embedded in another loop,
    such as the tests' extender); then the background writes they started are drained."""
    try:
        async with asyncio.TaskGroup() as tasks:
            start_sync(ctx, tasks)
    finally:
        await ctx.background.drain()
