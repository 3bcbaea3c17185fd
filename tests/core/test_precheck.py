"""The precheck's summaries for steered and numa-bind pods: exact verdicts, equal to the full Fit.

Type/uuid-steered pods (``use-gputype``, ``nouse-gputype``, ``use-gpuuuid``, ``nouse-gpuuuid``,
``vgpu-mode``) and ``numa-bind`` pods are judged from the node summary's card groups (per card type,
mode and NUMA node); the property tests draw nodes, requests, steering and policies and compare every
verdict with the full Fit (and check that the precheck declines only the pods it says it declines),
and every rejection ``allocate`` builds for a node the precheck failed (reasons, card counts, text,
resolvable) with the full Fit's.
"""

from __future__ import annotations

from hypothesis import assume, given, settings
from hypothesis import strategies as st

from hami.core import precheck
from hami.core.allocate import Policy, allocate, fit_node
from hami.core.fragmentation import Target, TargetClass
from hami.core.model import (
    Allocation,
    ContainerRequest,
    DeviceState,
    NamespaceQuota,
    NodeState,
    PodRequest,
    Rejection,
)
from hami.core.score import parse_gpu_policy

from .builders import make_card, make_container, make_request, node_state

SPREAD = parse_gpu_policy("spread")


def judged(request: PodRequest, node: NodeState, policy: str = "spread") -> bool | None:
    plan = precheck.plan(request, parse_gpu_policy(policy), None)
    assert plan is not None, request
    return precheck.verdict(plan, node.summary)


def fits(request: PodRequest, node: NodeState, policy: str = "spread") -> bool:
    return isinstance(fit_node(request, node, Policy(gpu_policy=policy)), Allocation)


def two_numa_node() -> NodeState:
    """Four cards, two per NUMA node; one card of NUMA 1 is full (slots)."""
    return node_state(
        cards=(
            make_card("GPU-0", index=0, numa=0),
            make_card("GPU-1", index=1, numa=0),
            make_card("GPU-2", index=2, numa=1),
            make_card("GPU-3", index=3, numa=1, count=1, used=1),
        )
    )


def test_numa_bind_pods_are_judged_from_the_summary() -> None:
    node = two_numa_node()
    for nums, expected in ((1, True), (2, True), (3, False)):
        request = make_request(make_container(nums, mem=100), numa_bind=True)
        assert judged(request, node) is expected, nums
        assert fits(request, node) is expected, nums
    # Two cards wanted, but GPU-0 is steered away: no NUMA node keeps two free cards.
    steered = make_request(make_container(2, mem=100), numa_bind=True, nouse_uuids=("GPU-0",))
    assert judged(steered, node) is False and fits(steered, node) is False
    # Without numa-bind the same pod takes GPU-1 and GPU-2 across NUMA nodes.
    loose = make_request(make_container(2, mem=100), nouse_uuids=("GPU-0",))
    assert judged(loose, node) is True and fits(loose, node) is True


def test_numa_bind_under_mutex_and_binpack() -> None:
    node = node_state(
        cards=(
            make_card("GPU-0", index=0, numa=0, used=1),
            make_card("GPU-1", index=1, numa=1),
            make_card("GPU-2", index=2, numa=0),
            make_card("GPU-3", index=3, numa=1),
        )
    )
    request = make_request(make_container(2, mem=100), numa_bind=True)
    for policy in ("mutex", "binpack", "numa", "numa,mutex"):
        assert judged(request, node, policy) is True, policy
        assert fits(request, node, policy) is True, policy
    three = make_request(make_container(3, mem=100), numa_bind=True)
    assert judged(three, node, "mutex") is False and fits(three, node, "mutex") is False


def test_type_steered_pods_are_judged_per_card_type() -> None:
    node = node_state(
        cards=(
            make_card("GPU-0", index=0, type="NVIDIA T4", numa=0),
            make_card("GPU-1", index=1, type="NVIDIA A100", numa=0, used=1, used_mem=900),
            make_card("GPU-2", index=2, type="NVIDIA A100", numa=1),
        )
    )
    cases = (
        ({"use_types": ("a100",)}, 1, 500, True),
        ({"use_types": ("a100",)}, 2, 500, False),  # GPU-1 lacks the memory
        ({"use_types": ("a100",)}, 2, 100, True),
        ({"use_types": ("a100",), "numa_bind": True}, 2, 100, False),  # A100s on two NUMA nodes
        ({"nouse_types": ("a100",)}, 1, 100, True),
        ({"nouse_types": ("a100",)}, 2, 100, False),
        ({"use_types": ("v100",)}, 1, 1, False),
        ({"use_uuids": ("GPU-1",)}, 1, 500, False),
        ({"use_uuids": ("GPU-1", "GPU-2")}, 1, 500, True),
        ({"use_uuids": ("GPU-9",)}, 1, 1, False),
        ({"nouse_uuids": ("GPU-0", "GPU-2")}, 1, 500, False),
        ({"nouse_uuids": ("GPU-9",)}, 3, 100, True),
        ({"vgpu_mode": "mps"}, 1, 1, False),
    )
    for steering, nums, mem, expected in cases:
        request = make_request(make_container(nums, mem=mem), **steering)
        assert judged(request, node) is expected, steering
        assert fits(request, node) is expected, steering


def test_rejections_keep_hamis_words_and_counts() -> None:
    # The node fails the precheck; its rejection is built by the unordered walk, counted per card.
    node = node_state(
        cards=(
            make_card("GPU-0", index=0, type="NVIDIA T4"),
            make_card("GPU-1", index=1, type="NVIDIA A100", used=1, used_mem=900),
            make_card("GPU-2", index=2, type="NVIDIA A100"),
        )
    )
    request = make_request(make_container(2, mem=500), use_types=("A100",))
    rejection = allocate(request, [node], Policy())["node1"]
    assert isinstance(rejection, Rejection)
    assert rejection.message == (
        "1/3 AllocatedCardsInsufficientRequest, 1/3 CardInsufficientMemory, 1/3 CardTypeMismatch"
    )
    assert rejection.resolvable  # both A100s hold 500 MiB once the other pod is gone
    whole = make_request(make_container(2, mem=2000), use_types=("A100",))
    too_big = allocate(whole, [node], Policy())["node1"]
    assert isinstance(too_big, Rejection) and not too_big.resolvable
    assert too_big.message == "1/3 CardTypeMismatch, 2/3 CardInsufficientMemory"


def test_topology_aware_numa_bind_and_quota_pods_run_the_full_fit() -> None:
    # With topology-aware card choice and numa-bind, only the last NUMA group Fit walks counts.
    numa = make_request(make_container(mem=1), numa_bind=True)
    assert precheck.plan(numa, parse_gpu_policy("topology-aware"), None) is None
    assert precheck.plan(numa, SPREAD, NamespaceQuota(memory_limit=10)) is None
    assert precheck.plan(numa, SPREAD, None) is not None


def test_allocate_uses_the_summary_for_steered_pods() -> None:
    nodes = [two_numa_node(), node_state("other", (make_card("GPU-7", type="NVIDIA T4"),))]
    request = make_request(make_container(2, mem=100), numa_bind=True, use_types=("NVIDIA",))
    decisions = allocate(request, nodes, Policy())
    assert decisions.fitting == ("node1",)
    assert {name: r.message for name, r in decisions.rejections().items()} == {
        "other": "NodeInsufficientDevice"
    }


# ------------------------------------------------------------------------- property: precheck == Fit

TYPES = ["NVIDIA", "NVIDIA A100", "NVIDIA T4", "AMD MI100"]


@st.composite
def nodes(draw: st.DrawFn) -> NodeState:
    n = draw(st.integers(0, 6))
    cards = []
    for i in range(n):
        count = draw(st.integers(1, 4))
        memory = draw(st.sampled_from([1000, 2000, 4000]))
        cores = draw(st.sampled_from([100, 100, 200, 0]))
        cards.append(
            make_card(
                f"GPU-{i}",
                index=draw(st.sampled_from([i, i, 0])),  # equal indexes: the order's tie-break
                count=count,
                memory=memory,
                cores=cores,
                used=draw(st.sampled_from([0, 0, 1, count - 1, count])),
                # boundary values (empty, full) are where the rules differ, so draw only those
                used_mem=draw(st.sampled_from([0, memory // 2, memory - 500, memory])),
                used_cores=draw(st.sampled_from([0, cores // 2, cores])),
                numa=draw(st.integers(0, 2)),
                health=draw(st.sampled_from([True, True, True, False])),
                type=draw(st.sampled_from(TYPES)),
                mode=draw(st.sampled_from(["hami-core", "hami-core", "mps", ""])),
            )
        )
    cordoned = frozenset(draw(st.lists(st.sampled_from([f"GPU-{i}" for i in range(6)]), max_size=1)))
    return node_state(cards=cards, cordoned=cordoned)


containers = st.builds(
    lambda nums, mem, pct, cores: make_container(nums, mem=mem, pct=pct, cores=cores),
    st.integers(1, 4),
    st.sampled_from([0, 0, 1, 500, 1000, 1500]),
    st.sampled_from([101, 101, 0, 25, 50, 100]),
    st.sampled_from([0, 0, 10, 50, 100, 150]),
)

STEERING = st.fixed_dictionaries(
    {},
    optional={
        "use_types": st.sampled_from([("a100",), ("T4", "A100"), ("v100",), ("NVIDIA",)]),
        "nouse_types": st.sampled_from([("A100",), ("t4",), ("nvidia",)]),
        "use_uuids": st.sampled_from([("GPU-0", "GPU-2"), ("GPU-3",), ("GPU-1", "GPU-4", "GPU-5")]),
        "nouse_uuids": st.sampled_from([("GPU-1",), ("GPU-0", "GPU-3")]),
        "vgpu_mode": st.sampled_from(["mps", "hami-core", "mig"]),
        "numa_bind": st.booleans(),
    },
)


#: The cluster policy of the property tests: its target workload orders the cards of the pods asking for
#: the ``fragmentation`` GPU policy (hami.core.fragplacement), the other policies ignore it.
CLUSTER = Policy(
    target=Target(
        [TargetClass(nums=1, percentage=50, cores=50), TargetClass(nums=2, memory_mib=1000, weight=0.5)]
    )
)
POLICIES = st.sampled_from(
    ["spread", "binpack", "mutex", "numa", "topology-aware", "numa,binpack", "binpack,mutex", "fragmentation"]
)
ITEMS = st.lists(st.one_of(st.none(), containers), min_size=1, max_size=3)


@settings(max_examples=500, deadline=None)
@given(node=nodes(), items=ITEMS, init_count=st.integers(0, 2), gpu_policy=POLICIES, steering=STEERING)
def test_steered_and_numa_verdicts_equal_fit(
    node: NodeState,
    items: list[ContainerRequest | None],
    init_count: int,
    gpu_policy: str,
    steering: dict[str, object],
) -> None:
    request = make_request(*items, init_count=min(init_count, len(items)), gpu_policy=gpu_policy, **steering)  # type: ignore[arg-type]
    policy = parse_gpu_policy(gpu_policy)
    plan = precheck.plan(request, policy, None)
    apps = sum(1 for c in request.containers[request.init_count :] if c is not None and c.nums > 0)
    declined = apps > 1 or (request.numa_bind and policy.topology)
    assert (plan is None) == declined, (apps, request.numa_bind, gpu_policy)
    assume(plan is not None)  # a declined plan has nothing more to compare
    assert plan is not None
    full = fit_node(request, node, CLUSTER)
    assert precheck.verdict(plan, node.summary) == isinstance(full, Allocation), full


@settings(max_examples=300, deadline=None)
@given(node=nodes(), items=ITEMS, init_count=st.integers(0, 2), gpu_policy=POLICIES, steering=STEERING)
def test_rejections_equal_the_full_fit(
    node: NodeState,
    items: list[ContainerRequest | None],
    init_count: int,
    gpu_policy: str,
    steering: dict[str, object],
) -> None:
    request = make_request(*items, init_count=min(init_count, len(items)), gpu_policy=gpu_policy, **steering)  # type: ignore[arg-type]
    decisions = allocate(request, [node], CLUSTER)
    full = fit_node(request, node, CLUSTER)
    assert decisions.fits(node.name) == isinstance(full, Allocation)
    assume(not isinstance(full, Allocation))  # the rest compares rejections
    assert not isinstance(full, Allocation)
    got = decisions[node.name]
    assert isinstance(got, Rejection)
    assert (got.reasons, got.total, got.message) == (full.reasons, full.total, full.message)
    # Resolvable, computed here by the full Fit alone: the pod fits the node with nothing used.
    idle = node_state(
        cards=[DeviceState(device=s.device) for s in node.devices],
        cordoned=node.cordoned,
        pair_scores=node.pair_scores,
    )
    per_card = all(reason.per_card for reason in full.reasons)
    expected = per_card and isinstance(fit_node(request, idle, CLUSTER), Allocation)
    assert got.resolvable == expected == full.resolvable
