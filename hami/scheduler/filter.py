"""``POST /filter``: which candidate nodes can take the pod, and why the others cannot. Read-only.

Owns the filter decision over the snapshot (names only, ``nodeCacheCapable``) or over the Node objects
given in the request (template nodes: evaluated from their annotations alone, zero usage). Every fitting
node is returned in ``NodeNames``; the others go to ``FailedNodes`` when other pods leaving could make
room (resolvable) and to ``FailedAndUnresolvableNodes`` otherwise (too few cards, type/uuid mismatch,
unregistered). A pod without a device request passes through unchanged. When nothing fits, a
``FilteringFailed`` Warning Event summarises the reasons on the pod. Writes nothing else: bind
recomputes and writes. Must not import the Kubernetes client or aiohttp.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping
from typing import Any

from hami.annotations import AnnotationError, read_node, read_pod_request
from hami.core.allocate import allocate
from hami.core.model import NodeState, PodRequest
from hami.scheduler.context import Context
from hami.scheduler.snapshot import UNREGISTERED, local_time
from hami.scheduler.wire import ExtenderArgs, ExtenderFilterResult, NodeListWire, filter_result

MISSING_POD = "extender args missing pod"
NOT_SYNCED = "scheduler cache not synced yet"


def pod_key(pod: Mapping[str, Any]) -> tuple[str, str]:
    metadata = pod.get("metadata") or {}
    return str(metadata.get("namespace") or ""), str(metadata.get("name") or "")


def template_states(nodes: NodeListWire) -> tuple[list[NodeState], dict[str, str], dict[str, dict[str, Any]]]:
    """Node objects from the request -> states (zero usage), problems, and the objects by name."""
    states: list[NodeState] = []
    problems: dict[str, str] = {}
    objects: dict[str, dict[str, Any]] = {}
    for obj in nodes.get("items") or []:
        metadata = obj.get("metadata") or {}
        name = str(metadata.get("name") or "")
        objects[name] = obj
        try:
            states.append(read_node(name, metadata.get("annotations") or {}))
        except AnnotationError as exc:
            problems[name] = f"{UNREGISTERED}: {exc}"
    return states, problems, objects


def snapshot_states(
    ctx: Context, names: list[str], request: PodRequest
) -> tuple[list[NodeState], dict[str, str]]:
    """Candidate names -> current states (without this pod's own booking) and the excluded ones."""
    local_now = local_time(ctx.clock())
    key = (request.namespace, request.name)
    states: list[NodeState] = []
    problems: dict[str, str] = {}
    for name in names:
        found = ctx.snapshot.candidate(name, local_now, exclude=key)
        if isinstance(found, str):
            problems[name] = found
        else:
            states.append(found)
    return states, problems


def failure_summary(failed: Mapping[str, str], candidates: int) -> str:
    """``no available node, 3 nodes do not meet: 2 nodes <reason>(n1,n2); 1 nodes <reason>(n3)``."""
    by_reason: dict[str, list[str]] = defaultdict(list)
    for node, reason in failed.items():
        by_reason[reason].append(node)
    parts = [
        f"{len(nodes)} nodes {reason}({','.join(sorted(nodes))})"
        for reason, nodes in sorted(by_reason.items(), key=lambda item: (-len(item[1]), item[0]))
    ]
    return f"no available node, {candidates} nodes do not meet: " + "; ".join(parts)


def handle_filter(ctx: Context, args: ExtenderArgs) -> ExtenderFilterResult:
    pod = args["Pod"]
    if pod is None:
        return filter_result(error=MISSING_POD)
    try:
        request = read_pod_request(pod, ctx.settings.device_config)
    except AnnotationError as exc:
        return filter_result(error=str(exc))
    names, nodes = args["NodeNames"], args["Nodes"]
    if not request.has_devices:
        return filter_result(node_names=names, nodes=nodes)
    objects: dict[str, dict[str, Any]] = {}
    if names is None and nodes is not None:
        states, problems, objects = template_states(nodes)
    else:
        if not ctx.snapshot.ready:
            return filter_result(error=NOT_SYNCED)
        states, problems = snapshot_states(ctx, names or [], request)
    decisions = allocate(request, states, ctx.settings.policy, now=ctx.clock())
    fitting = list(decisions.fitting)
    failed: dict[str, str] = {}
    unresolvable = dict(problems)
    for name, rejection in decisions.rejections().items():
        (failed if rejection.resolvable else unresolvable)[name] = rejection.message
    if not fitting:
        everything = {**failed, **unresolvable}
        ctx.event(pod, "FilteringFailed", failure_summary(everything, len(everything)), warning=True)
    if objects:
        listing = NodeListWire(
            apiVersion="v1", kind="NodeList", metadata={}, items=[objects[n] for n in fitting]
        )
        return filter_result(nodes=listing, node_names=fitting, failed=failed, unresolvable=unresolvable)
    return filter_result(node_names=fitting, failed=failed, unresolvable=unresolvable)
