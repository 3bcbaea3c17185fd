"""The replay's cluster: its one-shot node mask says exactly what the production core's Fit says, on any
card state (property test), CPU and memory are checked like NodeResourcesFit, and every booking goes
through the core — a pinned card the core refuses is an error, never a silent placement."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hami.core.allocate import Policy, fit_node
from hami.core.model import Allocation, Device, DeviceMode, DeviceState, NodeState
from hami.simulate.cluster import Cluster, CoreDisagrees, NodeCapacity, container_request
from hami.simulate.trace import TraceNode, TracePod

MODELS = ("NVIDIA T4", "NVIDIA G2", "NVIDIA V100M16", "NVIDIA V100M32", "AMD MI100")


@st.composite
def card_states(draw: st.DrawFn, node: int, index: int) -> DeviceState:
    memory = draw(st.sampled_from((1000, 15360, 81920)))
    cores = draw(st.sampled_from((100, 100, 100, 200, 0)))
    count = draw(st.integers(1, 12))
    device = Device(
        uuid=f"GPU-{node}-{index}",
        index=index,
        count=count,
        memory_mib=memory,
        cores=cores,
        type=draw(st.sampled_from(MODELS)),
        mode=draw(st.sampled_from((DeviceMode.HAMI_CORE, DeviceMode.HAMI_CORE, DeviceMode.MIG))),
        health=draw(st.booleans()) or draw(st.booleans()),
    )
    return DeviceState(
        device=device,
        used=draw(st.integers(0, count)),
        used_mem=draw(st.one_of(st.just(0), st.just(memory), st.integers(0, memory))),
        used_cores=draw(st.one_of(st.just(0), st.just(cores), st.integers(0, max(cores, 1)))),
    )


@st.composite
def node_states(draw: st.DrawFn, node: int) -> NodeState:
    cards = tuple(draw(card_states(node, j)) for j in range(draw(st.sampled_from((0, 1, 1, 2, 2, 3, 8)))))
    cordoned = frozenset(c.device.uuid for c in cards if draw(st.integers(0, 5)) == 0)
    return NodeState(name=f"node-{node}", devices=cards, cordoned=cordoned)


pods = st.builds(
    lambda k, milli, spec, cpu, mem: TracePod(
        name="p", cpu_milli=cpu, memory_mib=mem, num_gpu=k, gpu_milli=1000 if k > 1 else milli, gpu_spec=spec
    ),
    st.sampled_from((1, 1, 1, 2, 4)),
    st.sampled_from((50, 470, 500, 995, 1000, 1000, 1000, 5)),
    st.sampled_from(((), (), ("T4",), ("V100M16", "V100M32"), ("v100",), ("G3",))),
    st.integers(0, 4000),
    st.integers(0, 4000),
)


@settings(max_examples=400, deadline=None)
@given(
    states=st.lists(st.integers(0, 10**6), min_size=1, max_size=4).flatmap(
        lambda seeds: st.tuples(*(node_states(k) for k in range(len(seeds))))
    ),
    pod=pods,
    exact=st.booleans(),
)
def test_mask_equals_the_cores_fit(states: tuple[NodeState, ...], pod: TracePod, exact: bool) -> None:
    capacity = [NodeCapacity(cpu_milli=3000, memory_mib=3000, cpu_used=i * 500) for i in range(len(states))]
    cluster = Cluster(states=list(states), capacity=capacity, exact_card_mib=1000 if exact else None)
    ok, _ = cluster.feasible(pod)
    for i, node in enumerate(states):
        fits = isinstance(fit_node(cluster.request(pod), node, Policy()), Allocation)
        resources = pod.cpu_milli <= 3000 - i * 500 and pod.memory_mib <= 3000
        assert bool(ok[i]) == (fits and resources), (node, pod)


def test_cpu_and_memory_are_checked_like_node_resources_fit() -> None:
    nodes = [TraceNode(name=f"n{i}", cpu_milli=8000, memory_mib=16384, gpus=1, model="T4") for i in range(2)]
    cluster = Cluster.from_trace(nodes)
    cluster.place(
        0, TracePod(name="cpu", cpu_milli=6000, memory_mib=100, num_gpu=0, gpu_milli=0), None, "binpack"
    )
    wants = TracePod(name="g", cpu_milli=2001, memory_mib=1, num_gpu=1, gpu_milli=100)
    assert cluster.feasible(wants)[0].tolist() == [False, True]
    exact = TracePod(name="g", cpu_milli=2000, memory_mib=16284, num_gpu=1, gpu_milli=100)
    assert cluster.feasible(exact)[0].tolist() == [True, True]  # requested + pod == allocatable fits


def test_a_pinned_card_the_core_refuses_is_an_error() -> None:
    cluster = Cluster.from_trace([TraceNode(name="n", cpu_milli=8000, memory_mib=8000, gpus=2, model="T4")])
    share = TracePod(name="s", cpu_milli=1, memory_mib=1, num_gpu=1, gpu_milli=600)
    assert cluster.place(0, share, (1,), "binpack") == (1,)
    assert cluster.milli[0].tolist() == [1000, 400]
    with pytest.raises(CoreDisagrees, match="the core says"):
        cluster.place(0, share, (1,), "binpack")


def test_the_core_picks_cards_for_hami_policies_and_slots_bind() -> None:
    cluster = Cluster.from_trace(
        [TraceNode(name="n", cpu_milli=10**6, memory_mib=10**6, gpus=2, model="T4")], 2
    )
    tiny = TracePod(name="t", cpu_milli=1, memory_mib=1, num_gpu=1, gpu_milli=50)
    packed = cluster.place(0, tiny, None, "binpack")
    assert cluster.place(0, tiny, None, "binpack") == packed  # binpack fills one card's two slots first
    spread = cluster.place(0, tiny, None, "spread")
    assert spread != packed  # spread takes the other card
    assert cluster.place(0, tiny, None, "binpack") == spread  # the one slot left
    assert cluster.used[0].tolist() == [2, 2]  # two slots per card, all taken
    assert not cluster.feasible(tiny)[0].any()
    assert cluster.feasible_without_slots(tiny)


def test_trace_requests_map_to_hami_requests() -> None:
    share = TracePod(name="s", cpu_milli=1, memory_mib=1, num_gpu=1, gpu_milli=470)
    assert (container_request(share, 1000).percentage, container_request(share, 1000).cores) == (47, 47)
    odd = TracePod(name="s", cpu_milli=1, memory_mib=1, num_gpu=1, gpu_milli=125)
    assert (container_request(odd, 1000).memory_mib, container_request(odd, None).percentage) == (125, 13)


def _card(**changes: object) -> DeviceState:
    device = {"uuid": "g", "count": 4, "memory_mib": 1000, "cores": 100, "type": "NVIDIA T4", "health": True}
    device.update({k: v for k, v in changes.items() if k in device or k == "mode"})
    usage = {k: v for k, v in changes.items() if k in ("used", "used_mem", "used_cores")}
    return DeviceState(device=Device(**device), **usage)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("card", "milli", "spec", "cordoned"),
    [
        (_card(used=4, used_mem=10, used_cores=1), 50, (), False),  # no free slot
        (_card(used=1, used_mem=0, used_cores=0), 1000, (), False),  # exclusive: the card has a task
        (_card(used=1, used_mem=10, used_cores=100), 5, (), False),  # a 0-core task on a fully cored card
        (_card(health=False), 50, (), False),
        (_card(), 50, (), True),  # cordoned
        (_card(mode=DeviceMode.MIG), 50, (), False),
        (_card(type="AMD MI100"), 50, (), False),
        (_card(), 50, ("V100",), False),  # type constraint
        (_card(used=1, used_mem=600, used_cores=10), 470, (), False),  # memory
        (_card(used=1, used_mem=100, used_cores=90), 470, (), False),  # cores
    ],
)
def test_each_card_check_of_the_core_is_mirrored(
    card: DeviceState, milli: int, spec: tuple[str, ...], cordoned: bool
) -> None:
    node = NodeState(name="n", devices=(card,), cordoned=frozenset({"g"}) if cordoned else frozenset())
    cluster = Cluster(states=[node], capacity=[NodeCapacity(cpu_milli=10, memory_mib=10)])
    pod = TracePod(name="p", cpu_milli=1, memory_mib=1, num_gpu=1, gpu_milli=milli, gpu_spec=spec)
    assert not isinstance(fit_node(cluster.request(pod), node, Policy()), Allocation)
    assert not cluster.feasible(pod)[0][0]
    free = Cluster(
        states=[NodeState(name="n", devices=(_card(),))], capacity=[NodeCapacity(cpu_milli=10, memory_mib=10)]
    )
    assert free.feasible(TracePod(name="p", cpu_milli=1, memory_mib=1, num_gpu=1, gpu_milli=milli))[0][0]
