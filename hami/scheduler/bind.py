"""``POST /bind``: the only scheduler step that writes (spec-scheduler §16, architecture rule 7).

Writes only to a pending pod of ours (:func:`hami.scheduler.attempt.judge`): a pod already bound,
naming another scheduler (GPU-less ones included), not Pending, being deleted, recreated, or with
another bind of it in flight is refused and never written to (no Event either); a pod already bound
to this node with our grant for it is a success without a write (kube-scheduler retrying after a lost
answer). A second bind of a pod while one is in progress in this process is refused.

Order for a GPU pod: read the pod; fail fast when it cannot fit (no lock taken); take the node lock
(compare-and-set, ``hami.kube.nodelock``; every pod with a GPU request, init-only ones included) —
waiting for a busy lock happens outside the node's decision queue, in a per-node line of waiters of
which only the head polls, up to ``--node-lock-wait`` (PodGroup members ``--node-lock-retry-timeout``)
and never past the deadline; re-read the pod and judge it again; inside the node's queue decide the
cards with the core's ``fit_node`` on the snapshot and book them at once; one JSON patch that applies
only to the pod as re-read (uid, resourceVersion, annotation and label maps tested) writes the device
lists, ``vgpu-node`` annotation and label, ``vgpu-time``, ``bind-phase=allocating``, ``bind-time``
and MIG reservations; create the Binding. Before every write the remaining time of kube-scheduler's
deadline (``--bind-timeout`` from the request's arrival) is checked, and every write's own timeout is
cut to it; past it, the attempt gives back what it took and answers an error.

A failed write whose outcome is unknown (5xx, timeout, reset) or a refused Binding leads to a re-read
before anything is undone (:func:`hami.scheduler.attempt.undo`): a pod bound here with our grant is a
success (booking and lock kept); anything else is undone with conditional writes. Success: a
``BindingSucceed`` Event; the lock stays for the node agent to release after Allocate. Failure: a
``BindingFailed`` Warning Event (the error and what to do about it) and the error in the reply. Each
outcome is counted (``hami_scheduler_binds_total{result}``), each lock takeover by its reason, and
every acquired lock is handed to the hold-time metric. Must not import the Kubernetes client (only
``hami.kube``) or aiohttp.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import logging
from collections.abc import Callable, Mapping
from typing import Any

from hami.annotations import (
    POD_BIND_PHASE,
    POD_DEVICES_ALLOCATED,
    POD_GROUP_LABEL,
    POD_VGPU_NODE,
    AnnotationError,
    BindPhase,
    allocation_annotations,
    bind_annotations,
    read_bind_time,
    read_pod_request,
)
from hami.core.allocate import fit_node
from hami.core.model import Allocation, PodRequest
from hami.core.usage import pod_usage
from hami.kube.client import KubeError, NotFound
from hami.kube.nodelock import LockGrant, NodeLockBusy, take_node_lock
from hami.kube.pods import bind_pod, get_pod, json_patch_pod, unchanged_tests, write_operations
from hami.scheduler.attempt import (
    Attempt,
    BindFailure,
    Deadline,
    Outcome,
    Verdict,
    abandon,
    carries,
    judge,
    ownership,
    release,
    undo,
)
from hami.scheduler.context import Context
from hami.scheduler.snapshot import PodRecord, local_time
from hami.scheduler.wire import ExtenderBindingArgs, ExtenderBindingResult

logger = logging.getLogger(__name__)


async def handle_bind(ctx: Context, args: ExtenderBindingArgs) -> ExtenderBindingResult:
    att = Attempt(
        namespace=args["PodNamespace"],
        name=args["PodName"],
        node=args["Node"],
        uid=args["PodUID"],
        deadline=Deadline.start(ctx.ticker, ctx.settings.bind_timeout),
    )
    if att.key in ctx.binding:
        return _refused(ctx, att, f"pod {att.ref} has a bind in progress here: refused", "refused")
    ctx.binding.add(att.key)
    try:
        return await _bind(ctx, att)
    finally:
        ctx.binding.discard(att.key)


async def _read(ctx: Context, att: Attempt) -> dict[str, Any] | None:
    try:
        return await get_pod(ctx.api, att.namespace, att.name, limit=max(att.deadline.remaining(), 1.0))
    except NotFound:
        return None


def _judge(ctx: Context, att: Attempt, pod: Mapping[str, Any] | None) -> tuple[Verdict, str]:
    return judge(
        pod,
        att,
        scheduler=ctx.settings.scheduler_name,
        now=ctx.clock(),
        horizon=ctx.settings.allocating_horizon,
    )


async def _bind(ctx: Context, att: Attempt) -> ExtenderBindingResult:
    try:
        pod = await _read(ctx, att)
    except KubeError as exc:
        return _refused(ctx, att, f"reading pod {att.ref}: {exc}", "api_error")
    verdict, why = _judge(ctx, att, pod)
    if verdict is Verdict.BOUND_HERE:
        return _already_bound(ctx, att, why)
    if verdict is not Verdict.PROCEED or pod is None:
        return _refused(ctx, att, why, verdict.value)
    att.not_before = _bind_time(pod)
    try:
        request = read_pod_request(pod, ctx.settings.device_config)
    except AnnotationError as exc:
        return _failed(ctx, pod, att.node, str(exc), "invalid")
    if not request.has_devices:
        return await _bind_plain(ctx, att, pod)
    try:
        _decide(ctx, request, att.node, att.key)  # fail fast, without locking, when it cannot fit anyway
        att.grant = await _acquire(ctx, att, request, wait=lock_wait(ctx, pod))
    except (KubeError, BindFailure) as exc:
        await abandon(ctx, att, pod, mark=True)
        return _failed(ctx, pod, att.node, str(exc), _result_of(exc))
    _count_grant(ctx, att.node, att.grant)
    try:
        return await _allocate(ctx, att, request)
    except (KubeError, BindFailure) as exc:
        if att.written is None:
            await abandon(ctx, att, pod, mark=isinstance(exc, BindFailure))
            return _failed(ctx, pod, att.node, str(exc), _result_of(exc))
        if await undo(ctx, att) is Outcome.BOUND:
            return _succeeded(ctx, pod, att.node)
        return _failed(ctx, pod, att.node, str(exc), _result_of(exc))


async def _allocate(ctx: Context, att: Attempt, request: PodRequest) -> ExtenderBindingResult:
    """With the lock held: re-read, judge, decide and book, patch, bind. Raises on failure; the caller
    gives back (before the patch was sent) or undoes (after)."""
    pod = await _read(ctx, att)
    verdict, why = _judge(ctx, att, pod)
    if verdict is not Verdict.PROCEED or pod is None:
        if att.grant is not None and not att.grant.written:
            att.grant = None  # not taken by this attempt: left as it is
        allocating = pod is not None and carries(pod, {POD_BIND_PHASE: BindPhase.ALLOCATING.value})
        if verdict is not Verdict.BOUND_HERE or not allocating:
            await release(ctx, att)  # else the node agent, still to allocate it, releases it
        if verdict is Verdict.BOUND_HERE:
            return _already_bound(ctx, att, why)
        return _refused(ctx, att, why, verdict.value)
    att.deadline.check("deciding the cards")
    async with ctx.node_queue(att.node):
        # decide and book with no await in between: the next bind on this loop sees the booking
        now = max(_after(ctx.clock(), _bind_time(pod)), att.locked_at or ctx.clock())
        decision = _decide(ctx, request, att.node, att.key)
        annotations = allocation_annotations(
            node=att.node, devices=decision.devices, mig=decision.mig, now=now
        )
        usage = pod_usage(decision.devices, request.init_count, init_done=False, mig=decision.mig)
        record = PodRecord(node=att.node, usage=usage, allocated=annotations[POD_DEVICES_ALLOCATED])
        ctx.snapshot.book(att.key, record)
        att.booked = True
    annotations.update(bind_annotations(BindPhase.ALLOCATING, now=now))
    await _patch(ctx, att, pod, annotations)
    att.deadline.check("creating the Binding")
    await bind_pod(
        ctx.api, att.namespace, att.name, att.node, att.uid or None, limit=att.deadline.remaining()
    )
    return _succeeded(ctx, pod, att.node)


def _bind_time(pod: Mapping[str, Any]) -> datetime.datetime | None:
    """The ``bind-time`` an earlier attempt left on the pod, when readable."""
    try:
        return read_bind_time(pod)
    except AnnotationError:
        return None


async def _patch(ctx: Context, att: Attempt, pod: Mapping[str, Any], annotations: dict[str, str]) -> None:
    """Write the allocation with a compare-and-set on the pod as read; an unknown outcome is re-read
    (our values there: it landed), a lost race re-judged and retried while the deadline allows."""
    for _ in range(3):
        att.deadline.check("writing the allocation")
        operations = unchanged_tests(pod) + write_operations(
            pod, annotations=annotations, labels={POD_VGPU_NODE: att.node}
        )
        att.written = dict(annotations)
        try:
            await json_patch_pod(ctx.api, att.namespace, att.name, operations, limit=att.deadline.remaining())
            return
        except KubeError as exc:
            logger.info("%s: allocation patch not confirmed (%s); reading the pod again", att.ref, exc)
            error = exc
        fresh = await _read(ctx, att)
        if fresh is not None and carries(fresh, ownership(annotations)):
            return  # it landed; only the answer was lost
        verdict, why = _judge(ctx, att, fresh)
        if verdict is not Verdict.PROCEED or fresh is None:
            raise BindFailure(why)
        pod = fresh
    raise error


async def _bind_plain(ctx: Context, att: Attempt, pod: dict[str, Any]) -> ExtenderBindingResult:
    """A pod without GPU requests: only the Binding (kube-scheduler delegates every bind to us)."""
    try:
        att.deadline.check("creating the Binding")
        await bind_pod(
            ctx.api, att.namespace, att.name, att.node, att.uid or None, limit=att.deadline.remaining()
        )
    except BindFailure as exc:
        return _failed(ctx, pod, att.node, str(exc), exc.result)
    except KubeError as exc:
        with contextlib.suppress(KubeError):
            fresh = await get_pod(ctx.api, att.namespace, att.name)
            if (fresh.get("spec") or {}).get("nodeName") == att.node:
                return _succeeded(ctx, pod, att.node)  # applied; only the answer was lost
        return _failed(ctx, pod, att.node, f"binding {att.ref} to {att.node}: {exc}", "api_error")
    return _succeeded(ctx, pod, att.node)


def locks_node(request: PodRequest) -> bool:
    """Every pod with a GPU request takes the node lock, init-only ones included (HAMi skips the lock
    when only init containers ask for cards; the node agent then cannot pair its grant safely)."""
    return request.has_devices


def is_group_member(pod: Mapping[str, Any]) -> bool:
    """A PodGroup member: label ``scheduling.x-k8s.io/pod-group`` with a non-empty value."""
    labels = (pod.get("metadata") or {}).get("labels") or {}
    return bool(labels.get(POD_GROUP_LABEL))


def lock_wait(ctx: Context, pod: Mapping[str, Any]) -> float:
    """Seconds this pod's bind waits for a busy node lock: ``--node-lock-wait``, or for a PodGroup
    member the longer of that and ``--node-lock-retry-timeout`` (a group waits for its siblings)."""
    if is_group_member(pod):
        return max(ctx.settings.node_lock_wait, ctx.settings.node_lock_retry_timeout)
    return ctx.settings.node_lock_wait


async def _take(ctx: Context, att: Attempt) -> LockGrant:
    """One try at the lock. Its time never repeats an earlier lock of this pod here, nor comes before
    an earlier attempt's bind-time: a lock this pod already holds is re-taken with the new time."""
    att.deadline.check("taking the node lock")
    floors = [t for t in (ctx.lock_stamps.get((att.node, *att.key)), att.not_before) if t is not None]
    now = _after(ctx.clock(), max(floors) if floors else None)
    att.locked_at = now.replace(microsecond=0)
    grant = await take_node_lock(
        ctx.api,
        att.node,
        att.namespace,
        att.name,
        now=now,
        expiry=ctx.settings.node_lock_timeout,
        refresh=True,
    )
    if grant.written:
        if len(ctx.lock_stamps) >= 4096:  # bounded: the oldest entries go first
            ctx.lock_stamps.pop(next(iter(ctx.lock_stamps)))
        ctx.lock_stamps[(att.node, *att.key)] = now.replace(microsecond=0)
    return grant


_SKEW = datetime.timedelta(minutes=1)


def _after(now: datetime.datetime, previous: datetime.datetime | None) -> datetime.datetime:
    """``now``, or one second after ``previous`` when ``now`` falls in the same second or earlier.

    Lock values and ``bind-time`` have whole seconds; two attempts of one pod within one second would
    write identical values, and a delayed conditional write of the first (a release, an undo) would
    then match the second. A value that never repeats cannot be matched by a stale write."""
    if previous is not None and now.replace(microsecond=0) <= previous <= now + _SKEW:
        return previous + datetime.timedelta(seconds=1)
    return now  # (a time further ahead than clocks can drift is not followed)


async def _acquire(ctx: Context, att: Attempt, request: PodRequest, *, wait: float) -> LockGrant:
    """Take the node lock; while another pod holds it, wait up to ``wait`` seconds (never past the
    deadline), outside the node's decision queue.

    One try at once (a re-entrant or free lock never waits behind others); then the bind joins the
    node's line of waiters. The head of the line tries again whenever the node watch shows the lock
    annotation change, and at least every second (a holder pod that was deleted or moved does not
    change the annotation), each time first checking that the pod still fits (a full node fails the
    waiters without taking the lock); 0 fails at once, as HAMi does for pods outside a PodGroup.
    """
    try:
        return await _take(ctx, att)
    except NodeLockBusy:
        if wait <= 0:
            raise
    end = min(ctx.ticker() + wait, att.deadline.end)
    line = ctx.lock_line(att.node)
    if not await _join(line, lambda: end - ctx.ticker()):
        return await _take(ctx, att)  # a last try: the answer names the holder
    try:
        while True:
            change = ctx.snapshot.lock_change(att.node)  # registered before reading: no change is missed
            try:
                _decide(ctx, request, att.node, att.key)
                return await _take(ctx, att)
            except NodeLockBusy:
                remaining = end - ctx.ticker()
                if remaining <= 0:
                    att.deadline.check("taking the node lock")  # which ran out: the deadline, or the wait
                    raise
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(change, timeout=min(remaining, 1.0))
            finally:
                change.cancel()
    finally:
        line.release()


async def _join(line: asyncio.Lock, remaining: Callable[[], float]) -> bool:
    """Wait for the head of ``line`` while ``remaining()`` (seconds, on the context's ticker) is
    positive; True once it is ours (the caller releases it)."""
    turn = asyncio.ensure_future(line.acquire())
    ours = False
    try:
        while not turn.done():
            left = remaining()
            if left <= 0:
                break
            await asyncio.wait({turn}, timeout=min(left, 1.0))
        ours = turn.done() and not turn.cancelled()
        return ours
    finally:
        if not ours:
            if turn.done() and not turn.cancelled():
                line.release()  # granted while we were being cancelled
            else:
                turn.cancel()


def _count_grant(ctx: Context, node: str, grant: LockGrant) -> None:
    ctx.metrics.lock_holds.acquired(node, grant.value, ctx.snapshot.lock_of(node))
    if grant.takeover is not None:
        ctx.metrics.lock_takeovers.labels(grant.takeover).inc()


def _decide(ctx: Context, request: PodRequest, node: str, key: tuple[str, str]) -> Allocation:
    """The pod's allocation on ``node`` now (its own current booking left out), or BindFailure."""
    found = ctx.snapshot.candidate(node, local_time(ctx.clock()), exclude=key)
    if isinstance(found, str):
        raise BindFailure(found)
    quotas = ctx.snapshot.quotas_for(request.namespace, exclude=key)
    decision = fit_node(request, found, ctx.settings.policy, quotas=quotas, now=ctx.clock())
    if not isinstance(decision, Allocation):
        raise BindFailure(f"pod {key[0]}/{key[1]} does not fit node {node}: {decision.message}")
    return decision


#: What a person can do about each kind of failed bind (appended to the ``BindingFailed`` Event).
ADVICE = {
    "lock_busy": "kube-scheduler retries the pod; the lock goes once that pod's GPUs are allocated by "
    "the node agent, or after --node-lock-timeout if the agent never does (check hami-monitor there)",
    "no_fit": "the node changed since filtering; kube-scheduler retries the pod on the nodes that fit",
    "deadline": "kube-scheduler gave up waiting for this bind and retries the pod; if this repeats, "
    "check the API server's latency and --bind-timeout against the extender's httpTimeout",
    "api_error": "kube-scheduler retries the pod; if this repeats, check the API server and the "
    "scheduler's permissions (pods patch, pods/binding create, nodes patch)",
    "invalid": "fix the value named above and recreate the pod",
}


def _result_of(exc: Exception) -> str:
    if isinstance(exc, NodeLockBusy):
        return "lock_busy"
    return exc.result if isinstance(exc, BindFailure) else "api_error"


def _refused(ctx: Context, att: Attempt, message: str, result: str) -> ExtenderBindingResult:
    """Nothing was written, and no Event either: the pod may not be ours (nor the caller kube-scheduler)."""
    logger.info("bind of %s to %s refused: %s", att.ref, att.node, message)
    ctx.metrics.bound(result)
    return ExtenderBindingResult(Error=message)


def _already_bound(ctx: Context, att: Attempt, message: str) -> ExtenderBindingResult:
    logger.info("bind of %s to %s: %s with our grant; nothing to write", att.ref, att.node, message)
    ctx.metrics.bound("already_bound")
    return ExtenderBindingResult(Error="")


def _failed(ctx: Context, pod: dict[str, Any], node: str, message: str, result: str) -> ExtenderBindingResult:
    logger.info("bind to %s failed: %s", node, message)
    ctx.metrics.bound(result)
    advice = ADVICE.get(result)
    ctx.event(pod, "BindingFailed", f"{message}. {advice}" if advice else message, warning=True)
    return ExtenderBindingResult(Error=message)


def _succeeded(ctx: Context, pod: dict[str, Any], node: str) -> ExtenderBindingResult:
    metadata = pod.get("metadata") or {}
    message = f"Successfully binding node [{node}] to {metadata.get('namespace')}/{metadata.get('name')}"
    ctx.metrics.bound("success")
    ctx.event(pod, "BindingSucceed", message)
    return ExtenderBindingResult(Error="")
