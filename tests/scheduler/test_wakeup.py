"""The wake-up (docs/scheduler.md, "Waking pending pods"): a pending pod /filter rejected is touched when
cards it fits are freed, bounded and de-duplicated; its owner gains nothing from the annotation."""

from __future__ import annotations

from typing import Any

from hami.annotations import POD_WAKE_UP, read_pod_request
from hami.core.model import PodRequest
from hami.scheduler.wakeup import PodKey, WakeUp
from hami.settings import DeviceConfig
from tests.builders import card, make_node, make_pod, placed
from tests.eventually import eventually

from .kit import Extender, StartExtender

POD = "/api/v1/namespaces/default/pods"


async def _woken(ext: Extender, name: str) -> bool:
    return POD_WAKE_UP in ((await ext.pod(name))["metadata"].get("annotations") or {})


async def test_a_rejected_pod_is_woken_when_the_pod_filling_its_node_goes(
    start_extender: StartExtender,
) -> None:
    node = make_node("full", card("full", 0, memory=10000))
    holder = make_pod("holder", memory=9000, node="full", annotations=placed("full", "GPU-full-0", 9000, 30))
    ext = await start_extender(nodes=[node], pods=[holder])
    waiter = make_pod("waiter", memory=4000)
    await ext.apiserver.post(POD, json=waiter)
    other = make_pod("other", memory=20000)  # fits no card of that node, ever
    await ext.apiserver.post(POD, json=other)
    assert (await ext.filter(waiter, ["full"]))["NodeNames"] == []
    assert (await ext.filter(other, ["full"]))["NodeNames"] == []
    assert ext.ctx.wakeup is not None and len(ext.ctx.wakeup) == 2
    assert not await _woken(ext, "waiter")
    await ext.apiserver.delete(f"{POD}/holder")
    await eventually(lambda: _woken(ext, "waiter"), "the waiter to be woken", within=30)
    assert not await _woken(ext, "other")  # it would not fit: left alone
    assert (await ext.filter(waiter, ["full"]))["NodeNames"] == ["full"]  # and now it fits
    assert len(ext.ctx.wakeup) == 1


async def test_without_the_flag_nothing_is_remembered_or_written(start_extender: StartExtender) -> None:
    ext = await start_extender(nodes=[make_node("full", cards=1, memory=1000)], wake_pending=False)
    assert ext.ctx.wakeup is None
    assert ext.ctx.snapshot.on_freed is None


async def test_the_owners_wake_annotation_changes_no_decision(start_extender: StartExtender) -> None:
    ext = await start_extender(nodes=[make_node("n1"), make_node("n2", memory=500)])
    plain = make_pod("p", memory=800)
    hostile = make_pod("p", memory=800, annotations={POD_WAKE_UP: "x" * 4096})
    assert await ext.filter(hostile, ["n1", "n2"]) == await ext.filter(plain, ["n1", "n2"])


# ------------------------------------------------------------------------------------ the bounds


def _request(name: str, memory: int = 1000) -> PodRequest:
    return read_pod_request(make_pod(name, memory=memory), DeviceConfig())


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _wakeup(clock: Clock, fits: Any = None, **bounds: Any) -> tuple[WakeUp, list[PodKey]]:
    woken: list[PodKey] = []
    wakeup = WakeUp(
        fits=fits or (lambda request, priority, node: True),
        wake=lambda key, uid, value: woken.append(key),
        ticker=clock,
        **bounds,
    )
    return wakeup, woken


def test_a_pass_wakes_the_highest_priority_then_the_longest_waiting_at_most_per_pass() -> None:
    clock = Clock()
    wakeup, woken = _wakeup(
        clock, per_pass=2, fits=lambda request, priority, node: request.name != "elsewhere"
    )
    for name, priority in (("old-low", 0), ("new-high", 10), ("mid-low", 0)):
        wakeup.rejected(_request(name), priority, ["n1"])
        clock.now += 1
    wakeup.rejected(_request("elsewhere"), 100, ["n2"])  # does not fit n1: not woken for it
    assert wakeup.wake_for("n1") == [("default", "new-high"), ("default", "old-low")]
    assert woken == [("default", "new-high"), ("default", "old-low")]


def test_a_pod_that_does_not_fit_now_is_not_woken() -> None:
    clock = Clock()
    wakeup, _ = _wakeup(clock, fits=lambda request, priority, node: request.name != "big")
    wakeup.rejected(_request("big", 50000), 0, ["n1"])
    wakeup.rejected(_request("small"), 0, ["n1"])
    assert wakeup.wake_for("n1") == [("default", "small")]


def test_no_pod_is_woken_twice_within_the_pod_interval_whatever_its_owner_does() -> None:
    clock = Clock()
    wakeup, woken = _wakeup(clock, pod_interval=10.0)
    wakeup.rejected(_request("p"), 0, ["n1"])
    assert wakeup.wake_for("n1") == [("default", "p")]
    # the owner edits the annotation, kube-scheduler retries, filter rejects it again
    edited = make_pod("p", annotations={POD_WAKE_UP: "999999"})
    wakeup.pod_event("MODIFIED", edited)
    wakeup.rejected(_request("p"), 0, ["n1"])
    clock.now += 5
    assert wakeup.wake_for("n1") == []
    clock.now += 5
    assert wakeup.wake_for("n1") == [("default", "p")]
    assert woken == [("default", "p"), ("default", "p")]


def test_bound_finished_deleted_or_replaced_pods_are_forgotten_and_the_memory_is_bounded() -> None:
    clock = Clock()
    wakeup, _ = _wakeup(clock, capacity=3)
    for name in ("a", "b", "c", "d"):
        wakeup.rejected(_request(name), 0, ["n1"])
    assert len(wakeup) == 3  # the least recently rejected ("a") went
    wakeup.pod_event("MODIFIED", make_pod("b", node="n1"))
    wakeup.pod_event("MODIFIED", make_pod("c", phase="Failed"))
    wakeup.pod_event("DELETED", make_pod("x"))  # not remembered: nothing happens
    assert len(wakeup) == 1
    replaced = make_pod("d")
    replaced["metadata"]["uid"] = "another"
    wakeup.pod_event("ADDED", replaced)
    assert len(wakeup) == 0


async def test_freed_calls_coalesce_into_one_pass_per_node_interval() -> None:
    clock = Clock()
    passes: list[str] = []
    wakeup, woken = _wakeup(clock, node_interval=0.0)
    wakeup.rejected(_request("p"), 0, ["n1"])
    original = wakeup.wake_for

    def counted(node: str, now: float | None = None) -> list[PodKey]:
        passes.append(node)
        return original(node, now)

    wakeup.wake_for = counted  # type: ignore[method-assign]
    for _ in range(50):
        wakeup.freed("n1")
    await eventually(lambda: passes, "the pass")
    assert passes == ["n1"] and woken == [("default", "p")]
    wakeup.close()


def test_a_pass_asks_fits_about_a_bounded_number_of_pods_and_each_gets_its_turn() -> None:
    clock = Clock()
    asked: list[str] = []

    def fits(request: PodRequest, priority: int, node: str) -> bool:
        asked.append(request.name)
        return request.name == "low-fits"

    wakeup, woken = _wakeup(clock, fits=fits, checks_per_pass=32)
    for i in range(1000):  # never fit, and outrank the one that does
        wakeup.rejected(_request(f"never-{i}"), 10, ["n1"])
    wakeup.rejected(_request("low-fits"), 0, ["n1"])
    assert wakeup.wake_for("n1") == [] and len(asked) == 32
    passes = 1
    while not woken:
        clock.now += 1
        wakeup.wake_for("n1")
        passes += 1
        assert len(asked) <= 32 * passes
    assert woken == [("default", "low-fits")]
    assert passes <= 1001 // 32 + 1  # every parked pod was asked about once before any twice
    assert len(set(asked[:1001])) == 1001


def test_the_nodes_kube_scheduler_asked_about_do_not_limit_the_wake() -> None:
    clock = Clock()
    wakeup, _ = _wakeup(clock)
    wakeup.rejected(_request("p"), 0, ["n1", "n2"])  # above 100 nodes, only a sample is sent
    assert wakeup.wake_for("n500") == [("default", "p")]


def test_each_wake_not_followed_by_a_rejection_doubles_the_pods_interval() -> None:
    clock = Clock()
    wakeup, _ = _wakeup(clock, pod_interval=10.0, max_pod_interval=40.0)
    wakeup.rejected(_request("p"), 0, ["n1"])
    times = []
    for _ in range(200):  # kube-scheduler rejects it elsewhere: our /filter never sees it again
        if wakeup.wake_for("n1"):
            times.append(clock.now)
        clock.now += 1
    assert times[:5] == [100, 110, 130, 170, 210]  # 10, 20, 40, then the cap
    clock.now = 300  # last woken at 290
    wakeup.rejected(_request("p"), 0, ["n1"])  # /filter saw it again: back to the shortest interval
    clock.now = 330
    assert wakeup.wake_for("n1") == [("default", "p")]
    clock.now = 340
    assert wakeup.wake_for("n1") == [("default", "p")]
    clock.now = 359
    assert wakeup.wake_for("n1") == []  # that one brought no rejection: 20 s now


async def test_a_pod_created_again_under_the_same_name_is_not_woken(start_extender: StartExtender) -> None:
    node = make_node("full", card("full", 0, memory=10000))
    holder = make_pod("holder", memory=9000, node="full", annotations=placed("full", "GPU-full-0", 9000, 30))
    ext = await start_extender(nodes=[node], pods=[holder])
    seen = ext.ctx.snapshot.pod_events
    await ext.apiserver.post(POD, json=make_pod("waiter", memory=4000))
    # the service has seen the new pod before the rejection of the old one is remembered: a later event of
    # the new pod would drop it (another uid), and the wake's own uid guard would go untested
    await eventually(lambda: ext.ctx.snapshot.pod_events > seen, "the new waiter to be seen")
    gone = make_pod("waiter", memory=4000)  # the pod /filter rejected, since deleted and created again
    gone["metadata"]["uid"] = "uid-gone"
    assert ext.ctx.wakeup is not None
    ext.ctx.wakeup.rejected(read_pod_request(gone, DeviceConfig()), 0, ["full"])
    await ext.apiserver.delete(f"{POD}/holder")
    wakeup = ext.ctx.wakeup

    async def written() -> bool:
        return wakeup.woken >= 1 and len(ext.ctx.background) == 0

    await eventually(written, "the wake to be tried", within=30)
    assert not await _woken(ext, "waiter")


async def test_a_pod_without_annotations_is_woken(start_extender: StartExtender) -> None:
    node = make_node("full", card("full", 0, memory=10000))
    holder = make_pod("holder", memory=9000, node="full", annotations=placed("full", "GPU-full-0", 9000, 30))
    ext = await start_extender(nodes=[node], pods=[holder])
    waiter = make_pod("waiter", memory=4000)
    del waiter["metadata"]["annotations"]
    await ext.apiserver.post(POD, json=waiter)
    assert (await ext.filter(waiter, ["full"]))["NodeNames"] == []
    await ext.apiserver.delete(f"{POD}/holder")
    await eventually(lambda: _woken(ext, "waiter"), "the waiter to be woken", within=30)
