"""Node registration: turn discovered cards into ``hami.io/node-nvidia-register`` and keep it current.

Owns the card → registration rules (docs/node-agent.md, "Registration") and the loop that
writes them: every ``interval`` seconds rebuild the registration and merge-patch ONLY the
register, pair-score and enforcement keys when the JSON differs from what the Node carries, or when the last
patch is older than ``refresh`` (a cheap guard against a lost write); after an error wait ``retry``
seconds. The comparison is against the Node itself (not a cache of what was sent), so a failed patch
is retried and an annotation removed by someone else comes back. The node lock key is never written
here. The enforcement per card (``hami.io/node-enforcement``) is read at each registration from what
is on disk: ``hami-core`` when ``--hook-path`` is set and ``<hook>/vgpu/libvgpu.so`` is a regular
non-empty file (symlinks followed, as the container runtime would), ``mig`` for MIG-mode cards, for
MPS-mode cards what the control daemon answers at that moment (``MpsControl.check``) and the card's
compute mode as the backend reads it now: ``mps-namespaced`` with namespaces on a card in
``EXCLUSIVE_PROCESS`` mode once the running pods' namespaces are restored on that daemon, else ``mps``,
or ``none`` when it is down; else ``none``. An MPS card not in ``EXCLUSIVE_PROCESS`` mode is logged
once (tenants can leave MPS there; the agent never changes the mode). Imports the codec and ``hami.kube``;
must not import grpc or pynvml.
"""

from __future__ import annotations

import asyncio
import logging
import stat
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from hami import objects
from hami.annotations import (
    NODE_ENFORCEMENT,
    NODE_PAIR_SCORES,
    NODE_REGISTER,
    Enforcement,
    encode_node_devices,
    encode_node_enforcement,
    encode_pair_scores,
)
from hami.core.model import Device, DeviceMode, MigPlacement, MigProfile
from hami.kube.client import KubeError
from hami.kube.nodes import get_node, patch_node_annotations
from hami.kube.protocol import KubeApi
from nodeagent.backends.base import EXCLUSIVE_PROCESS, BackendError, Card, Link
from nodeagent.config import NodeSettings
from nodeagent.inventory import Inventory
from nodeagent.mps.control import MpsControl
from nodeagent.mps.protocol import MpsState
from nodeagent.mps.rules import MAX_CLIENTS, capped_split_count

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True, kw_only=True)
class Registration:
    """What this node registers: cards in discovery order, pair scores, and why cards were left out."""

    devices: tuple[Device, ...]
    pair_scores: Mapping[str, Mapping[str, int]] = field(default_factory=dict)
    skipped: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()  # settings the node could not take as written (logged with the patch)


def card_type(model: str) -> str:
    """HAMi prefixes ``NVIDIA-`` unless the model already starts with ``NVIDIA`` (the scheduler's type
    pre-filter keeps only types containing ``nvidia``)."""
    return model if model.startswith("NVIDIA") else f"NVIDIA-{model}"


def allowed_mig_profiles(card: Card, allowlist: Mapping[str, Iterable[str]]) -> tuple[MigProfile, ...]:
    """The card's hardware profiles named in the allowlist entry whose key is part of the model name
    (case-insensitive), in hardware order."""
    model = card.model.lower()
    names: set[str] = set()
    for key, profiles in allowlist.items():
        if key.lower() in model:
            names.update(profiles)
    return tuple(
        MigProfile(
            name=p.name,
            memory_mib=p.memory_mib,
            cores=p.cores,
            slice_count=p.slice_count,
            placements=tuple(MigPlacement(start=s, size=z) for s, z in p.placements),
        )
        for p in card.mig_profiles
        if p.name in names
    )


def build_registration(cards: Iterable[Card], links: Iterable[Link], settings: NodeSettings) -> Registration:
    """Apply the node settings to the discovered cards (pure).

    hami-core: ``count`` = split count; ``devmem`` = MiB × memory scaling (truncated, as HAMi's int32
    conversion); ``devcore`` = 100 × core scaling. MIG: ``count`` = the largest instance count among the
    allowed profiles, memory unscaled, ``devcore`` 100; a card without an allowed profile is skipped.
    Filtered cards (uuid or index) and cards without a memory size (and no preconfigured size) are
    skipped too. MPS: as hami-core, ``count`` capped at MPS's client limit per card
    (:data:`nodeagent.mps.rules.MAX_CLIENTS`, 48), with a note. Example: a 32768 MiB card, scaling 1.5,
    split 10 → ``count`` 10, ``devmem`` 49152.
    """
    devices: list[Device] = []
    skipped: list[str] = []
    mig = settings.mode == DeviceMode.MIG.value
    split = settings.split_count
    notes: list[str] = []
    if settings.mode == DeviceMode.MPS.value and split > MAX_CLIENTS:
        split = capped_split_count(split)
        notes.append(f"deviceSplitCount {settings.split_count} capped at {MAX_CLIENTS}, MPS clients per card")
    for card in cards:
        if card.uuid in settings.filter_uuids or card.index in settings.filter_indexes:
            skipped.append(f"{card.uuid}: filtered by the node config")
            continue
        memory = card.memory_mib if card.memory_mib is not None else settings.preconfigured_memory
        if not memory:
            skipped.append(f"{card.uuid}: memory size unknown and preConfiguredDeviceMemory unset")
            continue
        if mig:
            profiles = allowed_mig_profiles(card, settings.device.mig_profile_allowlist)
            if not profiles:
                skipped.append(f"{card.uuid}: no MIG profile of {card.model!r} is in migProfileAllowlist")
                continue
            count = max(p.instance_count for p in card.mig_profiles if p.name in {q.name for q in profiles})
            devmem, devcore = memory, 100
        else:
            profiles, count = (), split
            devmem = int(memory * settings.memory_scaling) if settings.memory_scaling != 1 else memory
            devcore = int(settings.core_scaling * 100)
        devices.append(
            Device(
                uuid=card.uuid,
                index=card.index,
                count=count,
                memory_mib=devmem,
                cores=devcore,
                type=card_type(card.model),
                numa=card.numa,
                mode=settings.mode,
                health=card.healthy,
                mig_profiles=profiles,
            )
        )
    registered = {d.uuid for d in devices}
    scores: dict[str, dict[str, int]] = {}
    for link in links:
        if link.a in registered and link.b in registered:
            scores.setdefault(link.a, {})[link.b] = link.score
            scores.setdefault(link.b, {})[link.a] = link.score
    return Registration(
        devices=tuple(devices), pair_scores=scores, skipped=tuple(skipped), notes=tuple(notes)
    )


#: how much of ld.so.preload is read (it names one library; a huge file is not ours)
PRELOAD_LIMIT = 64 * 1024


def hami_core_installed(hook_path: Path | None) -> bool:
    """True when ``hook_path`` is set, ``<hook_path>/vgpu/libvgpu.so`` is a regular, non-empty file (a
    symlink counts by what it points to) and ``<hook_path>/vgpu/ld.so.preload`` (Allocate mounts it at
    ``/etc/ld.so.preload``) is a regular file naming that library on a line of its own: a library that
    nothing preloads enforces nothing. Any error reading them counts as not installed."""
    if hook_path is None:
        return False
    library = hook_path / "vgpu" / "libvgpu.so"
    preload = hook_path / "vgpu" / "ld.so.preload"
    try:
        info = library.stat()
        if not stat.S_ISREG(info.st_mode) or info.st_size == 0 or not stat.S_ISREG(preload.stat().st_mode):
            return False
        with preload.open("rb") as file:
            lines = file.read(PRELOAD_LIMIT).decode("utf-8", "replace").splitlines()
    except OSError:
        return False
    return str(library) in (line.strip() for line in lines)


def card_enforcement(
    devices: Iterable[Device],
    *,
    hami_core: bool,
    mps: MpsState | None = None,
    exclusive: Collection[str] = (),
) -> dict[str, Enforcement]:
    """Per registered card: ``mig`` for a MIG-mode card; for an MPS-mode card what the control daemon
    answered: ``none`` when it is down or the agent runs none, ``mps-namespaced`` when it holds
    namespaces, the running pods' namespaces are restored on it and the card is in ``exclusive``
    (the UUIDs of the cards in ``EXCLUSIVE_PROCESS`` compute mode: elsewhere a process that leaves MPS
    runs on the card unlimited), else ``mps``; else ``hami-core`` when the library is installed, else
    ``none``."""
    shared = Enforcement.HAMI_CORE if hami_core else Enforcement.NONE
    namespaced = mps is not None and mps.running and mps.namespaces and mps.restored
    found: dict[str, Enforcement] = {}
    for device in devices:
        if device.mode == DeviceMode.MIG.value:
            found[device.uuid] = Enforcement.MIG
        elif device.mode != DeviceMode.MPS.value:
            found[device.uuid] = shared
        elif mps is None or not mps.running:
            found[device.uuid] = Enforcement.NONE
        elif namespaced and device.uuid in exclusive:
            found[device.uuid] = Enforcement.MPS_NAMESPACED
        else:
            found[device.uuid] = Enforcement.MPS
    return found


def registration_annotations(
    registration: Registration,
    current: Mapping[str, str],
    *,
    hami_core: bool = False,
    mps: MpsState | None = None,
    exclusive: Collection[str] = (),
) -> dict[str, str | None]:
    """The node annotations to hold: register JSON, the enforcement per card (left out, with a warning,
    when a card UUID has a ``,``, ``:`` or whitespace), pair scores when known (removed when they
    vanish)."""
    wanted: dict[str, str | None] = {NODE_REGISTER: encode_node_devices(registration.devices)}
    try:
        wanted[NODE_ENFORCEMENT] = encode_node_enforcement(
            card_enforcement(registration.devices, hami_core=hami_core, mps=mps, exclusive=exclusive)
        )
    except ValueError as exc:  # a card UUID the format cannot hold: the register still goes out
        log.warning("not reporting the node's enforcement: %s", exc)
        if NODE_ENFORCEMENT in current:  # never leave an older, now unknown, value standing
            wanted[NODE_ENFORCEMENT] = None
    if registration.pair_scores:
        wanted[NODE_PAIR_SCORES] = encode_pair_scores(registration.pair_scores)
    elif NODE_PAIR_SCORES in current:
        wanted[NODE_PAIR_SCORES] = None
    return wanted


class Registrar:
    """The registration loop for one node (``run`` never returns; cancel it to stop)."""

    def __init__(
        self,
        *,
        api: KubeApi,
        node_name: str,
        inventory: Inventory,
        settings: NodeSettings,
        hook_path: Path | None = None,
        interval: float = 30.0,
        retry: float = 5.0,
        refresh: float = 300.0,
        clock: Callable[[], float] | None = None,
        mps: MpsControl | None = None,
    ) -> None:
        self._api, self._node, self._inventory, self._settings = api, node_name, inventory, settings
        self._interval, self._retry, self._refresh = interval, retry, refresh
        self._hook = hook_path
        self._mps = mps  # MPS mode: the cards' enforcement is what the control daemon answers
        self._clock = clock  # default: the event loop's clock, the one asyncio.sleep counts in
        self._last_patch: float | None = None
        self._told_shared: set[str] = set()  # MPS cards logged as not in EXCLUSIVE_PROCESS mode

    async def run(self) -> None:
        while True:
            try:
                await self.register_once()
            except (KubeError, BackendError) as exc:
                log.warning(
                    "registration of node %s failed, retrying in %gs: %s", self._node, self._retry, exc
                )
                await asyncio.sleep(self._retry)
                continue
            await asyncio.sleep(self._interval)

    def _tell_shared(self, devices: Iterable[Device], exclusive: Collection[str]) -> None:
        """Log once per card an MPS card whose compute mode is not ``EXCLUSIVE_PROCESS``."""
        for device in devices:
            if (
                device.mode != DeviceMode.MPS.value
                or device.uuid in exclusive
                or device.uuid in self._told_shared
            ):
                continue
            self._told_shared.add(device.uuid)
            log.warning(
                "node %s: MPS card %s is not in EXCLUSIVE_PROCESS compute mode: tenants can leave MPS and "
                "use the card unlimited (reported as mps, not mps-namespaced); the agent never changes "
                "the mode: an operator may set it with nvidia-smi -i %s -c EXCLUSIVE_PROCESS",
                self._node,
                device.uuid,
                device.uuid,
            )

    async def register_once(self) -> bool:
        """One cycle; True when the Node was patched. Raises on API or hardware errors."""
        cards = await self._inventory.refresh()
        links = await self._inventory.links()
        registration = build_registration(cards, links, self._settings)
        node = await get_node(self._api, self._node)
        current = objects.annotations(node)
        hami_core = await asyncio.to_thread(hami_core_installed, self._hook)
        mps = await self._mps.check() if self._mps is not None else None
        exclusive = {c.uuid for c in cards if c.compute_mode == EXCLUSIVE_PROCESS}
        if mps is not None:
            self._tell_shared(registration.devices, exclusive)
        wanted = registration_annotations(
            registration, current, hami_core=hami_core, mps=mps, exclusive=exclusive
        )
        changed = any(current.get(key) != value for key, value in wanted.items())
        now = self._clock() if self._clock is not None else asyncio.get_running_loop().time()
        due = self._last_patch is not None and now - self._last_patch >= self._refresh
        if not changed and not due:
            if self._last_patch is None:
                self._last_patch = now  # the Node already says what we would write
            return False
        await patch_node_annotations(self._api, self._node, wanted)
        self._last_patch = now
        healthy = sum(d.health for d in registration.devices)
        log.info(
            "registered node %s: %d cards (%d healthy)%s%s",
            self._node,
            len(registration.devices),
            healthy,
            f", skipped {'; '.join(registration.skipped)}" if registration.skipped else "",
            f"; {'; '.join(registration.notes)}" if registration.notes else "",
        )
        return True
