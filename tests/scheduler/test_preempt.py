"""POST /preempt with kube-scheduler's extender v1 JSON, on a live view fed by the embedded API server.

The cluster: node ``n1`` has two 10000 MiB cards, both full of priority-1 pods (GPU-n1-0: ``a`` 8000
+ ``b`` 2000; GPU-n1-1: ``c`` 5000 + ``d`` 5000); ``n2`` is full of pods as important as the
preemptor; ``cpu`` is a pod holding no card. The preemptor (priority 100) asks one card of 7000 MiB:
on n1 only evicting ``a`` frees enough on one card, so the minimal victims are exactly {a}.
"""

from __future__ import annotations

import json
from typing import Any

from aiohttp.test_utils import TestClient, TestServer
from prometheus_client.parser import text_string_to_metric_families

from hami.scheduler.app import create_app
from hami.scheduler.config import SchedulerSettings
from hami.scheduler.main import build_context
from hami.scheduler.wire import MAX_PREEMPT_NODES, MAX_UID
from tests.builders import NO_API, NOW, make_node, make_pod, placed
from tests.eventually import eventually

from .kit import Extender, StartExtender

PREEMPTOR = 100


def holder(name: str, node: str, card: int, memory: int, priority: int, **kwargs: Any) -> dict[str, Any]:
    """A running pod bound to ``node`` holding ``memory`` MiB of card ``card`` (uid ``uid-<name>``)."""
    annotations = placed(node, f"GPU-{node}-{card}", memory, 0, **kwargs)
    pod = make_pod(name, memory=memory, node=node, phase="Running", annotations=annotations)
    pod["spec"]["priority"] = priority
    pod["status"]["startTime"] = "2026-05-01T09:00:00Z"
    return pod


def preemptor(memory: int = 7000, priority: int = PREEMPTOR, **spec: Any) -> dict[str, Any]:
    pod = make_pod("urgent", memory=memory, cores=None)
    pod["spec"].update(priority=priority, **spec)
    return pod


CLUSTER_PODS = [
    holder("a", "n1", 0, 8000, 1),
    holder("b", "n1", 0, 2000, 1),
    holder("c", "n1", 1, 5000, 1),
    holder("d", "n1", 1, 5000, 1),
    holder("e", "n2", 0, 10000, PREEMPTOR),
    holder("f", "n2", 1, 10000, PREEMPTOR + 5),
    make_pod("cpu", gpus=0, node="n1", phase="Running"),
]


async def start(start_extender: StartExtender, pods: list[dict[str, Any]] = CLUSTER_PODS) -> Extender:
    return await start_extender(nodes=[make_node("n1"), make_node("n2"), make_node("idle")], pods=pods)


def meta(**nodes: list[str]) -> dict[str, Any]:
    return {
        node: {"Pods": [{"UID": uid} for uid in uids], "NumPDBViolations": 0} for node, uids in nodes.items()
    }


async def preempt(ext: Extender, body: Any) -> tuple[int, Any]:
    response = await ext.client.post("/preempt", data=json.dumps(body).encode())
    text = await response.text()
    return response.status, (json.loads(text) if response.status == 200 else text)


# ----------------------------------------------------------------------------------- the answer


async def test_meta_victims_form_names_exactly_the_minimal_victims(start_extender: StartExtender) -> None:
    # nodeCacheCapable: true. kube-scheduler's plugins need no victim on n1 (empty placeholder, as
    # kube-scheduler sends since it hands GPU-only candidates to preempting extenders); n2 holds only
    # pods at or above the preemptor's priority; "ghost" is no node of ours.
    ext = await start(start_extender)
    body = {"Pod": preemptor(), "NodeNameToMetaVictims": meta(n1=[], n2=[], ghost=["uid-x"])}
    status, answer = await preempt(ext, body)
    assert status == 200, answer
    assert answer == {"NodeNameToMetaVictims": {"n1": {"Pods": [{"UID": "uid-a"}], "NumPDBViolations": 0}}}


async def test_kube_schedulers_own_victims_are_kept_and_the_gpu_victims_added(
    start_extender: StartExtender,
) -> None:
    # kube-scheduler evicts the CPU pod for its own reasons (it sees no GPU): it stays in the answer,
    # with its PDB count, and a is added for the card (after it: this extender does not know the CPU
    # pod's priority in this form, and kube-scheduler listed its own victims most important first).
    ext = await start(start_extender)
    body = {
        "Pod": preemptor(),
        "NodeNameToMetaVictims": {"n1": {"Pods": [{"UID": "uid-cpu"}], "NumPDBViolations": 1}},
    }
    status, answer = await preempt(ext, body)
    assert status == 200, answer
    assert answer == {
        "NodeNameToMetaVictims": {
            "n1": {"Pods": [{"UID": "uid-cpu"}, {"UID": "uid-a"}], "NumPDBViolations": 1}
        }
    }
    # a victim kube-scheduler already chose on the cards counts as freed: with c gone, one more pod
    # is needed either way (d on GPU-n1-1 or a on GPU-n1-0), same priority, same age: the smaller
    # uid decides, and c is not named twice.
    body["NodeNameToMetaVictims"] = meta(n1=["uid-c"])
    status, answer = await preempt(ext, body)
    assert answer["NodeNameToMetaVictims"]["n1"]["Pods"] == [{"UID": "uid-c"}, {"UID": "uid-a"}]


async def test_victims_are_listed_most_important_first_as_kube_scheduler_ranks_nodes(
    start_extender: StartExtender,
) -> None:
    # kube-scheduler reads Pods[0] as a node's most important victim when it picks among the nodes
    # (pickOneNodeForPreemption), so the list is ordered as its MoreImportantPod orders victims:
    # higher priority first, then older. The whole card 0 must go: y (priority 7) before x (1).
    pods = [
        holder("x", "n1", 0, 5000, 1),
        holder("y", "n1", 0, 5000, 7),
        holder("u", "n1", 1, 5000, 30),
        holder("v", "n1", 1, 5000, 40),
    ]
    ext = await start(start_extender, pods)
    status, answer = await preempt(
        ext, {"Pod": preemptor(memory=10000), "NodeNameToMetaVictims": meta(n1=[])}
    )
    assert status == 200, answer
    assert answer["NodeNameToMetaVictims"]["n1"]["Pods"] == [{"UID": "uid-y"}, {"UID": "uid-x"}]


async def test_full_victims_form_gives_the_same_answer_by_uid(start_extender: StartExtender) -> None:
    # nodeCacheCapable: false: kube-scheduler sends whole pods; the answer is still by uid.
    ext = await start(start_extender)
    cpu = next(p for p in CLUSTER_PODS if p["metadata"]["name"] == "cpu")
    body = {"Pod": preemptor(), "NodeNameToVictims": {"n1": {"Pods": [cpu], "NumPDBViolations": 0}}}
    status, answer = await preempt(ext, body)
    assert status == 200, answer
    assert answer["NodeNameToMetaVictims"] == {
        "n1": {"Pods": [{"UID": "uid-a"}, {"UID": "uid-cpu"}], "NumPDBViolations": 0}
    }
    # a victim kube-scheduler names whose own priority is not below the preemptor's drops the node
    important = dict(cpu, spec=dict(cpu["spec"], priority=PREEMPTOR))
    body = {"Pod": preemptor(), "NodeNameToVictims": {"n1": {"Pods": [important], "NumPDBViolations": 0}}}
    status, answer = await preempt(ext, body)
    assert (status, answer) == (200, {"NodeNameToMetaVictims": {}})


async def test_higher_and_equal_priority_pods_are_never_victims(start_extender: StartExtender) -> None:
    # The preemptor at priority 1 may evict nothing on n1 (all priority 1): the node is dropped; at
    # priority 2 it may.
    ext = await start(start_extender)
    status, answer = await preempt(ext, {"Pod": preemptor(priority=1), "NodeNameToMetaVictims": meta(n1=[])})
    assert (status, answer) == (200, {"NodeNameToMetaVictims": {}})
    status, answer = await preempt(ext, {"Pod": preemptor(priority=2), "NodeNameToMetaVictims": meta(n1=[])})
    assert answer["NodeNameToMetaVictims"]["n1"]["Pods"] == [{"UID": "uid-a"}]


async def test_pods_kube_scheduler_cannot_name_are_never_added(start_extender: StartExtender) -> None:
    # a is not bound yet (its bind is in flight: allocating, no nodeName): kube-scheduler does not
    # have it on n1, so naming it would fail the whole preemption. Its card stays used; GPU-n1-1's
    # two pods go instead.
    unbound = holder("a", "n1", 0, 8000, 1, phase="allocating", bound_ago=1)
    del unbound["spec"]["nodeName"]
    unbound["status"] = {"phase": "Pending"}
    pods = [unbound, *CLUSTER_PODS[1:]]
    ext = await start(start_extender, pods)
    status, answer = await preempt(ext, {"Pod": preemptor(), "NodeNameToMetaVictims": meta(n1=[])})
    assert status == 200, answer
    assert answer["NodeNameToMetaVictims"]["n1"]["Pods"] == [{"UID": "uid-c"}, {"UID": "uid-d"}]


async def test_nothing_to_preempt_for_pods_that_fit_or_never_preempt(start_extender: StartExtender) -> None:
    ext = await start(start_extender)
    # the pod fits the idle node without any eviction: no victim, so the node is left out (an empty
    # list would fail kube-scheduler)
    status, answer = await preempt(ext, {"Pod": preemptor(), "NodeNameToMetaVictims": meta(idle=[])})
    assert (status, answer) == (200, {"NodeNameToMetaVictims": {}})
    never = preemptor(preemptionPolicy="Never")
    status, answer = await preempt(ext, {"Pod": never, "NodeNameToMetaVictims": meta(n1=["uid-cpu"])})
    assert (status, answer) == (200, {"NodeNameToMetaVictims": {}})
    # a pod asking for no GPU: kube-scheduler's choice stands, unchanged
    plain = make_pod("plain", gpus=0)
    status, answer = await preempt(ext, {"Pod": plain, "NodeNameToMetaVictims": meta(n1=["uid-cpu"], n2=[])})
    assert (status, answer) == (200, {"NodeNameToMetaVictims": meta(n1=["uid-cpu"])})


# ------------------------------------------------------------------------------------ hostile bodies


async def test_malformed_bodies_get_a_clear_400(start_extender: StartExtender) -> None:
    ext = await start(start_extender)
    pod = preemptor()
    cases: list[tuple[bytes, str]] = [
        (b"", "Please send a request body"),
        (b"{not json", "request body is not JSON"),
        (b"[]", "request body must be a JSON object"),
        (json.dumps({"NodeNameToMetaVictims": {}}).encode(), "extender args missing pod"),
        (json.dumps({"Pod": [1]}).encode(), "Pod must be an object"),
        (
            json.dumps({"Pod": pod, "NodeNameToMetaVictims": ["n1"]}).encode(),
            "must be an object keyed by node",
        ),
        (
            json.dumps({"Pod": pod, "NodeNameToMetaVictims": {"n1": {"Pods": "uid-a"}}}).encode(),
            'NodeNameToMetaVictims["n1"].Pods must be a list',
        ),
        (
            json.dumps({"Pod": pod, "NodeNameToMetaVictims": {"n1": {"Pods": [None]}}}).encode(),
            'NodeNameToMetaVictims["n1"].Pods[0] must be an object with a UID',
        ),
        (
            json.dumps({"Pod": pod, "NodeNameToMetaVictims": {"n1": {"Pods": [{"UID": 7}]}}}).encode(),
            "UID must be a uid",
        ),
        (
            json.dumps(
                {"Pod": pod, "NodeNameToMetaVictims": {"n1": {"Pods": [{"UID": "u" * (MAX_UID + 1)}]}}}
            ).encode(),
            "UID must be a uid",
        ),
        (
            json.dumps(
                {"Pod": pod, "NodeNameToMetaVictims": {"n1": {"Pods": [], "NumPDBViolations": -1}}}
            ).encode(),
            "NumPDBViolations must be a count",
        ),
        (
            json.dumps({"Pod": pod, "NodeNameToMetaVictims": {"n1": {"NumPDBViolations": True}}}).encode(),
            "NumPDBViolations must be a count",
        ),
        (
            json.dumps({"Pod": pod, "NodeNameToVictims": {"n1": {"Pods": [{"spec": {}}]}}}).encode(),
            'NodeNameToVictims["n1"].Pods[0] must be a Pod object with metadata',
        ),
        (
            json.dumps({"Pod": pod, "NodeNameToVictims": {}, "NodeNameToMetaVictims": {}}).encode(),
            "send NodeNameToVictims or NodeNameToMetaVictims, not both",
        ),
        (
            json.dumps(
                {
                    "Pod": pod,
                    "NodeNameToMetaVictims": meta(**{f"n{i}": [] for i in range(MAX_PREEMPT_NODES + 1)}),
                }
            ).encode(),
            f"names {MAX_PREEMPT_NODES + 1} nodes",
        ),
    ]
    for body, reason in cases:
        response = await ext.client.post("/preempt", data=body)
        assert response.status == 400, (body[:80], await response.text())
        assert reason in await response.text(), (body[:80], await response.text())


async def test_keys_are_matched_as_go_does_and_null_victims_are_none(start_extender: StartExtender) -> None:
    ext = await start(start_extender)
    body = {
        "pod": preemptor(),
        "nodeNameToMetaVictims": {"n1": None, "n2": {"pods": None, "numpdbviolations": 0}},
    }
    status, answer = await preempt(ext, body)
    assert status == 200, answer
    assert answer == {"NodeNameToMetaVictims": {"n1": {"Pods": [{"UID": "uid-a"}], "NumPDBViolations": 0}}}


async def test_unknown_victims_and_nodes_are_ignored_safely(start_extender: StartExtender) -> None:
    # Unknown uids are kube-scheduler's business (pods without cards): passed through, never used as
    # room; a uid repeated is named once; unknown nodes are dropped.
    ext = await start(start_extender)
    body = {"Pod": preemptor(), "NodeNameToMetaVictims": meta(n1=["uid-nope", "uid-nope"], **{"no such": []})}
    status, answer = await preempt(ext, body)
    assert status == 200, answer
    assert answer == {
        "NodeNameToMetaVictims": {
            "n1": {"Pods": [{"UID": "uid-nope"}, {"UID": "uid-a"}], "NumPDBViolations": 0}
        }
    }


async def test_before_the_snapshot_is_synced_the_answer_is_503() -> None:
    ctx = build_context(SchedulerSettings(), api=NO_API, clock=lambda: NOW)
    client: TestClient[Any, Any] = TestClient(TestServer(create_app(ctx), host="127.0.0.1"))
    await client.start_server()
    try:
        body = {"Pod": preemptor(), "NodeNameToMetaVictims": meta(n1=[])}
        response = await client.post("/preempt", data=json.dumps(body).encode())
        assert response.status == 503
        assert await response.text() == "scheduler cache not synced yet"
    finally:
        await client.close()


# ----------------------------------------------------------------------------------------- metrics


async def test_metrics_count_attempts_nodes_and_victims(start_extender: StartExtender) -> None:
    ext = await start(start_extender)
    body = {"Pod": preemptor(), "NodeNameToMetaVictims": meta(n1=["uid-cpu"], n2=[], ghost=[])}
    assert (await preempt(ext, body))[0] == 200
    assert (await ext.client.post("/preempt", data=b"[]")).status == 400
    response = await ext.probes.get("/metrics")
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(await response.text())
        for s in family.samples
    }
    assert samples[("hami_scheduler_preemption_attempts_total", ())] == 1
    assert samples[("hami_scheduler_preemption_nodes_total", (("result", "kept"),))] == 1
    assert samples[("hami_scheduler_preemption_nodes_total", (("result", "dropped"),))] == 2
    assert samples[("hami_scheduler_preemption_victims_total", (("source", "kube_scheduler"),))] == 1
    assert samples[("hami_scheduler_preemption_victims_total", (("source", "gpu"),))] == 1
    assert samples[("hami_scheduler_requests_total", (("outcome", "ok"), ("verb", "preempt")))] == 1
    assert samples[("hami_scheduler_requests_total", (("outcome", "error"), ("verb", "preempt")))] == 1


# ------------------------------------------------------------------------ PodDisruptionBudgets


def budget(name: str, allowed: int, selector: dict[str, Any], **status: Any) -> dict[str, Any]:
    """A policy/v1 PodDisruptionBudget in ``default`` with ``status.disruptionsAllowed`` = ``allowed``."""
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"selector": selector, "minAvailable": 1},
        "status": {"disruptionsAllowed": allowed, **status},
    }


PDB_PATH = "/apis/policy/v1/namespaces/default/poddisruptionbudgets"


async def test_equally_cheap_victims_prefer_the_one_no_budget_protects(
    start_extender: StartExtender, apiserver: Any
) -> None:
    # p and q each fill 6000 MiB of one card: evicting either lets the 7000 MiB preemptor fit, same
    # priority, same age, so without budgets the smaller uid (p) goes. A PDB covering p with no
    # disruption left makes q the cheaper set (kube-scheduler's filterPodsWithPDBViolation order).
    p = holder("p", "n1", 0, 6000, 1)
    q = holder("q", "n1", 1, 6000, 1)
    p["metadata"]["labels"] = {"app": "guarded"}
    q["metadata"]["labels"] = {"app": "free"}
    await apiserver.post(PDB_PATH, json=budget("guard", 0, {"matchLabels": {"app": "guarded"}}))
    # budgets that must not count: another namespace's, an empty selector, disruptions left, and
    # one where q is already among the disrupted pods
    other = budget("elsewhere", 0, {"matchLabels": {"app": "free"}})
    other["metadata"]["namespace"] = "other"
    await apiserver.post("/apis/policy/v1/namespaces/other/poddisruptionbudgets", json=other)
    await apiserver.post(PDB_PATH, json=budget("everything", 0, {}))
    await apiserver.post(PDB_PATH, json=budget("roomy", 1, {"matchLabels": {"app": "free"}}))
    gone = budget("gone", 0, {"matchExpressions": [{"key": "app", "operator": "NotIn", "values": ["x"]}]})
    gone["status"]["disruptedPods"] = {"q": "2026-05-01T09:00:00Z", "p": "2026-05-01T09:00:00Z"}
    await apiserver.post(PDB_PATH, json=gone)
    ext = await start(start_extender, [p, q])
    body = {"Pod": preemptor(), "NodeNameToMetaVictims": meta(n1=[])}
    status, answer = await preempt(ext, body)
    assert status == 200, answer
    assert answer == {"NodeNameToMetaVictims": {"n1": {"Pods": [{"UID": "uid-q"}], "NumPDBViolations": 0}}}

    # both protected: the cheapest set violates anyway, and the count says so
    both = {"matchExpressions": [{"key": "app", "operator": "In", "values": ["guarded", "free"]}]}
    await apiserver.post(PDB_PATH, json=budget("both", 0, both))

    await eventually(lambda: ("default", "both") in ext.ctx.disruptions, "the new budget")
    status, answer = await preempt(ext, body)
    assert answer == {"NodeNameToMetaVictims": {"n1": {"Pods": [{"UID": "uid-p"}], "NumPDBViolations": 1}}}
