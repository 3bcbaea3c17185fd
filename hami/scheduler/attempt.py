"""One bind attempt: its deadline, what it took, how a re-read pod is judged, and the undo.

Owns :class:`Deadline` (kube-scheduler stops waiting for ``/bind`` after its extender ``httpTimeout``,
``--bind-timeout``: measured from the request's arrival on the context's monotonic ``ticker``),
:class:`Attempt` (the node lock it holds, its booking, the annotations its allocation patch carries),
:func:`judge` (pure: may this bind write to the pod as just read?) and the give-back paths:
:func:`abandon` before the allocation patch was sent, :func:`undo` after it. Every undo write is a
JSON patch whose ``test`` ops check the values this attempt wrote (or, when its patch may still
land, the pod exactly as re-read, so that the late patch's own tests then fail); the lock is released
only while it still carries this attempt's value. A pod found bound to this node with this attempt's
grant keeps everything (the bind succeeded whatever the answer said); a pod that cannot be re-read
keeps its lock and annotations (its Binding may have happened). Must not import the Kubernetes client
(only ``hami.kube``) or aiohttp.
"""

from __future__ import annotations

import datetime
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Any

from hami import objects
from hami.annotations import (
    POD_BIND_PHASE,
    POD_BIND_TIME,
    POD_DEVICES_ALLOCATED,
    POD_VGPU_NODE,
    BindPhase,
    bind_annotations,
)
from hami.annotations.holding import allocating_until
from hami.kube.client import KubeError, NotFound
from hami.kube.nodelock import CAS_ATTEMPTS, LockGrant, release_node_lock
from hami.kube.pods import (
    get_pod,
    json_patch_pod,
    pointer,
    unchanged_tests,
    value_tests,
    write_operations,
)
from hami.objects import RawPod
from hami.scheduler.context import Context

logger = logging.getLogger(__name__)

#: The annotations that say "this allocation is the one this attempt wrote".
OWNERSHIP = (POD_VGPU_NODE, POD_DEVICES_ALLOCATED, POD_BIND_TIME)


class BindFailure(Exception):
    """A bind that cannot proceed for a reason of ours (not an API error); ``result`` is its metric."""

    result = "no_fit"


class DeadlinePassed(BindFailure):
    result = "deadline"


@dataclass(frozen=True, slots=True)
class Deadline:
    """kube-scheduler's deadline for one ``/bind``, on a monotonic clock (seconds)."""

    ticker: Callable[[], float]
    end: float
    seconds: float

    @classmethod
    def start(cls, ticker: Callable[[], float], seconds: float) -> Deadline:
        return cls(ticker=ticker, end=ticker() + seconds, seconds=seconds)

    def remaining(self) -> float:
        return self.end - self.ticker()

    def check(self, before: str) -> None:
        if self.remaining() <= 0:
            raise DeadlinePassed(
                f"kube-scheduler's bind timeout ({self.seconds:g} s) passed before {before}; "
                "nothing more is written"
            )


@dataclass(slots=True, kw_only=True)
class Attempt:
    namespace: str
    name: str
    node: str
    uid: str
    deadline: Deadline
    grant: LockGrant | None = None  # the node lock this attempt holds
    locked_at: datetime.datetime | None = None  # the time of the lock it wrote, or tried to
    not_before: datetime.datetime | None = None  # an earlier attempt's bind-time on the pod
    booked: bool = False
    written: dict[str, str] | None = None  # the annotations of its allocation patch, once sent

    @property
    def key(self) -> tuple[str, str]:
        return self.namespace, self.name

    @property
    def ref(self) -> str:
        return f"{self.namespace}/{self.name}"


# ------------------------------------------------------------------------------- judging a pod


class Verdict(Enum):
    PROCEED = "proceed"  # a pending pod of ours, free to be written
    BOUND_HERE = "already_bound"  # bound to this node with our grant for it: nothing to do
    MISSING = "pod_missing"  # gone or recreated
    REFUSE = "refused"  # not ours to write


def carries(pod: Mapping[str, Any], values: Mapping[str, str]) -> bool:
    """True when the pod's annotations hold every one of ``values``."""
    annotations = objects.annotations(pod)
    return all(annotations.get(key) == value for key, value in values.items())


def ownership(written: Mapping[str, str]) -> dict[str, str]:
    return {key: written[key] for key in OWNERSHIP if key in written}


def judge(
    pod: Mapping[str, Any] | None,
    att: Attempt,
    *,
    scheduler: str,
    now: datetime.datetime,
    horizon: datetime.timedelta,
) -> tuple[Verdict, str]:
    """May this attempt write to ``pod`` (as just read)? The verdict and, unless PROCEED, the reason."""
    if pod is None:
        return Verdict.MISSING, f"pod {att.ref} not found"
    found_uid = objects.uid(pod)
    if att.uid and found_uid and att.uid != found_uid:
        return Verdict.MISSING, f"pod {att.ref} was recreated (uid {found_uid}, not {att.uid}): refused"
    annotations = objects.annotations(pod)
    bound = objects.node_name(pod)
    if bound:
        if (
            bound == att.node
            and annotations.get(POD_VGPU_NODE) == att.node
            and POD_DEVICES_ALLOCATED in annotations
        ):
            return Verdict.BOUND_HERE, f"pod {att.ref} is already bound to node {bound}"
        return Verdict.REFUSE, f"pod {att.ref} is already bound to node {bound}: refused"
    if objects.meta(pod).get("deletionTimestamp"):
        return Verdict.REFUSE, f"pod {att.ref} is being deleted: refused"
    named = objects.scheduler_name(pod) or "default-scheduler"  # the API server's default
    if named != scheduler:
        return Verdict.REFUSE, f"pod {att.ref} names scheduler {named!r}, not {scheduler!r}: refused"
    phase = objects.pod_phase(pod)
    if phase not in ("", "Pending"):  # the API server sets Pending at creation; "" only in simulations
        return Verdict.REFUSE, f"pod {att.ref} is {phase}, not Pending: refused"
    # another attempt's allocation for another node may still be bound there: wait for the horizon.
    # One for this node is re-done under this node's lock (a crashed attempt, kube-scheduler's retry):
    # whichever Binding lands first, the pod ends on this node with the grant its annotations name.
    until = allocating_until(pod, horizon)
    where = annotations.get(POD_VGPU_NODE) or "?"
    if until is not None and until > now and where != att.node:
        return Verdict.REFUSE, (
            f"pod {att.ref} has a bind to node {where} in progress (bind-phase allocating until "
            f"{until.isoformat()}): refused"
        )
    return Verdict.PROCEED, ""


# ------------------------------------------------------------------------------------ give back


class Outcome(Enum):
    BOUND = "bound"  # the pod is bound here with this attempt's grant: a success after all
    UNDONE = "undone"
    UNKNOWN = "unknown"  # the pod could not be read: lock and annotations left as they are


def _cancel(ctx: Context, att: Attempt) -> None:
    if att.booked:
        ctx.snapshot.cancel(att.key)
        att.booked = False


async def release(ctx: Context, att: Attempt) -> None:
    """Release this attempt's node lock, only while it still carries this attempt's value."""
    grant, att.grant = att.grant, None
    if grant is None:
        return
    try:
        await release_node_lock(ctx.api, att.node, att.namespace, att.name, value=grant.value)
    except KubeError as exc:
        logger.warning("releasing the lock of node %s for %s failed: %s", att.node, att.ref, exc)


def failed_at(ctx: Context, att: Attempt) -> datetime.datetime:
    """The ``bind-time`` that goes with ``bind-phase=failed``: now, and never before the lock this
    attempt wrote or tried to write (a lock older than its holder's failure is free to take over)."""
    now = ctx.clock()
    return max(now, att.locked_at) if att.locked_at is not None else now


async def mark_failed(ctx: Context, att: Attempt, pod: Mapping[str, Any]) -> None:
    """Say ``bind-phase=failed`` (and when: ``bind-time``) on a pending pod of ours that this attempt
    never wrote to, only if it is still exactly as read (one compare-and-set, best effort) and the
    deadline has not passed."""
    if att.deadline.remaining() <= 0:
        return
    values = bind_annotations(BindPhase.FAILED, now=failed_at(ctx, att))
    operations = unchanged_tests(pod) + write_operations(pod, annotations=values)
    try:
        await json_patch_pod(ctx.api, att.namespace, att.name, operations, limit=att.deadline.remaining())
    except KubeError as exc:
        logger.info("%s not marked bind-phase=failed (it changed, or the API failed): %s", att.ref, exc)


async def abandon(ctx: Context, att: Attempt, pod: Mapping[str, Any] | None, *, mark: bool) -> None:
    """Give back what an attempt took before its allocation patch was sent: the booking, the lock
    (only while it is this attempt's value); with ``mark`` also :func:`mark_failed`."""
    _cancel(ctx, att)
    await release(ctx, att)
    if mark and pod is not None:
        await mark_failed(ctx, att, pod)


def _undo_operations(ctx: Context, att: Attempt, pod: Mapping[str, Any]) -> list[dict[str, Any]] | None:
    """The conditional patch that undoes this attempt on ``pod`` (as just re-read), None when none is due."""
    assert att.written is not None
    mine = ownership(att.written)
    phase = {"op": "add", "path": pointer("metadata", "annotations", POD_BIND_PHASE), "value": "failed"}
    if carries(pod, mine):
        return [*value_tests(pod, mine), phase]
    if objects.node_name(pod):
        return None  # bound without our grant: nothing of ours on it
    until = allocating_until(pod, ctx.settings.allocating_horizon)
    if until is not None and until > ctx.clock():
        return None  # another attempt's allocation is in flight: not ours to touch
    # our patch may still land: change what it tests, so that it cannot apply any more
    values = {POD_BIND_PHASE: BindPhase.FAILED.value, POD_BIND_TIME: att.written[POD_BIND_TIME]}
    return unchanged_tests(pod) + write_operations(pod, annotations=values)


async def undo(ctx: Context, att: Attempt) -> Outcome:
    """After the allocation patch was sent and something failed: re-read the pod, then give back."""
    assert att.written is not None
    for _ in range(CAS_ATTEMPTS):
        try:
            pod: RawPod | None = await get_pod(ctx.api, att.namespace, att.name)
        except NotFound:
            pod = None
        except KubeError as exc:
            logger.warning("%s: cannot re-read the pod (%s); its lock and annotations are kept", att.ref, exc)
            _cancel(ctx, att)
            return Outcome.UNKNOWN
        uid = objects.uid(pod)
        if pod is None or (att.uid and uid and uid != att.uid):
            _cancel(ctx, att)
            await release(ctx, att)
            return Outcome.UNDONE
        bound = objects.node_name(pod)
        if bound == att.node and carries(pod, ownership(att.written)):
            return Outcome.BOUND
        if bound == att.node:
            _cancel(ctx, att)  # bound here by someone else: the node agent allocates it and frees the lock
            return Outcome.UNDONE
        operations = _undo_operations(ctx, att, pod)
        if operations is not None:
            try:
                await json_patch_pod(ctx.api, att.namespace, att.name, operations)
            except KubeError as exc:
                logger.info("%s: undo did not apply (%s); reading the pod again", att.ref, exc)
                continue
        _cancel(ctx, att)
        await release(ctx, att)
        return Outcome.UNDONE
    _cancel(ctx, att)
    logger.warning("%s: the pod kept changing under the undo; its lock and annotations are kept", att.ref)
    return Outcome.UNKNOWN
