"""``POST /prioritize``: a 0..10 score per candidate node from the node policy. Read-only.

Owns the mapping of HAMi's node score (0..30: ``10 x (slots used/total + cores used/total + memory
used/total)`` over the node's cards, before this pod) onto kube-scheduler's extender range 0..10.
``binpack`` (default) prefers fuller nodes: ``round(score / 3)``; ``spread`` prefers emptier ones:
``10 - round(score / 3)``. The pod annotation ``hami.io/node-scheduler-policy`` overrides the flag.
Worked example: a node with 3/10 slots, 30/100 cores, 300/1000 MiB used scores 9.0 -> binpack 3,
spread 7. Unknown or excluded nodes, and pods without a device request, score 0.
Must not import the Kubernetes client or aiohttp.
"""

from __future__ import annotations

from hami.annotations import AnnotationError, read_pod_request
from hami.core.model import NodeState
from hami.scheduler.context import Context
from hami.scheduler.filter import snapshot_states, template_states
from hami.scheduler.wire import ExtenderArgs, HostPriority

MAX_SCORE = 10


def extender_score(node_score: float, policy: str) -> int:
    """HAMi's 0..30 node score -> 0..10 for kube-scheduler under ``policy``."""
    fullness = max(0, min(MAX_SCORE, round(node_score / 3)))
    return MAX_SCORE - fullness if policy == "spread" else fullness


def handle_prioritize(ctx: Context, args: ExtenderArgs) -> list[HostPriority]:
    names = args["NodeNames"]
    nodes = args["Nodes"]
    if names is None:
        names = [str((n.get("metadata") or {}).get("name") or "") for n in (nodes or {}).get("items") or []]
    pod = args["Pod"]
    if pod is None:
        return [HostPriority(Host=n, Score=0) for n in names]
    try:
        request = read_pod_request(pod, ctx.settings.device_config)
    except AnnotationError:
        return [HostPriority(Host=n, Score=0) for n in names]
    if not request.has_devices:
        return [HostPriority(Host=n, Score=0) for n in names]
    states: list[NodeState]
    if args["NodeNames"] is None and nodes is not None:
        states, _, _ = template_states(nodes)
    else:
        states, _ = snapshot_states(ctx, names, request)
    policy = request.node_policy or ctx.settings.node_policy
    scores = {s.name: extender_score(s.summary.score, policy) for s in states}
    return [HostPriority(Host=n, Score=scores.get(n, 0)) for n in names]
