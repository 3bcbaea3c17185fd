"""Fit: one container request against one node's sorted card list
(docs/protocol.md, "Fit", "Several cards", "Topology", "MIG").

Owns :func:`fit_container`, HAMi's card walk: from the last card of the sorted list to the first, the
first failing check of 1..16 records its reason and skips the card (after check 3, ours: a card whose
enforcement level is below the pod's required one, ``CardEnforcementInsufficient``, checked only when a
level above ``none`` is required); picks accumulate until ``nums``
(or, in topology mode, every passing card is collected and :mod:`hami.core.topology` chooses). A
picked MIG card is visited again so one card can supply several instances. A failure is the reason
codes with their card counts (:mod:`hami.core.rejection` renders HAMi's text from them).

Pure: stdlib only; must not import a Kubernetes client, aiohttp, kopf, grpc, pynvml, ``logging``,
``os`` or ``time``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from hami.core import mig, topology
from hami.core.enforcement import Level, level_of
from hami.core.model import (
    NVIDIA,
    PERCENT_NOT_GIVEN,
    ContainerRequest,
    DeviceMode,
    DeviceState,
    MigReservation,
    PodRequest,
    Reason,
)
from hami.core.quota import QuotaGate
from hami.core.score import GpuPolicy


@dataclass(frozen=True, slots=True, kw_only=True)
class Steering:
    """The pod- and node-level inputs Fit consults besides the request itself."""

    use_types: tuple[str, ...]  # lower-cased
    nouse_types: tuple[str, ...]
    use_uuids: frozenset[str]
    nouse_uuids: frozenset[str]
    vgpu_mode: str | None
    numa_bind: bool
    policy: GpuPolicy
    cordoned: frozenset[str]
    pair_scores: Mapping[str, Mapping[str, int]]
    required: Level = Level.NONE  # the least enforcement a card must provide (pod's and cluster's)
    #: check 3's answer per (card type, mode) met so far: decided once per kind of card, not per card.
    _types: dict[tuple[str, str], bool] = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def of(
        cls,
        pod: PodRequest,
        policy: GpuPolicy,
        node_cordoned: frozenset[str],
        pair_scores: Mapping[str, Mapping[str, int]],
    ) -> Steering:
        return cls(
            use_types=tuple(t.lower() for t in pod.use_types),
            nouse_types=tuple(t.lower() for t in pod.nouse_types),
            use_uuids=frozenset(pod.use_uuids),
            nouse_uuids=frozenset(pod.nouse_uuids),
            vgpu_mode=pod.vgpu_mode,
            numa_bind=pod.numa_bind,
            policy=policy,
            cordoned=node_cordoned,
            pair_scores=pair_scores,
            required=pod.enforcement,
        )

    def type_ok(self, request: ContainerRequest, state: DeviceState) -> bool:
        """Check 3: request type, use/nouse-gputype (case-insensitive substrings), vgpu-mode."""
        if request.type != NVIDIA:
            return False
        key = (state.device.type, state.device.mode)
        ok = self._types.get(key)
        if ok is None:
            ok = self._types[key] = self._kind_ok(*key)
        return ok

    def _kind_ok(self, card_type: str, mode: str) -> bool:
        card_type = card_type.lower()
        if self.use_types and not any(t in card_type for t in self.use_types):
            return False
        if any(t in card_type for t in self.nouse_types):
            return False
        return self.vgpu_mode is None or mode in self.vgpu_mode

    def uuid_ok(self, uuid: str) -> bool:
        """Check 5: use-gpuuuid must list the uuid exactly, nouse-gpuuuid must not."""
        if self.use_uuids and uuid not in self.use_uuids:
            return False
        return uuid not in self.nouse_uuids


@dataclass(frozen=True, slots=True, kw_only=True)
class Pick:
    """One card chosen for the container.

    ``need`` is the memory resolved for this card (MiB or % of it); the grant carries ``memory`` /
    ``cores``, which a MIG booking replaces by the profile's figures (docs/protocol.md, "MIG").
    """

    slot: int  # position in the card list handed to Fit
    uuid: str
    need: int
    memory: int
    cores: int
    reservation: MigReservation | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class FitResult:
    """Picks on success; on failure the reason counts and the partial picks."""

    ok: bool
    picks: tuple[Pick, ...]
    reasons: Mapping[Reason, int]
    total: int


def memory_need(request: ContainerRequest, total_mem: int) -> int:
    """Check 9: MiB if given, else the percentage of this card (integer division), else 0."""
    if request.memory_mib > 0:
        return request.memory_mib
    if request.percentage != PERCENT_NOT_GIVEN:
        return total_mem * request.percentage // 100
    return 0


def fit_container(
    cards: Sequence[DeviceState], request: ContainerRequest, steer: Steering, quota: QuotaGate | None
) -> FitResult:
    """Walk ``cards`` (already sorted and type-filtered) from the end and pick ``request.nums`` cards."""
    total = len(cards)
    nums = request.nums
    remaining = nums
    prev_numa = -1
    picks: list[Pick] = []
    reasons: dict[Reason, int] = {}
    cores = min(request.cores, 100)  # check 8: clamped, no reason recorded
    topo = steer.policy.topology
    required = steer.required
    i = total - 1
    while i >= 0:
        state = cards[i]
        dev = state.device
        reason: Reason | None
        pick: Pick | None = None
        if not state.healthy:
            reason = Reason.CARD_NOT_HEALTH
        elif dev.uuid in steer.cordoned:
            reason = Reason.CARD_CORDONED
        elif not steer.type_ok(request, state):
            reason = Reason.CARD_TYPE_MISMATCH
        elif required and level_of(dev.enforcement) < required:
            reason = Reason.CARD_ENFORCEMENT_INSUFFICIENT
        else:
            if steer.numa_bind and dev.numa != prev_numa:
                # Check 4 happens before the uuid check: even a card rejected below resets the group.
                if remaining != nums:
                    reasons[Reason.NUMA_NOT_FIT] = reasons.get(Reason.NUMA_NOT_FIT, 0) + nums - remaining
                picks.clear()
                remaining = nums
                prev_numa = dev.numa
            reason, pick = _card_checks(i, state, request, cores, picks, steer, quota)
        if reason is not None:
            reasons[reason] = reasons.get(reason, 0) + 1
            i -= 1
            continue
        assert pick is not None
        picks.append(pick)
        if dev.mode != DeviceMode.MIG:
            i -= 1  # a MIG card is revisited: it may supply another instance
        if not topo:
            remaining -= 1
            if remaining == 0:
                return FitResult(ok=True, picks=tuple(picks), reasons={}, total=total)
    if topo and len(picks) >= nums:
        chosen = topology.select([p.uuid for p in picks], nums, steer.pair_scores)
        return FitResult(ok=True, picks=tuple(picks[c] for c in chosen), reasons={}, total=total)
    if picks:
        reasons[Reason.ALLOCATED_CARDS_INSUFFICIENT_REQUEST] = len(picks)  # replaces, not adds
    return FitResult(ok=False, picks=tuple(picks), reasons=reasons, total=total)


def _card_checks(
    slot: int,
    state: DeviceState,
    request: ContainerRequest,
    cores: int,
    picks: Sequence[Pick],
    steer: Steering,
    quota: QuotaGate | None,
) -> tuple[Reason | None, Pick | None]:
    """Checks 5..15 for one card; returns the failing reason, or the pick."""
    dev = state.device
    if not steer.uuid_ok(dev.uuid):
        return Reason.CARD_UUID_MISMATCH, None
    if dev.count <= state.used:
        return Reason.CARD_TIME_SLICING_EXHAUSTED, None
    if steer.policy.mutex and state.used > 0:
        return Reason.EXCLUSIVE_DEVICE_ALLOCATE_CONFLICT, None
    need = memory_need(request, dev.memory_mib)
    if quota is not None:
        entries = [(p.uuid, p.need, p.cores) for p in picks]
        if not quota.allows([*entries, (dev.uuid, need, cores)]):
            return Reason.RESOURCE_QUOTA_NOT_FIT, None
    if state.free_mem < need:
        return Reason.CARD_INSUFFICIENT_MEMORY, None
    if state.free_cores < cores:
        return Reason.CARD_INSUFFICIENT_CORE, None
    if dev.cores == 100 and cores == 100 and state.used > 0:
        return Reason.EXCLUSIVE_DEVICE_ALLOCATE_CONFLICT, None
    if dev.cores != 0 and state.used_cores == dev.cores and cores == 0:
        return Reason.CARD_COMPUTE_UNITS_EXHAUSTED, None
    if dev.mode != DeviceMode.MIG:
        return None, Pick(slot=slot, uuid=dev.uuid, need=need, memory=need, cores=cores)
    earlier = [p.need for p in picks if p.slot == slot]
    booked = mig.book_all(dev, state.reservations, [*earlier, need])
    if booked is None:
        return Reason.CARD_MIG_TOPOLOGY_INFEASIBLE, None
    reservation = booked[-1]
    profile = mig.profile_of(dev, reservation.profile)
    assert profile is not None
    grant = Pick(
        slot=slot,
        uuid=dev.uuid,
        need=need,
        memory=profile.memory_mib,
        cores=profile.cores,
        reservation=reservation,
    )
    return None, grant
