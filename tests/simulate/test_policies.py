"""Each policy's rule on small clusters whose answer is worked out by hand from the paper's formulas, ties
broken by the seed's node rank, and HAMi's two policies choosing a node the production core ranks first
(``priorities``, the ranking ``/prioritize`` answers) with the cards the core's Fit picks there."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from hami.core.allocate import Policy as CorePolicy
from hami.core.allocate import allocate, priorities
from hami.core.model import Allocation
from hami.simulate.cluster import Cluster
from hami.simulate.frag import FragMeasure
from hami.simulate.policies import Context
from hami.simulate.registry import make_policy
from hami.simulate.trace import TraceNode, TracePod
from hami.simulate.workload import RequestClass

CLASSES = [RequestClass(cpu_milli=1000, gpu_milli=500, num_gpu=1, gpu_spec=(), probability=1.0)]


def pod(k: int, milli: int, cpu: int = 1000, name: str = "p") -> TracePod:
    return TracePod(name=name, cpu_milli=cpu, memory_mib=1, num_gpu=k, gpu_milli=milli)


def cluster_with(shares: list[list[int]], cpu: int = 64000) -> Cluster:
    """One node per list; each number a card's used milli (0 = free)."""
    nodes = [
        TraceNode(name=f"n{i}", cpu_milli=cpu, memory_mib=10**6, gpus=len(c), model="T4")
        for i, c in enumerate(shares)
    ]
    cluster = Cluster.from_trace(nodes, split_count=100)
    for i, cards in enumerate(shares):
        for j, used in enumerate(cards):
            if used:
                cluster.place(i, pod(1, used, cpu=0, name="setup"), (j,), "binpack")
    return cluster


def choose(name: str, cluster: Cluster, p: TracePod, rank: list[int] | None = None) -> tuple[int, object]:
    n = len(cluster.states)
    ctx = Context(
        cluster=cluster,
        measure=FragMeasure(CLASSES, cluster),
        rank=np.array(rank if rank is not None else list(range(n))),
        rng=np.random.default_rng(0),
    )
    ok, fit = cluster.feasible(p)
    return make_policy(name, ctx).choose(p, np.flatnonzero(ok), fit)


def test_packing_prefers_used_cards_then_free_cards_of_used_nodes_then_empty_nodes() -> None:
    cluster = cluster_with([[0, 0], [400, 0], [700, 700], [900, 0]])
    # n0 empty: max(33-2, 2) = 31; n1: tightest fitting card 600 free -> 100 - 60/10 = 94;
    # n2: 300 free -> 97; n3: only the free card fits -> max(50-1, 33) = 49
    assert choose("packing", cluster, pod(1, 250)) == (2, (0,))
    assert choose("packing", cluster, pod(1, 350)) == (1, (0,))
    assert choose("packing", cluster, pod(1, 1000)) == (1, (1,))  # 49 beats the empty node's 31
    assert choose("packing", cluster, pod(0, 0), rank=[3, 2, 0, 1]) == (2, None)  # CPU-only: 0 everywhere


def test_bestfit_takes_the_node_left_with_least() -> None:
    cluster = cluster_with([[0, 0], [500, 0], [0]], cpu=64000)
    # free GPU 2000 / 1500 / 1000: the 1-card node leaves the least (100 (1 - 0.5 c/128000 - 0.5 g/8000))
    assert choose("bestfit", cluster, pod(1, 500)) == (2, (0,))
    assert choose("bestfit", cluster, pod(1, 1000), rank=[0, 1, 2])[0] == 2
    big = cluster_with([[0, 0], [0]], cpu=64000)
    big.place(0, pod(0, 0, cpu=60000), None, "binpack")
    assert choose("bestfit", big, pod(1, 100))[0] == 0  # CPU counts as much as GPU


def test_dotprod_prefers_the_smallest_dot_product() -> None:
    cluster = cluster_with([[0, 0], [600, 0]])
    cluster.place(1, pod(0, 0, cpu=32000), None, "binpack")
    # [c/128000, g/8000] . [32000/128000, 300/8000]: n0 0.5*0.25 + 0.25*0.0375 -> int(100 (1 - 0.067)) = 93;
    # n1 0.25*0.25 + 0.175*0.0375 -> 96
    assert choose("dotprod", cluster, pod(1, 300, cpu=32000)) == (1, (0,))
    assert choose("dotprod", cluster, pod(1, 300, cpu=10)) == (0, (0,))  # both 99: the lower rank


def test_clustering_groups_pods_of_one_kind() -> None:
    cluster = cluster_with([[0, 0], [0, 0], [0, 0]])
    policy_ctx = Context(
        cluster=cluster,
        measure=FragMeasure(CLASSES, cluster),
        rank=np.array([2, 1, 0]),
        rng=np.random.default_rng(0),
    )
    policy = make_policy("clustering", policy_ctx)
    share = pod(1, 200)
    ok, fit = cluster.feasible(share)
    first = policy.choose(share, np.flatnonzero(ok), fit)
    assert first[0] == 2  # all equal (25 + B): the lowest rank
    policy.placed(2, share, (0,))
    cluster.place(2, share, (0,), "binpack")
    whole = pod(1, 1000)
    ok, fit = cluster.feasible(whole)
    assert policy.choose(whole, np.flatnonzero(ok), fit)[0] == 1  # n2 holds another tag: B only
    ok, fit = cluster.feasible(share)
    assert policy.choose(share, np.flatnonzero(ok), fit)[0] == 2  # same tag only: 75 + B


def test_fgd_takes_the_card_that_fragments_least() -> None:
    cluster = cluster_with([[0, 500, 700]])
    # target: shares of 500. A 300 share on the 300-free card leaves 0 (no new fragment);
    # on the 500 card it would leave 200 (fragment), on the free card 700 (fine but loses a 500 slot later)
    assert choose("fgd", cluster, pod(1, 300)) == (0, (2,))


def fgd_and_ours(cluster: Cluster, classes: list[RequestClass], p: TracePod) -> dict[str, int]:
    """The node ``fgd`` and ``fragmentation`` each choose for ``p`` (the node order: the rows')."""
    ok, fit = cluster.feasible(p)
    picked = {}
    for name in ("fgd", "fragmentation"):
        ctx = Context(
            cluster=cluster,
            measure=FragMeasure(classes, cluster),
            rank=np.arange(len(cluster.states)),
            rng=np.random.default_rng(0),
        )
        picked[name] = make_policy(name, ctx).choose(p, np.flatnonzero(ok), fit)[0]
    return picked


def test_fragmentation_keeps_cards_from_being_stranded_behind_spent_host_memory() -> None:
    """Two like nodes, but n0 has 1,400 MiB of host memory, n1 plenty. The workload's pods take 500 milli
    and 1,000 MiB. FGD sees no difference and takes n0 (rank); ``fragmentation`` sees that n0 would be
    left with 400 MiB, less than half of what the next such pod needs, its 1,500 free milli lost to it."""
    nodes = [
        TraceNode(name="n0", cpu_milli=64000, memory_mib=1400, gpus=2, model="T4"),
        TraceNode(name="n1", cpu_milli=64000, memory_mib=10**6, gpus=2, model="T4"),
    ]
    cluster = Cluster.from_trace(nodes, split_count=100)
    classes = [
        RequestClass(cpu_milli=1000, gpu_milli=500, num_gpu=1, gpu_spec=(), probability=1, memory_mib=1000)
    ]
    p = TracePod(name="p", cpu_milli=1000, memory_mib=1000, num_gpu=1, gpu_milli=500)
    assert fgd_and_ours(cluster, classes, p) == {"fgd": 0, "fragmentation": 1}


def test_fragmentation_leaves_a_scarce_model_to_the_pods_restricted_to_it() -> None:
    """One P100 card against eight G2 cards; a tenth of the pods may only use the P100, three tenths only
    the G2s. FGD sends an unrestricted pod to the P100 (fewer classes accept it, so FGD counts its card
    as lost to them already); ``fragmentation`` holds the P100 back for its own demand, nine times the
    average per card, and takes a G2."""
    nodes = [
        TraceNode(name="p100", cpu_milli=64000, memory_mib=10**6, gpus=1, model="P100"),
        TraceNode(name="g2", cpu_milli=64000, memory_mib=10**6, gpus=8, model="G2"),
    ]
    cluster = Cluster.from_trace(nodes, split_count=100)

    def whole(probability: float, *spec: str) -> RequestClass:
        return RequestClass(
            cpu_milli=1000, gpu_milli=1000, num_gpu=1, gpu_spec=spec, probability=probability, memory_mib=1000
        )

    classes = [whole(0.6), whole(0.3, "G2"), whole(0.1, "P100")]
    p = TracePod(name="p", cpu_milli=1000, memory_mib=1000, num_gpu=1, gpu_milli=1000)
    assert fgd_and_ours(cluster, classes, p) == {"fgd": 0, "fragmentation": 1}


def test_random_picks_only_feasible_nodes() -> None:
    cluster = cluster_with([[1000], [0], [900]])
    for seed in range(5):
        ctx = Context(
            cluster=cluster,
            measure=FragMeasure(CLASSES, cluster),
            rank=np.arange(3),
            rng=np.random.default_rng(seed),
        )
        ok, fit = cluster.feasible(pod(1, 500))
        assert make_policy("random", ctx).choose(pod(1, 500), np.flatnonzero(ok), fit) == (1, (0,))


def test_unknown_policy() -> None:
    with pytest.raises(ValueError, match="unknown policy 'tetris'"):
        make_policy("tetris", None)  # type: ignore[arg-type]


@settings(max_examples=40, deadline=None)
@given(
    used=st.lists(
        st.lists(st.sampled_from([0, 0, 100, 250, 500, 1000]), min_size=1, max_size=4), min_size=2, max_size=6
    ),
    milli=st.sampled_from([100, 300, 600, 1000]),
    node_policy=st.sampled_from(["binpack", "spread"]),
)
def test_hami_policies_choose_what_the_core_chooses(
    used: list[list[int]], milli: int, node_policy: str
) -> None:
    cluster = cluster_with(used)
    p = pod(1, milli)
    ok, _ = cluster.feasible(p)
    assume(ok.any())
    chosen, cards = choose(f"hami-{node_policy}", cluster, p)
    request, policy = cluster.request(p), CorePolicy(node_policy=node_policy, gpu_policy=node_policy)
    decisions = allocate(request, cluster.states, policy)
    ranks = priorities(request, [s for s in cluster.states if decisions.fits(s.name)], policy)
    name = cluster.states[chosen].name
    assert name in ranks and ranks[name] == max(ranks.values())  # HAMi's choice is ranked first here too
    core = decisions[name]
    assert isinstance(core, Allocation)
    assert cards is None  # the core picks the cards
    granted = cluster.place(chosen, p, None, node_policy)
    assert [cluster.states[chosen].devices[j].device.uuid for j in granted] == [
        g.uuid for g in core.devices[0]
    ]
