"""ENTRY POINT of ``hami scheduler``: the service wired in one place, every loop a named task.

Owns ``add_arguments(parser)`` and ``run(args) -> int`` (registered in ``hami/cli.py``): flags ->
settings -> logging -> API client (asked once: a wrong server is one line and exit 2) ->
:func:`build_context` -> :func:`serve` until SIGTERM/SIGINT. :func:`build_context` builds every
collaborator once, in order, and passes it down (nothing in module globals, no closures): the
background :class:`~hami.process.tasks.TaskSet`, the metrics, the registration writes
(:mod:`hami.scheduler.registration`), the snapshot wired to both, the :class:`Context`, and
(``--wake-pending``) the :class:`~hami.scheduler.wakeup.WakeUp` the snapshot tells of freed cards.
:func:`serve` runs the named tasks: ``listeners`` (the verbs on ``--listen``, loopback by default, plain
HTTP unless ``--tls-cert``/``--tls-key``; probes and metrics on ``--metrics-listen``),
``watch-nodes``, ``watch-pods``, ``watch-resourcequotas``, ``watch-poddisruptionbudgets``,
``registration-resync`` and ``workload-learning`` (:mod:`hami.scheduler.watches`); on the way out the
background writes are drained. Process set-up (logging, one-line errors, signals) is the shared
:mod:`hami.process.entry`.
Must not import the Kubernetes client (only ``hami.kube``).
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import logging
import ssl
from collections.abc import Callable, Iterable

from hami import objects
from hami.annotations import POD_WAKE_UP
from hami.core.allocate import allocate
from hami.core.model import NodeState, PodRequest
from hami.kube.client import KubeError, NotFound
from hami.kube.events import EventRecorder
from hami.kube.pods import get_pod, json_patch_pod, pointer, value_tests, write_operations
from hami.kube.protocol import KubeApi
from hami.process.entry import FAILED, configure_logging, reachable_api, refuse, until_signalled
from hami.process.tasks import TaskSet
from hami.scheduler import config
from hami.scheduler.app import Listeners, serving
from hami.scheduler.context import Context, utc_now
from hami.scheduler.metrics import Metrics, NodeSource
from hami.scheduler.nominations import NominationBook, Nominations
from hami.scheduler.quotas import QuotaBook
from hami.scheduler.registration import Registration
from hami.scheduler.snapshot import Snapshot, local_time
from hami.scheduler.wakeup import PodKey, WakeUp
from hami.scheduler.watches import start_sync
from hami.scheduler.workload import Workload
from hami.settings import ConfigError

logger = logging.getLogger(__name__)

PROGRAM = "hami scheduler"
#: Background API calls (Events, handshakes) at once, and held at most (more are dropped, logged).
BACKGROUND_CONCURRENCY = 16
BACKGROUND_LIMIT = 1024


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The service's flags (:data:`hami.scheduler.config.FLAGS`), env fallbacks from ``os.environ``."""
    config.add_arguments(parser)


def build_context(
    settings: config.SchedulerSettings,
    api: KubeApi,
    *,
    clock: Callable[[], datetime.datetime] = utc_now,
) -> Context:
    """Every collaborator of the service, built once and wired: the snapshot reports to the
    registration writes and the lock metric, the metrics read the snapshot."""
    background = TaskSet(
        concurrency=BACKGROUND_CONCURRENCY, limit=BACKGROUND_LIMIT, expected=(KubeError,), logger=logger
    )
    metrics = Metrics()
    registration = Registration(
        api=api,
        component=settings.scheduler_name,
        background=background,
        clock=clock,
        resync_seconds=settings.resync_seconds,
    )
    resources = settings.device_config.resources
    snapshot = Snapshot(
        count_resource=resources.count,
        handshake_window=settings.handshake_window,
        on_malformed=registration.report_malformed,
        on_enforcement=registration.report_enforcement,
        on_handshake=registration.request_handshake,
        on_lock=metrics.lock_holds.seen,
        quotas=QuotaBook(
            memory_resource=resources.memory,
            cores_resource=resources.cores,
            memory_factor=settings.device_config.effective_memory_factor,
        ),
        clock=clock,
        allocating_horizon=settings.allocating_horizon,
        workload=Workload(
            device_config=settings.device_config,
            half_life=settings.fragmentation_half_life,
            min_pods=settings.fragmentation_min_pods,
            fallback=settings.fragmentation_fallback,
        ),
        nominations=NominationBook(
            Nominations(
                scheduler_name=settings.scheduler_name,
                device_config=settings.device_config,
                policy=settings.policy,
            )
        ),
    )
    metrics.attach(_node_source(snapshot, clock), snapshot.tracked_count)
    ctx = Context(
        settings=settings,
        api=api,
        snapshot=snapshot,
        metrics=metrics,
        background=background,
        registration=registration,
        clock=clock,
    )
    if settings.wake_pending:
        ctx.wakeup = _wakeup(ctx)
        snapshot.on_freed = ctx.wakeup.freed
    return ctx


def _wakeup(ctx: Context) -> WakeUp:
    """The wake-up (docs/scheduler.md, "Waking pending pods"): filter's own decision on the live view
    says whether a pod fits a node now; a wake is a JSON patch of one annotation guarded by the pod's uid,
    in the background."""
    snapshot, policy = ctx.snapshot, ctx.settings.policy

    def fits(request: PodRequest, priority: int, node: str) -> bool:
        if not snapshot.ready:
            return False
        key = (request.namespace, request.name)
        found = snapshot.candidate(node, local_time(ctx.clock()), exclude=key, priority=priority)
        if not isinstance(found, NodeState):
            return False
        quotas = snapshot.quotas_for(request.namespace, exclude=key)
        return allocate(request, [found], policy, quotas=quotas).fits(node)

    async def write(namespace: str, name: str, uid: str, value: str) -> None:
        # only the pod /filter rejected: one deleted and created again under its name is not touched
        guard = [{"op": "test", "path": "/metadata/uid", "value": uid}]
        add = {"op": "add", "path": pointer("metadata", "annotations", POD_WAKE_UP), "value": value}
        try:
            await json_patch_pod(ctx.api, namespace, name, [*guard, add])
            return
        except NotFound:
            return
        except KubeError:
            pass  # another uid, or no annotations map to add to: read the pod to tell
        try:
            pod = await get_pod(ctx.api, namespace, name)
        except NotFound:
            return
        if objects.uid(pod) != uid:
            return
        operations = write_operations(pod, annotations={POD_WAKE_UP: value})
        await json_patch_pod(ctx.api, namespace, name, [*value_tests(pod, {}), *operations])

    def wake(key: PodKey, uid: str, value: str) -> None:
        ctx.background.spawn(write(*key, uid, value), f"wake the pending pod {key[0]}/{key[1]}")

    return WakeUp(fits=fits, wake=wake, ticker=ctx.ticker)


def _node_source(snapshot: Snapshot, clock: Callable[[], datetime.datetime]) -> NodeSource:
    """What the metrics read on each scrape: every node, its state, and why it is excluded if it is."""

    def nodes() -> Iterable[tuple[str, NodeState | None, str | None]]:
        local_now = local_time(clock())
        return [(e.name, e.state, snapshot.problem(e.name, local_now)) for e in snapshot.entries()]

    return nodes


async def serve(
    ctx: Context,
    *,
    ssl_context: ssl.SSLContext | None = None,
    recorder: EventRecorder | None = None,
    on_listening: Callable[[Listeners], None] | None = None,
) -> None:
    """Run the service until cancelled (or a listener cannot bind: ``OSError``), each loop a named
    task; then drain the background writes. ``on_listening`` is told the bound addresses."""

    async def listen() -> None:
        async with serving(ctx, ssl_context=ssl_context, recorder=recorder) as listeners:
            logger.info(
                "%s %s: verbs on %s:%d (%s), probes and metrics on %s:%d",
                PROGRAM,
                ctx.settings.scheduler_name,
                *listeners.verbs,
                "https" if ssl_context else "http",
                *listeners.metrics,
            )
            if on_listening is not None:
                on_listening(listeners)
            await asyncio.Event().wait()

    try:
        async with asyncio.TaskGroup() as tasks:
            tasks.create_task(listen(), name="listeners")
            start_sync(ctx, tasks)
    finally:
        if ctx.wakeup is not None:
            ctx.wakeup.close()
        await ctx.background.drain()


def run(args: argparse.Namespace) -> int:
    try:
        settings = config.from_args(args)
    except ConfigError as exc:
        return refuse(PROGRAM, exc)
    configure_logging(settings.log_level)
    try:
        api = reachable_api(
            settings.kubeconfig, component="hami-scheduler", request_timeout=settings.api_timeout
        )
    except KubeError as exc:
        return refuse(PROGRAM, exc)
    failure: OSError | None = None
    try:
        ssl_context = None
        if settings.tls_cert and settings.tls_key:
            ssl_context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
            ssl_context.load_cert_chain(settings.tls_cert, settings.tls_key)
        asyncio.run(until_signalled(serve(build_context(settings, api), ssl_context=ssl_context)))
    except* OSError as group:  # an address in use or not available, an unreadable certificate
        failure = next(e for e in group.exceptions if isinstance(e, OSError))
    finally:
        api.close()
    if failure is not None:
        return refuse(PROGRAM, f"cannot serve: {failure}", FAILED)
    return 0
