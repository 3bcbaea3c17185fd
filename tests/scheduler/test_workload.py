"""The ``fragmentation`` policy's learned target workload: pods counted once through the snapshot's pod
events, the decayed histogram (half-life), the fallback until enough pods were seen, the refresh, the
bounds against hostile pods, and the ``--fragmentation-fallback`` text."""

from __future__ import annotations

import asyncio
import random
from typing import Any

import pytest

from hami.core.fragmentation import Target, TargetClass
from hami.core.model import PERCENT_NOT_GIVEN
from hami.scheduler.snapshot import Snapshot
from hami.scheduler.workload import MAX_TRACKED, REFRESH_SECONDS, Workload, parse_fallback
from tests.builders import device, make_node, make_pod

HOUR = 3600.0


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def pods(prefix: str, count: int, memory: int = 3000, cores: int = 30, **kwargs: Any) -> list[dict[str, Any]]:
    return [make_pod(f"{prefix}{i}", memory=memory, cores=cores, **kwargs) for i in range(count)]


def shares(workload: Workload) -> dict[int, float]:
    """MiB per card -> probability in the current target."""
    target = workload.target()
    total = sum(c.weight for c in target.classes)
    return {c.memory_mib: c.weight / total for c in target.classes}


def test_each_gpu_pod_counts_once_through_the_pod_events() -> None:
    clock = Clock()
    workload = Workload(clock=clock, min_pods=3)
    snapshot = Snapshot(workload=workload)
    for pod in pods("a", 3):
        snapshot.pod_event("ADDED", pod)
        snapshot.pod_event("MODIFIED", pod)  # the same uid again: not counted twice
    snapshot.pod_event("ADDED", make_pod("cpu", gpus=0))  # asks for no card
    bad = make_pod("bad", annotations={"hami.io/device-scoring-weights": "slot=x"})
    snapshot.pod_event("ADDED", bad)  # unreadable: skipped
    assert workload.observed == 3
    assert workload.weight() == pytest.approx(3)
    assert [(c.nums, c.memory_mib, c.cores) for c in workload.target().classes] == [(1, 3000, 30)]


def test_the_fallback_until_enough_pods_were_seen() -> None:
    clock = Clock()
    fallback = parse_fallback("1:100%:100,1:50%:50")
    workload = Workload(clock=clock, min_pods=20, fallback=fallback)
    for pod in pods("a", 19):
        workload.observe(pod)
    assert not workload.is_learned
    assert workload.target().classes == fallback
    workload.observe(make_pod("20th", memory=3000, cores=30))
    assert workload.is_learned
    clock.now += REFRESH_SECONDS  # the target is looked at again at most every refresh
    assert not workload.is_learned  # the weight is decayed: 20 pods a minute ago weigh a little less
    workload.observe(make_pod("21st", memory=3000, cores=30))
    assert [c.memory_mib for c in workload.target().classes] == [3000]


def test_older_pods_weigh_less_by_the_half_life() -> None:
    clock = Clock()
    workload = Workload(clock=clock, half_life=HOUR, min_pods=0.5)
    for pod in pods("old", 30, memory=1000):
        workload.observe(pod)
    clock.now += 2 * HOUR
    assert workload.weight() == pytest.approx(30 / 4)
    for pod in pods("new", 30, memory=2000):
        workload.observe(pod)
    assert shares(workload) == pytest.approx({2000: 0.8, 1000: 0.2})  # 30 against 30/4
    clock.now += 200 * HOUR  # long past the stored scale's rebase: the proportions hold
    workload.observe(make_pod("later", memory=2000, cores=30))
    assert workload.weight() == pytest.approx(1.0)
    clock.now += REFRESH_SECONDS
    assert set(shares(workload)) == {2000}  # the old classes decayed below 5 % of the weight


def test_the_target_is_kept_while_it_barely_moves() -> None:
    clock = Clock()
    workload = Workload(clock=clock, min_pods=1)
    for pod in [*pods("a", 50, memory=1000), *pods("b", 50, memory=2000)]:
        workload.observe(pod)
    first = workload.target()
    workload.observe(make_pod("c", memory=1000, cores=30))  # 51/101: moved by less than 2 %
    clock.now += REFRESH_SECONDS
    assert workload.target() is first  # its memos stay
    for pod in pods("d", 20, memory=1000):
        workload.observe(pod)
    assert workload.target() is first  # within the refresh interval
    clock.now += REFRESH_SECONDS
    assert workload.target() is not first


def test_a_class_is_the_request_per_card_and_the_allowed_types() -> None:
    workload = Workload(clock=Clock(), min_pods=1)
    typed = make_pod("t", gpus=2, memory=None, cores=100, annotations={"nvidia.com/use-gputype": "A100"})
    typed["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpumem-percentage"] = "100"
    workload.observe(typed)
    (cls,) = workload.learned()
    assert (cls.nums, cls.memory_mib, cls.percentage, cls.cores, cls.types) == (2, 0, 100, 100, ("a100",))


def test_hostile_pods_cannot_grow_the_histogram() -> None:
    workload = Workload(clock=Clock(), min_pods=1)
    for i in range(MAX_TRACKED + 50):
        workload.observe(make_pod(f"p{i}", memory=1000 + i, cores=30))
    assert len(workload._weights) == MAX_TRACKED
    assert workload._total == pytest.approx(sum(workload._weights.values()))
    assert len(workload.target().classes) <= 32


def test_a_full_histogram_drops_its_lightest_class_the_oldest_of_equals_first() -> None:
    """Replayed against the rule itself (a scan for the first lightest class) over pods of repeated and
    new classes, first at one instant (many equal weights), then as time passes across a rebase of the
    stored weights: the same classes kept, in the same order, with the same weights."""
    clock = Clock()
    workload = Workload(clock=clock, min_pods=1, half_life=HOUR)
    expected: dict[int, float] = {}  # MiB -> weight, in insertion order, as the rule keeps it
    origin = clock.now
    rng = random.Random(7)
    for i in range(4 * MAX_TRACKED):
        # a few heavy classes, many new ones, some seen again (recent ones, and ones dropped long ago)
        classes = [
            1000 + rng.randrange(40),
            5000 + i,
            5000 + i - rng.randrange(1, 50),
            5000 + rng.randrange(i + 1),
        ]
        memory = rng.choice(classes)
        if i >= 2 * MAX_TRACKED:  # time passes (no more ties), past a rebase of the stored weights
            clock.now += 100 * HOUR / (2 * MAX_TRACKED)
        workload.observe(make_pod(f"p{i}", memory=memory, cores=30))
        if (clock.now - origin) / HOUR > 64:
            scale = 2 ** (-(clock.now - origin) / HOUR)
            expected = {k: w * scale for k, w in expected.items() if w * scale > 1e-12}
            origin = clock.now
        if memory not in expected and len(expected) >= MAX_TRACKED:
            del expected[min(expected, key=expected.__getitem__)]
        expected[memory] = expected.get(memory, 0.0) + 2 ** ((clock.now - origin) / HOUR)
        assert [key[1] for key in workload._weights] == list(expected), f"after pod {i}"
    kept = {key[1]: weight for key, weight in workload._weights.items()}
    assert kept == pytest.approx(expected)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("1:100%:100", [TargetClass(nums=1, percentage=100, cores=100)]),
        (
            " 2 : 4000 : 30 : 2.5 ",
            [TargetClass(nums=2, memory_mib=4000, percentage=PERCENT_NOT_GIVEN, cores=30, weight=2.5)],
        ),
    ],
)
def test_fallback_text(text: str, expected: list[TargetClass]) -> None:
    assert list(parse_fallback(text)) == expected
    Target(parse_fallback(text))  # usable as a target


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "expected CARDS:MEMORY:CORES"),
        ("1:50%", "expected CARDS:MEMORY:CORES"),
        ("x:50%:50", "whole numbers"),
        ("0:50%:50", "CARDS must be 1..64"),
        ("1:150%:50", "MEMORY must be 1..100 %"),
        ("1:0:50", "MEMORY must be 1..100 %"),
        ("1:50%:101", "CORES must be 0..100"),
        ("1:50%:50:0", "WEIGHT must be a positive number"),
        ("1:50%:50:inf", "WEIGHT must be a positive number"),
        (",".join(["1:50%:50"] * 40), "at most 32 classes"),
    ],
)
def test_bad_fallback_text(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_fallback(text)


def test_a_workload_needs_a_positive_half_life() -> None:
    with pytest.raises(ValueError, match="half-life"):
        Workload(half_life=float("nan"))


def test_the_supply_follows_the_registered_nodes() -> None:
    workload = Workload(clock=Clock(), min_pods=1)
    snapshot = Snapshot(workload=workload)
    a = make_node("a", device("GPU-a-0", type="NVIDIA T4"), device("GPU-a-1", index=1, type="NVIDIA T4"))
    b = make_node("b", device("GPU-b-0", type="NVIDIA A100"))
    snapshot.replace_nodes([a, b])
    assert dict(workload.supply) == {"NVIDIA T4": 2, "NVIDIA A100": 1}
    snapshot.node_event("MODIFIED", make_node("a", device("GPU-a-0", type="NVIDIA T4")))  # re-registered
    assert dict(workload.supply) == {"NVIDIA T4": 1, "NVIDIA A100": 1}
    snapshot.node_event("DELETED", b)
    assert dict(workload.supply) == {"NVIDIA T4": 1}
    snapshot.node_event("ADDED", make_node("c", register="not a registration"))  # unreadable: offers none
    snapshot.replace_nodes([b])  # a relist without a and c
    assert dict(workload.supply) == {"NVIDIA A100": 1}
    for pod in pods("t", 3, annotations={"nvidia.com/use-gputype": "A100"}):
        workload.observe(pod)
    assert workload.target().reserve == pytest.approx({"nvidia a100": 1.0})  # every card's demand is A100's


# ------------------------------------------------------------------ pods deferred by the snapshot


def test_the_snapshot_leaves_the_pods_unread_until_the_workload_is_read() -> None:
    """A list of pods is booked without reading their requests for the workload (a third of the
    scheduler's start); the first read of the target reads them all, each weighed as of when it was
    shown."""
    clock = Clock()
    workload = Workload(clock=clock, min_pods=1, half_life=HOUR, refresh=0)
    snapshot = Snapshot(workload=workload)
    snapshot.replace_pods(pods("a", 4))
    assert workload.pending == 4
    clock.now += HOUR  # read an hour later: each weighs what it weighed when shown, halved since
    assert [(c.nums, c.memory_mib) for c in workload.target().classes] == [(1, 3000)]
    assert workload.pending == 0
    assert workload.weight() == pytest.approx(2.0)
    assert workload.observed == 4


def test_learning_a_few_at_a_time_keeps_the_order_and_the_weights() -> None:
    """Any interleaving of deferred pods, pods read at once, time passing (across a rebase of the
    stored weights) and partial reads gives the histogram reading every pod when shown gives."""
    rng = random.Random(11)
    clock, reference_clock = Clock(), Clock()
    deferred = Workload(clock=clock, min_pods=1, half_life=HOUR)
    reference = Workload(clock=reference_clock, min_pods=1, half_life=HOUR)
    for i in range(3 * MAX_TRACKED):
        pod = make_pod(f"p{i}", memory=1000 + rng.randrange(2 * MAX_TRACKED), cores=30)
        again = make_pod(f"p{rng.randrange(i + 1)}", memory=1000, cores=30)  # a uid seen before
        step = rng.uniform(0, 100 * HOUR / MAX_TRACKED)
        clock.now += step
        reference_clock.now += step
        for shown in (pod, again):
            reference.observe(shown)
            if rng.random() < 0.1:
                deferred.observe(shown)  # read at once: the deferred ones before it first
            else:
                deferred.defer(shown)
        if rng.random() < 0.05:
            deferred.learn_pending(rng.randrange(1, 40))
    assert deferred.pending > 0
    assert deferred.observed == reference.observed  # reads the rest
    assert list(deferred._weights) == list(reference._weights)
    assert deferred._weights == pytest.approx(reference._weights)
    assert deferred.weight() == pytest.approx(reference.weight())


def test_learn_pending_reads_at_most_its_limit_oldest_first() -> None:
    workload = Workload(clock=Clock(), min_pods=1)
    for pod in [*pods("a", 3, memory=1000), *pods("b", 2, memory=2000)]:
        workload.defer(pod)
    assert workload.learn_pending(3) == 2
    assert {key[1] for key in workload._weights} == {1000}
    assert workload.learn_pending(10) == 0
    assert {key[1] for key in workload._weights} == {1000, 2000}


async def test_the_learning_task_reads_deferred_pods_without_any_read() -> None:
    """``workload-learning``: pods deferred before it starts and after it waits are read, a chunk per
    turn of the loop, with nobody reading the workload."""
    from hami.scheduler.watches import LEARNING_CHUNK, learn_workload
    from tests.eventually import eventually

    workload = Workload(clock=Clock(), min_pods=1)
    for pod in pods("early", LEARNING_CHUNK + 7):
        workload.defer(pod)
    task = asyncio.create_task(learn_workload(workload))
    try:
        await eventually(lambda: workload.pending == 0, "the early pods read")
        for pod in pods("late", 3):
            workload.defer(pod)
        await eventually(lambda: workload.pending == 0, "the late pods read")
        assert workload._counted == LEARNING_CHUNK + 10
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    assert workload.on_pending is None


async def test_the_learning_task_waits_for_the_first_lists() -> None:
    """Until the snapshot is ready the deferred pods stay unread: reading them then would only slow
    down the decoding of the other first lists, and with it ``/readyz``."""
    from hami.scheduler.watches import learn_workload
    from tests.eventually import eventually

    workload = Workload(clock=Clock(), min_pods=1)
    for pod in pods("early", 30):
        workload.defer(pod)
    ready = False
    task = asyncio.create_task(learn_workload(workload, lambda: ready))
    try:
        for _ in range(20):  # turns of the loop in which the task would have read a chunk
            await asyncio.sleep(0)
        assert workload.pending == 30
        ready = True
        await eventually(lambda: workload.pending == 0, "the pods read once ready")
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


def test_only_a_fragmentation_decision_reads_the_deferred_pods() -> None:
    """``binpack`` and ``spread`` never read the target: a pod placed by them right after a restart does
    not wait for the workload to read the 50,000 pods it was shown."""
    from hami.annotations import read_pod_request
    from hami.core.allocate import Policy
    from hami.settings import DeviceConfig

    workload = Workload(clock=Clock(), min_pods=1)
    for pod in pods("shown", 5):
        workload.defer(pod)
    config = DeviceConfig()
    plain = read_pod_request(make_pod("plain"), config)
    base = Policy()
    assert workload.policy(base, plain) is base
    spread = read_pod_request(make_pod("s", annotations={"hami.io/node-scheduler-policy": "spread"}), config)
    assert workload.policy(base, spread) is base
    assert workload.pending == 5
    fragmenting = read_pod_request(
        make_pod("f", annotations={"hami.io/node-scheduler-policy": "fragmentation"}), config
    )
    assert workload.policy(base, fragmenting).target is not None
    assert workload.pending == 0
    workload.defer(make_pod("late"))
    card_policy = read_pod_request(
        make_pod("g", annotations={"hami.io/gpu-scheduler-policy": "fragmentation"}), config
    )
    assert workload.policy(base, card_policy).target is not None


def test_a_pod_that_fails_to_read_is_skipped_and_the_learning_goes_on(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import hami.scheduler.workload as module
    from hami.annotations import read_pod_request as real

    def failing(pod: Any, config: Any) -> Any:
        if pod["metadata"]["name"] == "bad":
            raise RuntimeError("a shape nobody foresaw")
        return real(pod, config)

    monkeypatch.setattr(module, "read_pod_request", failing)
    workload = Workload(clock=Clock(), min_pods=1)
    for pod in [make_pod("a"), make_pod("bad"), make_pod("b")]:
        workload.defer(pod)
    assert workload.learn_pending(10) == 0
    assert (workload.observed, workload.unreadable) == (2, 1)
