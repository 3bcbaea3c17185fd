"""The kube-scheduler stand-in drives an extender as kube-scheduler does (verbs, JSON shape, retries).

A small aiohttp server plays the extender and records every call; pods and nodes live in the embedded
apiserver. The extender's /bind creates the Binding, as ours does.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Any

import aiohttp
import kmock
import pytest
from aiohttp import web

from hami_testkit.kubeapi import SimApi, nodes_path, pods_path
from hami_testkit.scheduler_standin import SchedulerStandIn
from tests.eventually import eventually
from tests.testkit.fakeserver import serving

Reply = Callable[[dict[str, Any]], Any]


class FakeExtender:
    def __init__(self, apiserver: kmock.KubernetesEmulator) -> None:
        self.apiserver = apiserver
        self.calls: list[tuple[str, dict[str, Any]]] = []
        self.filter: Reply = lambda args: {"NodeNames": args["NodeNames"], "FailedNodes": {}, "Error": ""}
        self.prioritize: Reply = lambda args: [{"Host": n, "Score": 0} for n in args["NodeNames"]]
        self.preempt: Reply = lambda args: {"NodeNameToMetaVictims": {}}
        self.bind_error = ""
        self.bind_errors: dict[str, str] = {}  # pod name -> the Error its binds answer
        self.held: dict[str, asyncio.Event] = {}  # pod name -> its binds answer once this is set

    async def handle(self, request: web.Request) -> web.Response:
        verb = request.match_info["verb"]
        args = await request.json()
        self.calls.append((verb, args))
        if verb == "filter":
            return web.json_response(self.filter(args))
        if verb == "prioritize":
            return web.json_response(self.prioritize(args))
        if verb == "preempt":
            return web.json_response(self.preempt(args))
        if args["PodName"] in self.held:
            await self.held[args["PodName"]].wait()
        if self.bind_error or args["PodName"] in self.bind_errors:
            return web.json_response({"Error": self.bind_error or self.bind_errors[args["PodName"]]})
        binding = {"apiVersion": "v1", "kind": "Binding", "metadata": {"name": args["PodName"]},
                   "target": {"kind": "Node", "name": args["Node"]}}  # fmt: skip
        await self.apiserver.post(pods_path(args["PodNamespace"], args["PodName"], "binding"), json=binding)
        return web.json_response({"Error": ""})

    def verbs(self) -> list[str]:
        return [verb for verb, _ in self.calls]

    def sent(self, verb: str) -> list[str]:
        """The pods each call of ``verb`` was about, in order."""
        return [args["PodName"] if verb == "bind" else args["Pod"]["metadata"]["name"]
                for v, args in self.calls if v == verb]  # fmt: skip


@pytest.fixture
async def extender(apiserver: kmock.KubernetesEmulator) -> AsyncIterator[tuple[FakeExtender, str]]:
    fake = FakeExtender(apiserver)
    async with serving("/{verb}", fake.handle) as server:
        yield fake, f"http://127.0.0.1:{server.port}"


@pytest.fixture
async def standin(
    apiserver: kmock.KubernetesEmulator, extender: tuple[FakeExtender, str]
) -> AsyncIterator[SchedulerStandIn]:
    try:
        async with _running(apiserver, extender[1]) as scheduler:
            yield scheduler
    finally:
        for held in extender[0].held.values():  # a bind the test left waiting answers, and its handler ends
            held.set()


@contextlib.asynccontextmanager
async def _running(
    apiserver: kmock.KubernetesEmulator, url: str, **options: Any
) -> AsyncIterator[SchedulerStandIn]:
    async with aiohttp.ClientSession() as session:
        scheduler = SchedulerStandIn(
            SimApi(session, str(apiserver.url)), session, url, backoff=(0.05, 0.2), **options
        )
        task = asyncio.create_task(scheduler.run())
        try:
            yield scheduler
        finally:
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task


async def _node(apiserver: kmock.KubernetesEmulator, name: str, **labels: str) -> None:
    node = {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": labels, "annotations": {}},
        "status": {"conditions": [{"type": "Ready", "status": "True"}]},
    }
    await apiserver.post(nodes_path(), json=node)


async def _pod(
    apiserver: kmock.KubernetesEmulator, name: str, scheduler: str = "hami-scheduler", **spec: Any
) -> None:
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "default", "uid": f"uid-{name}"},
        "spec": {"schedulerName": scheduler, "containers": [{"name": "c"}], **spec},
        "status": {"phase": "Pending"},
    }
    await apiserver.post(pods_path("default"), json=pod)


async def _stored(apiserver: kmock.KubernetesEmulator, name: str) -> dict[str, Any]:
    return dict(await (await apiserver.get(pods_path("default", name))).json())


async def _bound(apiserver: kmock.KubernetesEmulator, name: str) -> str:
    async def probe() -> str | None:
        node: str | None = (await _stored(apiserver, name))["spec"].get("nodeName")
        return node

    return await eventually(probe, f"{name} to be bound", within=10)


async def test_filter_prioritize_bind_with_node_names_only(
    apiserver: kmock.KubernetesEmulator, extender: tuple[FakeExtender, str], standin: SchedulerStandIn
) -> None:
    fake, _ = extender
    for name in ("n2", "n1", "n3"):
        await _node(apiserver, name, gpu="on")
    await _node(apiserver, "cpu-only", gpu="off")
    fake.prioritize = lambda args: [{"Host": "n1", "Score": 3}, {"Host": "n2", "Score": 7}]
    fake.filter = lambda args: {
        "NodeNames": ["n1", "n2"],
        "FailedNodes": {"n3": "1/1 CardInsufficientMemory"},
    }
    await eventually(lambda: _ready(standin, 4), "the stand-in to see the nodes", within=10)
    await _pod(apiserver, "p1", nodeSelector={"gpu": "on"})
    assert await _bound(apiserver, "p1") == "n2"  # highest score
    assert fake.verbs() == ["filter", "prioritize", "bind"]
    filter_args = fake.calls[0][1]
    # nodeCacheCapable: names only, sorted, nodeSelector already applied; the pod travels whole
    assert filter_args["Nodes"] is None
    assert filter_args["NodeNames"] == ["n1", "n2", "n3"]
    assert filter_args["Pod"]["metadata"]["name"] == "p1"
    assert fake.calls[1][1]["NodeNames"] == ["n1", "n2"]
    assert fake.calls[2][1] == {"PodName": "p1", "PodNamespace": "default", "PodUID": "uid-p1", "Node": "n2"}


async def test_other_schedulers_pods_are_left_alone(
    apiserver: kmock.KubernetesEmulator, extender: tuple[FakeExtender, str], standin: SchedulerStandIn
) -> None:
    fake, _ = extender
    await _node(apiserver, "n1")
    await _pod(apiserver, "theirs", scheduler="default-scheduler")
    await _pod(apiserver, "ours")
    assert await _bound(apiserver, "ours") == "n1"
    assert [args["Pod"]["metadata"]["name"] for verb, args in fake.calls if verb == "filter"] == ["ours"]
    assert "nodeName" not in (await _stored(apiserver, "theirs"))["spec"]


async def test_unschedulable_pods_are_explained_and_retried_when_a_node_changes(
    apiserver: kmock.KubernetesEmulator, extender: tuple[FakeExtender, str], standin: SchedulerStandIn
) -> None:
    fake, _ = extender
    await _node(apiserver, "n1")
    fake.filter = lambda args: {"NodeNames": [], "FailedNodes": {"n1": "1/1 CardInsufficientMemory"}}
    await _pod(apiserver, "p1")

    def events() -> list[dict[str, Any]]:
        return [o.raw for (r, _, _), o in apiserver.objects.items() if r.plural == "events"]

    def settled() -> bool:  # the attempt is recorded before its condition and Event are written
        pod = standin.pods.get(("default", "p1"))
        return pod is not None and standin.settled(pod) and bool(events())

    await eventually(settled, "p1 to be unschedulable and its Event written", within=10)
    message = (
        "0/1 nodes are available: 1 1/1 CardInsufficientMemory. "
        "preemption: 0/1 nodes are available: 1 No preemption victims found for incoming pod.."
    )
    pod = await _stored(apiserver, "p1")
    assert pod["status"]["conditions"] == [
        {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": message}
    ]
    assert [(e["reason"], e["message"], e["involvedObject"]["name"]) for e in events()] == [
        ("FailedScheduling", message, "p1")
    ]
    assert fake.verbs() == ["filter"]  # nothing changed: no retry
    # the node agent registers more memory: the node changes, the pod is tried again and fits
    fake.filter = lambda args: {"NodeNames": ["n1"]}
    await apiserver.patch(
        nodes_path("n1"), json={"metadata": {"annotations": {"hami.io/node-nvidia-register": "[]"}}}
    )
    assert await _bound(apiserver, "p1") == "n1"
    assert fake.verbs() == ["filter", "filter", "bind"]


async def test_errors_are_retried_with_backoff(
    apiserver: kmock.KubernetesEmulator, extender: tuple[FakeExtender, str], standin: SchedulerStandIn
) -> None:
    fake, _ = extender
    await _node(apiserver, "n1")
    fake.bind_error = "node n1 has been locked within 5m0s"
    await _pod(apiserver, "p1")

    async def failed_twice() -> bool | None:
        return True if fake.verbs().count("bind") >= 2 else None

    await eventually(failed_twice, "two failed binds", within=10)
    attempt = standin.attempt(await _stored(apiserver, "p1"))
    assert attempt is not None and attempt.kind == "error" and "locked" in attempt.message
    fake.bind_error = ""
    assert await _bound(apiserver, "p1") == "n1"


async def _ready(standin: SchedulerStandIn, nodes: int) -> bool | None:
    return True if len(standin.nodes) >= nodes else None


# ------------------------------------------------------------- kube-scheduler's DefaultPreemption


def _exists(apiserver: kmock.KubernetesEmulator, name: str) -> bool:
    key = (kmock.resource("v1/pods"), "default", name)
    return key in apiserver.objects and not apiserver.objects[key].deleted


def _last_version(apiserver: kmock.KubernetesEmulator, name: str) -> dict[str, Any]:
    history = apiserver.objects[kmock.resource("v1/pods"), "default", name].history
    raw: dict[str, Any] = [v for v in history if v is not None][-1].raw
    return raw


def _events(apiserver: kmock.KubernetesEmulator, pod: str) -> list[dict[str, Any]]:
    return [
        o.raw
        for (r, _, _), o in apiserver.objects.items()
        if r.plural == "events" and not o.deleted and o.raw["involvedObject"]["name"] == pod
    ]


def _full(names: list[str], reason: str = "1/1 CardInsufficientMemory") -> dict[str, Any]:
    return {"NodeNames": [], "FailedNodes": dict.fromkeys(names, reason)}


async def _settled(standin: SchedulerStandIn, name: str) -> bool:
    async def probe() -> bool | None:
        pod = standin.pods.get(("default", name))
        return True if pod is not None and standin.settled(pod) else None

    return await eventually(probe, f"{name} to be unschedulable", within=10)


async def test_a_pod_no_node_takes_preempts_the_victims_the_extender_names(
    apiserver: kmock.KubernetesEmulator, extender: tuple[FakeExtender, str], standin: SchedulerStandIn
) -> None:
    fake, _ = extender
    for name in ("n1", "n2"):
        await _node(apiserver, name)
    await _pod(apiserver, "low-a", nodeName="n1", priority=10, status={"phase": "Running"})
    await _pod(apiserver, "low-b", nodeName="n1", priority=10)
    await _pod(apiserver, "peer", nodeName="n2", priority=100)  # equal priority: never a victim
    await eventually(lambda: len(standin.pods) == 3 and len(standin.nodes) == 2, "the stand-in's view")
    # n1 fits once low-a is gone; n2 never does
    fake.filter = lambda args: (
        {"NodeNames": ["n1"]} if args["NodeNames"] == ["n1"] and not _exists(apiserver, "low-a")
        else _full(args["NodeNames"])
    )  # fmt: skip
    fake.preempt = lambda args: {
        "NodeNameToMetaVictims": {"n1": {"Pods": [{"UID": "uid-low-a"}], "NumPDBViolations": 0}}
    }
    await _pod(apiserver, "urgent", priority=100)
    assert await _bound(apiserver, "urgent") == "n1"
    assert fake.verbs() == ["filter", "preempt", "filter", "bind"]
    # nodeCacheCapable: the candidates by name, each with kube-scheduler's (empty) victims; n2 has no
    # lower-priority pod, so it is no candidate
    preempt_args = fake.calls[1][1]
    assert preempt_args["Pod"]["metadata"]["name"] == "urgent"
    assert preempt_args["NodeNameToMetaVictims"] == {"n1": {"Pods": [], "NumPDBViolations": 0}}
    assert "NodeNameToVictims" not in preempt_args
    assert fake.calls[2][1]["NodeNames"] == ["n1"]  # the nominated node is tried alone first
    # exactly the named victim went, with the scheduler's DisruptionTarget condition and an Event
    assert not _exists(apiserver, "low-a") and _exists(apiserver, "low-b") and _exists(apiserver, "peer")
    (condition,) = [
        c
        for c in _last_version(apiserver, "low-a")["status"]["conditions"]
        if c["type"] == "DisruptionTarget"
    ]
    assert (condition["status"], condition["reason"], condition["message"]) == (
        "True",
        "PreemptionByScheduler",
        "hami-scheduler: preempting to accommodate a higher priority pod",
    )
    (event,) = _events(apiserver, "low-a")
    assert (event["type"], event["reason"], event["action"], event["message"]) == (
        "Normal",
        "Preempted",
        "Preempting",
        "Preempted by pod uid-urgent on node n1",
    )
    assert (event["related"]["name"], event["related"]["uid"]) == ("urgent", "uid-urgent")
    assert event["source"]["component"] == "hami-scheduler"
    assert (await _stored(apiserver, "urgent"))["status"]["nominatedNodeName"] == "n1"
    record = standin.preemption.preemptions["default/low-a"]
    assert (record.preemptor, record.preemptor_uid, record.node, record.victim.priority) == (
        "default/urgent",
        "uid-urgent",
        "n1",
        10,
    )
    assert [r.victim.key for r in standin.preemption.preempted_for["default/urgent"]] == ["default/low-a"]


async def test_preemption_that_cannot_help_says_why_and_asks_no_extender(
    apiserver: kmock.KubernetesEmulator, extender: tuple[FakeExtender, str], standin: SchedulerStandIn
) -> None:
    fake, _ = extender
    for name in ("n1", "n2"):
        await _node(apiserver, name)
    await _pod(apiserver, "peer", nodeName="n1")  # priority 0, as the pending pod
    await _pod(apiserver, "low", nodeName="n2", priority=-5)
    await eventually(lambda: len(standin.pods) == 2 and len(standin.nodes) == 2, "the stand-in's view")
    fake.filter = lambda args: {
        "NodeNames": [],
        "FailedNodes": {"n1": "1/1 CardInsufficientMemory"},
        "FailedAndUnresolvableNodes": {"n2": "1/1 CardTypeMismatch"},  # removing pods cannot help there
    }
    await _pod(apiserver, "p1")
    await _settled(standin, "p1")
    attempt = standin.attempts["uid-p1"]
    assert attempt.message == (
        "0/2 nodes are available: 1 1/1 CardInsufficientMemory, 1 1/1 CardTypeMismatch. preemption: 0/2 "
        "nodes are available: 1 No preemption victims found for incoming pod, 1 Preemption is not helpful "
        "for scheduling.."
    )
    assert fake.verbs() == ["filter"]
    assert _exists(apiserver, "low") and _exists(apiserver, "peer")


async def test_a_pod_that_never_preempts_is_not_eligible(
    apiserver: kmock.KubernetesEmulator, extender: tuple[FakeExtender, str], standin: SchedulerStandIn
) -> None:
    fake, _ = extender
    await _node(apiserver, "n1")
    await _pod(apiserver, "low", nodeName="n1", priority=-5)
    await eventually(lambda: len(standin.pods) == 1 and len(standin.nodes) == 1, "the stand-in's view")
    fake.filter = lambda args: _full(args["NodeNames"])
    await _pod(apiserver, "p1", preemptionPolicy="Never")
    await _settled(standin, "p1")
    assert standin.attempts["uid-p1"].message.endswith(
        " preemption: not eligible due to preemptionPolicy=Never.."
    )
    assert fake.verbs() == ["filter"] and _exists(apiserver, "low")


@pytest.mark.parametrize(
    ("answer", "error"),
    [
        (
            {"n1": {"Pods": [{"UID": "uid-elsewhere"}], "NumPDBViolations": 0}},
            "claims to preempt pod (UID: uid-elsewhere) on node: n1, but the pod is not found on that node",
        ),
        ({"n1": {"Pods": [], "NumPDBViolations": 0}}, 'expected at least one victim pod on node "n1"'),
    ],
    ids=["victim-not-on-node", "no-victims"],
)
async def test_an_extender_answer_kube_scheduler_rejects_evicts_nothing(
    apiserver: kmock.KubernetesEmulator,
    extender: tuple[FakeExtender, str],
    standin: SchedulerStandIn,
    answer: dict[str, Any],
    error: str,
) -> None:
    fake, url = extender
    for name in ("n1", "n2"):
        await _node(apiserver, name)
    await _pod(apiserver, "low", nodeName="n1", priority=-5)
    await _pod(apiserver, "elsewhere", nodeName="n2", priority=-5)
    await eventually(lambda: len(standin.pods) == 2 and len(standin.nodes) == 2, "the stand-in's view")
    fake.filter = lambda args: _full(args["NodeNames"])
    fake.preempt = lambda args: {"NodeNameToMetaVictims": answer}
    await _pod(apiserver, "p1")

    def failed() -> bool:
        attempt = standin.attempts.get("uid-p1")
        return attempt is not None and attempt.kind == "error"

    await eventually(failed, "the preemption to fail")
    assert error in standin.attempts["uid-p1"].message
    if "claims" in error:
        assert standin.attempts["uid-p1"].message.startswith(f"extender: {url} claims")
    assert _exists(apiserver, "low") and _exists(apiserver, "elsewhere")
    assert "nominatedNodeName" not in (await _stored(apiserver, "p1"))["status"]
    assert standin.preemption.preemptions == {}


async def test_the_highest_priority_pending_pod_is_scheduled_first(
    apiserver: kmock.KubernetesEmulator, extender: tuple[FakeExtender, str], standin: SchedulerStandIn
) -> None:
    fake, _ = extender
    await _pod(apiserver, "first-low", priority=1)
    await _pod(apiserver, "then-high", priority=1000)
    await _settled(standin, "first-low")
    await _settled(standin, "then-high")  # no node yet: both wait
    await _node(apiserver, "n1")  # the cluster changes: both are due again, the higher first
    await _bound(apiserver, "first-low")
    filtered = [args["Pod"]["metadata"]["name"] for verb, args in fake.calls if verb == "filter"]
    assert filtered[-2:] == ["then-high", "first-low"]


async def test_a_pod_naming_a_scheduler_that_does_not_run_gets_one_warning(
    apiserver: kmock.KubernetesEmulator, extender: tuple[FakeExtender, str]
) -> None:
    """In the embedded cluster (warn_other_schedulers) the stand-in is the only scheduler: a ``kubectl
    run`` pod (default-scheduler) or one naming any other scheduler is told so once, and stays Pending;
    our own pods and bound pods get no such Event."""
    async with aiohttp.ClientSession() as session:
        scheduler = SchedulerStandIn(
            SimApi(session, str(apiserver.url)), session, extender[1], warn_other_schedulers=True
        )
        task = asyncio.create_task(scheduler.run())
        try:
            await _node(apiserver, "n1")
            await _pod(apiserver, "plain", scheduler="default-scheduler")
            await _pod(apiserver, "volcano", scheduler="volcano")
            await _pod(apiserver, "bound", scheduler="default-scheduler", nodeName="n1")
            await _pod(apiserver, "ours")
            assert await _bound(apiserver, "ours") == "n1"
            await eventually(
                lambda: _events(apiserver, "plain") and _events(apiserver, "volcano"),
                "the Warning Events",
                within=10,
            )
            await apiserver.patch(pods_path("default", "plain"), json={"metadata": {"labels": {"a": "b"}}})
            await _pod(apiserver, "last", scheduler="default-scheduler")
            await eventually(lambda: _events(apiserver, "last"), "the last pod's Warning", within=10)
        finally:
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
    (plain,) = _events(apiserver, "plain")  # once, though the pod changed after it
    assert (plain["type"], plain["reason"], plain["source"]["component"]) == (
        "Warning",
        "NoScheduler",
        "embedded-cluster",
    )
    assert plain["message"] == (
        'no scheduler named "default-scheduler" runs in this embedded cluster: it runs "hami-scheduler" '
        "only, for the pods HAMi's webhook sends to it (those asking for GPUs); this pod stays Pending"
    )
    assert 'no scheduler named "volcano"' in _events(apiserver, "volcano")[0]["message"]
    assert [e["reason"] for e in _events(apiserver, "ours")] == ["Scheduled"]
    assert _events(apiserver, "bound") == []
    assert "nodeName" not in (await _stored(apiserver, "plain"))["spec"]


# ------------------------------------------------------------- kube-scheduler's binding cycle


def _bind_tasks() -> list[asyncio.Task[Any]]:
    return [t for t in asyncio.all_tasks() if t.get_name().startswith("standin-bind")]


async def _kind(standin: SchedulerStandIn, name: str, kind: str) -> bool:
    def probe() -> bool:
        attempt = standin.attempts.get(f"uid-{name}")
        return attempt is not None and attempt.kind == kind

    return await eventually(probe, f"{name}'s attempt to be {kind}", within=10)


async def test_the_next_pod_is_scheduled_while_a_bind_is_in_flight(
    apiserver: kmock.KubernetesEmulator, extender: tuple[FakeExtender, str], standin: SchedulerStandIn
) -> None:
    """kube-scheduler binds in a goroutine of its own: the next scheduling cycle does not wait for it."""
    fake, _ = extender
    await _node(apiserver, "n1")
    fake.held["p1"] = asyncio.Event()
    await _pod(apiserver, "p1")
    await eventually(lambda: fake.sent("bind") == ["p1"], "p1's bind to reach the extender", within=10)
    await _pod(apiserver, "p2")
    assert await _bound(apiserver, "p2") == "n1"  # while p1's bind still waits
    attempt = standin.attempts["uid-p1"]
    assert (attempt.kind, attempt.node) == ("binding", "n1")  # assumed on n1, not yet bound
    assert "nodeName" not in (await _stored(apiserver, "p1"))["spec"]
    assert fake.sent("filter") == ["p1", "p2"]  # p1 was not tried again while assumed
    fake.held["p1"].set()
    assert await _bound(apiserver, "p1") == "n1"
    assert fake.sent("bind") == ["p1", "p2"]
    await eventually(lambda: _events(apiserver, "p1"), "p1's Event", within=10)
    assert [e["reason"] for e in _events(apiserver, "p1")] == ["Scheduled"]


async def test_a_failed_background_bind_forgets_the_pod_and_requeues_it(
    apiserver: kmock.KubernetesEmulator, extender: tuple[FakeExtender, str], standin: SchedulerStandIn
) -> None:
    """kube-scheduler's handleBindingCycleError: the assumed pod is forgotten (an AssignedPod/Delete
    event for the parked pods: the room it held is free again) and goes to the backoff queue."""
    fake, _ = extender
    await _node(apiserver, "n1")
    fake.filter = lambda args: (
        _full(args["NodeNames"]) if args["Pod"]["metadata"]["name"] == "parked"
        else {"NodeNames": args["NodeNames"]}
    )  # fmt: skip
    await _pod(apiserver, "parked")
    await _settled(standin, "parked")
    fake.held["p1"] = asyncio.Event()
    fake.bind_errors["p1"] = "node n1 has been locked within 5m0s"
    await _pod(apiserver, "p1")
    await _kind(standin, "p1", "binding")
    assert standin.requeued_by(standin.pods[("default", "parked")]) == []
    fake.held["p1"].set()
    await _kind(standin, "p1", "error")
    attempt = standin.attempts["uid-p1"]
    assert "locked" in attempt.message and attempt.failures == 1
    assert "AssignedPod/Delete" in standin.requeued_by(standin.pods[("default", "parked")])
    # the retried bind fails again (its answer, not only its sending: the two are apart in time)
    await eventually(lambda: standin.attempts["uid-p1"].failures >= 2, "p1's retried bind to fail", within=10)
    assert fake.sent("bind").count("p1") >= 2  # backoff doubles with each failed bind
    del fake.bind_errors["p1"]
    assert await _bound(apiserver, "p1") == "n1"


async def test_an_assumed_pod_counts_on_its_node_for_the_next_pods_preemption(
    apiserver: kmock.KubernetesEmulator, extender: tuple[FakeExtender, str], standin: SchedulerStandIn
) -> None:
    """The assumed pod is in kube-scheduler's cache on its node: a higher-priority pod that no node takes
    finds it there as a possible victim while its bind is still in flight."""
    fake, _ = extender
    await _node(apiserver, "n1")
    fake.held["low"] = asyncio.Event()
    await _pod(apiserver, "low", priority=10)
    await _kind(standin, "low", "binding")
    fake.filter = lambda args: _full(args["NodeNames"])
    await _pod(apiserver, "urgent", priority=100)
    await _settled(standin, "urgent")
    (preempt,) = [args for verb, args in fake.calls if verb == "preempt"]
    assert preempt["Pod"]["metadata"]["name"] == "urgent"
    assert preempt["NodeNameToMetaVictims"] == {"n1": {"Pods": [], "NumPDBViolations": 0}}
    assert "nodeName" not in (await _stored(apiserver, "low"))["spec"]  # still only assumed
    fake.held["low"].set()
    assert await _bound(apiserver, "low") == "n1"


async def test_binds_in_flight_are_capped_and_serial_binds_remain_a_switch(
    apiserver: kmock.KubernetesEmulator, extender: tuple[FakeExtender, str]
) -> None:
    fake, url = extender
    await _node(apiserver, "n1")
    modes: list[tuple[str, dict[str, Any]]] = [
        ("cap", {"max_binding": 1}),
        ("serial", {"background_binds": False}),
    ]
    for label, options in modes:
        first, second = f"{label}-first", f"{label}-second"
        fake.held[first] = asyncio.Event()
        try:
            async with _running(apiserver, url, **options) as standin:
                await _pod(apiserver, first)
                await eventually(lambda: first in fake.sent("bind"), "the first bind", within=10)  # noqa: B023
                await _pod(apiserver, second)
                await eventually(lambda: ("default", second) in standin.pods, "the stand-in to see it")  # noqa: B023
                assert second not in fake.sent("filter")  # it waits until the first bind is done
                fake.held[first].set()
                assert await _bound(apiserver, second) == "n1"
                assert await _bound(apiserver, first) == "n1"
                assert fake.sent("bind")[-2:] == [first, second]
        finally:
            fake.held[first].set()


async def test_stopping_the_stand_in_cancels_every_bind_in_flight(
    apiserver: kmock.KubernetesEmulator, extender: tuple[FakeExtender, str]
) -> None:
    fake, url = extender
    await _node(apiserver, "n1")
    fake.held["p1"] = asyncio.Event()
    try:
        async with _running(apiserver, url) as standin:
            await _pod(apiserver, "p1")
            await eventually(
                lambda: fake.sent("bind") == ["p1"], "p1's bind to reach the extender", within=10
            )
            (task,) = _bind_tasks()
            assert standin.binding == 1
        assert task.cancelled()
        assert _bind_tasks() == []
        assert standin.binding == 0
    finally:
        fake.held["p1"].set()
