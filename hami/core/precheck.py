"""The cheap, exact per-node verdict (what makes ``allocate`` ~1 µs per node), steered pods included.

Owns :func:`plan` (built once per pod), :func:`verdict` (per node, from the node's precomputed
:class:`~hami.core.model.NodeSummary`) and :func:`idle_verdict` (the same pod on the node with nothing
used: a rejection's ``resolvable``). The precheck covers pods with only NVIDIA requests, no namespace
quota, and at most one app container with a request; type/uuid steering (``use-gputype``,
``nouse-gputype``, ``use-gpuuuid``, ``nouse-gpuuuid``, ``vgpu-mode``) and ``numa-bind`` included, except
numa-bind under topology-aware card choice. Init containers run on fresh copies
(docs/protocol.md, "Pod on a node"), so each container is judged on its own. For such a pod and a node without
MIG cards, whether Fit succeeds does not depend on the card order, because no check 5..15 looks at the cards
picked before:

- without numa-bind, it succeeds iff at least ``nums`` cards pass checks 1..15 independently;
- with numa-bind, the order keeps each NUMA node's cards together (NUMA is the primary sort key of
  every card order, the ``fragmentation`` one included; under the single ``mutex`` policy the idle
  cards, the only ones that can pass, come first sorted by NUMA)
  and Fit restarts its picks at each change of NUMA node, so it succeeds iff one NUMA node has
  ``nums`` such cards. (With topology-aware choice Fit keeps only the last NUMA group's picks: declined.)

:func:`verdict` takes the summary's ``open_cards`` (healthy, uncordoned, NVIDIA, non-MIG, a free slot),
or for a steered pod the card groups whose type and mode pass (decided once per distinct type and mode
per pod, not per card) and the uuid filter (skipped when the node's uuids are disjoint from the lists),
split by NUMA node for numa-bind, and counts the cards that pass in each pool, free memory descending,
stopping at ``nums``. A pod that must have an enforcement level (``PodRequest.enforcement``, the
cluster's floor already applied) is judged as usual on a node whose open cards all reach it
(``NodeSummary.min_level``), fails a node where none does (``max_level``) and gets None ("run Fit") on a
node with some of each. It answers True/False, or None ("run Fit") for a node with MIG cards. Tests
compare it with Fit on random nodes (``tests/core/test_precheck.py``).

Pure: stdlib only; must not import a Kubernetes client, aiohttp, kopf, grpc, pynvml, ``logging``,
``os`` or ``time``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from hami.core.enforcement import Level, level_of
from hami.core.model import (
    NVIDIA,
    PERCENT_NOT_GIVEN,
    DeviceMode,
    NamespaceQuota,
    NodeState,
    NodeSummary,
    OpenCard,
    PodRequest,
)
from hami.core.score import GpuPolicy


@dataclass(frozen=True, slots=True, kw_only=True)
class Check:
    """One container to judge: ``memory`` MiB (or ``percentage`` of each card when >= 0), ``cores``."""

    nums: int
    memory: int
    percentage: int  # -1: absolute memory
    cores: int


_VENDOR = NVIDIA.lower()  # is_vendor_card's type pre-filter (docs/protocol.md, "Registration"), lower-cased

#: Cards to count together: the open cards of the node, or of one NUMA node (free memory descending).
Pool = tuple[OpenCard, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class Plan:
    checks: tuple[Check, ...]
    mutex: bool
    steered: bool  # some per-card filter below applies
    numa_bind: bool = False
    use_types: tuple[str, ...] = ()  # lower-cased
    nouse_types: tuple[str, ...] = ()
    use_uuids: frozenset[str] = frozenset()
    nouse_uuids: frozenset[str] = frozenset()
    vgpu_mode: str | None = None
    uuids: bool = False  # use_uuids or nouse_uuids given
    required: Level = Level.NONE  # the least enforcement level a card must provide
    #: type_ok per (lower-cased type, mode) seen so far: one decision per distinct card type per pod.
    _types: dict[tuple[str, str], bool] = field(default_factory=dict, compare=False, repr=False)

    def type_ok(self, card_type: str, mode: str) -> bool:
        """Check 3 (type and vgpu-mode steering) for a lower-cased card type, as Fit does it."""
        if self.use_types and not any(t in card_type for t in self.use_types):
            return False
        if any(t in card_type for t in self.nouse_types):
            return False
        return self.vgpu_mode is None or mode in self.vgpu_mode

    def card_ok(self, uuid: str, card_type: str, mode: str) -> bool:
        """Checks 3 and 5 (type and uuid steering) for one card, as Fit does them."""
        key = (card_type, mode)
        ok = self._types.get(key)
        if ok is None:
            ok = self._types[key] = self.type_ok(card_type, mode)
        if not ok:
            return False
        if self.use_uuids and uuid not in self.use_uuids:
            return False
        return uuid not in self.nouse_uuids


def plan(request: PodRequest, policy: GpuPolicy, quota: NamespaceQuota | None) -> Plan | None:
    """The checks for a pod the precheck covers, or None when every node must run the full Fit."""
    if quota is not None and quota.limited:
        return None
    if request.numa_bind and policy.topology:
        return None  # topology-aware Fit keeps only the last NUMA group's picks: order-dependent
    checks: list[Check] = []
    apps = 0
    for position, container in enumerate(request.containers):
        if container is None or container.nums <= 0:
            continue
        if container.type != NVIDIA:
            return None
        if position >= request.init_count:
            apps += 1
        if container.memory_mib > 0:
            memory, percentage = container.memory_mib, -1
        elif container.percentage != PERCENT_NOT_GIVEN:
            memory, percentage = 0, container.percentage
        else:
            memory, percentage = 0, -1
        checks.append(
            Check(nums=container.nums, memory=memory, percentage=percentage, cores=min(container.cores, 100))
        )
    if apps > 1:
        return None  # later app containers see earlier ones' usage: needs the real walk
    steered = bool(
        request.use_types
        or request.nouse_types
        or request.use_uuids
        or request.nouse_uuids
        or request.vgpu_mode is not None
    )
    return Plan(
        checks=tuple(checks),
        mutex=policy.mutex,
        steered=steered,
        numa_bind=request.numa_bind,
        use_types=tuple(t.lower() for t in request.use_types),
        nouse_types=tuple(t.lower() for t in request.nouse_types),
        use_uuids=frozenset(request.use_uuids),
        nouse_uuids=frozenset(request.nouse_uuids),
        vgpu_mode=request.vgpu_mode,
        uuids=bool(request.use_uuids or request.nouse_uuids),
        required=request.enforcement,
    )


def verdict(p: Plan, summary: NodeSummary) -> bool | None:
    """Does the pod fit a node with this summary? None when the node has MIG cards."""
    if summary.has_mig:
        return None
    if p.required > summary.min_level:
        if p.required > summary.max_level:
            return False  # no open card has the enforcement required
        return None  # some have, some not: Fit counts them
    kinds = summary.kinds
    if not p.steered:
        pools = summary.by_numa if p.numa_bind else (summary.open_cards,)
    elif len(kinds) == 1 and not p.uuids:  # the common steered node: one kind of card, no uuid list
        ok = p._types.get(kinds[0])
        if ok is None:
            ok = p._types[kinds[0]] = p.type_ok(*kinds[0])
        pools = (summary.by_numa if p.numa_bind else (summary.open_cards,)) if ok else ()
    else:
        pools = _steered_pools(p, summary)
    mutex = p.mutex
    for check in p.checks:
        if check.cores > summary.max_free_cores:
            return False
        for pool in pools:
            if _enough(check, pool, mutex):
                break
        else:
            return False
    return True


def idle_verdict(p: Plan, node: NodeState) -> bool | None:
    """Does the pod fit ``node`` with nothing used on it (a rejection's ``resolvable``)? None when the
    node has MIG cards. An idle card has every slot, all its memory and cores free and no task, so
    checks 6, 7, 13 and 14 and a percentage of memory always pass on it: a usable card takes the
    container iff its memory and cores reach the request's."""
    usable: list[tuple[int, int, int]] = []
    for state in node.devices:
        dev = state.device
        card_type = dev.type.lower()
        if _VENDOR not in card_type:
            continue
        if dev.mode == DeviceMode.MIG:
            return None
        if not dev.health or dev.count <= 0 or dev.uuid in node.cordoned:
            continue
        if p.steered and not p.card_ok(dev.uuid, card_type, dev.mode):
            continue
        if p.required and level_of(dev.enforcement) < p.required:
            continue
        usable.append((dev.memory_mib, dev.cores, dev.numa if p.numa_bind else 0))
    for check in p.checks:
        per_numa: dict[int, int] = {}
        for memory, cores, numa in usable:
            if (check.percentage >= 0 or memory >= check.memory) and cores >= check.cores:
                per_numa[numa] = per_numa.get(numa, 0) + 1
        if max(per_numa.values(), default=0) < check.nums:
            return False
    return True


def _steered_pools(p: Plan, summary: NodeSummary) -> tuple[Pool, ...]:
    """The open cards passing the pod's type, mode and uuid filters: one pool, or one per NUMA node.

    The type and mode filter is decided once per distinct (type, mode) of the pod (``Plan._types``);
    the uuid lists cost nothing on a node whose uuids they do not name."""
    known = p._types
    passing = 0
    for kind in summary.kinds:
        ok = known.get(kind)
        if ok is None:
            ok = known[kind] = p.type_ok(*kind)
        passing += ok
    use, nouse = p.use_uuids, p.nouse_uuids
    if not passing or (use and summary.uuids.isdisjoint(use)):
        return ()
    keep_all = not use and (not nouse or summary.uuids.isdisjoint(nouse))
    if passing == len(summary.kinds):
        pools = summary.by_numa if p.numa_bind else (summary.open_cards,)
        if keep_all:
            return pools
        return tuple(_named(pool, use, nouse) for pool in pools)
    by_numa: dict[int, list[OpenCard]] = {}  # some kinds pass, some not: the groups of those that do
    merged = False
    for group in summary.groups:
        if not known[group.type, group.mode]:
            continue
        cards = group.cards
        if not keep_all:
            cards = _named(cards, use, nouse)
        pool = by_numa.setdefault(group.numa if p.numa_bind else 0, [])
        merged = merged or bool(pool)
        pool.extend(cards)
    if merged:
        for pool in by_numa.values():
            pool.sort(key=_minus_free_mem)  # free memory descending again
    return tuple(tuple(pool) for pool in by_numa.values())


def _named(cards: Pool, use: frozenset[str], nouse: frozenset[str]) -> Pool:
    """``cards`` passing check 5: named by ``use`` (when given), not named by ``nouse``."""
    return tuple(c for c in cards if (not use or c[5] in use) and c[5] not in nouse)


def _minus_free_mem(card: OpenCard) -> int:
    return -card[0]


def _enough(check: Check, cards: Pool, mutex: bool) -> bool:
    """Do ``check.nums`` of ``cards`` (free memory descending) pass checks 6..15 on their own?"""
    nums = check.nums
    if nums > len(cards):
        return False
    cores, memory, percentage = check.cores, check.memory, check.percentage
    found = 0
    for free_mem, free_cores, used, total_cores, total_mem, *_ in cards:
        if percentage < 0:
            if free_mem < memory:
                return False  # sorted by free memory, descending: no later card has enough
        elif free_mem < total_mem * percentage // 100:
            continue
        if free_cores < cores:
            continue
        if used and (mutex or (cores == 100 and total_cores == 100)):
            continue  # checks 7 and 13: mutex / exclusive request on a card with a task
        if cores == 0 and free_cores == 0 and total_cores != 0:
            continue  # check 14: a 0-core task cannot join a fully cored card
        found += 1
        if found == nums:
            return True
    return False
