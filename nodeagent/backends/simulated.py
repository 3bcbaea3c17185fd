"""Simulated cards described in a YAML file, for the demo, tests and GPU-less nodes.

Owns the file format and its strict parser::

    cards:
      - uuid: GPU-0000          # required, unique
        model: NVIDIA A100-SXM4-40GB
        memory_mib: 40960       # omit or null = "not reported" (preConfiguredDeviceMemory applies)
        numa: 0                 # default 0
        healthy: true           # default true
        index: 0                # default: position in the list
        compute_mode: default   # default "default"; exclusive-process | exclusive-thread | prohibited
        used_memory_mib: 1024   # optional live usage (exporter only): card memory in use
        utilization: 35         # optional, 0-100 (GPU); memory_utilization: 0-100 (memory controller)
        processes:              # optional: processes on the card (host PIDs; [] = none)
          - {pid: 4242, used_memory_mib: 1000, utilization: 30}
        mig:                    # optional: MIG profiles the card offers
          - {name: 1g.5gb, memory_mib: 4864, cores: 15, slice_count: 1, instance_count: 7,
             placements: [{start: 0, size: 1}, ...]}
    links:                      # optional topology scores (symmetric)
      - {a: GPU-0000, b: GPU-0001, score: 100}

The file is read again on every call and parsed again only when its bytes changed, so a test or the
demo can mark a card unhealthy, add or remove one, and the agent sees it on its next poll. Errors name
the file, the entry and the field. Dynamic MIG: GPU instances live in memory only (a restarted agent
starts with empty cards, as after a driver reload); creation enforces the card's profiles, their legal
placements and non-overlap, and hands out ``MIG-<uuid4>`` UUIDs shaped like the driver's. Must not
import pynvml, grpc or the Kubernetes client.
"""

from __future__ import annotations

import itertools
import threading
import uuid as uuidlib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from nodeagent.backends.base import (
    COMPUTE_MODES,
    DEFAULT_COMPUTE,
    BackendError,
    BackendUnavailable,
    Card,
    Link,
    LiveUsage,
    MigInstance,
    MigProfileInfo,
    ProcessUsage,
)

_MIB = 1024 * 1024


class SimBackend:
    """Cards from a YAML file (format in the module docstring)."""

    def __init__(self, path: Path) -> None:
        self._path = path
        self._raw: bytes | None = None
        self._cards: tuple[Card, ...] = ()
        self._links: tuple[Link, ...] = ()
        self._usage: tuple[LiveUsage, ...] = ()
        self._instances: dict[str, list[MigInstance]] = {}  # card uuid -> its MIG GPU instances
        self._lock = threading.Lock()  # the registrar and the health poll may read from two threads
        if not path.is_file():
            raise BackendUnavailable(f"simulated devices file {str(path)!r} does not exist")
        self._refresh()

    @property
    def name(self) -> str:
        return "sim"

    def cards(self) -> tuple[Card, ...]:
        self._refresh()
        return self._cards

    def links(self) -> tuple[Link, ...]:
        self._refresh()
        return self._links

    def usage(self) -> tuple[LiveUsage, ...]:
        """Live usage for the cards whose entry carries usage fields (see the module docstring)."""
        self._refresh()
        return self._usage

    def close(self) -> None:
        """Nothing to release: the file is opened per read."""

    def _refresh(self) -> None:
        with self._lock:
            self._refresh_locked()

    def _refresh_locked(self) -> None:
        try:
            raw = self._path.read_bytes()
        except OSError as exc:
            raise BackendError(f"cannot read simulated devices file {str(self._path)!r}: {exc}") from exc
        if raw == self._raw:
            return
        text = raw.decode("utf-8", errors="replace")
        self._cards, self._links = parse_sim_devices(text, source=self._path)
        self._usage = parse_sim_usage(text, source=self._path)
        self._raw = raw  # only after a successful parse: a bad edit is reported on every poll

    # ------------------------------------------------------------------------------------ dynamic MIG
    def mig_instances(self, gpu_uuid: str) -> tuple[MigInstance, ...]:
        with self._lock:
            self._mig_card(gpu_uuid)
            return tuple(sorted(self._instances.get(gpu_uuid, ()), key=lambda i: i.gpu_instance_id))

    def create_mig_instance(self, gpu_uuid: str, profile: str, start: int, size: int) -> MigInstance:
        with self._lock:
            card = self._mig_card(gpu_uuid)
            where = f"simulated card {gpu_uuid}: MIG profile {profile!r} at slices [{start}, {start + size})"
            info = next((p for p in card.mig_profiles if p.name == profile), None)
            if info is None:
                offered = ", ".join(p.name for p in card.mig_profiles)
                raise BackendError(f"{where}: the card offers no such profile (it offers {offered})")
            if (start, size) not in info.placements:
                legal = ", ".join(f"[{a}, {a + b})" for a, b in info.placements)
                raise BackendError(f"{where}: not a legal placement of the profile (legal: {legal})")
            present = self._instances.setdefault(gpu_uuid, [])
            for other in present:
                if other.overlaps(start, size):
                    raise BackendError(
                        f"{where}: overlaps GPU instance {other.gpu_instance_id} ({other.profile} at "
                        f"[{other.start}, {other.start + other.size}))"
                    )
            used = {i.gpu_instance_id for i in present}
            instance = MigInstance(
                gpu_uuid=gpu_uuid,
                profile=profile,
                start=start,
                size=size,
                gpu_instance_id=next(n for n in itertools.count(1) if n not in used),
                compute_instance_id=0,
                mig_uuid=f"MIG-{uuidlib.uuid4()}",
            )
            present.append(instance)
            return instance

    def destroy_mig_instance(self, gpu_uuid: str, gpu_instance_id: int) -> None:
        with self._lock:
            self._mig_card(gpu_uuid)
            present = self._instances.get(gpu_uuid, [])
            kept = [i for i in present if i.gpu_instance_id != gpu_instance_id]
            if len(kept) == len(present):
                raise BackendError(f"simulated card {gpu_uuid}: no GPU instance {gpu_instance_id} to destroy")
            self._instances[gpu_uuid] = kept

    def _mig_card(self, gpu_uuid: str) -> Card:
        self._refresh_locked()
        card = next((c for c in self._cards if c.uuid == gpu_uuid), None)
        if card is None:
            raise BackendError(f"simulated devices file {str(self._path)!r}: no card {gpu_uuid!r}")
        if not card.mig_profiles:
            raise BackendError(f"simulated card {gpu_uuid}: offers no MIG profiles (no 'mig' in the file)")
        return card


def _document(text: str, where: str) -> Mapping[str, Any]:
    try:
        document = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise BackendError(f"{where}: not valid YAML: {exc}") from exc
    if document is None:
        document = {}
    if not isinstance(document, Mapping):
        raise BackendError(f"{where}: top level must be a mapping with 'cards', got {text[:80]!r}")
    return document


def parse_sim_devices(
    text: str, *, source: Path | str = "<text>"
) -> tuple[tuple[Card, ...], tuple[Link, ...]]:
    """Parse the simulated devices document; raises :class:`BackendError` naming file, entry and field."""
    where = f"simulated devices file {str(source)!r}"
    document = _document(text, where)
    raw_cards = _list(document, "cards", where)
    cards = tuple(_card(entry, i, f"{where}: cards[{i}]") for i, entry in enumerate(raw_cards))
    seen: set[str] = set()
    for card in cards:
        if card.uuid in seen:
            raise BackendError(f"{where}: duplicate card uuid {card.uuid!r}")
        seen.add(card.uuid)
    links = tuple(
        _link(entry, f"{where}: links[{i}]", seen) for i, entry in enumerate(_list(document, "links", where))
    )
    return cards, links


def parse_sim_usage(text: str, *, source: Path | str = "<text>") -> tuple[LiveUsage, ...]:
    """The live-usage fields of the document's cards (cards without any are left out)."""
    where = f"simulated devices file {str(source)!r}"
    usage = []
    for i, entry in enumerate(_list(_document(text, where), "cards", where)):
        here = f"{where}: cards[{i}]"
        if not isinstance(entry, Mapping):
            raise BackendError(f"{here}: must be a mapping, got {entry!r}")
        keys = ("used_memory_mib", "utilization", "memory_utilization", "processes")
        if all(entry.get(key) is None for key in keys):
            continue
        raw_processes = entry.get("processes")
        if raw_processes is not None and not isinstance(raw_processes, list):
            raise BackendError(f"{here}.processes: must be a list, got {raw_processes!r}")
        used = _optional_int(entry, "used_memory_mib", here)
        usage.append(
            LiveUsage(
                uuid=_str(entry, "uuid", here, required=True),
                memory_used_bytes=None if used is None else used * _MIB,
                utilization=_percent(entry, "utilization", here),
                memory_utilization=_percent(entry, "memory_utilization", here),
                processes=None
                if raw_processes is None
                else tuple(_process(p, f"{here}.processes[{j}]") for j, p in enumerate(raw_processes)),
            )
        )
    return tuple(usage)


def _process(entry: Any, where: str) -> ProcessUsage:
    if not isinstance(entry, Mapping):
        raise BackendError(f"{where}: must be a mapping, got {entry!r}")
    return ProcessUsage(
        pid=_int(entry, "pid", where),
        memory_bytes=_int(entry, "used_memory_mib", where, default=0) * _MIB,
        utilization=_percent(entry, "utilization", where),
    )


def _optional_int(entry: Mapping[str, Any], key: str, where: str) -> int | None:
    return None if entry.get(key) is None else _int(entry, key, where)


def _percent(entry: Mapping[str, Any], key: str, where: str) -> int | None:
    value = _optional_int(entry, key, where)
    if value is not None and value > 100:
        raise BackendError(f"{where}.{key}: must be a percentage 0-100, got {value!r}")
    return value


def _list(document: Mapping[str, Any], key: str, where: str) -> list[Any]:
    value = document.get(key)
    if value is None:
        return []
    if not isinstance(value, list):
        raise BackendError(f"{where}: {key!r} must be a list, got {value!r}")
    return value


def _card(entry: Any, position: int, where: str) -> Card:
    if not isinstance(entry, Mapping):
        raise BackendError(f"{where}: must be a mapping, got {entry!r}")
    uuid = _str(entry, "uuid", where, required=True)
    memory = entry.get("memory_mib")
    profiles = entry.get("mig") or []
    if not isinstance(profiles, list):
        raise BackendError(f"{where}.mig: must be a list, got {profiles!r}")
    return Card(
        uuid=uuid,
        index=_int(entry, "index", where, default=position),
        model=_str(entry, "model", where, required=False) or "NVIDIA Simulated GPU",
        memory_mib=None if memory is None else _int(entry, "memory_mib", where, default=0),
        numa=_int(entry, "numa", where, default=0),
        healthy=_bool(entry, "healthy", where, default=True),
        mig_profiles=tuple(_profile(p, f"{where}.mig[{j}]") for j, p in enumerate(profiles)),
        compute_mode=_compute_mode(entry, where),
    )


def _compute_mode(entry: Mapping[str, Any], where: str) -> str:
    value = _str(entry, "compute_mode", where, required=False) or DEFAULT_COMPUTE
    if value not in COMPUTE_MODES[:-1]:
        raise BackendError(
            f"{where}.compute_mode: must be one of {', '.join(COMPUTE_MODES[:-1])}, got {value!r}"
        )
    return value


def _profile(entry: Any, where: str) -> MigProfileInfo:
    if not isinstance(entry, Mapping):
        raise BackendError(f"{where}: must be a mapping, got {entry!r}")
    placements = entry.get("placements") or []
    if not isinstance(placements, list):
        raise BackendError(f"{where}.placements: must be a list, got {placements!r}")
    pairs = []
    for k, p in enumerate(placements):
        if not isinstance(p, Mapping):
            raise BackendError(f"{where}.placements[{k}]: must be a mapping, got {p!r}")
        pairs.append(
            (_int(p, "start", f"{where}.placements[{k}]"), _int(p, "size", f"{where}.placements[{k}]"))
        )
    return MigProfileInfo(
        name=_str(entry, "name", where, required=True),
        memory_mib=_int(entry, "memory_mib", where),
        cores=_int(entry, "cores", where),
        slice_count=_int(entry, "slice_count", where),
        instance_count=_int(entry, "instance_count", where, default=len(pairs)),
        placements=tuple(pairs),
    )


def _link(entry: Any, where: str, known: set[str]) -> Link:
    if not isinstance(entry, Mapping):
        raise BackendError(f"{where}: must be a mapping, got {entry!r}")
    a, b = _str(entry, "a", where, required=True), _str(entry, "b", where, required=True)
    for field_name, uuid in (("a", a), ("b", b)):
        if uuid not in known:
            raise BackendError(f"{where}.{field_name}: unknown card uuid {uuid!r}")
    return Link(a=a, b=b, score=_int(entry, "score", where))


def _str(entry: Mapping[str, Any], key: str, where: str, *, required: bool) -> str:
    value = entry.get(key)
    if value is None or value == "":
        if required:
            raise BackendError(f"{where}.{key}: required, got {value!r}")
        return ""
    if not isinstance(value, str):
        raise BackendError(f"{where}.{key}: must be a string, got {value!r}")
    return value


def _int(entry: Mapping[str, Any], key: str, where: str, *, default: int | None = None) -> int:
    value = entry.get(key)
    if value is None:
        if default is None:
            raise BackendError(f"{where}.{key}: required, got nothing")
        return default
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise BackendError(f"{where}.{key}: must be a non-negative integer, got {value!r}")
    return int(value)


def _bool(entry: Mapping[str, Any], key: str, where: str, *, default: bool) -> bool:
    value = entry.get(key)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise BackendError(f"{where}.{key}: must be true or false, got {value!r}")
    return value
