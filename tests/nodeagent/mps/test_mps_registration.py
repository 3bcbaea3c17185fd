"""Registration of an MPS-mode node: a card's split count is capped at MPS's clients per card (48), and
the registration's log line says so; the decoded register on the Node carries the capped count."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import kmock
import pytest

from hami.annotations import NODE_REGISTER, decode_node_devices
from nodeagent.backends.base import Card
from nodeagent.backends.simulated import SimBackend
from nodeagent.config import NodeSettings
from nodeagent.inventory import Inventory
from nodeagent.registrar import Registrar, build_registration
from tests.nodeagent.agent_helpers import annotations_of, card, create_node, write_cards

V100 = Card(uuid="GPU-a", index=0, model="Tesla V100-PCIE-32GB", memory_mib=32768)


@pytest.mark.parametrize(
    ("mode", "split", "count", "notes"),
    [
        ("mps", 100, 48, ("deviceSplitCount 100 capped at 48, MPS clients per card",)),
        ("mps", 49, 48, ("deviceSplitCount 49 capped at 48, MPS clients per card",)),
        ("mps", 48, 48, ()),
        ("mps", 10, 10, ()),
        ("hami-core", 100, 100, ()),  # only MPS has the client limit
    ],
)
def test_split_count_capped_on_mps_nodes(mode: str, split: int, count: int, notes: tuple[str, ...]) -> None:
    registration = build_registration([V100], [], NodeSettings(mode=mode, split_count=split))
    (device,) = registration.devices
    assert (device.count, device.mode, device.memory_mib, device.cores) == (count, mode, 32768, 100)
    assert registration.notes == notes


async def test_the_registration_log_line_names_the_cap(
    apiserver: kmock.KubernetesEmulator, api: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    await create_node(apiserver, "n1")
    inventory = Inventory(SimBackend(write_cards(tmp_path / "cards.yaml", [card("GPU-a")])))
    settings = NodeSettings(mode="mps", split_count=64)
    registrar = Registrar(api=api, node_name="n1", inventory=inventory, settings=settings)
    with caplog.at_level(logging.INFO, logger="nodeagent.registrar"):
        assert await registrar.register_once()
    stored = decode_node_devices((await annotations_of(apiserver, "/api/v1/nodes/n1"))[NODE_REGISTER])
    assert [(d.uuid, d.count, d.mode) for d in stored] == [("GPU-a", 48, "mps")]
    assert "registered node n1: 1 cards (1 healthy); deviceSplitCount 64 capped at 48" in caplog.text
