"""Small builders for the pure core's table tests (never through the annotation codec)."""

from __future__ import annotations

from collections.abc import Mapping

from hami.core.enforcement import Enforcement, Level
from hami.core.model import (
    NVIDIA,
    PERCENT_NOT_GIVEN,
    ContainerRequest,
    Device,
    DeviceState,
    MigPlacement,
    MigProfile,
    MigReservation,
    NodeState,
    PodRequest,
    ScoringWeights,
)


def make_device(
    uuid: str = "GPU-0",
    *,
    index: int = 0,
    count: int = 10,
    memory: int = 1000,
    cores: int = 100,
    type: str = NVIDIA,
    numa: int = 0,
    mode: str = "hami-core",
    health: bool = True,
    mig_profiles: tuple[MigProfile, ...] = (),
    enforcement: Enforcement = Enforcement.NONE,
) -> Device:
    return Device(
        uuid=uuid,
        index=index,
        count=count,
        memory_mib=memory,
        cores=cores,
        type=type,
        numa=numa,
        mode=mode,
        health=health,
        mig_profiles=mig_profiles,
        enforcement=enforcement,
    )


def make_card(
    uuid: str = "GPU-0",
    *,
    used: int = 0,
    used_mem: int = 0,
    used_cores: int = 0,
    reservations: tuple[MigReservation, ...] = (),
    inconsistencies: int = 0,
    **device: object,
) -> DeviceState:
    """A card with usage; ``device`` keywords go to :func:`make_device`."""
    return DeviceState(
        device=make_device(uuid, **device),  # type: ignore[arg-type]
        used=used,
        used_mem=used_mem,
        used_cores=used_cores,
        reservations=reservations,
        inconsistencies=inconsistencies,
    )


def make_cards(n: int, **kwargs: object) -> tuple[DeviceState, ...]:
    """``n`` identical cards GPU-0..GPU-(n-1) with index = position."""
    return tuple(make_card(f"GPU-{i}", index=i, **kwargs) for i in range(n))  # type: ignore[arg-type]


def node_state(
    name: str = "node1",
    cards: tuple[DeviceState, ...] | list[DeviceState] = (),
    *,
    pair_scores: Mapping[str, Mapping[str, int]] | None = None,
    cordoned: frozenset[str] = frozenset(),
) -> NodeState:
    """The core's view of a node (a :class:`NodeState`); ``tests.builders.make_node`` builds a Node object."""
    return NodeState(name=name, devices=tuple(cards), pair_scores=pair_scores or {}, cordoned=cordoned)


def make_container(
    nums: int = 1, *, mem: int = 0, pct: int = PERCENT_NOT_GIVEN, cores: int = 0, type: str = NVIDIA
) -> ContainerRequest:
    """A request as the parser (docs/protocol.md, "Requests") would build it; ``mem=0, pct=101`` means 0 MiB
    (hand-built)."""
    return ContainerRequest(nums=nums, type=type, memory_mib=mem, percentage=pct, cores=cores)


def make_request(
    *containers: ContainerRequest | None,
    init_count: int = 0,
    namespace: str = "default",
    name: str = "pod",
    use_types: tuple[str, ...] = (),
    nouse_types: tuple[str, ...] = (),
    use_uuids: tuple[str, ...] = (),
    nouse_uuids: tuple[str, ...] = (),
    numa_bind: bool = False,
    vgpu_mode: str | None = None,
    gpu_policy: str | None = None,
    node_policy: str | None = None,
    weights: ScoringWeights | None = None,
    enforcement: Level = Level.NONE,
) -> PodRequest:
    return PodRequest(
        namespace=namespace,
        name=name,
        containers=tuple(containers),
        init_count=init_count,
        use_types=use_types,
        nouse_types=nouse_types,
        use_uuids=use_uuids,
        nouse_uuids=nouse_uuids,
        numa_bind=numa_bind,
        vgpu_mode=vgpu_mode,
        gpu_policy=gpu_policy,
        node_policy=node_policy,
        weights=weights or ScoringWeights(),
        enforcement=enforcement,
    )


def a100_profiles() -> tuple[MigProfile, ...]:
    """A100-40GB-like MIG profiles with NVML's legal placements."""

    def places(size: int, *starts: int) -> tuple[MigPlacement, ...]:
        return tuple(MigPlacement(start=s, size=size) for s in starts)

    return (
        MigProfile(name="1g.5gb", memory_mib=4864, cores=15, slice_count=1, placements=places(1, *range(7))),
        MigProfile(name="2g.10gb", memory_mib=9856, cores=29, slice_count=2, placements=places(2, 0, 2, 4)),
        MigProfile(name="3g.20gb", memory_mib=19968, cores=43, slice_count=3, placements=places(4, 0, 4)),
        MigProfile(name="7g.40gb", memory_mib=40192, cores=100, slice_count=7, placements=places(8, 0)),
    )


def mig_card(uuid: str = "MIG-0", **kwargs: object) -> DeviceState:
    return make_card(uuid, mode="mig", count=7, memory=40960, mig_profiles=a100_profiles(), **kwargs)  # type: ignore[arg-type]
