"""``POST /bind``: the only scheduler step that writes (spec-scheduler §16, architecture rule 7).

Order: read the pod fresh from the API; take the node lock (compare-and-set, ``hami.kube.nodelock``)
when some *app* container asks for cards (HAMi's NVIDIA backend: a pod whose only GPU request is in
init containers binds without it, the node agent finds it by its bind phase);
recompute the pod's allocation for that node on the snapshot's current state with the core's
``fit_node`` and book it in the snapshot at once (no ``await`` between deciding and booking, so racing
binds in this process always see each other); merge-patch the pod (device lists, ``hami.io/vgpu-node``
annotation and label, ``vgpu-time``, ``bind-phase=allocating``, ``bind-time``, MIG reservations when
any); create the Binding. Success: a ``BindingSucceed`` Event; the lock stays for the node agent to
release after Allocate. Any failure: undo the booking, release our lock, mark the pod
``bind-phase=failed``, a ``BindingFailed`` Warning Event (the error and what to do about it), and the
error text in the reply. A busy lock fails at once unless ``--node-lock-wait`` is set; PodGroup
members (label ``scheduling.x-k8s.io/pod-group`` non-empty) wait up to ``--node-lock-retry-timeout``
(28 s, HAMi's retry), the longer of the two. Each outcome is counted
(``hami_scheduler_binds_total{result}``) and every acquired lock is handed to the hold-time metric.
Must not import the Kubernetes client (only ``hami.kube``) or aiohttp.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Mapping
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
    read_pod_request,
)
from hami.core.allocate import fit_node
from hami.core.model import Allocation, PodRequest
from hami.core.usage import pod_usage
from hami.kube.client import KubeError, NotFound
from hami.kube.nodelock import NodeLockBusy, acquire_node_lock, release_node_lock
from hami.kube.pods import bind_pod, get_pod, patch_pod
from hami.scheduler.context import Context, pod_ref
from hami.scheduler.snapshot import PodRecord, local_time
from hami.scheduler.wire import ExtenderBindingArgs, ExtenderBindingResult

logger = logging.getLogger(__name__)


class BindFailure(Exception):
    """A bind that cannot proceed for a reason of ours (not an API error)."""


async def handle_bind(ctx: Context, args: ExtenderBindingArgs) -> ExtenderBindingResult:
    namespace, name, node, uid = args["PodNamespace"], args["PodName"], args["Node"], args["PodUID"]
    key = (namespace, name)
    try:
        pod = await get_pod(ctx.api, namespace, name)
    except NotFound:
        ctx.snapshot.cancel(key)
        ctx.metrics.bound("pod_missing")
        return ExtenderBindingResult(Error=f"pod {namespace}/{name} not found")
    except KubeError as exc:
        message = f"reading pod {namespace}/{name}: {exc}"
        return _failed(ctx, pod_ref(namespace, name, uid), node, message, "api_error")
    found_uid = str((pod.get("metadata") or {}).get("uid") or "")
    if uid and found_uid and uid != found_uid:
        message = f"pod {namespace}/{name} was recreated (uid {found_uid}, not {uid})"
        return _failed(ctx, pod, node, message, "pod_missing")
    try:
        request = read_pod_request(pod, ctx.settings.device_config)
    except AnnotationError as exc:
        return _failed(ctx, pod, node, str(exc), "invalid")
    if not request.has_devices:
        try:
            await bind_pod(ctx.api, namespace, name, node, uid or None)
        except KubeError as exc:
            return _failed(ctx, pod, node, f"binding {namespace}/{name} to {node}: {exc}", "api_error")
        return _succeeded(ctx, pod, node)

    locked = booked = False
    try:
        async with ctx.node_queue(node):
            _decide(ctx, request, node, key)  # fail fast, without locking, when it cannot fit anyway
            if locks_node(request):
                value = await _acquire(ctx, node, namespace, name, wait=lock_wait(ctx, pod))
                locked = True
                ctx.metrics.lock_holds.acquired(node, value, ctx.snapshot.lock_of(node))
            # decide and book with no await in between: the next bind on this loop sees the booking
            now = ctx.clock()
            decision = _decide(ctx, request, node, key)
            annotations = allocation_annotations(
                node=node, devices=decision.devices, mig=decision.mig, now=now
            )
            usage = pod_usage(decision.devices, request.init_count, init_done=False, mig=decision.mig)
            record = PodRecord(node=node, usage=usage, allocated=annotations[POD_DEVICES_ALLOCATED])
            ctx.snapshot.book(key, record)
            booked = True
        annotations.update(bind_annotations(BindPhase.ALLOCATING, now=now))
        await patch_pod(ctx.api, namespace, name, annotations=annotations, labels={POD_VGPU_NODE: node})
        await bind_pod(ctx.api, namespace, name, node, uid or None)
    except (KubeError, BindFailure) as exc:
        await _undo(ctx, namespace, name, node, booked=booked, locked=locked)
        return _failed(ctx, pod, node, str(exc), _result_of(exc))
    return _succeeded(ctx, pod, node)


def locks_node(request: PodRequest) -> bool:
    """HAMi's NVIDIA backend locks the node only when some app container asks for cards (§16 step 3)."""
    return any(c is not None and c.nums > 0 for c in request.containers[request.init_count :])


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


async def _acquire(ctx: Context, node: str, namespace: str, name: str, *, wait: float) -> str:
    """Take the node lock; while another pod holds it, wait up to ``wait`` seconds.

    The wait listens to the node watch (a change of the lock annotation triggers a new attempt) and
    re-checks at least every second in case an event is slow (or the holder pod was deleted, which
    does not change the annotation); 0 fails at once, as HAMi does for pods outside a PodGroup.
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + wait
    while True:
        change = ctx.snapshot.lock_change(node)  # registered before reading: no change is missed
        try:
            return await acquire_node_lock(
                ctx.api, node, namespace, name, now=ctx.clock(), expiry=ctx.settings.node_lock_timeout
            )
        except NodeLockBusy:
            remaining = deadline - loop.time()
            if remaining <= 0:
                raise
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(change, timeout=min(remaining, 1.0))
        finally:
            change.cancel()


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


async def _undo(ctx: Context, namespace: str, name: str, node: str, *, booked: bool, locked: bool) -> None:
    """Give back what a failed bind took and mark the pod failed; each step best effort, logged."""
    if booked:
        ctx.snapshot.cancel((namespace, name))
    if locked:
        try:
            await release_node_lock(ctx.api, node, namespace, name)
        except KubeError as exc:
            logger.warning("releasing the lock of node %s for %s/%s failed: %s", node, namespace, name, exc)
    try:
        await patch_pod(ctx.api, namespace, name, annotations={POD_BIND_PHASE: BindPhase.FAILED.value})
    except KubeError as exc:
        logger.warning("marking %s/%s bind-phase=failed failed: %s", namespace, name, exc)


#: What a person can do about each kind of failed bind (appended to the ``BindingFailed`` Event).
ADVICE = {
    "lock_busy": "kube-scheduler retries the pod; the lock goes once that pod's GPUs are allocated by "
    "the node agent, or after --node-lock-timeout if the agent never does (check hami-monitor there)",
    "no_fit": "the node changed since filtering; kube-scheduler retries the pod on the nodes that fit",
    "api_error": "kube-scheduler retries the pod; if this repeats, check the API server and the "
    "scheduler's permissions (pods patch, pods/binding create, nodes patch)",
    "invalid": "fix the value named above and recreate the pod",
}


def _result_of(exc: Exception) -> str:
    if isinstance(exc, NodeLockBusy):
        return "lock_busy"
    return "no_fit" if isinstance(exc, BindFailure) else "api_error"


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
