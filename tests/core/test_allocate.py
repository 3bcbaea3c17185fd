"""Pod level per node (docs/protocol.md, "Pod on a node"), Decisions, resolvability, and the fast precheck."""

from __future__ import annotations

from hypothesis import assume, given, settings
from hypothesis import strategies as st

from hami.core import precheck
from hami.core.allocate import Policy, allocate, fit_node
from hami.core.model import Allocation, ContainerRequest, NamespaceQuota, NodeState, Rejection
from hami.core.score import parse_gpu_policy
from hami.core.usage import apply_usage, pod_usage

from .builders import make_card, make_cards, make_container, make_request, mig_card, node_state

ONE_CARD = node_state(cards=make_cards(1))


def grants(decision: Allocation | Rejection) -> list[list[tuple[str, int]]]:
    assert isinstance(decision, Allocation), decision
    return [[(g.uuid, g.memory_mib) for g in c] for c in decision.devices]


def test_init_containers_each_run_on_a_fresh_copy() -> None:
    # Two init containers of 800 MiB and an app of 800 MiB on one 1000 MiB card: none sees the others.
    request = make_request(
        make_container(mem=800), make_container(mem=800), make_container(mem=800), init_count=2
    )
    assert grants(fit_node(request, ONE_CARD, Policy())) == [[("GPU-0", 800)]] * 3


def test_app_containers_share_one_copy() -> None:
    request = make_request(make_container(mem=600), make_container(mem=600))
    decision = fit_node(request, ONE_CARD, Policy())
    assert isinstance(decision, Rejection) and decision.message == "1/1 CardInsufficientMemory"
    assert decision.resolvable is False  # even an empty card cannot hold 1200 MiB


def test_later_app_containers_see_earlier_picks_in_scores() -> None:
    # Spread: the first container takes GPU-1 (last registered), which then scores higher, so the second
    # container goes to GPU-0.
    request = make_request(make_container(mem=100), make_container(mem=100))
    assert grants(fit_node(request, node_state(cards=make_cards(2)), Policy())) == [
        [("GPU-1", 100)],
        [("GPU-0", 100)],
    ]


def test_containers_without_requests_get_empty_entries() -> None:
    request = make_request(None, make_container(mem=100), None, init_count=1)
    assert grants(fit_node(request, ONE_CARD, Policy())) == [[], [("GPU-0", 100)], []]


def test_pod_without_requests_fits_everywhere_with_empty_entries() -> None:
    decisions = allocate(make_request(None, None), [ONE_CARD, node_state("n2")], Policy())
    assert decisions.fitting == ("node1", "n2")
    assert grants(decisions["n2"]) == [[], []]


def test_failing_init_container_fails_the_node_with_its_reason() -> None:
    request = make_request(make_container(mem=5000), make_container(mem=1), init_count=1)
    decision = fit_node(request, ONE_CARD, Policy())
    assert isinstance(decision, Rejection) and decision.message == "1/1 CardInsufficientMemory"


def test_resolvable_flags() -> None:
    full = node_state(cards=(make_card(count=1, used=1),))
    busy = fit_node(make_request(make_container(mem=1)), full, Policy())
    assert isinstance(busy, Rejection) and busy.resolvable  # other pods could leave
    excluded = fit_node(make_request(make_container(mem=1), nouse_uuids=("GPU-0",)), full, Policy())
    assert isinstance(excluded, Rejection) and not excluded.resolvable
    sick = fit_node(
        make_request(make_container(mem=1)), node_state(cards=(make_card(health=False),)), Policy()
    )
    assert isinstance(sick, Rejection) and not sick.resolvable


def test_decisions_expose_verdicts_and_rejections() -> None:
    nodes = [node_state("ok", make_cards(1)), node_state("full", make_cards(1, count=1, used=1))]
    decisions = allocate(make_request(make_container(mem=1)), nodes, Policy())
    assert decisions.fits("ok") and not decisions.fits("full")
    assert list(decisions) == ["ok", "full"] and len(decisions) == 2
    assert decisions.fitting == ("ok",)
    assert {n: r.message for n, r in decisions.rejections().items()} == {
        "full": "1/1 CardTimeSlicingExhausted"
    }
    chosen = decisions["ok"]
    assert isinstance(chosen, Allocation) and chosen.node == "ok"
    none = allocate(make_request(make_container(mem=5000)), nodes, Policy())
    assert none.fitting == () and set(none.rejections()) == {"ok", "full"}


def test_snapshot_maintained_incrementally_sees_the_booking() -> None:
    # Place a whole-card pod, apply its usage: the next identical pod no longer fits; removing it frees it.
    request = make_request(make_container(mem=1000, cores=100))
    placed = fit_node(request, ONE_CARD, Policy())
    assert isinstance(placed, Allocation)
    usage = pod_usage(placed.devices, request.init_count, init_done=False, mig=placed.mig)
    taken = apply_usage(ONE_CARD, usage)
    assert allocate(request, [taken], Policy()).fitting == ()
    assert allocate(request, [apply_usage(taken, usage, sign=-1)], Policy()).fitting == ("node1",)


# ---------------------------------------------------------------------------- precheck == Fit

PRECHECK_CASES = [
    ("fits", make_card(), make_container(mem=1000, cores=100), True),
    ("memory", make_card(used=1, used_mem=1), make_container(mem=1000), False),
    ("percentage", make_card(used=1, used_mem=1), make_container(pct=100), False),
    ("cores", make_card(used=1, used_cores=1), make_container(mem=1, cores=100), False),
    ("clamped cores", make_card(), make_container(mem=1, cores=150), True),
    ("slots", make_card(count=1, used=1), make_container(mem=1), False),
    ("health", make_card(health=False), make_container(mem=1), False),
    ("exclusive", make_card(used=1), make_container(mem=1, cores=100), False),
    ("exclusive on a 200-core card", make_card(cores=200, used=1), make_container(mem=1, cores=100), True),
    ("0-core on a full card", make_card(used=1, used_cores=100), make_container(mem=1), False),
    ("0-core on a 0-core card", make_card(cores=0), make_container(mem=1), True),
    ("two cards wanted", make_card(), make_container(2, mem=1), False),
    ("other vendor", make_card(type="AMD"), make_container(mem=1), False),
]


def test_precheck_table() -> None:
    for name, card, container, expected in PRECHECK_CASES:
        node = node_state(cards=(card,))
        request = make_request(container)
        plan = precheck.plan(request, parse_gpu_policy("spread"), None)
        assert plan is not None
        assert precheck.verdict(plan, node.summary) is expected, name
        assert isinstance(fit_node(request, node, Policy()), Allocation) is expected, name
    steered = node_state(
        cards=(make_card("GPU-0", type="NVIDIA T4"), make_card("GPU-1", index=1, type="NVIDIA A100"))
    )
    for steering, fits in (
        ({"use_types": ("a100",)}, True),
        ({"use_types": ("V100",)}, False),
        ({"nouse_types": ("nvidia",)}, False),
        ({"nouse_uuids": ("GPU-0", "GPU-1")}, False),
        ({"use_uuids": ("GPU-0",)}, True),
        ({"vgpu_mode": "mig"}, False),
    ):
        request = make_request(make_container(mem=1), **steering)
        plan = precheck.plan(request, parse_gpu_policy("spread"), None)
        assert plan is not None and precheck.verdict(plan, steered.summary) is fits, steering
        assert isinstance(fit_node(request, steered, Policy()), Allocation) is fits, steering
    mutex = precheck.plan(make_request(make_container(mem=1)), parse_gpu_policy("mutex"), None)
    assert (
        mutex is not None and precheck.verdict(mutex, node_state(cards=(make_card(used=1),)).summary) is False
    )
    cordoned = node_state(cards=make_cards(1), cordoned=frozenset({"GPU-0"}))
    assert allocate(make_request(make_container(mem=1)), [cordoned], Policy()).fitting == ()


def test_precheck_declines_steered_pods_and_mig_nodes() -> None:
    spread = parse_gpu_policy("spread")
    topology = parse_gpu_policy("topology-aware")
    assert precheck.plan(make_request(make_container(mem=1), numa_bind=True), topology, None) is None
    assert precheck.plan(make_request(make_container(mem=1), make_container(mem=1)), spread, None) is None
    assert precheck.plan(make_request(make_container(mem=1)), spread, NamespaceQuota(cores_limit=1)) is None
    plan = precheck.plan(make_request(make_container(mem=1)), spread, NamespaceQuota())
    assert plan is not None
    assert precheck.verdict(plan, node_state(cards=(mig_card(),)).summary) is None


@st.composite
def nodes(draw: st.DrawFn) -> NodeState:
    n = draw(st.integers(0, 4))
    cards = []
    for i in range(n):
        count = draw(st.integers(1, 4))
        memory = draw(st.sampled_from([1000, 2000, 4000]))
        cores = draw(st.sampled_from([100, 100, 200, 0]))
        cards.append(
            make_card(
                f"GPU-{i}",
                index=i,
                count=count,
                memory=memory,
                cores=cores,
                used=draw(st.sampled_from([0, 1, count - 1, count])),
                # boundary values (empty, full) are where the rules differ, so draw only those
                used_mem=draw(st.sampled_from([0, memory // 2, memory - 500, memory])),
                used_cores=draw(st.sampled_from([0, cores // 2, cores])),
                numa=draw(st.integers(0, 1)),
                health=draw(st.sampled_from([True, True, True, False])),
                type=draw(st.sampled_from(["NVIDIA", "NVIDIA A100", "NVIDIA", "AMD MI100"])),
            )
        )
    cordoned = frozenset(draw(st.lists(st.sampled_from([f"GPU-{i}" for i in range(4)]), max_size=1)))
    return node_state(cards=cards, cordoned=cordoned)


containers = st.builds(
    lambda nums, mem, pct, cores: make_container(nums, mem=mem, pct=pct, cores=cores),
    st.integers(1, 3),
    st.sampled_from([0, 0, 1, 500, 1000, 1500]),
    st.sampled_from([101, 101, 0, 25, 50, 100]),
    st.sampled_from([0, 0, 10, 50, 100, 150]),
)


@settings(max_examples=500, deadline=None)
@given(
    node=nodes(),
    items=st.lists(st.one_of(st.none(), containers), min_size=1, max_size=3),
    init_count=st.integers(0, 2),
    gpu_policy=st.sampled_from(["spread", "binpack", "mutex", "topology-aware", "numa,binpack"]),
    steering=st.sampled_from(
        [
            {},
            {"use_types": ("a100",)},
            {"nouse_types": ("A100",)},
            {"use_uuids": ("GPU-0", "GPU-2")},
            {"nouse_uuids": ("GPU-1",)},
            {"vgpu_mode": "mps"},
            {"vgpu_mode": "hami-core"},
        ]
    ),
)
def test_precheck_verdict_equals_fit(
    node: NodeState,
    items: list[ContainerRequest | None],
    init_count: int,
    gpu_policy: str,
    steering: dict[str, object],
) -> None:
    request = make_request(*items, init_count=min(init_count, len(items)), gpu_policy=gpu_policy, **steering)  # type: ignore[arg-type]
    plan = precheck.plan(request, parse_gpu_policy(gpu_policy), None)
    full = fit_node(request, node, Policy())
    assume(plan is not None)
    assert plan is not None
    assert precheck.verdict(plan, node.summary) == isinstance(full, Allocation), full
