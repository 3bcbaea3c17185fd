"""``POST /preempt`` (the extender's ``preemptVerb``): kube-scheduler's preemption, made device-aware.

Owns :func:`handle_preempt` (its view is :mod:`hami.scheduler.app`'s, like every verb's; the pod's
request and the candidate states it can reuse come from the pod's scheduling cycle,
:mod:`hami.scheduler.cycle`). In:
``ExtenderPreemptionArgs`` — the pod and, per candidate node, the victims kube-scheduler's own
plugins chose (by uid with ``nodeCacheCapable: true``, full pods without). Out:
``ExtenderPreemptionResult`` — the nodes kept, each with its victims by uid (both forms).

kube-scheduler ignores the GPU resources (``ignoredByScheduler``), so its victims are what *its*
plugins need (CPU, memory, ports ...): they are all kept, their cards' usage is taken off first,
and :func:`hami.core.preempt.preempt_node` adds the cheapest set of pods of strictly lower
priority whose eviction lets the pod fit on specific cards (the live snapshot's state, the
namespace quota, the scheduler's own Fit; the cards held for pods nominated there of equal or higher
priority stay taken, as kube-scheduler keeps those pods in place: :mod:`hami.core.reservations`).
Only pods bound to that node with a uid can be added
(:mod:`hami.scheduler.victims`): kube-scheduler fails the whole preemption on a uid it cannot find
there. A node is dropped (left out of the answer) when the snapshot cannot take GPU pods there,
when no set works, when a victim kube-scheduler named has a priority not below the pod's (as
far as this extender knows it), or when the answer would name no victim (the pod fits already;
an empty list would fail kube-scheduler). Victims the snapshot does not know (pods without GPU
grants) pass through unchanged. Among equally few and unimportant sets the one violating the fewest
PodDisruptionBudgets wins (``ctx.disruptions``, kube-scheduler's rule: :mod:`hami.core.disruption`), and
``NumPDBViolations`` is kube-scheduler's count for its own victims plus the added victims that violate
one (docs/scheduler.md).

A pod without a GPU request gets its input back unchanged (as uids); one with
``preemptionPolicy: Never`` gets no node. The answer type has no error field, so errors are HTTP
statuses (kube-scheduler reports any non-200 as the extender's error): 400 for an empty or
unreadable body or a missing pod, 503 before the snapshot and the budgets are synced
(:class:`PreemptError`). Must not import the Kubernetes client, ``hami.kube`` or aiohttp.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass, field

from hami import objects
from hami.core.preempt import preempt_node
from hami.core.rejection import Rejection
from hami.core.victimsearch import CardMemo, Holder
from hami.scheduler.context import Context
from hami.scheduler.victims import node_holders
from hami.scheduler.wire import (
    ExtenderPreemptionArgs,
    ExtenderPreemptionResult,
    MetaPod,
    MetaVictims,
)

MISSING_POD = "extender args missing pod"
NOT_SYNCED = "scheduler cache not synced yet"


class PreemptError(ValueError):
    """A request ``/preempt`` cannot answer: the HTTP status and the reason."""

    def __init__(self, status: int, text: str) -> None:
        super().__init__(text)
        self.status = status


@dataclass(frozen=True, slots=True)
class Proposal:
    """kube-scheduler's victims on one node: uids in its order, priorities when it sent full pods."""

    uids: tuple[str, ...]
    pdb: int
    priorities: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Preempted:
    """The answer and what it took (for the metrics)."""

    result: ExtenderPreemptionResult
    offered: int = 0  # nodes kube-scheduler sent
    proposed: int = 0  # kube-scheduler's victims on the kept nodes
    added: int = 0  # victims this extender added on the kept nodes


def proposals(args: ExtenderPreemptionArgs) -> dict[str, Proposal]:
    """Either form of the request -> per node, kube-scheduler's victims (uids deduplicated)."""
    found: dict[str, Proposal] = {}
    for node, meta in (args["NodeNameToMetaVictims"] or {}).items():
        uids = dict.fromkeys(p["UID"] for p in meta["Pods"])
        found[node] = Proposal(uids=tuple(uids), pdb=meta["NumPDBViolations"])
    for node, full in (args["NodeNameToVictims"] or {}).items():
        priorities = {str(p["metadata"]["uid"]): objects.priority(p) for p in full["Pods"]}
        found[node] = Proposal(uids=tuple(priorities), pdb=full["NumPDBViolations"], priorities=priorities)
    return found


def _answer(
    kept: Mapping[str, tuple[str, ...] | list[str]], pdb: Mapping[str, int]
) -> ExtenderPreemptionResult:
    return ExtenderPreemptionResult(
        NodeNameToMetaVictims={
            node: MetaVictims(Pods=[MetaPod(UID=u) for u in uids], NumPDBViolations=pdb[node])
            for node, uids in kept.items()
        }
    )


def handle_preempt(ctx: Context, args: ExtenderPreemptionArgs) -> Preempted:
    """Refine kube-scheduler's candidate nodes (see the module docstring); raises :class:`PreemptError`."""
    pod = args["Pod"]
    if pod is None:
        raise PreemptError(400, MISSING_POD)
    offered = proposals(args)
    cycle = ctx.cycle(pod)
    request = cycle.request
    if request is None:
        raise PreemptError(400, str(cycle.error))
    pdb = {node: p.pdb for node, p in offered.items()}
    if not request.has_devices:  # not ours to judge: kube-scheduler's answer stands
        kept = {node: p.uids for node, p in sorted(offered.items()) if p.uids}
        return Preempted(_answer(kept, pdb), len(offered), sum(len(u) for u in kept.values()))
    if objects.spec(pod).get("preemptionPolicy") == "Never":
        return Preempted(_answer({}, pdb), len(offered))
    if not (ctx.snapshot.ready and ctx.disruptions.synced):
        raise PreemptError(503, NOT_SYNCED)
    priority = cycle.priority
    key = (request.namespace, request.name)
    now = ctx.clock()
    quotas = ctx.snapshot.quotas_for(request.namespace, exclude=key)
    answer: dict[str, list[str]] = {}
    memo: dict[Hashable, CardMemo] = {}  # per-card answers shared by the nodes
    proposed = added = 0
    for node, proposal in sorted(offered.items()):
        if any(p >= priority for p in proposal.priorities.values()):
            continue
        state = cycle.candidate(ctx.snapshot, node, now, priority)
        if isinstance(state, Rejection):
            continue
        holders = node_holders(ctx.snapshot, node, exclude=key, budgets=ctx.disruptions)
        required = [holders.by_uid[u] for u in proposal.uids if u in holders.by_uid]
        pool = [h for uid, h in holders.by_uid.items() if uid in holders.evictable]
        found = preempt_node(
            request, priority, state, pool, ctx.settings.policy, required=required, quotas=quotas, memo=memo
        )
        if found is None or not (proposal.uids or found.added):
            continue
        answer[node] = _most_important_first(proposal, holders.by_uid, found.added)
        pdb[node] += sum(1 for h in found.added if h.violates_pdb)
        proposed += len(proposal.uids)
        added += len(found.added)
    return Preempted(_answer(answer, pdb), len(offered), proposed, added)


def _most_important_first(
    proposal: Proposal, known: Mapping[str, Holder], added: Sequence[Holder]
) -> list[str]:
    """The node's victims in kube-scheduler's order (``MoreImportantPod``: higher priority, then older),
    since it ranks nodes by the first one. A victim of kube-scheduler's that holds no card and came
    without a priority keeps its place ahead of ours: kube-scheduler already sorted its own list. Ties
    keep kube-scheduler's victims first, then ours cheapest first (the sort is stable)."""

    def rank(uid: str) -> tuple[int, float]:
        holder = known.get(uid)
        if holder is not None:
            return (-holder.priority, holder.started)
        if uid in proposal.priorities:
            return (-proposal.priorities[uid], float("-inf"))
        return (-(2**63), float("-inf"))

    return sorted([*proposal.uids, *(h.uid for h in added)], key=rank)
