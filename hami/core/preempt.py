"""Device-aware preemption: the cheapest set of lower-priority pods whose eviction lets a pod fit a node.

Owns :func:`preempt_node`. In: the pod's request and priority, one node's current state, the pods
holding grants there (:class:`Holder`: uid, namespace, priority, start time, PDB flag, usage) and the
victims kube-scheduler already chose (``required``: they go anyway; their usage is taken off first).
Out: a :class:`Preemption` (the victims to add and the allocation the pod gets once they are gone),
or None when no set of pods of strictly lower priority makes room (a required victim of equal or
higher priority also gives None). Whether the pod fits is always asked of the allocation core
(:func:`hami.core.allocate.allocate` / :func:`~hami.core.allocate.fit_node`), so type/uuid steering,
NUMA, memory, cores, slots, MIG and the namespace quota are the scheduler's own rules.

Choice, in order: the fewest victims; then the lowest priorities (the highest victim priority as low
as possible, then the next ...); then the fewest PodDisruptionBudget violations; then the youngest
pods (the oldest victim as young as possible, then the next ...); then the uids, so answers repeat.

Search. A victim only frees the cards it holds, so the pods that matter sit on cards the pod could
use. When one container asks for cards (and neither a quota nor a multi-instance MIG request couples
them), each card is searched on its own: the sets of that card's pods whose eviction lets one card's
share of the request fit there alone (smallest first), then sets of ``nums`` cards are combined and
checked on the whole node, cheapest first. Otherwise candidate sets are tried by size (only sets
whose pods can sit on at most as many cards as the pod asks for). Both stop after ``budget`` fit
questions; then, and whenever they find nothing, a greedy pass answers: evict every candidate, then
give back the most important ones (kube-scheduler's reprieve) while the pod still fits — never
optimal by proof, always a set that fits. ``Preemption.exact`` says which answered.

Pure: stdlib only; must not import a Kubernetes client, aiohttp, kopf, grpc, pynvml, ``logging``,
``os`` or ``time``.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from hami.core.allocate import Policy
from hami.core.model import Allocation, NamespaceQuota, NodeState, PodRequest, is_vendor_card
from hami.core.victimsearch import BUDGET, CardMemo, Holder, VictimSearch, cheap, cost, release, remove

__all__ = ["BUDGET", "Holder", "Preemption", "cost", "preempt_node"]


@dataclass(frozen=True, slots=True, kw_only=True)
class Preemption:
    """Evict ``added`` (besides the required victims): the pod then gets ``allocation``."""

    node: str
    added: tuple[Holder, ...]  # cheapest first: by priority, then youngest, then uid
    allocation: Allocation
    exact: bool  # the search proved this set the cheapest (False: the greedy pass answered)


def preempt_node(
    request: PodRequest,
    priority: int,
    node: NodeState,
    holders: Iterable[Holder],
    policy: Policy,
    *,
    required: Sequence[Holder] = (),
    quotas: Mapping[str, NamespaceQuota] | None = None,
    budget: int = BUDGET,
    memo: dict[Hashable, CardMemo] | None = None,
) -> Preemption | None:
    """The victims to add on ``node`` for a pod of ``priority`` (see the module docstring).

    ``memo``: pass one dict to every node of one preemption (same request and policy) to share
    the per-card answers between nodes with cards alike (a homogeneous cluster asks once)."""
    if any(h.priority >= priority for h in required):
        return None
    quota = (quotas or {}).get(request.namespace)
    quota = quota if quota is not None and quota.limited else None
    unique = list({h.uid: h for h in required}.values())
    gone = {h.uid for h in unique}
    start = remove(node, unique)
    quota_left = release(quota, request.namespace, unique)
    vendor = {s.device.uuid for s in node.devices if is_vendor_card(s.device)}
    pool = sorted(
        (
            h
            for h in {h.uid: h for h in holders}.values()
            if h.uid not in gone and h.priority < priority and any(c.uuid in vendor for c in h.usage.cards)
        ),
        key=lambda h: h.uid,
    )
    search = VictimSearch(request, start, policy, quota_left, pool, budget, memo)
    if search.fits(()):
        allocation = search.place(())
        return (
            None
            if allocation is None
            else Preemption(node=node.name, added=(), allocation=allocation, exact=True)
        )
    if not search.fits(search.by_uid):
        return None
    found = search.per_card() or search.by_size()
    exact = search.exact and found is not None
    if found is None:
        chosen = search.greedy()
        allocation = search.place(chosen)
        if allocation is None:
            return None
        found = (chosen, allocation)
    uids, allocation = found
    added = sorted((search.by_uid[u] for u in uids), key=cheap)
    return Preemption(node=node.name, added=tuple(added), allocation=allocation, exact=exact)
