"""Why a pod does not fit a node, in words, and the nearest change that would make it fit.

Owns :func:`explain_node`: the node's verdict (the core's :class:`~hami.core.rejection.Rejection`, whose
``message`` is HAMi's reason text), plus hints a person can act on:
"fits if gpumem <= 7000", "fits if gpucores <= 40", "fits if nvidia.com/gpu <= 2", "needs 2 cards on one
NUMA node, best NUMA node has 1", "fits without the use-gputype preference", "fits without the
hami.io/require-enforcement annotation" (only when the pod raised the level above the cluster's floor:
the floor itself is no preference), "fits when pod ns/name ends". Each hint is found by re-running the
real fit (:func:`hami.core.allocate.fit_node`) on a changed request or node, never by a second
implementation of the rules. And :func:`cheapest_preemption`: the cheapest set of lower-priority pods
whose eviction would make room, over all nodes, as the extender's ``/preempt`` chooses it on each node
(:func:`hami.core.preempt.preempt_node`).

Pure: stdlib only; must not import a Kubernetes client, aiohttp, kopf, grpc, pynvml, ``logging``,
``os`` or ``time``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace

from hami.core.allocate import Policy, fit_node
from hami.core.enforcement import Level
from hami.core.model import (
    PERCENT_NOT_GIVEN,
    Allocation,
    ContainerRequest,
    NamespaceQuota,
    NodeState,
    PodRequest,
)
from hami.core.preempt import Holder, Preemption, cost, preempt_node
from hami.core.rejection import Rejection
from hami.core.usage import PodUsage, apply_usage
from hami.core.victimsearch import Cost


@dataclass(frozen=True, slots=True, kw_only=True)
class NodeExplanation:
    """One node's verdict for a pod: ``rejection`` says why it does not fit (Fit's reasons, or the node's
    exclusion); None when it fits."""

    node: str
    rejection: Rejection | None = None
    hints: tuple[str, ...] = ()  # nearest first
    distance: float | None = None  # how much the nearest hint gives up (0..1); None without hints

    @property
    def fits(self) -> bool:
        return self.rejection is None

    @property
    def reason(self) -> str:
        """HAMi's text of the rejection (empty when it fits)."""
        return self.rejection.message if self.rejection is not None else ""

    @property
    def resolvable(self) -> bool:
        return self.rejection is None or self.rejection.resolvable


#: How much a hint that is not a number gives up, relative to "ask x% less" (0..1).
DROP_PREFERENCE = 0.5
WAIT_FOR_POD = 0.3

#: (cost, text): cost is the share of the request given up, or a fixed cost for non-numeric hints
_Hint = tuple[float, str]


def explain_node(
    request: PodRequest,
    node: NodeState,
    policy: Policy,
    *,
    quotas: Mapping[str, NamespaceQuota] | None = None,
    pods: Mapping[str, PodUsage] | None = None,
    memory_name: str = "gpumem",
    cores_name: str = "gpucores",
    count_name: str = "nvidia.com/gpu",
) -> NodeExplanation:
    """Explain ``request`` on ``node``. ``pods`` maps "ns/name" to the usage of pods already on it."""

    def fits(r: PodRequest, n: NodeState = node) -> bool:
        return isinstance(fit_node(r, n, policy, quotas=quotas), Allocation)

    decision = fit_node(request, node, policy, quotas=quotas)
    if isinstance(decision, Allocation):
        return NodeExplanation(node=node.name)
    hints: list[_Hint] = []
    for position, container in enumerate(request.containers):
        if container is None or container.nums <= 0:
            continue
        hints += _container_hints(request, position, container, fits, memory_name, cores_name, count_name)
    hints += _steering_hints(request, fits)
    if request.numa_bind and fits(replace(request, numa_bind=False)):
        hints.append((DROP_PREFERENCE, _numa_hint(request, node)))
    hints += _freeing_hints(request, node, pods or {}, fits)
    hints.sort(key=lambda hint: hint[0])  # stable: equal costs keep their order
    return NodeExplanation(
        node=node.name,
        rejection=decision,
        hints=tuple(dict.fromkeys(text for _, text in hints)),
        distance=hints[0][0] if hints else None,
    )


def _with(request: PodRequest, position: int, container: ContainerRequest) -> PodRequest:
    containers = list(request.containers)
    containers[position] = container
    return replace(request, containers=tuple(containers))


def _largest(low: int, high: int, ok: Callable[[int], bool]) -> int | None:
    """The largest value in ``[low, high]`` with ``ok`` true, assuming ok is monotone (smaller is easier)."""
    if high < low or not ok(low):
        return None
    while low < high:
        middle = (low + high + 1) // 2
        if ok(middle):
            low = middle
        else:
            high = middle - 1
    return low


def _container_hints(
    request: PodRequest,
    position: int,
    container: ContainerRequest,
    fits: Callable[[PodRequest], bool],
    memory_name: str,
    cores_name: str,
    count_name: str,
) -> list[_Hint]:
    hints: list[_Hint] = []
    label = f"container #{position}" if len(request.containers) > 1 else "the container"
    # (what it asks, the least it may ask, the resource's name, the container asking another amount) for
    # each amount it asks; memory in MiB, else a percentage of each card
    asked: list[tuple[int, int, str, Callable[[int], ContainerRequest]]] = []
    if container.memory_mib > 0:
        asked.append((container.memory_mib, 1, memory_name, lambda v: replace(container, memory_mib=v)))
    elif container.percentage != PERCENT_NOT_GIVEN:
        percentage = f"{memory_name}-percentage"
        asked.append((container.percentage, 1, percentage, lambda v: replace(container, percentage=v)))
    if container.cores > 0:
        asked.append((container.cores, 0, cores_name, lambda v: replace(container, cores=v)))
    if container.nums > 1:
        asked.append((container.nums, 1, count_name, lambda v: replace(container, nums=v)))
    for amount, least, resource, asking in asked:

        def fits_asking(value: int, asking: Callable[[int], ContainerRequest] = asking) -> bool:
            return fits(_with(request, position, asking(value)))

        best = _largest(least, amount - 1, fits_asking)
        if best is not None:
            hints.append((_given_up(amount, best), f"fits if {label} asks {resource} <= {best}"))
    return hints


def _given_up(asked: int, best: int) -> float:
    return (asked - best) / asked


def _steering_hints(request: PodRequest, fits: Callable[[PodRequest], bool]) -> list[_Hint]:
    relaxed = (
        (request.use_types, replace(request, use_types=()), "nvidia.com/use-gputype"),
        (request.nouse_types, replace(request, nouse_types=()), "nvidia.com/nouse-gputype"),
        (request.use_uuids, replace(request, use_uuids=()), "nvidia.com/use-gpuuuid"),
        (request.nouse_uuids, replace(request, nouse_uuids=()), "nvidia.com/nouse-gpuuuid"),
    )
    hints = [
        (DROP_PREFERENCE, f"fits without the {name} annotation")
        for given, without, name in relaxed
        if given and fits(without)
    ]
    if request.vgpu_mode is not None and fits(replace(request, vgpu_mode=None)):
        hints.append((DROP_PREFERENCE, "fits without the nvidia.com/vgpu-mode annotation"))
    if request.enforcement > Level.NONE and fits(replace(request, enforcement=Level.NONE)):
        hints.append((DROP_PREFERENCE, "fits without the hami.io/require-enforcement annotation"))
    return hints


def _numa_hint(request: PodRequest, node: NodeState) -> str:
    """ "needs 2 cards on one NUMA node, best NUMA node has 1": count per NUMA node the cards that could
    each take one share of the largest container on their own."""
    wanted = max((c for c in request.containers if c is not None), key=lambda c: c.nums)
    single = replace(request, numa_bind=False, containers=(replace(wanted, nums=1),), init_count=0)
    per_numa: dict[int, int] = {}
    for state in node.devices:
        alone = replace(node, devices=(state,))
        if isinstance(fit_node(single, alone, Policy()), Allocation):
            per_numa[state.device.numa] = per_numa.get(state.device.numa, 0) + 1
    layout = "+".join(str(per_numa[n]) for n in sorted(per_numa)) or "0"
    return f"needs {wanted.nums} cards on one NUMA node; free cards per NUMA node: {layout}"


def _freeing_hints(
    request: PodRequest,
    node: NodeState,
    pods: Mapping[str, PodUsage],
    fits: Callable[[PodRequest, NodeState], bool],
) -> list[_Hint]:
    """Pods whose end alone would make room (at most three named, smallest first)."""
    freeing = [
        name
        for name, usage in sorted(pods.items(), key=lambda item: (item[1].memory, item[0]))
        if fits(request, apply_usage(node, usage, sign=-1))
    ]
    return [(WAIT_FOR_POD, f"fits when pod {name} ends") for name in freeing[:3]]


def cheapest_preemption(
    request: PodRequest,
    priority: int,
    nodes: Iterable[tuple[NodeState, Iterable[Holder]]],
    policy: Policy,
    *,
    quotas: Mapping[str, NamespaceQuota] | None = None,
) -> Preemption | None:
    """The cheapest preemption that would let the pod of ``priority`` fit: per node the set
    :func:`~hami.core.preempt.preempt_node` chooses among ``holders`` (the pods that may be evicted there;
    only those of strictly lower priority are), across nodes the cheapest by
    :func:`~hami.core.preempt.cost` (fewest pods, lowest priorities, fewest PDB violations, youngest),
    then the node name. None when no node has such a set; a node the pod fits as it is needs none and
    is skipped."""
    best: tuple[tuple[Cost, str], Preemption] | None = None
    for node, holders in nodes:
        found = preempt_node(request, priority, node, holders, policy, quotas=quotas)
        if found is None or not found.added:
            continue
        rank = (cost(found.added), node.name)
        if best is None or rank < best[0]:
            best = (rank, found)
    return None if best is None else best[1]
