"""The enforcement the agent reports per card (``hami.io/node-enforcement``): read from what is on disk
under ``--hook-path`` at each registration, MIG cards as ``mig``, written in the registration's patch."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import kmock
import pytest

from hami.annotations import NODE_ENFORCEMENT, NODE_REGISTER, Enforcement, decode_node_enforcement
from hami.core.model import Device
from nodeagent.backends.base import Card
from nodeagent.backends.simulated import SimBackend
from nodeagent.config import NodeSettings
from nodeagent.inventory import Inventory
from nodeagent.registrar import (
    Registrar,
    build_registration,
    card_enforcement,
    hami_core_installed,
    registration_annotations,
)

from .agent_helpers import annotations_of, card, create_node, write_cards

NODES = kmock.resource("v1/nodes")


def _library(hook: Path, content: bytes | None = b"\x7fELF", preload: str | None = "") -> Path:
    """The library at ``hook``/vgpu and, unless ``preload`` is None, the ld.so.preload naming it (or
    ``preload`` when given)."""
    vgpu = hook / "vgpu"
    vgpu.mkdir(parents=True, exist_ok=True)
    path = vgpu / "libvgpu.so"
    if content is not None:
        path.write_bytes(content)
    if preload is not None:
        (vgpu / "ld.so.preload").write_text(f"{preload or path}\n")
    return path


def test_present_library_is_hami_core(tmp_path: Path) -> None:
    _library(tmp_path)
    assert hami_core_installed(tmp_path)


def test_symlink_to_the_library_counts_by_its_target(tmp_path: Path) -> None:
    real = _library(tmp_path / "real")
    (tmp_path / "hook" / "vgpu").mkdir(parents=True)
    os.symlink(real, tmp_path / "hook" / "vgpu" / "libvgpu.so")
    (tmp_path / "hook" / "vgpu" / "ld.so.preload").write_text(
        f"{tmp_path / 'hook' / 'vgpu' / 'libvgpu.so'}\n"
    )
    assert hami_core_installed(tmp_path / "hook")


@pytest.mark.parametrize(
    "layout",
    [
        "missing", "no vgpu dir", "empty file", "directory", "dangling symlink", "no hook path",
        "no preload", "preload a directory", "preload names another library",
    ],
)  # fmt: skip
def test_absent_library_is_not_hami_core(tmp_path: Path, layout: str) -> None:
    hook: Path | None = tmp_path
    if layout == "missing":
        (tmp_path / "vgpu").mkdir()
    elif layout == "empty file":
        _library(tmp_path, b"")
    elif layout == "directory":
        _library(tmp_path, None).mkdir()
    elif layout == "dangling symlink":
        os.symlink(tmp_path / "gone.so", _library(tmp_path, None))
    elif layout == "no hook path":
        _library(tmp_path)  # the library is there, but the agent was not told where to look
        hook = None
    elif layout == "no preload":  # mounted into containers, loaded by none
        _library(tmp_path, preload=None)
    elif layout == "preload a directory":  # what a runtime makes of a missing host path
        _library(tmp_path, preload=None)
        (tmp_path / "vgpu" / "ld.so.preload").mkdir()
    elif layout == "preload names another library":
        _library(tmp_path, preload="/elsewhere/libvgpu.so")
    assert not hami_core_installed(hook)


def _device(uuid: str, mode: str) -> Device:
    return Device(uuid=uuid, index=0, count=1, memory_mib=1, cores=100, type="NVIDIA-x", mode=mode)


@pytest.mark.parametrize(
    ("hami_core", "expected"),
    [
        (True, {"GPU-a": Enforcement.HAMI_CORE, "MIG-b": Enforcement.MIG}),
        (False, {"GPU-a": Enforcement.NONE, "MIG-b": Enforcement.MIG}),
    ],
)
def test_mig_cards_are_mig_others_follow_the_library(
    hami_core: bool, expected: dict[str, Enforcement]
) -> None:
    devices = [_device("GPU-a", "hami-core"), _device("MIG-b", "mig")]
    assert card_enforcement(devices, hami_core=hami_core) == expected


async def test_the_registration_patch_carries_the_enforcement_and_follows_the_disk(
    apiserver: kmock.KubernetesEmulator, api: Any, tmp_path: Path
) -> None:
    path = write_cards(tmp_path / "cards.yaml", [card("GPU-a"), card("GPU-b", numa=1)])
    hook = tmp_path / "hook"
    library = _library(hook)
    await create_node(apiserver, "n1")
    registrar = Registrar(
        api=api,
        node_name="n1",
        inventory=Inventory(SimBackend(path)),
        settings=NodeSettings(),
        hook_path=hook,
    )
    assert await registrar.register_once()
    patches = list(apiserver["patch", NODES])
    assert len(patches) == 1  # one API call: the register and the enforcement together
    assert {NODE_REGISTER, NODE_ENFORCEMENT} <= set(patches[0].data["metadata"]["annotations"])
    stored = await annotations_of(apiserver, "/api/v1/nodes/n1")
    assert decode_node_enforcement(stored[NODE_ENFORCEMENT]) == {
        "GPU-a": Enforcement.HAMI_CORE,
        "GPU-b": Enforcement.HAMI_CORE,
    }
    library.unlink()  # read at each registration: the library gone is the next patch
    assert await registrar.register_once()
    stored = await annotations_of(apiserver, "/api/v1/nodes/n1")
    assert set(decode_node_enforcement(stored[NODE_ENFORCEMENT]).values()) == {Enforcement.NONE}


def test_a_uuid_the_format_cannot_hold_leaves_the_enforcement_out_not_the_register() -> None:
    registration = build_registration(
        [Card(uuid="GPU a,b", index=0, model="T4", memory_mib=1)], [], NodeSettings()
    )
    wanted = registration_annotations(registration, {}, hami_core=True)
    assert NODE_REGISTER in wanted and NODE_ENFORCEMENT not in wanted


def test_an_unreportable_enforcement_removes_the_older_value() -> None:
    """A stale ``hami-core`` must not outlive what the agent can no longer say."""
    registration = build_registration(
        [Card(uuid="GPU a,b", index=0, model="T4", memory_mib=1)], [], NodeSettings()
    )
    wanted = registration_annotations(registration, {NODE_ENFORCEMENT: "GPU-a:hami-core"}, hami_core=True)
    assert wanted[NODE_ENFORCEMENT] is None
