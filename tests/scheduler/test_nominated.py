"""Nominated pods hold their cards: /filter and /bind over HTTP, fed by the embedded API server.

Once kube-scheduler nominates a node for a preemptor (``status.nominatedNodeName`` on a pending GPU
pod of ours), the cards the preemptor will get there are taken for every pod of equal or lower
priority (kube-scheduler's ``addGENominatedPods``: nominated pods of priority >= the pod's count),
until it binds or the nomination goes away. The node ``n1`` has two 10000 MiB cards throughout; the
preemptor asks for both (``2 x 6000`` MiB unless a test says otherwise), so a lower pod asking 5000
MiB on one card no longer fits anywhere there.
"""

from __future__ import annotations

from typing import Any

from hami.annotations import (
    POD_BIND_PHASE,
    POD_BIND_TIME,
    POD_SCORING_WEIGHTS,
    POD_USE_GPUUUID,
    allocation_annotations,
    encode_unix_time,
)
from hami.core.model import Grant
from tests.builders import ago, make_node, make_pod, placed
from tests.eventually import eventually

from .kit import Extender, StartExtender

PODS = "/api/v1/namespaces/default/pods"
URGENT = 100


def prio(pod: dict[str, Any], priority: int | None) -> dict[str, Any]:
    if priority is not None:
        pod["spec"]["priority"] = priority
    return pod


def preemptor(
    name: str = "urgent",
    *,
    node: Any = "n1",
    gpus: int = 2,
    memory: int = 6000,
    priority: int = URGENT,
    **kwargs: Any,
) -> dict[str, Any]:
    """A pending GPU pod of ours that kube-scheduler nominated to ``node``."""
    pod = prio(make_pod(name, gpus=gpus, memory=memory, cores=None, **kwargs), priority)
    pod["status"]["nominatedNodeName"] = node
    return pod


def pending(name: str, *, gpus: int = 1, memory: int = 5000, priority: int | None = None) -> dict[str, Any]:
    return prio(make_pod(name, gpus=gpus, memory=memory, cores=None), priority)


def holder(name: str, card: int, memory: int, priority: int, **metadata: Any) -> dict[str, Any]:
    """A running pod bound to n1 holding ``memory`` MiB of card ``card``."""
    annotations = placed("n1", f"GPU-n1-{card}", memory, 0)
    pod = prio(make_pod(name, memory=memory, cores=None, node="n1", phase="Running"), priority)
    pod["metadata"]["annotations"] = annotations
    pod["metadata"].update(metadata)
    return pod


def granted(node: str, memory: int) -> dict[str, str]:
    """What a bind of ours leaves on a pod given ``memory`` MiB on both cards of ``node``, its
    Binding not (yet) seen: ``bind-phase=allocating``, a second ago."""
    grants = tuple(Grant(uuid=f"GPU-{node}-{i}", memory_mib=memory, cores=0) for i in range(2))
    annotations = allocation_annotations(node=node, devices=(grants,), now=ago(1))
    annotations[POD_BIND_PHASE] = "allocating"
    annotations[POD_BIND_TIME] = encode_unix_time(ago(1))
    return annotations


async def fits(ext: Extender, pod: dict[str, Any], nodes: tuple[str, ...] = ("n1",)) -> dict[str, Any]:
    result: dict[str, Any] = await ext.filter(pod, list(nodes))
    assert result["Error"] == "", result
    return result


async def fitting(ext: Extender, pod: dict[str, Any], nodes: tuple[str, ...] = ("n1",)) -> list[str]:
    return list((await fits(ext, pod, nodes))["NodeNames"])


# ---------------------------------------------------------------------------------- filter


async def test_a_nomination_holds_the_preemptors_cards_against_pods_it_outranks(
    start_extender: StartExtender,
) -> None:
    ext = await start_extender(nodes=[make_node("n1"), make_node("n2")], pods=[preemptor()])
    low = pending("low")
    result = await fits(ext, low, ("n1", "n2"))
    assert result["NodeNames"] == ["n2"]
    # HAMi's words, resolvable (pods leaving, the preemptor among them, could make room)
    assert result["FailedNodes"] == {"n1": "2/2 CardInsufficientMemory"}
    assert not result.get("FailedAndUnresolvableNodes")
    # kube-scheduler's rule: nominated pods of priority >= the pod's count, so equal priority is held
    # off too; a pod of higher priority is not (it may take the room, and preempt the preemptor)
    assert await fitting(ext, pending("same", priority=URGENT)) == []
    assert await fitting(ext, pending("high", priority=URGENT + 1)) == ["n1"]
    # the hold is the preemptor's own request, no more: 4000 MiB still fit beside 6000 on a card
    assert await fitting(ext, pending("small", memory=4000)) == ["n1"]
    # the preemptor itself is not held off by its own nomination
    assert await fitting(ext, preemptor()) == ["n1"]


async def test_the_cards_are_free_again_once_the_nomination_is_cleared(start_extender: StartExtender) -> None:
    ext = await start_extender(nodes=[make_node("n1")], pods=[preemptor()])
    assert await fitting(ext, pending("low")) == []
    await ext.apiserver.patch(f"{PODS}/urgent", json={"status": {"nominatedNodeName": None}})
    await eventually(lambda: fitting(ext, pending("low")), "the cleared nomination to free n1")
    # nominated again (kube-scheduler's next preemption): held again
    await ext.apiserver.patch(f"{PODS}/urgent", json={"status": {"nominatedNodeName": "n1"}})
    await eventually(
        lambda: _none(fitting(ext, pending("low"))), "the new nomination to hold n1's cards again"
    )


async def _none(found: Any) -> bool:
    return not await found


async def test_the_cards_are_free_again_once_the_preemptor_is_deleted(start_extender: StartExtender) -> None:
    ext = await start_extender(nodes=[make_node("n1")], pods=[preemptor()])
    assert await fitting(ext, pending("low")) == []
    await ext.apiserver.delete(f"{PODS}/urgent")
    await eventually(lambda: fitting(ext, pending("low")), "the deleted preemptor to free n1")


async def test_the_cards_are_free_again_once_the_preemptor_is_bound_elsewhere(
    start_extender: StartExtender,
) -> None:
    ext = await start_extender(nodes=[make_node("n1"), make_node("n2")], pods=[preemptor()])
    assert await fitting(ext, pending("low")) == []
    # kube-scheduler placed it on another node after all; the nomination may stay in its status
    await ext.apiserver.patch(f"{PODS}/urgent", json={"spec": {"nodeName": "n2"}})
    await eventually(lambda: fitting(ext, pending("low")), "the preemptor bound to n2 to free n1")


async def test_a_preemptor_holding_its_grant_counts_once(start_extender: StartExtender) -> None:
    # Its bind's patch landed (allocating, not bound yet) while the nomination is still in its
    # status: its grant counts, the nomination adds nothing on top (2 x 4000 MiB, not 2 x 8000).
    allocating = preemptor(memory=4000)
    allocating["metadata"]["annotations"] = granted("n1", 4000)
    bound = preemptor("bound", node="n2", memory=4000)
    bound["spec"]["nodeName"] = "n2"
    bound["metadata"]["annotations"] = granted("n2", 4000)
    ext = await start_extender(nodes=[make_node("n1"), make_node("n2")], pods=[allocating, bound])
    assert ext.ctx.snapshot.record(("default", "urgent")) is not None
    assert ext.ctx.snapshot.record(("default", "bound")) is not None
    assert await fitting(ext, pending("low", memory=6000), ("n1", "n2")) == ["n1", "n2"]
    assert await fitting(ext, pending("over", memory=6001), ("n1", "n2")) == []


async def test_terminating_victims_free_the_cards_the_preemptor_will_get(
    start_extender: StartExtender,
) -> None:
    # kube-scheduler deleted the victim on card 0 (it is terminating) and nominated n1. The preemptor
    # gets both cards once it is gone, so card 1's free room is not for a lower pod meanwhile.
    victim = holder("victim", 0, 10000, 1, deletionTimestamp="2026-05-01T09:59:00Z")
    ext = await start_extender(nodes=[make_node("n1")], pods=[victim, preemptor(memory=8000)])
    result = await fits(ext, pending("low", memory=3000))
    assert result["NodeNames"] == []
    assert result["FailedNodes"] == {"n1": "2/2 CardInsufficientMemory"}
    await ext.apiserver.delete(f"{PODS}/victim")
    await eventually(lambda: ext.ctx.snapshot.record(("default", "victim")) is None, "the victim gone")
    assert await fitting(ext, pending("low", memory=3000)) == []
    assert await fitting(ext, pending("fits", memory=2000)) == ["n1"]  # 8000 + 2000 on a card


async def test_victims_not_yet_deleted_are_assumed_gone_only_when_they_rank_lower(
    start_extender: StartExtender,
) -> None:
    # kube-scheduler may nominate before the victims' deletions show (asynchronous preemption): the
    # preemptor's cards are then where it fits with the pods it outranks gone, never pods it does not.
    lower = holder("lower", 0, 10000, 1)
    ext = await start_extender(nodes=[make_node("n1")], pods=[lower, preemptor(memory=8000)])
    assert await fitting(ext, pending("low", memory=3000)) == []
    await ext.apiserver.delete(f"{PODS}/lower")
    await ext.apiserver.post(PODS, json=holder("peer", 0, 10000, URGENT))
    await eventually(lambda: ext.ctx.snapshot.record(("default", "peer")), "the peer counted")
    # it cannot fit n1 without evicting a pod as important as itself: it holds nothing there
    await eventually(lambda: fitting(ext, pending("low", memory=3000)), "n1 not held for a lost cause")


# ------------------------------------------------------------------------------------ bind


async def test_bind_of_an_outranked_pod_onto_reserved_cards_is_refused(start_extender: StartExtender) -> None:
    ext = await start_extender(nodes=[make_node("n1")], pods=[preemptor(), pending("low")])
    answer = await ext.bind("low", "n1")
    assert answer["Error"] == "pod default/low does not fit node n1: 2/2 CardInsufficientMemory"
    pod = await ext.pod("low")
    assert "nodeName" not in pod["spec"]
    assert "hami.io/vgpu-devices-allocated" not in pod["metadata"]["annotations"]
    assert ext.ctx.snapshot.record(("default", "low")) is None
    # the preemptor binds there: its own nomination does not stand in its way
    assert await ext.bind("urgent", "n1") == {"Error": ""}
    assert (await ext.pod("urgent"))["spec"]["nodeName"] == "n1"


async def test_bind_of_an_outranked_pod_goes_through_once_the_nomination_is_gone(
    start_extender: StartExtender,
) -> None:
    ext = await start_extender(nodes=[make_node("n1")], pods=[preemptor(), pending("low")])
    assert (await ext.bind("low", "n1"))["Error"] != ""
    await ext.apiserver.delete(f"{PODS}/urgent")
    await eventually(lambda: fitting(ext, pending("low")), "the deleted preemptor to free n1")
    assert await ext.bind("low", "n1") == {"Error": ""}


async def test_bind_of_a_pod_that_outranks_the_preemptor_is_not_held_off(
    start_extender: StartExtender,
) -> None:
    ext = await start_extender(
        nodes=[make_node("n1")], pods=[preemptor(), pending("high", priority=URGENT + 1)]
    )
    assert await ext.bind("high", "n1") == {"Error": ""}


# ------------------------------------------------------------------------------ hostile input


async def test_a_bogus_nomination_holds_no_more_than_its_own_request(start_extender: StartExtender) -> None:
    # Status is written by kube-scheduler; still, nothing a pod carries may block a node beyond what
    # that pod's own request would take there. Each node below has one nominee that must hold nothing.
    important = 2**31 - 1
    bogus: dict[str, dict[str, Any]] = {
        "ghost-target": preemptor("ghost", node="no-such-node", priority=important),
        "no-gpu": preemptor("no-gpu", node="no-gpu", gpus=0, priority=important),
        "other-scheduler": preemptor(
            "theirs", node="other-scheduler", scheduler="default-scheduler", priority=important
        ),
        "too-many-cards": preemptor("many", node="too-many-cards", gpus=3, priority=important),
        "too-much-memory": preemptor("huge", node="too-much-memory", memory=10001, priority=important),
        "being-deleted": preemptor("leaving", node="being-deleted", priority=important),
        "finished": preemptor("done", node="finished", priority=important, phase="Failed"),
        "not-a-name": preemptor("odd", node={"name": "not-a-name"}, priority=important),
        "unreadable": preemptor("unreadable", node="unreadable", priority=important),
    }
    bogus["unreadable"]["metadata"]["annotations"] = {POD_SCORING_WEIGHTS: "{not json"}
    bogus["being-deleted"]["metadata"]["deletionTimestamp"] = "2026-05-01T09:59:00Z"
    bogus["being-deleted"]["metadata"]["finalizers"] = ["example.com/hold"]
    nodes = [make_node(name) for name in bogus]
    ext = await start_extender(nodes=nodes, pods=list(bogus.values()))
    assert await fitting(ext, pending("low"), tuple(bogus)) == list(bogus)
    # one that does fit holds exactly its own request: one card of 5000 MiB, the other card is free
    await ext.apiserver.post(
        PODS, json=preemptor("one", node="no-gpu", gpus=1, memory=5000, priority=important)
    )
    await eventually(lambda: _none(fitting(ext, pending("two", gpus=2, memory=6000), ("no-gpu",))), "held")
    assert await fitting(ext, pending("low"), ("no-gpu",)) == ["no-gpu"]
    assert await fitting(ext, pending("low", memory=10000), ("no-gpu",)) == ["no-gpu"]


async def test_nominations_are_read_under_the_services_own_scheduler_name(
    start_extender: StartExtender,
) -> None:
    ours = preemptor("ours", scheduler="gpu-scheduler")
    theirs = preemptor("theirs", node="n2")  # names hami-scheduler, not this service
    ext = await start_extender(
        nodes=[make_node("n1"), make_node("n2")], pods=[ours, theirs], scheduler_name="gpu-scheduler"
    )
    assert await fitting(ext, pending("low"), ("n1", "n2")) == ["n2"]


# ---------------------------------------------------------------------------------- preempt


async def test_preemption_cannot_free_cards_held_for_a_nominee_that_outranks_the_pod(
    start_extender: StartExtender,
) -> None:
    # kube-scheduler finds victims with the nominated pods of priority >= the preemptor's in place:
    # evicting a (GPU-n1-0) would leave that card to the nominee, so b (GPU-n1-1) is the victim.
    held = preemptor("held", gpus=1, memory=6000, priority=URGENT)
    held["metadata"]["annotations"] = {POD_USE_GPUUUID: "GPU-n1-0"}
    pods = [holder("a", 0, 4000, 1), holder("b", 1, 4000, 1), held]
    ext = await start_extender(nodes=[make_node("n1")], pods=pods)
    (reservation,) = ext.ctx.snapshot.reservations("n1")
    assert {c.uuid: c.memory for c in reservation.usage.cards} == {"GPU-n1-0": 6000}
    body = {
        "Pod": pending("mid", memory=7000, priority=URGENT - 1),
        "NodeNameToMetaVictims": {"n1": {"Pods": [], "NumPDBViolations": 0}},
    }
    answer = await ext.post("/preempt", body)
    assert answer == {"NodeNameToMetaVictims": {"n1": {"Pods": [{"UID": "uid-b"}], "NumPDBViolations": 0}}}
    # a preemptor that outranks the nominee is not held off: the cheapest victim (smaller uid) goes
    body["Pod"] = pending("top", memory=7000, priority=URGENT + 1)
    answer = await ext.post("/preempt", body)
    assert answer["NodeNameToMetaVictims"]["n1"]["Pods"] == [{"UID": "uid-a"}]
