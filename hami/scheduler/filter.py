"""``POST /filter``: which candidate nodes can take the pod, and why the others cannot. Read-only.

Owns the filter decision over the snapshot (names only, ``nodeCacheCapable``) or over the Node objects
given in the request (template nodes: evaluated from their annotations alone, zero usage,
:mod:`hami.scheduler.candidates`). The pod's request, the candidates' states and the core's decisions
over them come from the pod's scheduling cycle (:mod:`hami.scheduler.cycle`): made once per pod version
and shared with prioritize, preempt and bind, made again when the snapshot changed (the rejection of a
node whose state did not change is then kept from the last pod of the same shape, the context's
``rejections``). Every fitting
node is returned in ``NodeNames``; the others go to ``FailedNodes`` when other pods leaving could make
room (resolvable) and to ``FailedAndUnresolvableNodes`` otherwise (too few cards, type/uuid mismatch,
unregistered). Every failing node is a :class:`~hami.core.rejection.Rejection` (the snapshot's
exclusions too); its HAMi text is rendered here, from the codes. The pod's namespace GPU quota
(docs/protocol.md, "Quotas", from the snapshot's ResourceQuotas, without the pod's own usage) is passed to the
core, so a pod over quota gets ``ResourceQuotaNotFit``. The cards held for pods kube-scheduler nominated
to a node for preemption count as used when they outrank the pod or equal it (``spec.priority``,
kube-scheduler's rule for nominated pods; :mod:`hami.core.reservations`). A pod without a device request
passes through unchanged. Every rejected node's reasons are counted
(``hami_scheduler_node_rejections_total``). When nothing fits a snapshot request, the outcome carries
the ``FilteringFailed`` text: the reasons (most common first, at most ``MAX_GROUPS`` groups of at most
``MAX_NAMES`` node names, so the text stays short on a large cluster; names the snapshot does not know
are counted, never echoed, so a caller cannot plant text), what to do about the most common one, and the
``hami explain`` command that details every node. The app hands it to the event recorder, which checks
the pod exists before writing; template-node requests (a simulation) write nothing. Writes nothing
itself: bind recomputes and writes. Must not import the Kubernetes client or aiohttp.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from hami.core.allocate import Decisions, allocate
from hami.core.rejection import Rejection
from hami.objects import pod_key
from hami.scheduler.candidates import template_states
from hami.scheduler.context import Context
from hami.scheduler.reasons import advice, rejection_words
from hami.scheduler.wire import ExtenderArgs, ExtenderFilterResult, NodeListWire, filter_result

MISSING_POD = "extender args missing pod"
NOT_SYNCED = "scheduler cache not synced yet"
MAX_GROUPS = 5
MAX_NAMES = 5
FILTERING_FAILED = "FilteringFailed"


@dataclass(frozen=True, slots=True)
class Filtered:
    """The answer, and the ``FilteringFailed`` text when no node fits a snapshot request."""

    result: ExtenderFilterResult
    failure: str | None = None


def failure_summary(
    failed: Mapping[str, str], candidates: int, known: Callable[[str], bool] | None = None
) -> str:
    """``no available node, 3 nodes do not meet: 2 nodes <reason>(n1,n2); 1 nodes <reason>(n3)``.

    Most common reason first; beyond ``MAX_NAMES`` names a group ends ``+N more``, beyond
    ``MAX_GROUPS`` groups the rest are counted as ``+N more reasons``. With ``known``, only the names
    it accepts are shown; the others are counted as ``+N unknown``.
    """
    by_reason: dict[str, list[str]] = defaultdict(list)
    for node, reason in failed.items():
        by_reason[reason].append(node)
    groups = sorted(by_reason.items(), key=lambda item: (-len(item[1]), item[0]))
    parts = []
    for reason, nodes in groups[:MAX_GROUPS]:
        names = sorted(n for n in nodes if known is None or known(n))
        unknown = len(nodes) - len(names)
        shown = names[:MAX_NAMES] + ([f"+{len(names) - MAX_NAMES} more"] if len(names) > MAX_NAMES else [])
        shown += [f"+{unknown} unknown"] if unknown else []
        parts.append(f"{len(nodes)} nodes {reason}({','.join(shown)})")
    if len(groups) > MAX_GROUPS:
        parts.append(f"+{len(groups) - MAX_GROUPS} more reasons")
    return f"no available node, {candidates} nodes do not meet: " + "; ".join(parts)


def failure_message(
    pod: Mapping[str, Any],
    failed: Mapping[str, str],
    words: Mapping[str, frozenset[str]],
    known: Callable[[str], bool] | None = None,
) -> str:
    """The ``FilteringFailed`` text: the summary, the remedy of the most common reason, the command."""
    namespace, name = pod_key(pod)
    hint = advice(words.values())
    return (
        failure_summary(failed, len(failed), known)
        + (f". {hint}" if hint else "")
        + f". Every node in detail: hami explain {namespace or 'default'}/{name}"
    )


def handle_filter(ctx: Context, args: ExtenderArgs) -> Filtered:
    pod = args["Pod"]
    if pod is None:
        return Filtered(filter_result(error=MISSING_POD))
    cycle = ctx.cycle(pod)
    request = cycle.request
    if request is None:
        return Filtered(filter_result(error=str(cycle.error)))
    names, nodes = args["NodeNames"], args["Nodes"]
    if not request.has_devices:
        return Filtered(filter_result(node_names=names, nodes=nodes))
    by_name: dict[str, dict[str, Any]] = {}
    excluded: dict[str, Rejection]
    decisions: Decisions
    if names is None and nodes is not None:
        states, excluded, by_name = template_states(nodes)
        quotas = ctx.snapshot.quotas_for(request.namespace, exclude=(request.namespace, request.name))
        decisions = allocate(request, states, ctx.settings.policy, quotas=quotas)
    else:
        if not ctx.snapshot.ready:
            return Filtered(filter_result(error=NOT_SYNCED))
        evaluation = cycle.evaluate(ctx.snapshot, names or [], ctx.clock(), cycle.priority)
        excluded = evaluation.candidates.excluded
        decisions = cycle.decisions(evaluation, ctx.settings.policy, ctx.rejections)
    fitting = list(decisions.fitting)
    if ctx.wakeup is not None and names is not None:
        if fitting:
            ctx.wakeup.placed((request.namespace, request.name))
        else:
            ctx.wakeup.rejected(request, cycle.priority, names)
    failed: dict[str, str] = {}
    unresolvable: dict[str, str] = {}
    words: dict[str, frozenset[str]] = {}
    for name, rejection in {**excluded, **decisions.rejections()}.items():
        (failed if rejection.resolvable else unresolvable)[name] = rejection.message
        words[name] = rejection_words(rejection)
    ctx.metrics.rejected(words.values())
    if not fitting:
        ctx.metrics.unschedulable.inc()
    if by_name:
        listing = NodeListWire(
            apiVersion="v1", kind="NodeList", metadata={}, items=[by_name[n] for n in fitting]
        )
        return Filtered(
            filter_result(nodes=listing, node_names=fitting, failed=failed, unresolvable=unresolvable)
        )
    result = filter_result(node_names=fitting, failed=failed, unresolvable=unresolvable)
    if fitting or names is None:
        return Filtered(result)
    known = {entry.name for entry in ctx.snapshot.entries()}
    everything = {**failed, **unresolvable}
    return Filtered(result, failure_message(pod, everything, words, known.__contains__))
