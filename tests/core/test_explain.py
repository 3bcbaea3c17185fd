"""hami.core.explain: the verdict in words and the nearest change that makes a pod fit."""

from __future__ import annotations

from hami.core.allocate import Policy
from hami.core.explain import explain_node
from hami.core.model import Grant
from hami.core.usage import apply_usage, pod_usage

from .builders import make_card, make_container, make_request, node_state

POLICY = Policy()


def test_a_fitting_node_needs_no_hints() -> None:
    node = node_state("n1", [make_card("GPU-0", memory=8000)])
    result = explain_node(make_request(make_container(mem=4000, cores=30)), node, POLICY)
    assert result.fits and result.reason == "" and result.hints == ()


def test_memory_hint_is_the_largest_that_fits() -> None:
    # card 8000 MiB with 1000 used -> 7000 free: 7000 fits, 7001 does not
    node = node_state("n1", [make_card("GPU-0", memory=8000, used=1, used_mem=1000, used_cores=10)])
    result = explain_node(make_request(make_container(mem=9000, cores=30)), node, POLICY)
    assert not result.fits
    assert result.reason == "1/1 CardInsufficientMemory"
    assert "fits if the container asks gpumem <= 7000" in result.hints


def test_cores_and_count_hints() -> None:
    # two cards with 60 % cores free each: 2 cards x 70 % cannot fit; 60 % fits, and so does 1 card x 60
    cards = [make_card(f"GPU-{i}", index=i, memory=8000, used=1, used_cores=40) for i in range(2)]
    result = explain_node(make_request(make_container(2, mem=100, cores=70)), node_state("n1", cards), POLICY)
    assert "fits if the container asks gpucores <= 60" in result.hints
    three = explain_node(make_request(make_container(3, mem=100)), node_state("n1", cards), POLICY)
    assert three.reason == "NodeInsufficientDevice"
    assert not three.resolvable
    assert "fits if the container asks nvidia.com/gpu <= 2" in three.hints


def test_percentage_hint() -> None:
    # 10000 MiB card with 6000 used: 40 % fits (4000), 41 % does not
    node = node_state("n1", [make_card("GPU-0", memory=10000, used=1, used_mem=6000)])
    result = explain_node(make_request(make_container(pct=50)), node, POLICY)
    assert "fits if the container asks gpumem-percentage <= 40" in result.hints


def test_type_preference_hint() -> None:
    node = node_state("n1", [make_card("GPU-0", type="NVIDIA A10")])
    request = make_request(make_container(mem=100), use_types=("V100",))
    result = explain_node(request, node, POLICY)
    assert result.reason == "1/1 CardTypeMismatch"
    assert "fits without the nvidia.com/use-gputype annotation" in result.hints


def test_numa_hint_counts_cards_per_numa_node() -> None:
    cards = [make_card("GPU-0", index=0, numa=0), make_card("GPU-1", index=1, numa=1)]
    request = make_request(make_container(2, mem=100), numa_bind=True)
    result = explain_node(request, node_state("n1", cards), POLICY)
    assert not result.fits
    assert "needs 2 cards on one NUMA node; free cards per NUMA node: 1+1" in result.hints


def test_names_the_pod_whose_end_frees_room() -> None:
    empty = node_state("n1", [make_card("GPU-0", memory=8000)])
    big = pod_usage(((Grant(uuid="GPU-0", memory_mib=6000, cores=50),),), 0, init_done=False)
    small = pod_usage(((Grant(uuid="GPU-0", memory_mib=1000, cores=10),),), 0, init_done=False)
    node = apply_usage(apply_usage(empty, big), small)
    result = explain_node(
        make_request(make_container(mem=4000)), node, POLICY, pods={"ns/big": big, "ns/small": small}
    )
    assert result.reason == "1/1 CardInsufficientMemory"
    assert "fits when pod ns/big ends" in result.hints
    assert "fits when pod ns/small ends" not in result.hints


def test_hints_are_ordered_nearest_first_with_their_distance() -> None:
    # 2 cards x 70 % cores on cards with 60 % free: cores <= 60 gives up 1/7, one card gives up 1/2
    cards = [make_card(f"GPU-{i}", index=i, memory=8000, used=1, used_cores=40) for i in range(2)]
    result = explain_node(make_request(make_container(2, mem=100, cores=70)), node_state("n1", cards), POLICY)
    assert result.hints[0] == "fits if the container asks gpucores <= 60"
    assert result.distance == (70 - 60) / 70
