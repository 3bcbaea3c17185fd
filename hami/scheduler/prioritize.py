"""``POST /prioritize``: a 0..10 score per candidate node from the node policy. Read-only.

Owns the answer: the candidate nodes' current states (``/filter``'s, without the cards held for nominated
pods; taken from the pod's scheduling cycle, :mod:`hami.scheduler.cycle`, while nothing they were read
from has changed, else read again; template nodes from :mod:`hami.scheduler.candidates`) ranked by the core's
one node ranking, :func:`hami.core.allocate.priorities`: HAMi's node score (0..30: ``10 x (slots
used/total + cores used/total + memory used/total)`` over the node's cards, before this pod) onto
kube-scheduler's extender range 0..10, ``binpack`` (default) preferring fuller nodes, ``spread`` emptier
ones; ``fragmentation`` scores the pod's best placement on each node by how little it grows the GPU
fragmentation against the learned target workload (:mod:`hami.core.fragmentation`, the target from
:mod:`hami.scheduler.workload`). The pod annotation ``hami.io/node-scheduler-policy`` overrides the flag.
Unknown or excluded nodes, and pods without a device request, score 0.

Not HAMi's (docs/compatibility.md, "Scheduler extender", item 30): a candidate whose node lock is busy
for this pod now (another pod's live lock as the node watch shows it, held for a grant there; an
unreadable one; or a GPU bind of this process to it in progress: :mod:`hami.scheduler.busy`) scores 0
and every other candidate at least 1 (the core's :func:`hami.core.score.demote_busy`), so kube-scheduler
sends the pod where its bind can take the lock instead of to the fullest node whose previous bind still
holds it; counted in ``hami_scheduler_prioritize_demoted_nodes_total``. With no busy candidate, or only
busy ones, the scores are HAMi's.
Must not import the Kubernetes client or aiohttp.
"""

from __future__ import annotations

from hami import objects
from hami.core.allocate import priorities
from hami.core.model import NodeState
from hami.core.score import demote_busy
from hami.scheduler.busy import busy_nodes
from hami.scheduler.candidates import template_states
from hami.scheduler.context import Context
from hami.scheduler.wire import ExtenderArgs, HostPriority


def handle_prioritize(ctx: Context, args: ExtenderArgs) -> list[HostPriority]:
    names = args["NodeNames"]
    nodes = args["Nodes"]
    if names is None:
        names = [objects.name(n) for n in objects.items(nodes)]
    pod = args["Pod"]
    if pod is None:
        return [HostPriority(Host=n, Score=0) for n in names]
    cycle = ctx.cycle(pod)
    request = cycle.request
    if request is None or not request.has_devices:
        return [HostPriority(Host=n, Score=0) for n in names]
    states: list[NodeState]
    now = ctx.clock()
    if args["NodeNames"] is None and nodes is not None:
        states, _, _ = template_states(nodes)
    else:
        states = cycle.states_unreserved(ctx.snapshot, names, now)
    scores = priorities(request, states, ctx.snapshot.workload.policy(ctx.settings.policy, request))
    busy = busy_nodes(
        scores,
        (request.namespace, request.name),
        snapshot=ctx.snapshot,
        binds=ctx.binds,
        now=now,
        expiry=ctx.settings.node_lock_timeout,
    )
    if busy:
        demoted = demote_busy(scores, busy)
        if demoted:
            ctx.metrics.prioritize_demoted.inc(demoted)
    out: list[HostPriority] = [{"Host": n, "Score": scores.get(n, 0)} for n in names]  # literal: cheaper
    return out
