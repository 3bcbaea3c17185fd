"""Registration: the card → register-JSON rules (pure tables) and the 30 s loop against the embedded API
server under looptime (change-only patches, periodic refresh, 5 s retry, the node lock left alone)."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from pathlib import Path
from typing import Any

import kmock
import pytest

from hami.annotations import (
    NODE_ENFORCEMENT,
    NODE_LOCK,
    NODE_PAIR_SCORES,
    NODE_REGISTER,
    decode_node_devices,
    decode_pair_scores,
)
from hami.settings import DeviceConfig
from nodeagent.backends.base import Card, Link, MigProfileInfo
from nodeagent.backends.simulated import SimBackend
from nodeagent.config import NodeSettings
from nodeagent.inventory import Inventory
from nodeagent.registrar import Registrar, build_registration, card_type

from .agent_helpers import annotations_of, card, create_node, write_cards

NODES = kmock.resource("v1/nodes")


def gpu(
    uuid: str, index: int = 0, *, model: str = "Tesla V100-PCIE-32GB", memory: int | None = 32768, **kw: Any
) -> Card:
    return Card(uuid=uuid, index=index, model=model, memory_mib=memory, **kw)


A100_PROFILES = (
    MigProfileInfo(
        name="1g.5gb", memory_mib=4864, cores=15, slice_count=1, instance_count=7, placements=((0, 1), (1, 1))
    ),
    MigProfileInfo(
        name="3g.20gb",
        memory_mib=19968,
        cores=43,
        slice_count=4,
        instance_count=2,
        placements=((0, 4), (4, 4)),
    ),
    MigProfileInfo(
        name="7g.40gb", memory_mib=40192, cores=100, slice_count=8, instance_count=1, placements=((0, 8),)
    ),
)


# ------------------------------------------------------------------------------------------ pure rules
def test_defaults_follow_hami_chart_split_10_and_prefix_the_type() -> None:
    reg = build_registration([gpu("GPU-a"), gpu("GPU-b", 1, numa=1, healthy=False)], [], NodeSettings())
    a, b = reg.devices
    assert (a.uuid, a.index, a.count, a.memory_mib, a.cores) == ("GPU-a", 0, 10, 32768, 100)
    assert a.type == "NVIDIA-Tesla V100-PCIE-32GB" and a.mode == "hami-core" and a.health
    assert (b.index, b.numa, b.health) == (1, 1, False)
    assert reg.pair_scores == {} and reg.skipped == ()


def test_type_prefix_only_when_the_model_does_not_start_with_nvidia() -> None:
    assert card_type("NVIDIA A100-SXM4-40GB") == "NVIDIA A100-SXM4-40GB"
    assert card_type("Tesla T4") == "NVIDIA-Tesla T4"


@pytest.mark.parametrize(
    ("memory_scaling", "core_scaling", "split", "devmem", "devcore", "count"),
    [
        (1.0, 1.0, 10, 32768, 100, 10),
        (1.5, 1.0, 10, 49152, 100, 10),  # 32768 × 1.5
        (1.3, 2.0, 4, 42598, 200, 4),  # int(32768 × 1.3) = int(42598.4); cores 100 × 2
    ],
)
def test_scaling_and_split_count(
    memory_scaling: float, core_scaling: float, split: int, devmem: int, devcore: int, count: int
) -> None:
    settings = NodeSettings(memory_scaling=memory_scaling, core_scaling=core_scaling, split_count=split)
    (device,) = build_registration([gpu("GPU-a")], [], settings).devices
    assert (device.memory_mib, device.cores, device.count) == (devmem, devcore, count)


def test_filtered_cards_and_cards_without_memory_are_left_out() -> None:
    settings = NodeSettings(filter_uuids=frozenset({"GPU-b"}), filter_indexes=frozenset({2}))
    cards = [gpu("GPU-a"), gpu("GPU-b", 1), gpu("GPU-c", 2), gpu("GPU-d", 3, memory=None)]
    reg = build_registration(cards, [], settings)
    assert [d.uuid for d in reg.devices] == ["GPU-a"]
    assert len(reg.skipped) == 3 and "GPU-d: memory size unknown" in reg.skipped[2]
    # with preConfiguredDeviceMemory the unified-memory card is registered with that size
    reg = build_registration(cards, [], replace(settings, preconfigured_memory=120000))
    assert [(d.uuid, d.memory_mib) for d in reg.devices] == [("GPU-a", 32768), ("GPU-d", 120000)]


def test_mig_mode_counts_instances_of_allowed_profiles_and_skips_cards_without_one() -> None:
    device = DeviceConfig(mig_profile_allowlist={"A100-SXM4-40GB": ("1g.5gb", "3g.20gb")})
    settings = NodeSettings(device=device, mode="mig", memory_scaling=2.0)
    cards = [
        gpu("GPU-a", model="NVIDIA A100-SXM4-40GB", memory=40960, mig_profiles=A100_PROFILES),
        gpu("GPU-t", 1, model="Tesla T4", memory=15360),
    ]
    reg = build_registration(cards, [], settings)
    (a,) = reg.devices
    # count = max instance count of the allowed profiles (1g: 7, 3g: 2); memory not scaled; cores 100
    assert (a.count, a.memory_mib, a.cores, a.mode) == (7, 40960, 100, "mig")
    assert [p.name for p in a.mig_profiles] == ["1g.5gb", "3g.20gb"]
    assert [(p.start, p.size) for p in a.mig_profiles[1].placements] == [(0, 4), (4, 4)]
    assert "GPU-t" in reg.skipped[0]


def test_pair_scores_are_symmetric_and_only_between_registered_cards() -> None:
    links = [Link(a="GPU-a", b="GPU-b", score=200), Link(a="GPU-a", b="GPU-x", score=60)]
    settings = NodeSettings(filter_uuids=frozenset({"GPU-x"}))
    reg = build_registration([gpu("GPU-a"), gpu("GPU-b", 1), gpu("GPU-x", 2)], links, settings)
    assert reg.pair_scores == {"GPU-a": {"GPU-b": 200}, "GPU-b": {"GPU-a": 200}}


# ------------------------------------------------------------------------------------------ the loop
def _patches(k: kmock.KubernetesEmulator) -> list[Any]:
    return list(k["patch", NODES])


@pytest.fixture
def cards_file(tmp_path: Path) -> Path:
    return write_cards(
        tmp_path / "cards.yaml",
        [card("GPU-a"), card("GPU-b", numa=1)],
        links=[{"a": "GPU-a", "b": "GPU-b", "score": 100}],
    )


def _registrar(api: Any, path: Path, **kw: Any) -> Registrar:
    inventory = Inventory(SimBackend(path))
    return Registrar(api=api, node_name="n1", inventory=inventory, settings=NodeSettings(), **kw)


@pytest.mark.looptime
async def test_registers_every_30s_but_patches_only_on_change(
    apiserver: kmock.KubernetesEmulator, api: Any, cards_file: Path
) -> None:
    lock = "2026-01-01T00:00:00Z,default,holder"
    await create_node(apiserver, "n1", {NODE_LOCK: lock})
    task = asyncio.create_task(_registrar(api, cards_file).run())
    try:
        await asyncio.sleep(95)  # cycles at 0, 30, 60, 90: one patch, nothing changed after it
        assert len(_patches(apiserver)) == 1
        stored = await annotations_of(apiserver, "/api/v1/nodes/n1")
        devices = decode_node_devices(stored[NODE_REGISTER])
        assert [(d.uuid, d.count, d.memory_mib, d.numa, d.health) for d in devices] == [
            ("GPU-a", 10, 32768, 0, True),
            ("GPU-b", 10, 32768, 1, True),
        ]
        assert decode_pair_scores(stored[NODE_PAIR_SCORES]) == {
            "GPU-a": {"GPU-b": 100},
            "GPU-b": {"GPU-a": 100},
        }
        assert stored[NODE_LOCK] == lock  # a live allocation's lock is never touched
        assert set(_patches(apiserver)[0].data["metadata"]["annotations"]) == {
            NODE_REGISTER,
            NODE_ENFORCEMENT,
            NODE_PAIR_SCORES,
        }

        write_cards(cards_file, [card("GPU-a"), card("GPU-b", numa=1, healthy=False)])  # at t=95
        await asyncio.sleep(24)  # t=119: the next cycle (t=120) has not run yet
        assert len(_patches(apiserver)) == 1
        # checks sit mid-way between cycles: while the agent's API call runs in its thread, looptime
        # waits in real time only a share of the distance to the next timer before moving the clock
        await asyncio.sleep(15)  # t=134: the t=120 cycle patched; the next is at t=150
        assert len(_patches(apiserver)) == 2
        stored = await annotations_of(apiserver, "/api/v1/nodes/n1")
        assert [d.health for d in decode_node_devices(stored[NODE_REGISTER])] == [True, False]
        assert NODE_PAIR_SCORES not in stored  # the links are gone from the file: the scores go too
        assert stored[NODE_LOCK] == lock
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


@pytest.mark.looptime
async def test_refresh_repatches_and_a_removed_annotation_comes_back(
    apiserver: kmock.KubernetesEmulator, api: Any, cards_file: Path
) -> None:
    await create_node(apiserver, "n1")
    task = asyncio.create_task(_registrar(api, cards_file, refresh=300).run())
    try:
        await asyncio.sleep(40)
        assert len(_patches(apiserver)) == 1
        await apiserver.patch("/api/v1/nodes/n1", json={"metadata": {"annotations": {NODE_REGISTER: None}}})
        await asyncio.sleep(35)  # t=75: the t=60 cycle saw the Node differ and wrote it again
        assert len(_patches(apiserver)) == 3  # ours, the test's, ours
        assert NODE_REGISTER in await annotations_of(apiserver, "/api/v1/nodes/n1")
        await asyncio.sleep(300)  # t=375: unchanged, but the t=360 cycle is 300 s after the last patch
        assert len(_patches(apiserver)) == 4
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


@pytest.mark.looptime
async def test_errors_are_retried_after_5s(
    apiserver: kmock.KubernetesEmulator, api: Any, cards_file: Path
) -> None:
    task = asyncio.create_task(_registrar(api, cards_file).run())  # the Node does not exist yet: 404
    try:
        await asyncio.sleep(12)
        await create_node(apiserver, "n1")
        await asyncio.sleep(2)  # t=14: attempts at 0, 5, 10 failed; the next is at 15
        assert NODE_REGISTER not in await annotations_of(apiserver, "/api/v1/nodes/n1")
        await asyncio.sleep(3)  # t=17: the t=15 attempt registered (checked mid-way, see above)
        assert NODE_REGISTER in await annotations_of(apiserver, "/api/v1/nodes/n1")
        await asyncio.to_thread(
            cards_file.write_text, "cards: [{uuid: GPU-a, memory_mib: lots}]"
        )  # a broken edit at t=17
        await asyncio.sleep(30)  # t=47: the t=45 cycle failed; the registration stays as it was
        assert (
            len(decode_node_devices((await annotations_of(apiserver, "/api/v1/nodes/n1"))[NODE_REGISTER]))
            == 2
        )
        write_cards(cards_file, [card("GPU-a")])
        await asyncio.sleep(5)  # t=52: retried at t=50
        stored = await annotations_of(apiserver, "/api/v1/nodes/n1")
        assert [d.uuid for d in decode_node_devices(stored[NODE_REGISTER])] == ["GPU-a"]
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def test_the_stored_register_json_is_hamis_byte_for_byte(
    apiserver: kmock.KubernetesEmulator, api: Any, tmp_path: Path
) -> None:
    # HAMi's registration example (docs/node-agent.md, "Registration"): zero index/numa and false health are
    # omitted (Go omitempty), key order id, index, count, devmem, devcore, type, numa, mode, health; scaling
    # applied (1.5 × 32768)
    path = write_cards(
        tmp_path / "cards.yaml",
        [
            card("GPU-a", memory=32768),
            card("GPU-b", memory=32768, numa=1, healthy=False),
            {"uuid": "GPU-c", "model": "NVIDIA A100-SXM4-40GB", "memory_mib": 40960, "numa": 1},
        ],
    )
    await create_node(apiserver, "n1")
    settings = NodeSettings(memory_scaling=1.5, core_scaling=0.5, split_count=4)
    registrar = Registrar(api=api, node_name="n1", inventory=Inventory(SimBackend(path)), settings=settings)
    assert await registrar.register_once()
    stored = (await annotations_of(apiserver, "/api/v1/nodes/n1"))[NODE_REGISTER]
    assert stored == (
        '[{"id":"GPU-a","count":4,"devmem":49152,"devcore":50,"type":"NVIDIA-Tesla V100-PCIE-32GB",'
        '"mode":"hami-core","health":true},'
        '{"id":"GPU-b","index":1,"count":4,"devmem":49152,"devcore":50,"type":"NVIDIA-Tesla V100-PCIE-32GB",'
        '"numa":1,"mode":"hami-core"},'
        '{"id":"GPU-c","index":2,"count":4,"devmem":61440,"devcore":50,"type":"NVIDIA A100-SXM4-40GB",'
        '"numa":1,"mode":"hami-core","health":true}]'
    )
    assert not await registrar.register_once()  # unchanged: no second patch
