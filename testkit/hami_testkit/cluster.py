"""The simulated cluster description: which nodes exist, their labels and their simulated cards.

Owns the cluster file format (the default is ``hami_testkit/cluster.yaml``, shipped as package data; its
header documents the format), its strict loader, and what the demo derives from it: the Node objects
to create, each node's devices file for ``hami-node-agent --backend sim`` and its per-node agent config.
Card entries are passed to the agent as written (the agent's parser validates their values in full);
here we check what the cluster needs -- unique node names and card uuids -- and that every field of the
file, the cards' included, is one the format knows: a typo (``memory_mb``) would otherwise be dropped
silently and give a node without usable cards. Simulation only. Must not import ``webhook``,
``nodeagent`` or the Kubernetes client.
"""

from __future__ import annotations

import difflib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
MODES = ("hami-core", "mig")
#: The fields of each part of the file (cards, MIG profiles, processes and links: the agent's sim format,
#: ``nodeagent/backends/simulated.py``).
TOP_FIELDS = ("device_config", "nodes")
NODE_FIELDS = ("name", "labels", "mode", "cards", "links", "hami_core")
CARD_FIELDS = (
    "uuid", "model", "memory_mib", "numa", "healthy", "index",
    "used_memory_mib", "utilization", "memory_utilization", "processes", "mig",
)  # fmt: skip
MIG_FIELDS = ("name", "memory_mib", "cores", "slice_count", "instance_count", "placements")
PLACEMENT_FIELDS = ("start", "size")
PROCESS_FIELDS = ("pid", "used_memory_mib", "utilization")
LINK_FIELDS = ("a", "b", "score")


class ClusterFileError(ValueError):
    """The cluster file is malformed; the message names the file, the entry and the field."""


@dataclass(frozen=True, slots=True, kw_only=True)
class NodeSpec:
    """One simulated node: its name, labels, operating mode and its cards/links (agent's sim format).
    ``hami_core``: whether HAMi-core is installed there (a stand-in library under the node's hook
    directory, which its agent is given with ``--hook-path``); without it the agent finds nothing and
    reports its cards' enforcement as ``none``."""

    name: str
    labels: Mapping[str, str]
    mode: str = "hami-core"
    cards: tuple[Mapping[str, Any], ...]
    links: tuple[Mapping[str, Any], ...] = ()
    hami_core: bool = True

    @property
    def card_uuids(self) -> tuple[str, ...]:
        return tuple(str(card["uuid"]) for card in self.cards)


@dataclass(frozen=True, slots=True, kw_only=True)
class ClusterSpec:
    """The whole simulated cluster; ``device_config`` is HAMi's device-config document (or empty)."""

    nodes: tuple[NodeSpec, ...]
    device_config: Mapping[str, Any] = field(default_factory=dict)
    source: str = "<text>"


def default_cluster_text() -> str:
    """The packaged default cluster file (4 nodes: A100 x8, V100 x4, A10 x2, MIG A100)."""
    return resources.files("hami_testkit").joinpath("cluster.yaml").read_text(encoding="utf-8")


def load_cluster(path: Path | None = None) -> ClusterSpec:
    """Load ``path``, or the packaged default when None; raises :class:`ClusterFileError`."""
    if path is None:
        return parse_cluster(default_cluster_text(), source="testkit/hami_testkit/cluster.yaml")
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ClusterFileError(f"cluster file {str(path)!r}: cannot read: {exc}") from exc
    return parse_cluster(text, source=str(path))


def parse_cluster(text: str, *, source: str = "<text>") -> ClusterSpec:
    where = f"cluster file {source!r}"
    try:
        document = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ClusterFileError(f"{where}: not valid YAML: {exc}") from exc
    if not isinstance(document, Mapping):
        raise ClusterFileError(f"{where}: top level must be a mapping with 'nodes', got {text[:60]!r}")
    _known(document, TOP_FIELDS, where)
    raw_nodes = document.get("nodes")
    if not isinstance(raw_nodes, list) or not raw_nodes:
        raise ClusterFileError(f"{where}: 'nodes' must be a non-empty list, got {raw_nodes!r}")
    device_config = document.get("device_config") or {}
    if not isinstance(device_config, Mapping):
        raise ClusterFileError(f"{where}: 'device_config' must be a mapping, got {device_config!r}")
    nodes = tuple(_node(entry, f"{where}: nodes[{i}]") for i, entry in enumerate(raw_nodes))
    names: set[str] = set()
    uuids: set[str] = set()
    for node in nodes:
        if node.name in names:
            raise ClusterFileError(f"{where}: duplicate node name {node.name!r}")
        names.add(node.name)
        for uuid in node.card_uuids:
            if uuid in uuids:
                raise ClusterFileError(f"{where}: node {node.name!r}: card uuid {uuid!r} is used twice")
            uuids.add(uuid)
    return ClusterSpec(nodes=nodes, device_config=dict(device_config), source=source)


def _node(entry: Any, where: str) -> NodeSpec:
    if not isinstance(entry, Mapping):
        raise ClusterFileError(f"{where}: must be a mapping, got {entry!r}")
    name = entry.get("name")
    if not isinstance(name, str) or not _DNS_LABEL.match(name):
        raise ClusterFileError(f"{where}.name: must be a DNS label (a-z, 0-9, '-'), got {name!r}")
    where = f"{where} ({name})"
    _known(entry, NODE_FIELDS, where)
    labels = entry.get("labels") or {}
    if not isinstance(labels, Mapping) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in labels.items()
    ):
        raise ClusterFileError(f"{where}.labels: must map strings to strings (quote on/off), got {labels!r}")
    mode = entry.get("mode", "hami-core")
    if mode not in MODES:
        raise ClusterFileError(f"{where}.mode: must be one of {', '.join(MODES)}, got {mode!r}")
    cards = entry.get("cards")
    if not isinstance(cards, list) or not cards:
        raise ClusterFileError(f"{where}.cards: must be a non-empty list, got {cards!r}")
    for j, card in enumerate(cards):
        if not isinstance(card, Mapping) or not isinstance(card.get("uuid"), str) or not card["uuid"]:
            raise ClusterFileError(f"{where}.cards[{j}].uuid: required string, got {card!r}")
        _card_fields(card, f"{where}.cards[{j}]")
    links = entry.get("links") or []
    if not isinstance(links, list) or not all(isinstance(link, Mapping) for link in links):
        raise ClusterFileError(f"{where}.links: must be a list of {{a, b, score}}, got {links!r}")
    for j, link in enumerate(links):
        _known(link, LINK_FIELDS, f"{where}.links[{j}]")
    hami_core = entry.get("hami_core", True)
    if not isinstance(hami_core, bool):
        raise ClusterFileError(f"{where}.hami_core: must be true or false, got {hami_core!r}")
    return NodeSpec(
        name=name, labels=dict(labels), mode=mode, cards=tuple(cards), links=tuple(links), hami_core=hami_core
    )


def _card_fields(card: Mapping[str, Any], where: str) -> None:
    """Every field of a card, its MIG profiles (and their placements) and its processes is known."""
    _known(card, CARD_FIELDS, where)
    for key, fields, inner in (("mig", MIG_FIELDS, "placements"), ("processes", PROCESS_FIELDS, None)):
        items = card.get(key)
        for k, item in enumerate(items if isinstance(items, list) else []):
            if not isinstance(item, Mapping):
                continue  # the agent's parser names a wrong type
            _known(item, fields, f"{where}.{key}[{k}]")
            nested = item.get(inner) if inner else None
            for m, placement in enumerate(nested if isinstance(nested, list) else []):
                if isinstance(placement, Mapping):
                    _known(placement, PLACEMENT_FIELDS, f"{where}.{key}[{k}].{inner}[{m}]")


def unknown_field(field: str, known: tuple[str, ...]) -> str:
    """``unknown field 'x'`` plus the nearest known name (:mod:`difflib`), or the list when none is near."""
    near = difflib.get_close_matches(field, known, n=1, cutoff=0.6)
    hint = f"did you mean {near[0]!r}?" if near else "known: " + ", ".join(known)
    return f"unknown field {field!r}; {hint}"


def _known(mapping: Mapping[str, Any], fields: tuple[str, ...], where: str) -> None:
    for key in mapping:
        if key not in fields:
            raise ClusterFileError(f"{where}: {unknown_field(str(key), fields)}")


# ------------------------------------------------------------------------------- what the demo derives


def node_object(node: NodeSpec) -> dict[str, Any]:
    """The Node the demo creates (what kubelet would register): labels, Ready, no GPU annotations.

    The node agent adds the registration annotations; the kubelet stand-in adds the device-plugin
    resource to ``status.capacity`` once the plugin registers.
    """
    labels = {"kubernetes.io/hostname": node.name, "kubernetes.io/os": "linux", **node.labels}
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": node.name, "labels": labels, "annotations": {}},
        "spec": {},
        "status": {
            "capacity": {"cpu": "64", "memory": "512Gi", "pods": "110"},
            "allocatable": {"cpu": "64", "memory": "512Gi", "pods": "110"},
            "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady"}],
        },
    }


def devices_document(node: NodeSpec) -> dict[str, Any]:
    """The node's ``--sim-devices`` file content (cards and links as written in the cluster file)."""
    return {"cards": [dict(card) for card in node.cards], "links": [dict(link) for link in node.links]}


def agent_config_document(node: NodeSpec) -> dict[str, Any]:
    """The node's per-node agent override (HAMi device-plugin ``config.json`` shape)."""
    return {"nodeconfig": [{"name": node.name, "operatingmode": node.mode}]}


@dataclass(frozen=True, slots=True, kw_only=True)
class NodeFiles:
    """Where one node's files were written."""

    devices: Path
    config: Path
    kubelet_dir: Path
    hook: Path | None = None  # the agent's --hook-path: HAMi-core installed there (stand-in)


#: What the stand-in library file holds: the agent checks only that it is a non-empty regular file that
#: ``ld.so.preload`` names (nodeagent/registrar.py); no container runs in the embedded cluster.
STAND_IN_LIBRARY = b"simulated HAMi-core (hami demo): not a library\n"


def write_node_files(node: NodeSpec, root: Path) -> NodeFiles:
    """Write the node's devices file, agent config and an empty kubelet device-plugin dir under ``root``;
    with ``hami_core``, ``<root>/<node>/hook/vgpu/libvgpu.so`` (a stand-in) and the ``ld.so.preload``
    naming it, as the chart's init container installs HAMi-core."""
    base = root / node.name
    kubelet_dir = base / "dp"  # short: unix socket paths are limited to 107 bytes
    kubelet_dir.mkdir(parents=True, exist_ok=True)
    devices = base / "devices.yaml"
    devices.write_text(yaml.safe_dump(devices_document(node), sort_keys=False), encoding="utf-8")
    config = base / "config.json"
    config.write_text(json.dumps(agent_config_document(node), indent=2), encoding="utf-8")
    hook = None
    if node.hami_core:
        hook = base / "hook"
        vgpu = hook / "vgpu"
        vgpu.mkdir(parents=True, exist_ok=True)
        library = vgpu / "libvgpu.so"
        library.write_bytes(STAND_IN_LIBRARY)
        (vgpu / "ld.so.preload").write_text(f"{library}\n", encoding="utf-8")
    return NodeFiles(devices=devices, config=config, kubelet_dir=kubelet_dir, hook=hook)
