"""The held-out trace generator (hami.simulate.generate): regenerable from family and index alone, every
knob does what its recipe says, and the CSV texts read back as the same trace. The variants are a small
openb-shaped subset written here, so each knob's effect can be counted by hand."""

from __future__ import annotations

from collections import Counter

import pytest

from hami.simulate.generate import family_seed, generate, nodes_csv, pods_csv
from hami.simulate.trace import TraceNode, TracePod, parse_nodes, parse_pods

NODES = parse_nodes(
    "sn,cpu_milli,memory_mib,gpu,model\n"
    + "".join(f"g2-{k},96000,786432,8,G2\n" for k in range(6))
    + "".join(f"t4-{k},64000,262144,2,T4\n" for k in range(5))
    + "".join(f"p100-{k},64000,262144,2,P100\n" for k in range(3))
    + "".join(f"v100-{k},96000,393216,4,V100M16\n" for k in range(2))
)
HEADER = "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec\n"
VARIANTS = {
    "default": parse_pods(
        HEADER
        + "".join(f"d{k},{4000 + 1000 * (k % 4)},{16384 + 4096 * (k % 3)},1,1000,\n" for k in range(20))
        + "".join(f"ds{k},2000,8192,1,{250 * (1 + k % 3)},\n" for k in range(12))
        + "".join(f"dm{k},16000,65536,{2 + 2 * (k % 2)},1000,\n" for k in range(4))
        + "".join(f"dc{k},8000,32768,0,0,\n" for k in range(4))
    ),
    "gpushare60": parse_pods(
        HEADER + "".join(f"s{k},{2000 + 500 * (k % 3)},12288,1,{100 * (1 + k % 9)},\n" for k in range(30))
    ),
    "gpuspec20": parse_pods(
        HEADER
        + "".join(f"r{k},6000,24576,1,1000,{('G2', 'T4|P100', 'V100M16')[k % 3]}\n" for k in range(12))
        + "".join(f"u{k},6000,24576,1,1000,\n" for k in range(18))
        + "".join(f"rm{k},32000,131072,8,1000,G2\n" for k in range(3))
    ),
}


def _find(predicate: object, family: str = "test") -> object:
    """The first trace of ``family`` (index < 200) whose recipe satisfies ``predicate``."""
    for index in range(200):
        trace = generate(VARIANTS, NODES, family, index, size=40)
        if predicate(trace.recipe):  # type: ignore[operator]
            return trace
    raise AssertionError("no trace of the family draws that knob in 200 indexes")


def test_a_trace_is_its_family_and_index_alone() -> None:
    one = generate(VARIANTS, NODES, "design", 3, size=40)
    again = generate(dict(reversed(list(VARIANTS.items()))), NODES, "design", 3, size=40)
    assert one == again  # the variants' order in the mapping does not matter, only their names
    assert generate(VARIANTS, NODES, "design", 4, size=40) != one
    assert generate(VARIANTS, NODES, "report", 3, size=40) != one
    assert family_seed("design") == 3_444_529_712  # CRC-32: the same on every machine and Python
    assert one.recipe.name == "design-003"


def test_node_list_has_the_size_asked_and_only_models_of_the_source() -> None:
    trace = generate(VARIANTS, NODES, "design", 0, size=57)
    assert len(trace.nodes) == 57
    assert len({n.name for n in trace.nodes}) == 57
    assert {n.model for n in trace.nodes} <= {n.model for n in NODES}
    assert len(trace.pods) > 0 and len({p.name for p in trace.pods}) == len(trace.pods)


def test_a_removed_model_is_absent_and_a_multiplied_one_more_frequent() -> None:
    trace = _find(lambda r: any(f == 0.0 for _, f in r.supply))
    removed = {m for m, f in trace.recipe.supply if f == 0.0}  # type: ignore[attr-defined]
    assert not removed & {n.model for n in trace.nodes}  # type: ignore[attr-defined]
    share = Counter(n.model for n in NODES)
    many = _find(lambda r: any(f >= 2.0 for m, f in r.supply if m == "T4") and len(r.supply) == 1)
    drawn = Counter(n.model for n in many.nodes)  # type: ignore[attr-defined]
    # T4 weighs >= 2x its share of the source list: over 40 draws it is above its plain share
    assert drawn["T4"] / 40 > share["T4"] / len(NODES)


def test_host_scales_apply_to_every_node() -> None:
    trace = _find(lambda r: r.memory_scale != 1.0 and r.cpu_scale != 1.0)
    recipe = trace.recipe  # type: ignore[attr-defined]
    memories = {int(n.memory_mib * recipe.memory_scale) for n in NODES}
    cpus = {int(n.cpu_milli * recipe.cpu_scale) for n in NODES}
    for node in trace.nodes:  # type: ignore[attr-defined]
        assert node.memory_mib in memories and node.cpu_milli in cpus
    plain = _find(lambda r: r.memory_scale == 1.0 and r.cpu_scale == 1.0)
    assert {(n.cpu_milli, n.memory_mib) for n in plain.nodes} <= {(n.cpu_milli, n.memory_mib) for n in NODES}  # type: ignore[attr-defined]


def test_drawn_model_constraints_name_only_models_of_the_node_list() -> None:
    trace = _find(lambda r: r.constrained >= 0.2 and r.dropped_specs)
    models = {n.model for n in trace.nodes}  # type: ignore[attr-defined]
    gpu = [p for p in trace.pods if p.num_gpu]  # type: ignore[attr-defined]
    specs = [p.gpu_spec for p in gpu if p.gpu_spec]
    assert specs and all(set(s) <= models for s in specs)
    assert 0.05 < len(specs) / len(gpu) < 0.7  # about the drawn share (small sample)
    assert all(not p.gpu_spec for p in trace.pods if not p.num_gpu)  # type: ignore[attr-defined]


def test_the_multi_card_share_moves_with_its_factor() -> None:
    def share(pods: tuple[TracePod, ...]) -> float:
        gpu = [p for p in pods if p.num_gpu]
        return sum(p.num_gpu > 1 for p in gpu) / len(gpu)

    up = _find(lambda r: r.multi_factor >= 2.0 and r.mixture[0][0] == "default" and len(r.mixture) == 1)
    plain = _find(lambda r: r.multi_factor == 1.0 and r.mixture[0][0] == "default" and len(r.mixture) == 1)
    assert share(up.pods) > share(plain.pods)  # type: ignore[attr-defined]
    assert share(up.pods) <= 0.6 + 1e-9  # type: ignore[attr-defined]


def test_pods_come_from_the_mixture_named_in_the_recipe() -> None:
    trace = _find(lambda r: len(r.mixture) == 1 and r.multi_factor == 1.0 and r.constrained == 0.0)
    ((variant, weight),) = trace.recipe.mixture  # type: ignore[attr-defined]
    assert weight == 1.0
    shapes = {(p.cpu_milli, p.memory_mib, p.num_gpu, p.gpu_milli, p.gpu_spec) for p in VARIANTS[variant]}
    assert {(p.cpu_milli, p.memory_mib, p.num_gpu, p.gpu_milli, p.gpu_spec) for p in trace.pods} <= shapes  # type: ignore[attr-defined]


def test_csv_texts_read_back_as_the_same_trace() -> None:
    trace = _find(lambda r: r.constrained > 0)
    nodes: tuple[TraceNode, ...] = trace.nodes  # type: ignore[attr-defined]
    pods: tuple[TracePod, ...] = trace.pods  # type: ignore[attr-defined]
    assert parse_nodes(nodes_csv(nodes)) == nodes
    assert parse_pods(pods_csv(pods)) == pods


@pytest.mark.parametrize(
    ("variants", "size", "index", "message"),
    [
        ({}, 10, 0, "at least one variant"),
        (VARIANTS, 0, 0, "size 0"),
        (VARIANTS, 10, -1, "index -1"),
    ],
)
def test_bad_arguments_are_refused(
    variants: dict[str, tuple[TracePod, ...]], size: int, index: int, message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        generate(variants, NODES, "x", index, size=size)
