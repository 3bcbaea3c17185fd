"""Arrival order and the target workload as the paper's simulator builds them, and the fragmentation
measure as the replay keeps it (the core's, :mod:`hami.core.fragmentation`): a worked example, and the
predicted "after placing here" figure equal to recomputing the node after the core really booked the pod
(property test)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hami.core.fragplacement import place
from hami.simulate.cluster import Cluster
from hami.simulate.frag import FragMeasure
from hami.simulate.trace import TraceNode, TracePod, read_pods
from hami.simulate.workload import RequestClass, arrivals, target_workload
from tests.simulate import shipped


def pod(name: str, k: int, milli: int, cpu: int = 1000, spec: tuple[str, ...] = ()) -> TracePod:
    return TracePod(name=name, cpu_milli=cpu, memory_mib=100, num_gpu=k, gpu_milli=milli, gpu_spec=spec)


def test_arrivals_top_up_to_the_target_and_keep_every_trace_pod() -> None:
    pods = [pod("a", 1, 500), pod("b", 0, 0), pod("c", 2, 1000)]
    order = arrivals(pods, 10_000, 1.3, np.random.default_rng(1))
    assert sorted(order[:3]) == [0, 1, 2]  # the trace itself first, shuffled
    total = sum(pods[i].gpu_request for i in order)
    assert 13_000 - 2000 < total <= 13_000
    assert order == arrivals(pods, 10_000, 1.3, np.random.default_rng(1))
    assert order != arrivals(pods, 10_000, 1.3, np.random.default_rng(2))


def test_arrivals_trim_a_trace_above_the_target() -> None:
    pods = [pod(f"p{i}", 1, 1000) for i in range(20)]
    order = arrivals(pods, 10_000, 1.3, np.random.default_rng(3))
    assert len(order) == 13 and len(set(order)) == 13


def test_target_workload_keeps_the_classes_covering_95_percent() -> None:
    pods = [pod(f"a{i}", 1, 500) for i in range(60)] + [pod(f"b{i}", 0, 0) for i in range(36)]
    pods += [pod("c", 1, 300), pod("d", 1, 200, cpu=5), pod("e", 1, 200, cpu=9), pod("f", 2, 1000)]
    classes = target_workload(pods)
    assert [(c.gpu_milli, c.num_gpu) for c in classes] == [(500, 1), (0, 0)]
    assert classes[0].probability == pytest.approx(60 / 96)
    tied = target_workload(pods, coverage=0.99)  # frequency ties: the larger key first
    assert [(c.cpu_milli, c.gpu_milli, c.num_gpu) for c in tied[2:4]] == [(1000, 1000, 2), (1000, 300, 1)]


def test_default_trace_target_workload_is_the_papers() -> None:
    classes = target_workload(read_pods(shipped.pods("default")))
    assert len(classes) == 35
    assert sum(c.probability for c in classes if c.num_gpu == 0) == pytest.approx(0.136, abs=0.0005)


MIB = 10**6


def test_fragmentation_worked_example() -> None:
    cluster = Cluster.from_trace([TraceNode(name="n", cpu_milli=8000, memory_mib=10**6, gpus=3, model="T4")])
    cluster.place(0, pod("x", 1, 600), (1,), "binpack")
    cluster.place(0, pod("y", 1, 1000), (2,), "binpack")  # cards now 1000, 400, 0; CPU 6000 free
    classes = [
        RequestClass(cpu_milli=1000, gpu_milli=500, num_gpu=1, gpu_spec=(), probability=0.5),
        RequestClass(cpu_milli=1000, gpu_milli=1000, num_gpu=2, gpu_spec=(), probability=0.3),
        RequestClass(cpu_milli=1000, gpu_milli=0, num_gpu=0, gpu_spec=(), probability=0.2),
    ]
    measure = FragMeasure(classes, cluster)
    # share 500 fits: only the 400 card is fragment; 2 whole cards do not fit: all 1400; CPU-only: all
    assert measure.frag[0] == pytest.approx(0.5 * 400 + 0.3 * 1400 + 0.2 * 1400)
    other = FragMeasure(
        [RequestClass(cpu_milli=1000, gpu_milli=500, num_gpu=1, gpu_spec=("V100",), probability=1)], cluster
    )
    assert other.frag[0] == pytest.approx(1400)  # the class may not use T4 cards: all of it
    hungry = FragMeasure(
        [RequestClass(cpu_milli=7000, gpu_milli=500, num_gpu=1, gpu_spec=(), probability=1)], cluster
    )
    assert hungry.frag[0] == pytest.approx(1400)  # not enough CPU left for the class
    big = [RequestClass(cpu_milli=1000, gpu_milli=500, num_gpu=1, gpu_spec=(), probability=1, memory_mib=MIB)]
    assert FragMeasure(big, cluster).frag[0] == pytest.approx(400)  # the paper's measure: no host memory
    assert FragMeasure(big, cluster, memory=1.0).frag[0] == pytest.approx(1400)  # 10**6 - 200 MiB left
    assert FragMeasure(big, cluster, memory=0.5).frag[0] == pytest.approx(400)  # half of it is free


def test_a_class_needs_the_median_host_memory_of_its_pods() -> None:
    pods = [
        TracePod(name=f"p{i}", cpu_milli=1000, memory_mib=mib, num_gpu=1, gpu_milli=500)
        for i, mib in enumerate([100, 900, 300])
    ]
    (only,) = target_workload(pods)
    assert only.memory_mib == 300


CLASSES = [
    RequestClass(cpu_milli=4000, gpu_milli=500, num_gpu=1, gpu_spec=(), probability=0.3),
    RequestClass(cpu_milli=8000, gpu_milli=250, num_gpu=1, gpu_spec=("G2",), probability=0.2),
    RequestClass(cpu_milli=12000, gpu_milli=1000, num_gpu=1, gpu_spec=(), probability=0.2),
    RequestClass(cpu_milli=16000, gpu_milli=1000, num_gpu=2, gpu_spec=(), probability=0.1),
    RequestClass(cpu_milli=2000, gpu_milli=0, num_gpu=0, gpu_spec=(), probability=0.2),
]
SHAPES = st.sampled_from([(1, 250), (1, 470), (1, 810), (1, 1000), (2, 1000), (0, 0), (1, 50)])


@settings(max_examples=60, deadline=None)
@given(history=st.lists(st.tuples(SHAPES, st.integers(0, 10**6)), min_size=1, max_size=40))
def test_after_placing_equals_recomputing_the_booked_node(history: list[tuple[tuple[int, int], int]]) -> None:
    """The core's predicted ``F`` after the rule's placement (what the score is taken from) equals the
    node's ``F`` once the core booked the pod there with those cards; the scores the measure remembers
    are the ones the core computes on the node as it is now."""
    nodes = [
        TraceNode(name=f"n{i}", cpu_milli=64000, memory_mib=10**6, gpus=g, model=m)
        for i, (g, m) in enumerate([(8, "G2"), (2, "T4"), (4, "G2")])
    ]
    cluster = Cluster.from_trace(nodes, split_count=100)
    measure = FragMeasure(CLASSES, cluster)
    for (k, milli), salt in history:
        p = pod("p", k, milli, cpu=3000)
        ok, fit = cluster.feasible(p)
        rows = np.flatnonzero(ok)
        if not rows.size:
            continue
        i = int(rows[salt % rows.size])
        scores = measure.scores(p, rows)
        found = place(
            measure.target,
            cluster.states[i],
            cluster.request(p),
            host_request=(3000, 0),
            host_free=(int(cluster.cpu_free[i]), 0),
        )
        assert found is not None
        assert scores[rows == i][0] == found.score
        cards = measure.cards(i, p) if fit is not None else None
        assert cards == (found.cards[0] if fit is not None else None)
        cluster.place(i, p, cards, "binpack")
        measure.refresh(i)
        assert measure.frag[i] == pytest.approx(found.after)
        assert measure.total == pytest.approx(measure.frag.sum())
