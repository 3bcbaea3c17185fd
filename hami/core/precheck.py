"""The cheap, exact per-node verdict for plain requests (what makes ``allocate`` ~1 µs per node).

Owns :func:`plan` (built once per pod) and :func:`verdict` (per node, from the node's precomputed
:class:`~hami.core.model.NodeSummary`). A *plain* pod has no numa-bind, only NVIDIA requests,
no namespace quota, and at most one app container with a request (type/uuid lists and vgpu-mode are
per-card filters); init containers run on fresh copies (§7), so each is judged on its own. For such a pod
and a node without MIG cards, whether Fit succeeds does not depend on the card order: it succeeds
iff at least ``nums`` cards pass checks 1..14 independently. :func:`verdict` counts those cards in the
summary's ``open_cards`` (healthy, uncordoned, NVIDIA, non-MIG, a free slot) and answers True/False;
it answers None ("run Fit") for anything else. Tests compare it with Fit on random nodes.

Pure: stdlib only; must not import a Kubernetes client, aiohttp, kopf, grpc, pynvml, ``logging``,
``os`` or ``time``.
"""

from __future__ import annotations

from dataclasses import dataclass

from hami.core.model import NVIDIA, PERCENT_NOT_GIVEN, NamespaceQuota, NodeSummary, PodRequest
from hami.core.score import GpuPolicy


@dataclass(frozen=True, slots=True, kw_only=True)
class Check:
    """One container to judge: ``memory`` MiB (or ``percentage`` of each card when >= 0), ``cores``."""

    nums: int
    memory: int
    percentage: int  # -1: absolute memory
    cores: int


@dataclass(frozen=True, slots=True, kw_only=True)
class Plan:
    checks: tuple[Check, ...]
    mutex: bool
    steered: bool  # some per-card filter below applies
    use_types: tuple[str, ...] = ()  # lower-cased
    nouse_types: tuple[str, ...] = ()
    use_uuids: frozenset[str] = frozenset()
    nouse_uuids: frozenset[str] = frozenset()
    vgpu_mode: str | None = None

    def card_ok(self, uuid: str, card_type: str, mode: str) -> bool:
        """Checks 3 and 5 (type and uuid steering) for one card, as Fit does them."""
        if self.use_types and not any(t in card_type for t in self.use_types):
            return False
        if any(t in card_type for t in self.nouse_types):
            return False
        if self.vgpu_mode is not None and mode not in self.vgpu_mode:
            return False
        if self.use_uuids and uuid not in self.use_uuids:
            return False
        return uuid not in self.nouse_uuids


def plan(request: PodRequest, policy: GpuPolicy, quota: NamespaceQuota | None) -> Plan | None:
    """The checks for a plain pod, or None when every node must run the full Fit."""
    if request.numa_bind or (quota is not None and quota.limited):
        return None
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
        use_types=tuple(t.lower() for t in request.use_types),
        nouse_types=tuple(t.lower() for t in request.nouse_types),
        use_uuids=frozenset(request.use_uuids),
        nouse_uuids=frozenset(request.nouse_uuids),
        vgpu_mode=request.vgpu_mode,
    )


def verdict(p: Plan, summary: NodeSummary) -> bool | None:
    """Does the plain pod fit a node with this summary? None when the node has MIG cards."""
    if summary.has_mig:
        return None
    open_cards = summary.open_cards
    if p.steered:
        open_cards = tuple(c for c in open_cards if p.card_ok(c[5], c[6], c[7]))
    for check in p.checks:
        cores, memory, percentage, nums = check.cores, check.memory, check.percentage, check.nums
        if cores > summary.max_free_cores or nums > len(open_cards):
            return False
        found = 0
        for free_mem, free_cores, used, total_cores, total_mem, *_ in open_cards:
            if percentage < 0:
                if free_mem < memory:
                    break  # sorted by free memory, descending: no later card has enough
            elif free_mem < total_mem * percentage // 100:
                continue
            if free_cores < cores:
                continue
            if used and (p.mutex or (cores == 100 and total_cores == 100)):
                continue  # checks 7 and 13: mutex / exclusive request on a card with a task
            if cores == 0 and free_cores == 0 and total_cores != 0:
                continue  # check 14: a 0-core task cannot join a fully cored card
            found += 1
            if found == nums:
                break
        if found < nums:
            return False
    return True
