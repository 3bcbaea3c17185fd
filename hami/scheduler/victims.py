"""Who holds cards on a node, as preemption needs them: identity, priority, age, and whether it may go.

Owns :func:`node_holders` (the pods the snapshot counts on a node, with the
:class:`~hami.scheduler.podrecords.PodMeta` the watch showed -> the core's
:class:`~hami.core.preempt.Holder` values, each with whether the extender may *add* it as a victim and,
given the PodDisruptionBudgets (:class:`~hami.scheduler.disruption.DisruptionBook`), whether evicting it
violates one).
kube-scheduler looks every victim up by uid among the pods it has on that node and fails the whole
preemption when one is missing, so only a pod bound to that node (``spec.nodeName``), with a uid,
counted as the watch shows it (no bind of ours in flight for it) may be added; the others still count as
used room, and kube-scheduler may name them itself. Pure apart from the snapshot it reads: no I/O; must
not import the Kubernetes client or aiohttp.
"""

from __future__ import annotations

from dataclasses import dataclass

from hami.core.preempt import Holder
from hami.scheduler.disruption import DisruptionBook
from hami.scheduler.snapshot import Snapshot


@dataclass(frozen=True, slots=True, kw_only=True)
class NodeHolders:
    """A node's holders by uid, and the uids the extender may add as victims."""

    by_uid: dict[str, Holder]
    evictable: frozenset[str]


def node_holders(
    snapshot: Snapshot,
    node: str,
    exclude: tuple[str, str] | None = None,
    budgets: DisruptionBook | None = None,
) -> NodeHolders:
    """The pods counted on ``node`` (``exclude``, the preemptor, left out) as core holders, each marked
    ``violates_pdb`` when one of ``budgets`` protects it."""
    by_uid: dict[str, Holder] = {}
    evictable: set[str] = set()
    for key, counted, observed in snapshot.holders(node):
        meta = observed.meta if observed is not None else None
        if key == exclude or meta is None or not meta.uid:
            continue  # no uid: neither kube-scheduler nor we can name it; it stays as used room
        by_uid[meta.uid] = Holder(
            uid=meta.uid,
            namespace=key[0],
            priority=meta.priority,
            started=meta.started,
            violates_pdb=budgets is not None and budgets.violates(key[0], key[1], dict(meta.labels)),
            usage=counted.usage,
        )
        same = observed is not None and (observed.node, observed.allocated) == (
            counted.node,
            counted.allocated,
        )
        if same and meta.bound == node:
            evictable.add(meta.uid)
    return NodeHolders(by_uid=by_uid, evictable=frozenset(evictable))
