"""``POST /bind``: the only scheduler step that writes (docs/protocol.md, "Node lock", architecture rule 7).

Writes only to a pending pod of ours (:func:`hami.scheduler.attempt.judge`): a pod already bound,
naming another scheduler (GPU-less ones included), not Pending, being deleted, recreated, or with
another bind of it in flight is refused and never written to (no Event either); a pod already bound
to this node with our grant for it is a success without a write (kube-scheduler retrying after a lost
answer). A second bind of a pod while one is in progress in this process is refused. A GPU bind counts
on its node from its start (when the pod's kept cycle asks for GPUs, else once the pod is read) until
it answers (``BindCoordination.locking``): ``/prioritize`` ranks that node below the free ones for the
other pods meanwhile, before the node watch shows its lock (docs/scheduler.md, "What each step does").

The pod's request comes from its scheduling cycle (:mod:`hami.scheduler.cycle`): the one filter read when
the pod read here is the same version, else read from this version; the cycle ends when the bind
succeeds. Order for a GPU pod: read the pod; fail fast when it cannot fit (no lock taken; skipped when
filter found it fits on the same unchanged snapshot); take the node lock (``hami.scheduler.bindlock``,
compare-and-set in ``hami.kube.nodelock``, whose first try decides on the Node as read in HAMi's step 2
rather than reading it again; every pod with a GPU request, init-only ones included) —
waiting for a busy lock happens outside the node's decision queue, in a per-node line of waiters of which
only the head polls, up to ``--node-lock-wait`` (PodGroup members ``--node-lock-retry-timeout``) and
never past the deadline; re-read the pod and judge it again (a new version is decided with its own
request; one that no longer reads, ``invalid``), and with it read the node's pods
(``hami.kube.pods.list_node_pods``: a consistent read, after the lock, of every grant written there
before, another scheduler's included; when it fails the bind fails closed, nothing decided); inside the
node's queue decide the cards with the core's ``fit_node`` on the snapshot corrected by that read
(:mod:`hami.scheduler.fence`; the cards held for nominated pods of equal or higher priority counted as
used: :mod:`hami.core.reservations`) and book them at once; one JSON patch that applies only to the pod
as re-read (uid, resourceVersion, annotation and label maps tested) writes the device lists,
``vgpu-node`` annotation and label, ``vgpu-time``, ``bind-phase=allocating``, ``bind-time``, MIG
reservations and ``hami.io/vgpu-enforcement`` (the enforcement of each granted card as the snapshot read
it from the node; when a card UUID cannot be written there, the key is removed instead, so an earlier
attempt's list never stands for this grant); create the Binding. Before every write the remaining time of
kube-scheduler's deadline (``--bind-timeout`` from the request's arrival) is checked, and every write's
own timeout is cut to it; past it, the attempt gives back what it took and answers an error.

A failed write whose outcome is unknown (5xx, timeout, reset) or a refused Binding leads to a re-read
before anything is undone (:func:`hami.scheduler.attempt.undo`): a pod bound here with our grant is a
success (booking and lock kept); anything else is undone with conditional writes. Success (this way
too): a ``BindingSucceed`` Event, and a ``NoEnforcement`` Warning Event when a granted card has
enforcement ``none`` (its memory and core limits are not held inside the container); the lock stays
for the node agent to release after Allocate. Failure: a ``BindingFailed`` Warning Event (the error
and what to do about it) and the error in the reply. Each outcome is counted
(``hami_scheduler_binds_total{result}``), each lock takeover by its reason, and every acquired lock is
handed to the hold-time metric. Must not import the Kubernetes client (only
``hami.kube``) or aiohttp.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import logging
from collections.abc import Mapping

from hami import objects
from hami.annotations import (
    NODE_LOCK,
    POD_BIND_PHASE,
    POD_DEVICES_ALLOCATED,
    POD_VGPU_ENFORCEMENT,
    POD_VGPU_NODE,
    AnnotationError,
    BindPhase,
    Enforcement,
    allocation_annotations,
    bind_annotations,
    decode_pod_enforcement,
    encode_pod_enforcement,
    read_bind_time,
)
from hami.core.allocate import fit_node
from hami.core.model import Allocation, NodeState, PodRequest
from hami.core.rejection import Rejection
from hami.core.usage import pod_usage
from hami.kube.client import KubeError, NotFound
from hami.kube.nodelock import NodeLockBusy, NodeLockUnreadable
from hami.kube.nodes import get_node
from hami.kube.pods import (
    bind_pod,
    get_pod,
    json_patch_pod,
    list_node_pods,
    unchanged_tests,
    write_operations,
)
from hami.objects import RawNode, RawPod
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
from hami.scheduler.bindlock import acquire, after, count_grant, lock_wait, locks_node
from hami.scheduler.context import Context
from hami.scheduler.fence import fenced, read_records
from hami.scheduler.nodecache import local_time
from hami.scheduler.podrecords import PodRecord
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
    if not ctx.binds.claim(att.key):
        return _refused(ctx, att, f"pod {att.ref} has a bind in progress here: refused", "refused")
    kept = ctx.cycles.kept(att.key)  # filter's cycle of the pod: does it ask for GPUs?
    if kept is not None and kept.request is not None and locks_node(kept.request):
        ctx.binds.locking(att.key, att.node)  # the node is busy for the others' /prioritize from now
    try:
        result = await _bind(ctx, att)
    finally:
        ctx.binds.done(att.key)
    if not result["Error"]:
        ctx.cycles.forget(att.key)  # bound: its scheduling cycle is over
    return result


async def _read(ctx: Context, att: Attempt) -> RawPod | None:
    try:
        return await get_pod(ctx.api, att.namespace, att.name, limit=max(att.deadline.remaining(), 1.0))
    except NotFound:
        return None


def _judge(ctx: Context, att: Attempt, pod: RawPod | None) -> tuple[Verdict, str]:
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
    cycle = ctx.cycle(pod)  # this pod version's: the request filter read, when the pod is unchanged
    request = cycle.request
    if request is None:
        return _failed(ctx, pod, att.node, str(cycle.error), "invalid")
    if locks_node(request):
        ctx.binds.locking(att.key, att.node)  # (once per bind: already so when filter's cycle said)
    try:
        node = await _node_exists(ctx, att)
    except (KubeError, BindFailure) as exc:
        if locks_node(request):
            await abandon(ctx, att, pod, mark=True)
        return _failed_on(ctx, pod, att.node, exc)
    if not locks_node(request):  # no GPU request: only the Binding
        return await _bind_plain(ctx, att, pod)
    priority = cycle.priority  # immutable: the cards held for nominated pods it does not outrank
    try:
        # fail fast, without locking, when it cannot fit (filter's verdict on the same view stands)
        if not cycle.known_fit(ctx.snapshot, att.node, ctx.clock(), priority):
            _decide(ctx, request, att.node, att.key, priority)
        att.grant = await acquire(
            ctx,
            att,
            lambda: _decide(ctx, request, att.node, att.key, priority),
            wait=lock_wait(ctx, pod),
            read=node,  # the lock's first try decides on this read: one node read per bind
        )
    except (KubeError, BindFailure) as exc:
        await abandon(ctx, att, pod, mark=True)
        return _failed_on(ctx, pod, att.node, exc)
    count_grant(ctx, att.node, att.grant)
    try:
        return await _allocate(ctx, att, request, priority)
    except (KubeError, BindFailure) as exc:
        if att.written is None:
            await abandon(ctx, att, pod, mark=isinstance(exc, BindFailure))
            return _failed_on(ctx, pod, att.node, exc)
        if await undo(ctx, att) is Outcome.BOUND:
            result = _succeeded(ctx, pod, att.node)
            _warn_unenforced(ctx, pod, att.node, written_enforcement(att.written))
            return result
        return _failed_on(ctx, pod, att.node, exc)


async def _node_exists(ctx: Context, att: Attempt) -> RawNode:
    """HAMi's step 2: the node is read before anything is written; a missing one fails the bind with
    ``not found`` (a Binding to it would be accepted and strand the pod on a node that never runs it).
    The Node as read (the lock's first try decides on it)."""
    try:
        return await get_node(ctx.api, att.node)
    except NotFound:
        raise BindFailure(f"node {att.node} not found") from None
    except KubeError as exc:
        raise KubeError(exc.status, exc.reason, f"reading node {att.node}: {exc.message}") from exc


async def _allocate(ctx: Context, att: Attempt, request: PodRequest, priority: int) -> ExtenderBindingResult:
    """With the lock held: re-read the pod and read the node's pods, judge, decide and book, patch,
    bind. Raises on failure; the caller gives back (before the patch was sent) or undoes (after)."""
    # the node's pods, read now that the lock is held, with the pod: every grant written there before
    pod, listed = await asyncio.gather(_read(ctx, att), _node_pods(ctx, att), return_exceptions=True)
    if isinstance(pod, BaseException):
        raise pod
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
    if isinstance(listed, BaseException):
        raise listed  # fail closed: the grants on the node are not known
    read = read_records(listed, now=ctx.clock(), horizon=ctx.settings.allocating_horizon)
    att.deadline.check("deciding the cards")
    request = _request_of(ctx, pod, request)
    async with ctx.binds.queue(att.node):
        # decide and book with no await in between: the next bind on this loop sees the booking
        now = max(after(ctx.clock(), _bind_time(pod)), att.locked_at or ctx.clock())
        decision, state = _decide_on(ctx, request, att.node, att.key, priority, read)
        annotations = allocation_annotations(
            node=att.node, devices=decision.devices, mig=decision.mig, now=now
        )
        kinds = granted_enforcement(state, decision)
        removed: tuple[str, ...] = ()
        try:
            annotations[POD_VGPU_ENFORCEMENT] = encode_pod_enforcement(kinds)
        except ValueError as exc:  # a card UUID the annotation cannot carry: said in the log only
            logger.warning("%s: %s left out: %s", att.ref, POD_VGPU_ENFORCEMENT, exc)
            removed = (POD_VGPU_ENFORCEMENT,)  # an earlier attempt's list would describe other cards
        usage = pod_usage(decision.devices, request.init_count, init_done=False, mig=decision.mig)
        record = PodRecord(node=att.node, usage=usage, allocated=annotations[POD_DEVICES_ALLOCATED])
        ctx.snapshot.book(att.key, record)
        att.booked = True
    annotations.update(bind_annotations(BindPhase.ALLOCATING, now=now))
    await _patch(ctx, att, pod, annotations, removed)
    att.deadline.check("creating the Binding")
    await bind_pod(
        ctx.api, att.namespace, att.name, att.node, att.uid or None, limit=att.deadline.remaining()
    )
    result = _succeeded(ctx, pod, att.node)
    _warn_unenforced(ctx, pod, att.node, kinds)
    return result


#: The Warning Event on a pod granted a card without enforcement.
NO_ENFORCEMENT = "NoEnforcement"


def granted_enforcement(state: NodeState, allocation: Allocation) -> dict[str, Enforcement]:
    """The enforcement of each card granted in ``allocation`` (grant order, each card once), as the
    node's state carries it."""
    kinds: dict[str, Enforcement] = {}
    for grants in allocation.devices:
        for grant in grants:
            at = state.positions.get(grant.uuid)
            kinds[grant.uuid] = state.devices[at].device.enforcement if at is not None else Enforcement.NONE
    return kinds


def written_enforcement(written: Mapping[str, str] | None) -> dict[str, Enforcement]:
    """The granted cards' enforcement as an attempt's allocation patch wrote it; nothing when it wrote
    none (or, never expected of our own text, an unreadable one)."""
    text = (written or {}).get(POD_VGPU_ENFORCEMENT)
    if text is None:
        return {}
    try:
        return decode_pod_enforcement(text)
    except AnnotationError:
        return {}


def _warn_unenforced(ctx: Context, pod: RawPod, node: str, kinds: Mapping[str, Enforcement]) -> None:
    """The ``NoEnforcement`` Warning Event when a granted card has enforcement ``none``."""
    bare = [uuid for uuid, kind in kinds.items() if kind is Enforcement.NONE]
    if bare:
        ctx.event(pod, NO_ENFORCEMENT, unenforced_message(node, bare), warning=True)


def unenforced_message(node: str, uuids: list[str]) -> str:
    """The ``NoEnforcement`` text: which cards of which node hold nothing to the pod's slice."""
    cards = f"card {uuids[0]}" if len(uuids) == 1 else f"cards {', '.join(uuids)}"
    return (
        f"placed on {cards} of node {node} without enforcement: its memory/core limits are not held "
        "inside the container (hami doctor names such nodes; hami.io/require-enforcement keeps a pod "
        "off them)"
    )


def _bind_time(pod: RawPod) -> datetime.datetime | None:
    """The ``bind-time`` an earlier attempt left on the pod, when readable."""
    try:
        return read_bind_time(pod)
    except AnnotationError:
        return None


async def _node_pods(ctx: Context, att: Attempt) -> list[RawPod]:
    """The node's pods as the API server holds them now that the lock is held (bound to it, or labelled
    ``vgpu-node`` with it): every grant written there before the lock was taken, by any scheduler. An
    error says so: the bind fails closed."""
    try:
        return await list_node_pods(
            ctx.api, att.node, label=POD_VGPU_NODE, limit=max(att.deadline.remaining(), 1.0)
        )
    except KubeError as exc:
        raise KubeError(
            exc.status,
            exc.reason,
            f"reading the pods of node {att.node} under its lock (another scheduler's grants there are "
            f"not known without it; nothing is decided): {exc.message}",
        ) from exc


async def _patch(
    ctx: Context, att: Attempt, pod: RawPod, annotations: dict[str, str], removed: tuple[str, ...] = ()
) -> None:
    """Write the allocation (and remove the ``removed`` keys where the pod has them) with a
    compare-and-set on the pod as read; an unknown outcome is re-read (our values there: it landed), a
    lost race re-judged and retried while the deadline allows."""
    for _ in range(3):
        att.deadline.check("writing the allocation")
        values: dict[str, str | None] = {**annotations, **dict.fromkeys(removed)}
        operations = unchanged_tests(pod) + write_operations(
            pod, annotations=values, labels={POD_VGPU_NODE: att.node}
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


async def _bind_plain(ctx: Context, att: Attempt, pod: RawPod) -> ExtenderBindingResult:
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
            if objects.node_name(fresh) == att.node:
                return _succeeded(ctx, pod, att.node)  # applied; only the answer was lost
        return _failed(ctx, pod, att.node, f"binding {att.ref} to {att.node}: {exc}", "api_error")
    return _succeeded(ctx, pod, att.node)


class InvalidRequest(BindFailure):
    result = "invalid"


def _request_of(ctx: Context, pod: RawPod, earlier: PodRequest) -> PodRequest:
    """The request of ``pod`` as re-read under the lock: the one read before when the pod is the same
    version, else read anew from this version (a decision is never made for an older one)."""
    cycle = ctx.cycle(pod)
    if cycle.request is None:
        raise InvalidRequest(str(cycle.error))
    if not cycle.request.has_devices and earlier.has_devices:
        raise InvalidRequest(f"pod {objects.namespace(pod)}/{objects.name(pod)} no longer asks for GPUs")
    return cycle.request


def _decide(ctx: Context, request: PodRequest, node: str, key: tuple[str, str], priority: int) -> Allocation:
    """The pod's allocation on ``node`` now (its own current booking left out, the cards held for
    nominated pods of ``priority`` or higher counted as used), or BindFailure."""
    return _decide_on(ctx, request, node, key, priority)[0]


def _decide_on(
    ctx: Context,
    request: PodRequest,
    node: str,
    key: tuple[str, str],
    priority: int,
    read: Mapping[tuple[str, str], PodRecord | None] | None = None,
) -> tuple[Allocation, NodeState]:
    """:func:`_decide`, and the node's state it decided on; with ``read`` (the node's pods read under
    its lock) each pod read counts as the read shows it, not as the live view does."""
    found = ctx.snapshot.candidate(node, local_time(ctx.clock()), exclude=key, priority=priority)
    if isinstance(found, Rejection):
        raise BindFailure(found.message)
    if read is not None:
        counted = ((k, record) for k, record, _ in ctx.snapshot.holders(node))
        found, behind = fenced(found, node, counted, read, key)
        if behind:
            logger.info(
                "node %s: the live view was behind on %s; deciding on the pods read under the lock",
                node,
                ", ".join(f"{ns}/{name}" for ns, name in behind),
            )
    quotas = ctx.snapshot.quotas_for(request.namespace, exclude=key)
    policy = ctx.snapshot.workload.policy(ctx.settings.policy, request)  # fragmentation's target
    decision = fit_node(request, found, policy, quotas=quotas)
    if not isinstance(decision, Allocation):
        raise BindFailure(f"pod {key[0]}/{key[1]} does not fit node {node}: {decision.message}")
    return decision, found


#: What a person can do about each kind of failed bind (appended to the ``BindingFailed`` Event).
ADVICE = {
    "lock_busy": "kube-scheduler retries the pod; the lock goes once that pod's GPUs are allocated by "
    "the node agent, or after --node-lock-timeout if the agent never does (check hami-node-agent there)",
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
    if isinstance(exc, NodeLockUnreadable):
        return "invalid"
    return exc.result if isinstance(exc, BindFailure) else "api_error"


def _failed_on(ctx: Context, pod: RawPod, node: str, exc: Exception) -> ExtenderBindingResult:
    """:func:`_failed` for an exception: its text, its result, and what to do about it."""
    advice = None
    if isinstance(exc, NodeLockUnreadable):
        advice = (
            "It never expires: once no pod is being allocated on the node, remove it "
            f"(kubectl annotate node {exc.node} {NODE_LOCK}-); kube-scheduler retries the pod"
        )
    return _failed(ctx, pod, node, str(exc), _result_of(exc), advice)


def _refused(ctx: Context, att: Attempt, message: str, result: str) -> ExtenderBindingResult:
    """Nothing was written, and no Event either: the pod may not be ours (nor the caller kube-scheduler)."""
    logger.info("bind of %s to %s refused: %s", att.ref, att.node, message)
    ctx.metrics.bound(result)
    return ExtenderBindingResult(Error=message)


def _already_bound(ctx: Context, att: Attempt, message: str) -> ExtenderBindingResult:
    logger.info("bind of %s to %s: %s with our grant; nothing to write", att.ref, att.node, message)
    ctx.metrics.bound("already_bound")
    return ExtenderBindingResult(Error="")


def _failed(
    ctx: Context, pod: RawPod, node: str, message: str, result: str, advice: str | None = None
) -> ExtenderBindingResult:
    logger.info("bind to %s failed: %s", node, message)
    ctx.metrics.bound(result)
    advice = advice or ADVICE.get(result)
    ctx.event(pod, "BindingFailed", f"{message}. {advice}" if advice else message, warning=True)
    return ExtenderBindingResult(Error=message)


def _succeeded(ctx: Context, pod: RawPod, node: str) -> ExtenderBindingResult:
    message = f"Successfully binding node [{node}] to {objects.namespace(pod)}/{objects.name(pod)}"
    ctx.metrics.bound("success")
    ctx.event(pod, "BindingSucceed", message)
    return ExtenderBindingResult(Error="")
