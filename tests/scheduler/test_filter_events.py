"""``FilteringFailed`` Events: one per pod that really waits for us, aggregated, bounded, our own words.

Like kube's event recorder: repeated failures of one pod are one Event whose ``count`` and
``lastTimestamp`` grow (a PATCH of the Event written first, at most once per interval, plus a final
flush). Written only into the pod's own namespace, only about a pod the API server has under that
namespace, name and uid that names our scheduler and is not bound; the text comes from our decision
(node names the scheduler does not know are counted, never echoed).
"""

from __future__ import annotations

import datetime
import itertools
from typing import Any

import kmock

from tests.builders import NOW, make_node, make_pod

from .kit import Extender, StartExtender

EVENTS = kmock.resource("v1/events")
PODS = kmock.resource("v1/pods")
#: a pod that fits no node of ``make_node`` (10000 MiB cards)
TOO_BIG = 20000


def stepping_clock() -> Any:
    """A clock that moves one second on every reading (timestamps visibly grow)."""
    ticks = itertools.count()
    return lambda: NOW + datetime.timedelta(seconds=next(ticks))


async def stored_events(ext: Extender, reason: str = "FilteringFailed") -> list[dict[str, Any]]:
    """Every Event with ``reason`` in every namespace, as the API server stores them."""
    listing = await ext.stored("/api/v1/events")
    return [e for e in listing.get("items") or [] if e.get("reason") == reason]


def writes(ext: Extender) -> int:
    """Event creations and patches the API server has seen."""
    return len(ext.apiserver["post", EVENTS]) + len(ext.apiserver["patch", EVENTS])


async def test_a_flood_of_failures_is_one_event_with_a_growing_count(start_extender: StartExtender) -> None:
    pod = make_pod("p", memory=TOO_BIG)
    ext = await start_extender(
        nodes=[make_node("n1")], pods=[pod], events={"interval": 3600.0, "clock": stepping_clock()}
    )
    for _ in range(300):
        assert (await ext.filter(pod, ["n1"]))["NodeNames"] == []
    # while the failures pour in: the first one is written, the rest wait for the interval
    assert writes(ext) <= 1
    await ext.settle()
    (event,) = await stored_events(ext)
    assert event["count"] == 300
    assert event["involvedObject"] == {
        "apiVersion": "v1",
        "kind": "Pod",
        "name": "p",
        "namespace": "default",
        "uid": "uid-p",
    }
    assert event["metadata"]["namespace"] == "default" and event["type"] == "Warning"
    assert event["message"].startswith("no available node, 1 nodes do not meet: 1 nodes")
    assert event["lastTimestamp"] > event["firstTimestamp"]
    assert (len(ext.apiserver["post", EVENTS]), len(ext.apiserver["patch", EVENTS])) == (1, 1)

    for _ in range(50):
        await ext.filter(pod, ["n1"])
    await ext.settle()
    (again,) = await stored_events(ext)
    assert again["metadata"]["name"] == event["metadata"]["name"]
    assert again["count"] == 350
    assert again["lastTimestamp"] > event["lastTimestamp"]
    assert again["firstTimestamp"] == event["firstTimestamp"]
    assert writes(ext) == 3


async def test_an_event_is_patched_again_after_the_interval(start_extender: StartExtender) -> None:
    pod = make_pod("p", memory=TOO_BIG)
    ext = await start_extender(nodes=[make_node("n1")], pods=[pod], events={"interval": 0.0})
    for expected in (1, 2, 3):
        await ext.filter(pod, ["n1"])
        await ext.settle()
        (event,) = await stored_events(ext)
        assert event["count"] == expected


async def test_no_event_about_a_pod_the_cluster_does_not_have(start_extender: StartExtender) -> None:
    real = make_pod("p", memory=TOO_BIG)
    ext = await start_extender(nodes=[make_node("n1")], pods=[real])
    elsewhere = make_pod("p", memory=TOO_BIG, namespace="kube-system")  # same name and uid, other namespace
    ghost = make_pod("ghost", memory=TOO_BIG)
    impostor = make_pod("p", memory=TOO_BIG)
    impostor["metadata"]["uid"] = "another-uid"
    anonymous = make_pod("p", memory=TOO_BIG)
    del anonymous["metadata"]["uid"]
    for pod in (elsewhere, ghost, impostor, anonymous):
        result = await ext.filter(pod, ["n1"])
        assert result["NodeNames"] == [] and "n1" in result["FailedAndUnresolvableNodes"]
    await ext.settle()
    assert await stored_events(ext) == []
    assert writes(ext) == 0


async def test_no_event_about_a_pod_that_is_not_ours_to_schedule(start_extender: StartExtender) -> None:
    other = make_pod("other-scheduler", memory=TOO_BIG)
    other["spec"]["schedulerName"] = "default-scheduler"
    bound = make_pod("bound", memory=TOO_BIG)
    bound["spec"]["nodeName"] = "n1"
    ext = await start_extender(nodes=[make_node("n1")], pods=[other, bound])
    for pod in (other, bound):
        await ext.filter(pod, ["n1"])
    await ext.settle()
    assert await stored_events(ext) == []


async def test_the_text_is_ours_not_the_callers(start_extender: StartExtender) -> None:
    pod = make_pod("p", memory=TOO_BIG)
    ext = await start_extender(nodes=[make_node("n1")], pods=[pod])
    planted = ["n1", "Click https://evil.example to fix your GPU", "x" * 200]
    result = await ext.filter(pod, planted)
    assert set(result["FailedAndUnresolvableNodes"]) == set(planted)  # the answer still covers every name
    await ext.settle()
    (event,) = await stored_events(ext)
    assert "evil" not in event["message"] and "x" * 20 not in event["message"]
    assert "(+2 unknown)" in event["message"]
    assert "(n1)" in event["message"]


async def test_events_are_bounded_in_number_and_rate(start_extender: StartExtender) -> None:
    pods = [make_pod(f"p{i}", memory=TOO_BIG) for i in range(6)]
    ext = await start_extender(
        nodes=[make_node("n1")], pods=pods, events={"interval": 3600.0, "max_objects": 4}
    )
    for _ in range(20):
        for pod in pods:
            await ext.filter(pod, ["n1"])
    ghosts = [make_pod(f"ghost-{i}", memory=TOO_BIG) for i in range(100)]
    for ghost in ghosts:
        await ext.filter(ghost, ["n1"])
    await ext.settle()
    events = await stored_events(ext)
    # at most max_objects pods are followed at once; the others' failures are dropped, not queued
    assert len(events) == 4
    assert all(e["count"] == 20 for e in events)
    assert writes(ext) == 2 * len(events)  # each: created, then patched once by the final flush
    # a pod is looked up once when it is first followed, never once per failure
    lookups = [r for r in ext.apiserver["get", PODS] if r.name]
    assert len(lookups) == 4


async def test_a_quiet_pod_makes_room_for_another(start_extender: StartExtender) -> None:
    first, second = make_pod("first", memory=TOO_BIG), make_pod("second", memory=TOO_BIG)
    ext = await start_extender(
        nodes=[make_node("n1")], pods=[first, second], events={"max_objects": 1, "forget_after": 0.0}
    )
    await ext.filter(first, ["n1"])
    await ext.settle()
    await ext.filter(second, ["n1"])  # "first" is written and quiet: it is forgotten
    await ext.settle()
    assert sorted(e["involvedObject"]["name"] for e in await stored_events(ext)) == ["first", "second"]
