"""The cluster file: the packaged default describes the demo's 4 nodes; bad files are named precisely."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from hami_testkit.cluster import (
    ClusterFileError,
    agent_config_document,
    default_cluster_text,
    load_cluster,
    node_object,
    parse_cluster,
    write_node_files,
)
from nodeagent.backends.simulated import parse_sim_devices

UUID = re.compile(r"^GPU-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")


def test_default_cluster_has_the_four_demo_nodes() -> None:
    cluster = load_cluster()
    shape = {n.name: (len(n.cards), n.mode, {str(c["model"]) for c in n.cards}) for n in cluster.nodes}
    assert shape == {
        "gpu-a100": (8, "hami-core", {"NVIDIA A100-SXM4-80GB"}),
        "gpu-v100": (4, "hami-core", {"Tesla V100-SXM2-32GB"}),
        "gpu-a10": (2, "hami-core", {"NVIDIA A10"}),
        "gpu-mig": (1, "mig", {"NVIDIA A100-SXM4-80GB"}),
    }
    assert all(n.labels["gpu"] == "on" for n in cluster.nodes)
    assert all(UUID.match(u) for n in cluster.nodes for u in n.card_uuids)


def test_a100_node_has_two_numa_nodes_and_nvlink_quads() -> None:
    a100 = load_cluster().nodes[0]
    assert [c["numa"] for c in a100.cards] == [0, 0, 0, 0, 1, 1, 1, 1]
    uuids = a100.card_uuids
    scores = {frozenset((link["a"], link["b"])): link["score"] for link in a100.links}
    assert len(scores) == 28  # every pair of 8 cards once
    # inside a quad the best pairs score 400, the others 200; across quads 10 (through the CPUs)
    assert scores[frozenset((uuids[0], uuids[1]))] == 400
    assert scores[frozenset((uuids[0], uuids[2]))] == 200
    assert scores[frozenset((uuids[3], uuids[4]))] == 10


def test_node_files_are_what_the_agent_reads(tmp_path: Path) -> None:
    for node in load_cluster().nodes:
        files = write_node_files(node, tmp_path)
        cards, links = parse_sim_devices(files.devices.read_text(), source=files.devices)
        assert tuple(c.uuid for c in cards) == node.card_uuids
        assert len(links) == len(node.links)
        assert files.kubelet_dir.is_dir()
    mig = load_cluster().nodes[3]
    assert agent_config_document(mig) == {"nodeconfig": [{"name": "gpu-mig", "operatingmode": "mig"}]}
    cards, _ = parse_sim_devices((tmp_path / "gpu-mig" / "devices.yaml").read_text())
    assert [p.name for p in cards[0].mig_profiles] == ["1g.10gb", "2g.20gb", "3g.40gb", "7g.80gb"]


def test_node_object_carries_the_labels() -> None:
    node = node_object(load_cluster().nodes[1])
    assert node["metadata"]["name"] == "gpu-v100"
    assert node["metadata"]["labels"]["gpu"] == "on"
    assert node["metadata"]["labels"]["kubernetes.io/hostname"] == "gpu-v100"


def _doc(**node: object) -> str:
    base: dict[str, object] = {"name": "n1", "cards": [{"uuid": "GPU-1"}]}
    base.update(node)
    return yaml.safe_dump({"nodes": [base]})


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("nodes: []", "'nodes' must be a non-empty list"),
        ("- a", "top level must be a mapping"),
        (_doc(name="Bad_Name"), "nodes[0].name: must be a DNS label"),
        (_doc(cards=[]), "nodes[0] (n1).cards: must be a non-empty list"),
        (_doc(cards=[{"model": "x"}]), "nodes[0] (n1).cards[0].uuid: required string"),
        (_doc(mode="time-slicing"), "nodes[0] (n1).mode: must be one of hami-core, mig"),
        (_doc(labels={"gpu": True}), "nodes[0] (n1).labels: must map strings to strings"),
        (
            yaml.safe_dump(
                {"nodes": [{"name": "a", "cards": [{"uuid": "G"}]}, {"name": "b", "cards": [{"uuid": "G"}]}]}
            ),
            "node 'b': card uuid 'G' is used twice",
        ),
        (
            yaml.safe_dump(
                {"nodes": [{"name": "a", "cards": [{"uuid": "G"}]}, {"name": "a", "cards": [{"uuid": "H"}]}]}
            ),
            "duplicate node name 'a'",
        ),
    ],
)
def test_bad_cluster_files_name_the_field(text: str, message: str) -> None:
    with pytest.raises(ClusterFileError) as caught:
        parse_cluster(text, source="c.yaml")
    assert "cluster file 'c.yaml'" in str(caught.value)
    assert message in str(caught.value)


def test_missing_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(ClusterFileError, match=r"nope\.yaml"):
        load_cluster(tmp_path / "nope.yaml")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            _doc(cards=[{"uuid": "GPU-1", "memory_mb": 4000}]),
            "nodes[0] (n1).cards[0]: unknown field 'memory_mb'; did you mean 'memory_mib'?",
        ),
        (_doc(label={"a": "b"}), "nodes[0] (n1): unknown field 'label'; did you mean 'labels'?"),
        (
            _doc(cards=[{"uuid": "GPU-1", "mig": [{"name": "1g", "memory": 1}]}]),
            "nodes[0] (n1).cards[0].mig[0]: unknown field 'memory'; did you mean 'memory_mib'?",
        ),
        (
            _doc(cards=[{"uuid": "GPU-1", "mig": [{"name": "1g", "placements": [{"begin": 0}]}]}]),
            "nodes[0] (n1).cards[0].mig[0].placements[0]: unknown field 'begin'",
        ),
        (
            _doc(cards=[{"uuid": "GPU-1", "processes": [{"pid": 1, "memory_mib": 3}]}]),
            "nodes[0] (n1).cards[0].processes[0]: unknown field 'memory_mib'; "
            "did you mean 'used_memory_mib'?",
        ),
        (
            _doc(
                cards=[{"uuid": "GPU-1"}, {"uuid": "GPU-2"}],
                links=[{"a": "GPU-1", "b": "GPU-2", "weight": 1}],
            ),
            "nodes[0] (n1).links[0]: unknown field 'weight'",
        ),
        (
            "device-config: {}\nnodes: [{name: n1, cards: [{uuid: G}]}]\n",
            "unknown field 'device-config'; did you mean 'device_config'?",
        ),
    ],
)
def test_unknown_fields_are_refused_with_the_nearest_name(text: str, message: str) -> None:
    """A typo would otherwise give a node without cards (memory_mb) and a demo that exits 0."""
    with pytest.raises(ClusterFileError) as caught:
        parse_cluster(text, source="c.yaml")
    assert message in str(caught.value)


def test_the_packaged_cluster_uses_only_known_fields() -> None:
    assert len(parse_cluster(default_cluster_text()).nodes) == 4
