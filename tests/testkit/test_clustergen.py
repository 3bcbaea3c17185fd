"""``hami demo --generate N``'s cluster (hami_testkit.clustergen): the card-mix text and its errors, the
mix kept exactly at any size (largest remainder), the same seed giving the same cluster, a node list's
mix, and the demo's flags choosing between a cluster file and a generated cluster."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from hami.commands.demo import add_arguments
from hami.simulate.trace import parse_nodes, read_nodes
from hami_testkit.cluster import ClusterFileError
from hami_testkit.clustergen import (
    MODELS,
    OPENB_MIX,
    Shape,
    apportion,
    describe_mix,
    generate_cluster,
    mix_from_nodes,
    parse_mix,
)
from hami_testkit.demo_session import demo_cluster, demo_options
from tests.simulate.shipped import OPENB


def test_a_mix_reads_models_card_counts_and_weights() -> None:
    assert parse_mix("T4x4:2, V100M32x8,A100") == (
        Shape("T4", 4, 2.0),
        Shape("V100M32", 8, 1.0),
        Shape("A100", 8, 1.0),
    )
    assert parse_mix("openb") == OPENB_MIX
    for text, problem in [
        ("H100x8", "unknown model 'H100' in 'H100x8'"),
        ("T4x0", "cards must be 1 to 16, got 0"),
        ("T4x4:0", "the weight must be positive"),
        ("T4 x4", "is not MODEL[xCARDS][:WEIGHT]"),
        ("", "is not MODEL[xCARDS][:WEIGHT]"),
    ]:
        with pytest.raises(ClusterFileError, match=problem.replace("[", r"\[").replace("]", r"\]")):
            parse_mix(text)


def test_the_mix_is_kept_exactly_and_the_seed_decides_order_and_uuids() -> None:
    assert apportion(10, [Shape("T4", 4, 2), Shape("A10", 1, 1)]) == [7, 3]  # 6.67 -> 7, 3.33 -> 3
    assert sum(apportion(1000, OPENB_MIX)) == 1000
    cluster = generate_cluster(300, parse_mix("T4x4:2,V100M32x8"), seed=7)
    assert len(cluster.nodes) == 300 and cluster.nodes[0].name == "gpu-00001"
    assert describe_mix(cluster) == "200 x T4x4, 100 x V100M32x8"
    t4 = next(n for n in cluster.nodes if n.labels["hami.io/demo-model"] == "T4")
    assert [(c["model"], c["memory_mib"], c["numa"]) for c in t4.cards] == [
        ("Tesla T4", 15360, 0),
        ("Tesla T4", 15360, 0),
        ("Tesla T4", 15360, 1),
        ("Tesla T4", 15360, 1),
    ]
    uuids = [u for n in cluster.nodes for u in n.card_uuids]
    assert len(set(uuids)) == len(uuids) == 200 * 4 + 100 * 8
    assert generate_cluster(300, parse_mix("T4x4:2,V100M32x8"), seed=7) == cluster
    assert generate_cluster(300, parse_mix("T4x4:2,V100M32x8"), seed=8).nodes != cluster.nodes
    with pytest.raises(ClusterFileError, match="the node count must be 1 to"):
        generate_cluster(0, OPENB_MIX)


def test_a_node_lists_mix_counts_its_nodes_per_model_and_card_count() -> None:
    nodes = parse_nodes(
        "sn,cpu_milli,memory_mib,gpu,model\n"
        "n1,64000,262144,8,G2\nn2,64000,262144,8,G2\nn3,32000,131072,2,T4\n"
    )
    assert mix_from_nodes(nodes, source="list.csv") == (Shape("G2", 8, 2), Shape("T4", 2, 1))
    strange = parse_nodes("sn,cpu_milli,memory_mib,gpu,model\nn1,64000,262144,8,K80\n")
    with pytest.raises(ClusterFileError, match=r"list\.csv: node n1: unknown card model 'K80'"):
        mix_from_nodes(strange, source="list.csv")
    assert set(MODELS) >= {s.model for s in OPENB_MIX}


def test_the_built_in_openb_mix_is_the_published_node_lists() -> None:
    found = mix_from_nodes(read_nodes(OPENB / "openb_node_list_gpu_node.csv.gz"), source="openb")
    assert sorted(found, key=lambda s: (s.model, s.cards)) == sorted(
        OPENB_MIX, key=lambda s: (s.model, s.cards)
    )


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parser.parse_args(list(argv))


def test_the_demo_takes_a_cluster_file_or_a_generated_cluster(tmp_path: Path) -> None:
    assert [n.name for n in demo_cluster(_args()).nodes] == ["gpu-a100", "gpu-v100", "gpu-a10", "gpu-mig"]
    generated = demo_cluster(_args("--generate", "12", "--card-mix", "A10x1", "--seed", "3"))
    assert describe_mix(generated) == "12 x A10x1"
    listed = tmp_path / "nodes.csv"
    listed.write_text("sn,cpu_milli,memory_mib,gpu,model\nn1,64000,262144,4,V100M32\n")
    assert describe_mix(demo_cluster(_args("--generate", "3", "--node-list", str(listed)))) == "3 x V100M32x4"
    with pytest.raises(ClusterFileError, match="--nodes and --generate"):
        demo_cluster(_args("--generate", "3", "--nodes", str(listed)))


def test_the_demo_passes_its_percentage_of_nodes_to_score_to_the_kube_scheduler_stand_in() -> None:
    cluster = demo_cluster(_args())
    assert demo_options(_args(), cluster).percentage_of_nodes_to_score == 100  # what the chart renders
    adaptive = _args("--percentage-of-nodes-to-score", "0")
    assert demo_options(adaptive, cluster).percentage_of_nodes_to_score == 0
    assert demo_options(_args("--generate", "3"), cluster).fleet  # the other knobs as before
    for bad in ("101", "-1", "x"):
        with pytest.raises(SystemExit):
            _args("--percentage-of-nodes-to-score", bad)
