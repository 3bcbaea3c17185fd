"""READ FIRST: what the scheduler asks of the core — place one pod on a set of nodes, rank them.

``allocate(request, nodes, policy, quotas=...)`` returns :class:`Decisions`: which nodes fit (``/filter``'s
``NodeNames``) and, per node, an :class:`~hami.core.model.Allocation` (grants per container, init
containers first) or a :class:`~hami.core.rejection.Rejection` (reason codes with card counts, and whether
it is resolvable). ``priorities(request, nodes, policy)`` is the one node ranking, kube-scheduler's 0..10
per node under the pod's node policy (``/prioritize``'s answer; kube-scheduler binds the best).
``fit_node`` is the decision for one node (bind recomputes with it on fresh state).

Pod level per node (docs/protocol.md, "Pod on a node"): init containers each run on a fresh copy of the
node's usage, app containers run in order on one shared copy that accumulates their picks;
containers without a request get an empty entry; the node score is the usage before the pod.

Speed: the verdict of most nodes comes from :mod:`hami.core.precheck` and the node's precomputed
summary; full allocations and rejection texts are built lazily, only for the nodes asked about; a
:class:`RejectionMemo` handed to ``allocate`` keeps the rejections of precheck-failed nodes from one call
to the next (per node state object and pod shape: the same answer, not recomputed for the next pod).

Pure: stdlib only; must not import a Kubernetes client, aiohttp, kopf, grpc, pynvml, ``logging``,
``os`` or ``time``.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, replace

from hami.core import fragmentation, fragplacement, precheck
from hami.core.enforcement import Level
from hami.core.fit import FitResult, Steering, fit_container
from hami.core.model import (
    NVIDIA,
    Allocation,
    Decision,
    DeviceState,
    Grant,
    MigAllocation,
    NamespaceQuota,
    NodeState,
    PodRequest,
)
from hami.core.quota import Entries, QuotaGate
from hami.core.rejection import Reason, Rejection
from hami.core.score import (
    BINPACK,
    FRAGMENTATION,
    SPREAD,
    GpuPolicy,
    card_score,
    node_priority,
    order_cards,
    parse_gpu_policy,
)
from hami.core.usage import add_grant

__all__ = ["Decisions", "Policy", "allocate", "fit_node", "priorities", "required"]


@dataclass(frozen=True, slots=True, kw_only=True)
class Policy:
    """Cluster defaults (``--node-scheduler-policy`` / ``--gpu-scheduler-policy``); pods may override.

    ``target``: the workload the ``fragmentation`` policies measure against (the scheduler's learned one);
    without it ``fragmentation`` ranks nodes like ``binpack`` and cards like ``spread``, as HAMi does
    with a value it does not know. ``enforcement``: the cluster's floor (``--require-enforcement``): the
    least enforcement level every granted card must provide; a pod's ``hami.io/require-enforcement``
    (``PodRequest.enforcement``) may raise it, never lower it (:func:`required`).
    """

    node_policy: str = BINPACK
    gpu_policy: str = SPREAD
    target: fragmentation.Target | None = None
    enforcement: Level = Level.NONE


def uses_target(request: PodRequest, policy: Policy) -> bool:
    """Does deciding ``request`` under ``policy`` read the policy's target: its node policy (the pod's,
    else the cluster's) is ``fragmentation``, or its card policy is."""
    if (request.node_policy or policy.node_policy) == FRAGMENTATION:
        return True
    return parse_gpu_policy(request.gpu_policy or policy.gpu_policy).fragmentation


def required(request: PodRequest, policy: Policy) -> PodRequest:
    """The request with the enforcement level its cards must have: the higher of the pod's own and the
    cluster's floor (the pod can raise the floor, never lower it)."""
    if policy.enforcement > request.enforcement:
        return replace(request, enforcement=policy.enforcement)
    return request


def fit_node(
    request: PodRequest,
    node: NodeState,
    policy: Policy,
    *,
    quotas: Mapping[str, NamespaceQuota] | None = None,
) -> Decision:
    """Place the pod on one node (docs/protocol.md, "Pod on a node"), or say why not and whether it ever
    could."""
    request = required(request, policy)
    quota = (quotas or {}).get(request.namespace)
    gpu = parse_gpu_policy(request.gpu_policy or policy.gpu_policy)
    target = policy.target if gpu.fragmentation else None
    outcome = _place(request, node, gpu, quota, target)
    if isinstance(outcome, Allocation):
        return outcome
    return _rejection(request, node, gpu, quota, target, outcome, precheck.plan(request, gpu, quota))


def _rejection(
    request: PodRequest,
    node: NodeState,
    gpu: GpuPolicy,
    quota: NamespaceQuota | None,
    target: fragmentation.Target | None,
    failure: _Failure,
    plan: precheck.Plan | None,
) -> Rejection:
    """The failure as a Rejection; resolvable when the pod would fit the node with nothing used
    (``plan``: the precheck's for this pod and quota, which judges the idle node when it covers it)."""
    reasons, total = failure
    resolvable = False
    if all(reason.per_card for reason in reasons):  # node-level ones (too few cards, type) never resolve
        idle = None if plan is None else precheck.idle_verdict(plan, node)
        if idle is None:
            empty = replace(node, devices=tuple(DeviceState(device=s.device) for s in node.devices))
            idle_quota = replace(quota, memory_used=0, cores_used=0) if quota is not None else None
            idle = isinstance(_place(request, empty, gpu, idle_quota, target), Allocation)
        resolvable = idle
    return Rejection(node=node.name, reasons=reasons, total=total, resolvable=resolvable)


#: The reasons a pod fails a node, with their card counts, and how many cards Fit saw.
_Failure = tuple[Mapping[Reason, int], int]


def _place(
    request: PodRequest,
    node: NodeState,
    gpu: GpuPolicy,
    quota: NamespaceQuota | None,
    target: fragmentation.Target | None = None,
    *,
    ordered: bool = True,
) -> Allocation | _Failure:
    """Fit the containers in turn (docs/protocol.md, "Pod on a node"). ``ordered=False`` walks the cards in
    registration order, skipping the card scores: only for a failure whose reason counts do not depend on the
    order (see :meth:`Decisions._rejected`)."""
    steer = Steering.of(request, gpu, node.cordoned, node.pair_scores)
    gated = quota if quota is not None and quota.limited else None
    vendor = node.summary.vendor  # cards passing the type pre-filter (docs/protocol.md, "Registration")
    fresh = node.devices
    shared = list(node.devices)
    grants: list[tuple[Grant, ...]] = []
    entries: list[Entries] = []
    migs: list[MigAllocation] = []
    for position, container in enumerate(request.containers):
        if container is None or container.nums <= 0:
            grants.append(())
            entries.append(())
            continue
        if container.type != NVIDIA:
            return {Reason.DEVICE_TYPE_NOT_FOUND: 1}, 0
        is_init = position < request.init_count
        cards = [(fresh if is_init else shared)[i] for i in vendor]
        if not ordered:
            order: list[int] | range = range(len(cards))
        elif target is not None:
            order = fragplacement.card_order(target, cards, node.cordoned, container, request.numa_bind)
        else:
            scores = [card_score(c, container, request.weights) for c in cards]
            order = order_cards(cards, scores, gpu, request.numa_bind)
        mig_exempt = (request.vgpu_mode is None or "mig" in request.vgpu_mode) and node.summary.has_mig
        if container.nums > len(cards) and not mig_exempt:
            return {Reason.NODE_INSUFFICIENT_DEVICE: 1}, 0
        gate = None
        if gated is not None:
            gate = QuotaGate(
                quota=gated, earlier=tuple(entries), position=position, init_count=request.init_count
            )
        result: FitResult = fit_container([cards[o] for o in order], container, steer, gate)
        if not result.ok:
            return result.reasons, result.total
        chosen: list[Grant] = []
        for k, pick in enumerate(result.picks):
            at = vendor[order[pick.slot]]
            chosen.append(
                Grant(uuid=pick.uuid, type=container.type, memory_mib=pick.memory, cores=pick.cores)
            )
            if pick.reservation is not None:
                migs.append(
                    MigAllocation(
                        container_index=position,
                        device_index=k,
                        gpu_uuid=pick.uuid,
                        profile=pick.reservation.profile,
                        placement=pick.reservation.placement,
                    )
                )
            if not is_init:
                shared[at] = add_grant(shared[at], pick.memory, pick.cores, pick.reservation)
        grants.append(tuple(chosen))
        entries.append(tuple((g.uuid, g.memory_mib, g.cores) for g in chosen))
    return Allocation(node=node.name, devices=tuple(grants), mig=tuple(migs), score=node.summary.score)


class RejectionMemo:
    """Rejections of nodes the precheck failed, kept from one :func:`allocate` to the next.

    Such a rejection is a function of the pod's request less who the pod is (namespace, name, uid), its
    card policy, the policy's target, the node's state and the namespace's quota; node states are
    immutable (a node whose usage changed has a new state object), so an entry is kept per node for
    its current state object only (a new state drops the node's entries) and is found only for that
    very object, at most ``per_node`` pod shapes each. Rejections under a quota are never kept. A node
    that goes is forgotten (:meth:`forget`, told by the live view); at most ``nodes`` node names are held
    (then it starts over). Not thread-safe: one event loop uses it."""

    __slots__ = ("_held", "_nodes", "_per_node")

    def __init__(self, *, per_node: int = 32, nodes: int = 100_000) -> None:
        self._per_node = per_node
        self._nodes = nodes
        self._held: dict[str, tuple[NodeState, dict[object, Rejection]]] = {}

    def get(self, node: NodeState, shape: object) -> Rejection | None:
        held = self._held.get(node.name)
        return held[1].get(shape) if held is not None and held[0] is node else None

    def put(self, node: NodeState, shape: object, rejection: Rejection) -> None:
        held = self._held.get(node.name)
        if held is None or held[0] is not node or len(held[1]) >= self._per_node:
            if held is None and len(self._held) >= self._nodes:
                self._held.clear()
            held = self._held[node.name] = (node, {})
        held[1][shape] = rejection

    def forget(self, name: str) -> None:
        """The node is gone (or has no usable state): drop what is kept for it."""
        self._held.pop(name, None)

    def __len__(self) -> int:
        """How many rejections are kept."""
        return sum(len(shapes) for _, shapes in self._held.values())


class Decisions:
    """The decision for every candidate node; full Allocations/Rejections are computed on demand."""

    __slots__ = (
        "_cache", "_fits", "_gpu", "_memo", "_nodes", "_plan", "_policy", "_quotas", "_request", "_shape",
    )  # fmt: skip

    def __init__(
        self,
        request: PodRequest,
        nodes: Iterable[NodeState],
        policy: Policy,
        quotas: Mapping[str, NamespaceQuota] | None,
        memo: RejectionMemo | None = None,
    ) -> None:
        request = required(request, policy)
        self._request = request
        self._policy = policy
        self._quotas = quotas
        self._nodes: dict[str, NodeState] = {}
        self._fits: dict[str, bool] = {}
        self._cache: dict[str, Decision] = {}
        self._gpu = parse_gpu_policy(request.gpu_policy or policy.gpu_policy)
        quota = (quotas or {}).get(request.namespace)
        plan = self._plan = precheck.plan(request, self._gpu, quota)
        self._memo = memo if quota is None else None
        self._shape: object = None
        if self._memo is not None:
            target = policy.target if self._gpu.fragmentation else None
            self._shape = (replace(request, namespace="", name="", uid=""), self._gpu, target)
        for node in nodes:
            self._nodes[node.name] = node
            fits = precheck.verdict(plan, node.summary) if plan is not None else None
            if fits is None:
                decision = self[node.name]
                fits = isinstance(decision, Allocation)
            self._fits[node.name] = fits

    def __getitem__(self, name: str) -> Decision:
        """The full decision for one node (KeyError for a node that was not a candidate)."""
        decision = self._cache.get(name)
        if decision is None:
            node = self._nodes[name]
            decision = self._rejected(node) if self._fits.get(name) is False else None
            if decision is None:
                decision = fit_node(self._request, node, self._policy, quotas=self._quotas)
            self._cache[name] = decision
        return decision

    def _rejected(self, node: NodeState) -> Rejection | None:
        """The rejection of a node the precheck failed, without the card scores and order.

        Without numa-bind, a pod the precheck covers fails the same way in any card order: each
        container meets the node's own usage (init containers a fresh copy, the one app container
        the unchanged node) and, with no MIG card and no quota, checks 1..15 judge each card alone, so
        each card's reason and the count of passing cards are the same. None: use the full Fit."""
        plan = self._plan
        if plan is None or plan.numa_bind or node.summary.has_mig:
            return None
        memo = self._memo
        if memo is not None:
            known = memo.get(node, self._shape)
            if known is not None:
                return known
        quota = (self._quotas or {}).get(self._request.namespace)
        outcome = _place(self._request, node, self._gpu, quota, ordered=False)
        if isinstance(outcome, Allocation):
            return None  # never, the precheck being exact; the full Fit decides
        target = self._policy.target if self._gpu.fragmentation else None
        rejection = _rejection(self._request, node, self._gpu, quota, target, outcome, plan)
        if memo is not None:
            memo.put(node, self._shape, rejection)
        return rejection

    def __iter__(self) -> Iterator[str]:
        return iter(self._nodes)

    def __len__(self) -> int:
        return len(self._nodes)

    def fits(self, name: str) -> bool:
        """Cheap: whether the pod fits ``name`` (no allocation is built)."""
        return self._fits[name]

    @property
    def fitting(self) -> tuple[str, ...]:
        return tuple(n for n, ok in self._fits.items() if ok)

    def rejections(self) -> dict[str, Rejection]:
        """Every failing node's rejection (runs the full Fit on each: the reasons are counted per card)."""
        out: dict[str, Rejection] = {}
        for name, ok in self._fits.items():
            if not ok:
                decision = self[name]
                assert isinstance(decision, Rejection)
                out[name] = decision
        return out


def allocate(
    request: PodRequest,
    nodes: Iterable[NodeState],
    policy: Policy,
    *,
    quotas: Mapping[str, NamespaceQuota] | None = None,
    memo: RejectionMemo | None = None,
) -> Decisions:
    """Decide the pod against every node (``memo``: rejections kept from earlier calls, see
    :class:`RejectionMemo`)."""
    return Decisions(request, nodes, policy, quotas, memo)


def priorities(request: PodRequest, nodes: Iterable[NodeState], policy: Policy) -> dict[str, int]:
    """The one node ranking: kube-scheduler's 0..10 per node (:func:`~hami.core.score.node_priority`
    of its node score, the usage before this pod) under the pod's node policy, else the cluster's;
    ``fragmentation`` with a target: :func:`hami.core.fragplacement.node_priorities`."""
    node_policy = request.node_policy or policy.node_policy
    if node_policy == FRAGMENTATION and policy.target is not None:
        return fragplacement.node_priorities(policy.target, request, nodes)
    return {node.name: node_priority(node.summary.score, node_policy) for node in nodes}
