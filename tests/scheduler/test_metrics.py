"""The scheduler's /metrics after real extender traffic on the embedded API server: exact values.

Filter/prioritize/bind latency counts, rejections by reason, unschedulable pods, bind outcomes, the
node-lock hold time (acquire in bind -> release seen by the node watch), snapshot sizes and watch
restarts; plus the lock-hold bookkeeping and the reason vocabulary on their own.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import kmock
from prometheus_client import Histogram
from prometheus_client.parser import text_string_to_metric_families

from hami.annotations import POD_DEVICES_ALLOCATED, POD_VGPU_NODE
from hami.core.rejection import Reason, Rejection
from hami.kube.nodelock import release_node_lock
from hami.scheduler.filter import failure_summary
from hami.scheduler.metrics import BIND_RESULTS, LockHolds
from hami.scheduler.reasons import VOCABULARY, advice, label, rejection_words
from tests.builders import make_node, make_pod
from tests.eventually import eventually, time_scale

from .kit import Extender, StartExtender

PODS = kmock.resource("v1/pods")
NODES = kmock.resource("v1/nodes")


async def scrape(ext: Extender) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """Every sample of ``GET /metrics``: (name, labels) -> value."""
    response = await ext.probes.get("/metrics")
    assert response.status == 200
    samples = {}
    for family in text_string_to_metric_families(await response.text()):
        for sample in family.samples:
            samples[(sample.name, frozenset(sample.labels.items()))] = sample.value
    return samples


def value(samples: dict[tuple[str, frozenset[tuple[str, str]]], float], name: str, **labels: str) -> float:
    return samples[(name, frozenset(labels.items()))]


def rejections(samples: dict[tuple[str, frozenset[tuple[str, str]]], float]) -> dict[str, float]:
    """The non-zero rejection counters by reason."""
    found = {}
    for (name, labels), number in samples.items():
        if name == "hami_scheduler_node_rejections_total" and number:
            found[dict(labels)["reason"]] = number
    return found


def busy(name: str, node: str, devices: str) -> dict[str, Any]:
    pod = make_pod(name)
    pod["metadata"]["annotations"] = {POD_VGPU_NODE: node, POD_DEVICES_ALLOCATED: devices}
    return pod


# ---------------------------------------------------------------------------------------- filter
async def test_rejections_are_counted_once_per_reason_per_node(start_extender: StartExtender) -> None:
    ext = await start_extender(
        nodes=[
            make_node("fits"),
            make_node("small", memory=500),  # both cards too small: one CardInsufficientMemory
            make_node("one-card", cards=1),
            make_node("garbage", register="{not json"),
            make_node("mixed"),
        ],
        # on "mixed" card 0 lacks memory and card 1 lacks cores: two reasons, each once
        pods=[
            busy("a", "mixed", "GPU-mixed-0,NVIDIA,9500,10:;"),
            busy("b", "mixed", "GPU-mixed-1,NVIDIA,100,90:;"),
            make_pod("q", gpus=2, memory=1000),  # pending; its FilteringFailed Event needs it stored
        ],
    )
    before = await scrape(ext)
    assert rejections(before) == {}
    assert {dict(k[1])["reason"] for k in before if k[0] == "hami_scheduler_node_rejections_total"} == set(
        VOCABULARY
    )  # every label value exists from the start, and no other
    pod = make_pod("p", gpus=1, memory=1000, cores=30)
    result = await ext.filter(pod, ["fits", "small", "one-card", "garbage", "ghost", "mixed"])
    assert result["NodeNames"] == ["fits", "one-card"]
    assert result["FailedNodes"]["mixed"] == "1/2 CardInsufficientCore, 1/2 CardInsufficientMemory"
    after = await scrape(ext)
    assert rejections(after) == {
        "CardInsufficientMemory": 2,  # small, mixed
        "CardInsufficientCore": 1,  # mixed
        "NodeUnregistered": 2,  # garbage (malformed), ghost (unknown)
    }
    assert value(after, "hami_scheduler_unschedulable_total") == 0

    two = make_pod("q", gpus=2, memory=1000)
    result = await ext.filter(two, ["small", "one-card", "ghost"])
    assert result["NodeNames"] == []
    after = await scrape(ext)
    assert rejections(after) == {
        "CardInsufficientMemory": 3,
        "CardInsufficientCore": 1,
        "NodeUnregistered": 3,
        "NodeInsufficientDevice": 1,
    }
    assert value(after, "hami_scheduler_unschedulable_total") == 1
    # a pod without GPUs is not judged: nothing counted
    await ext.filter(make_pod("cpu", gpus=0), ["ghost"])
    assert value(await scrape(ext), "hami_scheduler_unschedulable_total") == 1
    await ext.settle()
    (event,) = [
        r.data
        for r in ext.apiserver["post", kmock.resource("v1/events")]
        if r.data["reason"] == "FilteringFailed"
    ]
    assert event["involvedObject"]["name"] == "q"
    assert event["message"].startswith("no available node, 3 nodes do not meet: ")
    assert "1 nodes NodeInsufficientDevice(one-card)" in event["message"]
    assert "1 nodes node unregistered(+1 unknown)" in event["message"]  # "ghost" is not echoed
    assert event["message"].endswith(". Every node in detail: hami explain default/q")


async def test_each_verb_is_timed(start_extender: StartExtender) -> None:
    ext = await start_extender(nodes=[make_node("n1")], pods=[make_pod("p")])
    await ext.filter(make_pod("p"), ["n1"])
    await ext.filter(make_pod("p"), ["n1"])
    await ext.prioritize(make_pod("p"), ["n1"])
    assert await ext.bind("p", "n1") == {"Error": ""}
    assert (await ext.client.post("/filter", data=b"")).status == 400
    samples = await scrape(ext)
    counts = {
        verb: value(samples, "hami_scheduler_request_seconds_count", verb=verb)
        for verb in ("filter", "prioritize", "bind")
    }
    assert counts == {"filter": 3, "prioritize": 1, "bind": 1}
    assert value(samples, "hami_scheduler_requests_total", verb="filter", outcome="error") == 1
    for verb in counts:
        total = value(samples, "hami_scheduler_request_seconds_sum", verb=verb)
        assert 0 < total < 5 * time_scale()  # seconds, not milliseconds


# ------------------------------------------------------------------------------------------ bind
async def test_bind_outcomes(start_extender: StartExtender) -> None:
    ext = await start_extender(
        nodes=[make_node("n1"), make_node("n2", cards=1)],
        pods=[make_pod("p"), make_pod("q"), make_pod("huge", memory=20000), make_pod("r")],
    )
    # the first Binding is refused (slices count requests): not applied, so the bind fails
    (ext.apiserver**10)["post", PODS, kmock.subresource("binding")][:1] << 500
    assert (await ext.bind("r", "n2"))["Error"].startswith("500 ")
    assert await ext.bind("p", "n1") == {"Error": ""}
    assert await ext.bind("p", "n1") == {"Error": ""}  # kube-scheduler's retry: nothing to write
    assert (await ext.bind("p", "n2"))["Error"].endswith("already bound to node n1: refused")
    assert (await ext.bind("q", "n1"))["Error"].startswith("node n1 has been locked")
    assert "does not fit node n2" in (await ext.bind("huge", "n2"))["Error"]
    assert (await ext.bind("ghost", "n2"))["Error"] == "pod default/ghost not found"
    await ext.post("/bind", {"PodName": "p", "PodNamespace": "default", "Node": 3})
    samples = await scrape(ext)
    assert {r: value(samples, "hami_scheduler_binds_total", result=r) for r in BIND_RESULTS} == {
        "success": 1,
        "already_bound": 1,
        "refused": 1,
        "deadline": 0,
        "lock_busy": 1,
        "no_fit": 1,
        "pod_missing": 1,
        "api_error": 1,
        "invalid": 1,
    }
    await ext.settle()
    failed = {
        r.data["involvedObject"]["name"]: r.data["message"]
        for r in ext.apiserver["post", kmock.resource("v1/events")]
        if r.data["reason"] == "BindingFailed"
    }
    assert failed["huge"].endswith("kube-scheduler retries the pod on the nodes that fit")
    assert "check the API server and the scheduler's permissions" in failed["r"]


async def test_lock_hold_time_runs_from_acquire_until_the_watch_sees_it_go(
    start_extender: StartExtender,
) -> None:
    ext = await start_extender(nodes=[make_node("n1"), make_node("n2")], pods=[make_pod("p"), make_pod("r")])
    hold = "hami_scheduler_node_lock_hold_seconds"
    # a bind that fails after locking releases the lock itself: one hold, ended by its own release
    (ext.apiserver**10)["post", PODS, kmock.subresource("binding")][:1] << 500  # the first binding
    assert (await ext.bind("r", "n2"))["Error"].startswith("500 ")
    await eventually(
        lambda: ext.ctx.metrics.lock_holds.pending() == 0, "the failed bind's release to be seen"
    )
    assert value(await scrape(ext), hold + "_count") == 1
    assert ext.ctx.snapshot.lock_of("n2") is None

    started = time.monotonic()
    assert await ext.bind("p", "n1") == {"Error": ""}
    await eventually(lambda: ext.ctx.snapshot.lock_of("n1") is not None, "the watch to show the lock")
    assert value(await scrape(ext), hold + "_count") == 1  # still held: the node agent has not released it
    assert ext.ctx.metrics.lock_holds.pending() == 1
    first = value(await scrape(ext), hold + "_sum")
    # the node agent releases it after Allocate
    assert await release_node_lock(ext.ctx.api, "n1", "default", "p")
    await eventually(lambda: ext.ctx.metrics.lock_holds.pending() == 0, "the release to be seen")
    elapsed = time.monotonic() - started
    samples = await scrape(ext)
    assert value(samples, hold + "_count") == 2
    assert 0 < value(samples, hold + "_sum") - first <= elapsed
    assert value(samples, hold + "_bucket", le="+Inf") == 2


def test_lock_holds_bookkeeping() -> None:
    now = [100.0]
    histogram = Histogram("h", "h", buckets=(1.0, 10.0, 100.0), registry=None)
    holds = LockHolds(histogram, lambda: now[0], per_node=2)
    holds.acquired("n", "v1", current=None)
    now[0] = 101.0
    holds.seen("n", "old")  # an event from before the acquire, still in flight: ignored
    holds.seen("n", "v1")
    now[0] = 103.5
    holds.acquired("n", "v1", current="v1")  # re-entrant: the same hold goes on
    holds.seen("n", None)
    assert next(iter(histogram.collect())).samples[-2].value == 3.5  # _sum: from the first acquire
    assert holds.pending() == 0
    holds.acquired("n", "a", current=None)  # watch never shows them; only the last two are kept
    holds.acquired("n", "b", current=None)
    holds.acquired("n", "c", current=None)
    assert holds.pending() == 2
    holds.seen("n", "c")
    holds.seen("n", "d")  # c taken over: observed; b never seen: stays
    assert holds.pending() == 1
    assert [s.value for s in next(iter(histogram.collect())).samples if s.name == "h_count"] == [2]


# ----------------------------------------------------------------------------- snapshot, watches
async def test_snapshot_sizes_are_computed_at_scrape_time(start_extender: StartExtender) -> None:
    ext = await start_extender(
        nodes=[make_node("a", cards=2), make_node("b", cards=3), make_node("broken", register="{")],
        pods=[busy("running", "a", "GPU-a-0,NVIDIA,1000,10:;"), make_pod("p")],
    )
    samples = await scrape(ext)
    sizes = {k: value(samples, f"hami_scheduler_snapshot_{k}") for k in ("nodes", "cards", "pods_tracked")}
    assert sizes == {"nodes": 3, "cards": 5, "pods_tracked": 1}
    assert await ext.bind("p", "b") == {"Error": ""}
    assert value(await scrape(ext), "hami_scheduler_snapshot_pods_tracked") == 2
    await ext.apiserver.delete("/api/v1/nodes/broken")
    await eventually(lambda: len(list(ext.ctx.snapshot.entries())) == 2, "the node deletion")
    assert value(await scrape(ext), "hami_scheduler_snapshot_nodes") == 2


async def test_watch_restarts_are_counted(
    apiserver: kmock.KubernetesEmulator, start_extender: StartExtender
) -> None:
    expired = {
        "type": "ERROR",
        "object": {"kind": "Status", "code": 410, "reason": "Expired", "message": "old"},
    }
    apiserver[kmock.action.WATCH, PODS][:1] << b""  # the first pod watch ends at once
    apiserver[kmock.action.WATCH, NODES][:1] << (json.dumps(expired) + "\n").encode()
    ext = await start_extender(nodes=[make_node("n1")])
    restarts = "hami_scheduler_watch_restarts_total"

    async def counted() -> dict[tuple[str, str], float]:
        samples = await scrape(ext)
        return {
            (dict(labels)["resource"], dict(labels)["cause"]): number
            for (name, labels), number in samples.items()
            if name == restarts
        }

    await eventually(lambda: len(apiserver[kmock.action.WATCH, PODS]) >= 2, "the pod watch to be reopened")
    await eventually(lambda: len(apiserver[kmock.action.WATCH, NODES]) >= 2, "the node watch to be reopened")
    found = await counted()
    assert {k: v for k, v in found.items() if v} == {("pods", "ended"): 1, ("nodes", "gone_410"): 1}
    # nodes, pods, resourcequotas, poddisruptionbudgets x ended, dropped, gone_410, error, from the start
    assert len(found) == 16


# --------------------------------------------------------------------------------- vocabulary
def test_reason_labels_are_a_closed_vocabulary() -> None:
    exclusions = (Reason.NODE_UNREGISTERED, Reason.HANDSHAKE_UNANSWERED, Reason.REGISTRATION_MALFORMED)
    assert {label(reason) for reason in exclusions} == {"NodeUnregistered"}
    assert label(Reason.DEVICE_TYPE_NOT_FOUND) == "DeviceTypeNotFound"
    assert label(Reason.NODE_INSUFFICIENT_DEVICE) == "NodeInsufficientDevice"
    card = Rejection(
        node="n",
        reasons={Reason.CARD_INSUFFICIENT_MEMORY: 3, Reason.CARD_NOT_HEALTH: 1},
        total=4,
        resolvable=True,
    )
    assert rejection_words(card) == {"CardInsufficientMemory", "CardNotHealth"}
    assert set(VOCABULARY) == {label(reason) for reason in Reason}
    assert set(VOCABULARY) >= {"CardUuidMismatch", "NodeUsageUnavailable"}
    # HAMi's 18 words and our CardEnforcementInsufficient; every exclusion is one
    assert len(VOCABULARY) == len(set(VOCABULARY)) == 19
    assert advice([frozenset({"CardNotFoundCustomFilterRule"})]) == ""  # a word without a remedy
    assert advice(
        [frozenset({"NodeUnregistered"}), frozenset({"CardCordoned", "NodeUnregistered"})]
    ).startswith("NodeUnregistered: the node agent")


def test_failure_summary_stays_short_on_large_clusters() -> None:
    failed = {f"n{i:02d}": "1/1 CardInsufficientMemory" for i in range(8)}
    failed.update({f"u{i}": f"reason {i}" for i in range(6)})
    text = failure_summary(failed, len(failed))
    assert text == (
        "no available node, 14 nodes do not meet: "
        "8 nodes 1/1 CardInsufficientMemory(n00,n01,n02,n03,n04,+3 more); "
        "1 nodes reason 0(u0); 1 nodes reason 1(u1); 1 nodes reason 2(u2); 1 nodes reason 3(u3); "
        "+2 more reasons"
    )


async def test_every_labelled_series_exists_from_start_up(start_extender: StartExtender) -> None:
    """docs/metrics.md: every label value of a labelled counter (and histogram) is there at 0 before the
    first event, so rate() and alerts work from the start. Traffic may change values, never add series."""
    ext = await start_extender(nodes=[make_node("n1")], pods=[make_pod("p")])

    async def series() -> set[tuple[str, frozenset[tuple[str, str]]]]:
        response = await ext.probes.get("/metrics")
        found = set()
        for family in text_string_to_metric_families(await response.text()):
            if family.type in ("counter", "histogram"):
                found |= {(s.name, frozenset(s.labels.items())) for s in family.samples}
        return found

    before = await series()
    await ext.filter(make_pod("p"), ["n1"])
    assert (await ext.client.post("/filter", data=b"")).status == 400
    await ext.prioritize(make_pod("p"), ["n1"])
    assert (await ext.client.post("/prioritize", data=b"")).status == 400
    assert await ext.bind("p", "n1") == {"Error": ""}
    assert (await ext.client.post("/bind", data=b"")).status == 400
    deadline = asyncio.get_running_loop().time() + 10
    while True:  # the bind's patches reach the pod and node watches
        samples = await scrape(ext)
        if value(samples, "hami_scheduler_watch_events_total", kind="pod"):
            break
        assert asyncio.get_running_loop().time() < deadline, "no pod watch event applied"
        await asyncio.sleep(0.01)
    assert value(samples, "hami_scheduler_requests_total", verb="bind", outcome="error") == 1
    after = await series()
    assert after - before == set()
    kinds = {dict(labels)["kind"] for name, labels in before if name == "hami_scheduler_watch_events_total"}
    assert kinds == {"node", "pod", "quota", "pdb"}
    restarts = {
        dict(labels)["resource"] for name, labels in before if name == "hami_scheduler_watch_restarts_total"
    }
    assert restarts == {"nodes", "pods", "resourcequotas", "poddisruptionbudgets"}
