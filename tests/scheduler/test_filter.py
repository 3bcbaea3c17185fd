"""/filter and /prioritize over HTTP with real extender JSON, fed by the embedded API server."""

from __future__ import annotations

from typing import Any

import kmock

from hami.annotations import (
    NODE_HANDSHAKE,
    NODE_PAIR_SCORES,
    NODE_REGISTER,
    POD_DEVICES_ALLOCATED,
    POD_VGPU_NODE,
)
from hami.core.rejection import Reason, Rejection
from hami.scheduler.snapshot import local_time
from tests.builders import NOW, make_node, make_pod
from tests.eventually import eventually

from .kit import StartExtender

EVENTS = kmock.resource("v1/events")


def _events(apiserver: kmock.KubernetesEmulator, reason: str) -> list[dict[str, Any]]:
    return [r.data for r in apiserver["post", EVENTS] if r.data["reason"] == reason]


async def test_filter_returns_every_fitting_node_and_why_the_others_fail(
    start_extender: StartExtender,
) -> None:
    ext = await start_extender(
        nodes=[
            make_node("fits-a"),
            make_node("fits-b"),
            make_node("small", memory=500),  # 500 MiB cards: a 1000 MiB pod never fits
            make_node("one-card", cards=1),
            make_node("garbage", register="{not json"),
            make_node("no-register", annotations={NODE_REGISTER: ""}),
        ]
    )
    pod = make_pod("p", gpus=2, memory=1000)
    names = ["fits-a", "small", "fits-b", "one-card", "garbage", "ghost"]
    result = await ext.filter(pod, names)
    assert result["Error"] == ""
    assert result["NodeNames"] == ["fits-a", "fits-b"]
    assert result["FailedNodes"] == {}
    unresolvable = result["FailedAndUnresolvableNodes"]
    assert unresolvable["small"] == "2/2 CardInsufficientMemory"
    assert unresolvable["one-card"] == "NodeInsufficientDevice"
    assert unresolvable["ghost"] == "node unregistered"
    assert unresolvable["garbage"].startswith('node unregistered: hami.io/node-nvidia-register "{not json"')
    assert set(unresolvable) == {"small", "one-card", "garbage", "ghost"}
    # each malformed registration got exactly one Warning Event on its Node
    await ext.settle()
    events = _events(ext.apiserver, "InvalidNodeRegistration")
    assert sorted(e["involvedObject"]["name"] for e in events) == ["garbage", "no-register"]
    garbage = next(e for e in events if e["involvedObject"]["name"] == "garbage")
    assert garbage["involvedObject"] == {"apiVersion": "v1", "kind": "Node", "name": "garbage"}
    assert garbage["type"] == "Warning"
    assert str(garbage["message"]).startswith(
        "node excluded from GPU scheduling: hami.io/node-nvidia-register"
    )
    # filter is read-only: no pod was patched, nothing bound
    assert len(ext.apiserver["patch", kmock.resource("v1/pods")]) == 0


async def test_each_excluded_node_is_a_rejection_with_its_code(start_extender: StartExtender) -> None:
    missing = make_node("missing")
    del missing["metadata"]["annotations"][NODE_REGISTER]
    stale = make_node("stale", annotations={NODE_HANDSHAKE: "Requesting_2020-01-01 00:00:00"})
    stale["status"]["allocatable"] = {"nvidia.com/gpu": "0"}
    ext = await start_extender(
        nodes=[
            make_node("garbage", register="{not json"),
            missing,
            make_node("empty", register="[]"),
            make_node("bad-scores", annotations={NODE_PAIR_SCORES: "[1]"}),
            stale,
        ]
    )
    codes = {
        "garbage": Reason.REGISTRATION_MALFORMED,
        "missing": Reason.REGISTRATION_MISSING,
        "empty": Reason.NO_GPU_REGISTERED,
        "bad-scores": Reason.PAIR_SCORES_MALFORMED,
        "stale": Reason.HANDSHAKE_UNANSWERED,
        "ghost": Reason.NODE_UNREGISTERED,
    }
    result = await ext.filter(make_pod("p"), list(codes))
    unresolvable = result["FailedAndUnresolvableNodes"]
    assert result["NodeNames"] == [] and set(unresolvable) == set(codes) and result["FailedNodes"] == {}
    for name, code in codes.items():
        found = ext.ctx.snapshot.candidate(name, local_time(NOW))
        assert isinstance(found, Rejection) and found.reasons == {code: 1} and not found.resolvable, name
        assert unresolvable[name] == found.message, name  # the text is rendered from the code, once
    # HAMi's wire text is unchanged: "node unregistered", with the detail after a colon
    assert unresolvable["ghost"] == "node unregistered"
    assert unresolvable["missing"] == (
        "node unregistered: hami.io/node-nvidia-register (missing): "
        "annos not found hami.io/node-nvidia-register"
    )
    assert (
        unresolvable["empty"] == 'node unregistered: hami.io/node-nvidia-register "[]": no gpu found on node'
    )
    assert unresolvable["stale"] == (
        "node unregistered: handshake 'Requesting_2020-01-01 00:00:00' unanswered and nvidia.com/gpu "
        "allocatable is 0"
    )
    assert unresolvable["bad-scores"].startswith('node unregistered: hami.io/node-nvidia-score "[1]": ')


async def test_duplicate_keys_in_any_case_the_later_one_wins_as_go_decodes(
    start_extender: StartExtender,
) -> None:
    ext = await start_extender(nodes=[make_node("n1"), make_node("n2")])
    result = await ext.post("/filter", {"Pod": make_pod("p"), "NodeNames": ["n1"], "nodenames": ["n2"]})
    assert result["NodeNames"] == ["n2"]
    result = await ext.post("/filter", {"nodeNames": ["n2"], "NODENAMES": ["n1"], "pod": make_pod("p")})
    assert result["NodeNames"] == ["n1"]


async def test_used_cards_are_a_resolvable_failure(start_extender: StartExtender) -> None:
    busy = make_pod("busy", gpus=1, memory=9500)
    busy["metadata"]["annotations"] = {
        POD_VGPU_NODE: "n1",
        POD_DEVICES_ALLOCATED: "GPU-n1-0,NVIDIA,9500,30:;",
    }
    pending = make_pod("p", memory=1000)  # Events are written only about pods the API server has
    ext = await start_extender(nodes=[make_node("n1", cards=1)], pods=[busy, pending])
    result = await ext.filter(pending, ["n1"])
    assert result["NodeNames"] == []
    assert result["FailedNodes"] == {"n1": "1/1 CardInsufficientMemory"}
    await ext.settle()
    (event,) = _events(ext.apiserver, "FilteringFailed")
    assert event["message"] == (
        "no available node, 1 nodes do not meet: 1 nodes 1/1 CardInsufficientMemory(n1). "
        "CardInsufficientMemory: the cards lack free memory: ask for less GPU memory, or wait for other "
        "GPU pods to finish. Every node in detail: hami explain default/p"
    )
    assert event["involvedObject"]["name"] == "p"
    # the busy pod finishing frees the card: the watch applies it incrementally
    await ext.apiserver.patch("/api/v1/namespaces/default/pods/busy", json={"status": {"phase": "Succeeded"}})
    await eventually(
        lambda: ext.ctx.snapshot.record(("default", "busy")) is None, "the finished pod to drop out"
    )
    assert (await ext.filter(make_pod("p", memory=1000), ["n1"]))["NodeNames"] == ["n1"]


async def test_a_pod_without_gpus_passes_through(start_extender: StartExtender) -> None:
    ext = await start_extender(nodes=[make_node("n1")])
    result = await ext.filter(make_pod("plain", gpus=0), ["n1", "anything"])
    assert result["NodeNames"] == ["n1", "anything"]
    assert result["Error"] == ""


async def test_template_nodes_are_judged_from_their_annotations_alone(start_extender: StartExtender) -> None:
    ext = await start_extender()
    nodes = {
        "items": [
            make_node("tpl-big"),
            make_node("tpl-small", memory=100),
            make_node("tpl-bad", register="x"),
        ]
    }
    body = {"Pod": make_pod("p", memory=1000), "Nodes": nodes, "NodeNames": None}
    result = await ext.post("/filter", body)
    assert [n["metadata"]["name"] for n in result["Nodes"]["items"]] == ["tpl-big"]
    assert result["NodeNames"] == ["tpl-big"]
    assert set(result["FailedAndUnresolvableNodes"]) == {"tpl-small", "tpl-bad"}
    assert len(ext.apiserver["patch"]) == 0 or all("pods" not in str(r.url) for r in ext.apiserver["patch"])


async def test_prioritize_follows_the_node_policy_and_the_pod_override(start_extender: StartExtender) -> None:
    used = make_pod("used", gpus=1, memory=5000, cores=50)
    # n-half: one of one card, 1/10 slots, 50/100 cores, 5000/10000 MiB -> 10 x (0.1 + 0.5 + 0.5) = 11 -> 4
    used["metadata"]["annotations"] = {
        POD_VGPU_NODE: "n-half",
        POD_DEVICES_ALLOCATED: "GPU-n-half-0,NVIDIA,5000,50:;",
    }
    ext = await start_extender(
        nodes=[make_node("n-half", cards=1), make_node("n-empty", cards=1)], pods=[used]
    )
    pod = make_pod("p")
    assert await ext.prioritize(pod, ["n-half", "n-empty", "ghost"]) == [
        {"Host": "n-half", "Score": 4},
        {"Host": "n-empty", "Score": 0},
        {"Host": "ghost", "Score": 0},
    ]
    spread = make_pod("q", annotations={"hami.io/node-scheduler-policy": "spread"})
    assert await ext.prioritize(spread, ["n-half", "n-empty"]) == [
        {"Host": "n-half", "Score": 6},
        {"Host": "n-empty", "Score": 10},
    ]


async def test_bad_requests_get_http_status_rules(start_extender: StartExtender) -> None:
    ext = await start_extender(nodes=[make_node("n1")])
    empty = await ext.client.post("/filter", data=b"")
    assert empty.status == 400 and await empty.text() == "Please send a request body"
    garbled = await ext.client.post("/filter", data=b"{nope")
    assert garbled.status == 200 and (await garbled.json())["Error"].startswith("request body is not JSON")
    no_pod = await ext.post("/filter", {"NodeNames": ["n1"]})
    assert no_pod["Error"] == "extender args missing pod"
    # Go decodes field names case-insensitively
    lower = await ext.post("/filter", {"pod": make_pod("p"), "nodenames": ["n1"]})
    assert lower["NodeNames"] == ["n1"]
    bad_weights = make_pod("w", annotations={"hami.io/device-scoring-weights": "slot=x"})
    assert "hami.io/device-scoring-weights" in (await ext.filter(bad_weights, ["n1"]))["Error"]
    bind = await ext.post("/bind", {"PodName": "p", "PodNamespace": "default", "Node": 3})
    assert bind == {"Error": "Node must be a string, got 3"}


async def test_health_readiness_and_metrics(start_extender: StartExtender) -> None:
    ext = await start_extender(nodes=[make_node("n1", cards=1)])
    assert (await ext.probes.get("/healthz")).status == 200
    assert (await ext.probes.get("/readyz")).status == 200
    await ext.filter(make_pod("p"), ["n1"])
    text = await (await ext.probes.get("/metrics")).text()
    assert 'hami_scheduler_requests_total{outcome="ok",verb="filter"} 1.0' in text
    limit = 'hami_gpu_memory_limit_bytes{device_index="0",device_type="NVIDIA-Tesla V100-PCIE-32GB",'
    assert limit + 'device_uuid="GPU-n1-0",node="n1"} 1.048576e+10' in text
    assert 'hami_scheduler_node_usable{node="n1"} 1.0' in text


async def test_the_handshake_is_written_and_a_stale_node_is_excluded(start_extender: StartExtender) -> None:
    fresh = make_node("fresh")
    del fresh["metadata"]["annotations"][NODE_HANDSHAKE]
    stale = make_node("stale", annotations={NODE_HANDSHAKE: "Requesting_2020-01-01 00:00:00"})
    stale["status"]["allocatable"] = {"nvidia.com/gpu": "0"}
    ext = await start_extender(nodes=[fresh, stale])
    expected = "Requesting_" + local_time(NOW).strftime("%Y-%m-%d %H:%M:%S")
    await ext.settle()
    assert (await ext.node("fresh"))["metadata"]["annotations"][NODE_HANDSHAKE] == expected
    result = await ext.filter(make_pod("p"), ["fresh", "stale"])
    assert result["NodeNames"] == ["fresh"]
    assert result["FailedAndUnresolvableNodes"]["stale"].startswith("node unregistered: handshake")
    # the device plugin registers with the kubelet: allocatable > 0 makes the node usable again
    await ext.apiserver.patch(
        "/api/v1/nodes/stale", json={"status": {"allocatable": {"nvidia.com/gpu": "20"}}}
    )
    await eventually(
        lambda: ext.ctx.snapshot.problem("stale", local_time(NOW)) is None, "the node to recover"
    )
