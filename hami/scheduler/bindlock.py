"""Waiting for and taking the node lock for one bind attempt (``hami.scheduler.bind``'s step 3).

Owns which binds lock (every pod with a GPU request, init-only ones included: :func:`locks_node`),
how long they wait (:func:`lock_wait`: ``--node-lock-wait``, PodGroup members
``--node-lock-retry-timeout``, never past the attempt's deadline), the wait itself (:func:`acquire`: one
try at once, then the node's line of waiters in which only the head asks the API server, woken by the
node watch and at least every second, outside the node's decision queue), the lock's time (:func:`after`:
never a repeat of an earlier lock or ``bind-time`` of the same pod, so that a delayed conditional write
of an earlier attempt cannot match a later one) and the lock metrics (:func:`count_grant`). Must not
import the Kubernetes client (only ``hami.kube``) or aiohttp.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
from collections.abc import Callable, Mapping
from typing import Any

from hami import objects
from hami.annotations import POD_GROUP_LABEL, AnnotationError, decode_node_lock
from hami.core.model import PodRequest
from hami.kube.nodelock import LockGrant, NodeLockBusy, take_node_lock
from hami.objects import RawNode
from hami.scheduler.attempt import Attempt
from hami.scheduler.context import Context


def locks_node(request: PodRequest) -> bool:
    """Every pod with a GPU request takes the node lock, init-only ones included (HAMi skips the lock
    when only init containers ask for cards; the node agent then cannot pair its grant safely)."""
    return request.has_devices


def is_group_member(pod: Mapping[str, Any]) -> bool:
    """A PodGroup member: label ``scheduling.x-k8s.io/pod-group`` with a non-empty value."""
    return bool(objects.labels(pod).get(POD_GROUP_LABEL))


def lock_wait(ctx: Context, pod: Mapping[str, Any]) -> float:
    """Seconds this pod's bind waits for a busy node lock: ``--node-lock-wait``, or for a PodGroup
    member the longer of that and ``--node-lock-retry-timeout`` (a group waits for its siblings)."""
    if is_group_member(pod):
        return max(ctx.settings.node_lock_wait, ctx.settings.node_lock_retry_timeout)
    return ctx.settings.node_lock_wait


async def take(ctx: Context, att: Attempt, read: RawNode | None = None) -> LockGrant:
    """One try at the lock. Its time never repeats an earlier lock of this pod here, nor comes before
    an earlier attempt's bind-time: a lock this pod already holds is re-taken with the new time.
    ``read``: the Node as the bind has just read it (decided on instead of reading it again)."""
    att.deadline.check("taking the node lock")
    floors = [t for t in (ctx.binds.last_lock(att.node, att.key), att.not_before) if t is not None]
    now = after(ctx.clock(), max(floors) if floors else None)
    att.locked_at = now.replace(microsecond=0)
    grant = await take_node_lock(
        ctx.api,
        att.node,
        att.namespace,
        att.name,
        now=now,
        expiry=ctx.settings.node_lock_timeout,
        refresh=True,
        bind_timeout=datetime.timedelta(seconds=ctx.settings.bind_timeout),
        read=read,
    )
    if grant.written:
        ctx.binds.stamp(att.node, att.key, now.replace(microsecond=0))
    return grant


_SKEW = datetime.timedelta(minutes=1)


def after(now: datetime.datetime, previous: datetime.datetime | None) -> datetime.datetime:
    """``now``, or one second after ``previous`` when ``now`` falls in the same second or earlier.

    Lock values and ``bind-time`` have whole seconds; two attempts of one pod within one second would
    write identical values, and a delayed conditional write of the first (a release, an undo) would
    then match the second. A value that never repeats cannot be matched by a stale write."""
    if previous is not None and now.replace(microsecond=0) <= previous <= now + _SKEW:
        return previous + datetime.timedelta(seconds=1)
    return now  # (a time further ahead than clocks can drift is not followed)


async def acquire(
    ctx: Context, att: Attempt, fits: Callable[[], object], *, wait: float, read: RawNode | None = None
) -> LockGrant:
    """Take the node lock; while another pod holds it, wait up to ``wait`` seconds (never past the
    deadline), outside the node's decision queue. ``read``: the Node as the bind has just read it, which
    the first try, when made at once, decides on instead of reading it again (a later try reads).

    One try at once (a re-entrant or free lock never waits behind others; a bind that may wait skips
    it when the node watch already shows another pod's lock); then the bind joins the node's line of
    waiters. The head of the line tries again whenever the node watch shows the lock annotation
    change, and at least every second (a holder pod that was deleted or moved does not change the
    annotation), each time first checking that the pod still fits (a full node fails the waiters
    without taking the lock); 0 fails at once, as HAMi does for pods outside a PodGroup.
    """
    if wait <= 0 or not _held_by_another(ctx.snapshot.lock_of(att.node), att):
        try:
            return await take(ctx, att, read)
        except NodeLockBusy:
            if wait <= 0:
                raise
    end = min(ctx.ticker() + wait, att.deadline.end)
    line = ctx.binds.line(att.node)
    if not await _join(line, lambda: end - ctx.ticker()):
        return await take(ctx, att)  # a last try: the answer names the holder
    try:
        while True:
            change = ctx.snapshot.lock_change(att.node)  # registered before reading: no change is missed
            try:
                fits()  # raises when the pod no longer fits the node
                return await take(ctx, att)
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


def _held_by_another(shown: str | None, att: Attempt) -> bool:
    """The node watch shows a readable lock of another pod (an unreadable one is left to the API)."""
    if not shown:
        return False
    try:
        owner = decode_node_lock(shown)
    except AnnotationError:
        return False
    return owner.namespace is not None and (owner.namespace, owner.name) != att.key


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


def count_grant(ctx: Context, node: str, grant: LockGrant) -> None:
    ctx.metrics.lock_holds.acquired(node, grant.value, ctx.snapshot.lock_of(node))
    if grant.takeover is not None:
        ctx.metrics.lock_takeovers.labels(grant.takeover).inc()
