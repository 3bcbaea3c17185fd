"""Enforcement through the running extender: ``/filter`` keeps a pod that requires ``cooperative`` off a
node whose cards have none (``CardEnforcementInsufficient`` in FailedAndUnresolvableNodes), the cluster's
``--require-enforcement`` floor cannot be lowered by a pod, an unreadable requirement is an error (never
"no requirement"), a node whose enforcement annotation is unreadable stays schedulable at ``none`` with a
Warning Event, and ``/bind`` writes ``hami.io/vgpu-enforcement`` in its one patch plus a
``NoEnforcement`` Warning Event when a granted card has none."""

from __future__ import annotations

import argparse
from typing import Any

import kmock
import pytest

from hami.annotations import (
    NODE_ENFORCEMENT,
    POD_REQUIRE_ENFORCEMENT,
    POD_VGPU_ENFORCEMENT,
    POD_VGPU_NODE,
    decode_pod_enforcement,
)
from hami.core.enforcement import Level
from hami.scheduler.bind import NO_ENFORCEMENT
from hami.scheduler.config import SchedulerSettings, add_arguments, from_args
from hami.scheduler.registration import MALFORMED_ENFORCEMENT
from hami.settings import ConfigError
from tests.builders import device, make_node, make_pod
from tests.eventually import eventually

from .faults import lost_binding
from .kit import Extender, StartExtender

EVENTS = kmock.resource("v1/events")
PODS = kmock.resource("v1/pods")


def enforced(name: str, kind: str = "hami-core", cards: int = 2) -> dict[str, Any]:
    text = ",".join(f"GPU-{name}-{i}:{kind}" for i in range(cards))
    return make_node(name, cards=cards, annotations={NODE_ENFORCEMENT: text})


def requiring(name: str, level: str | None) -> dict[str, Any]:
    return make_pod(name, annotations={} if level is None else {POD_REQUIRE_ENFORCEMENT: level})


def events(ext: Extender, reason: str) -> list[dict[str, Any]]:
    return [r.data for r in ext.apiserver["post", EVENTS] if r.data["reason"] == reason]


async def test_a_pod_requiring_cooperative_is_not_placed_on_a_node_without_enforcement(
    start_extender: StartExtender,
) -> None:
    pod = requiring("p", "cooperative")
    ext = await start_extender(nodes=[make_node("bare"), enforced("safe")], pods=[pod])
    result = await ext.filter(pod, ["bare", "safe"])
    assert result["NodeNames"] == ["safe"]
    assert result["FailedAndUnresolvableNodes"] == {"bare": "2/2 CardEnforcementInsufficient"}
    assert result["FailedNodes"] == {}
    # without a requirement (and the default floor, none) both take it, as in HAMi
    plain = requiring("q", None)
    assert (await ext.filter(plain, ["bare", "safe"]))["NodeNames"] == ["bare", "safe"]


async def test_nothing_fits_names_the_reason_and_what_to_do(start_extender: StartExtender) -> None:
    pod = requiring("p", "isolated")
    ext = await start_extender(nodes=[enforced("n1")], pods=[pod])
    result = await ext.filter(pod, ["n1"])
    assert result["NodeNames"] == [] and result["FailedAndUnresolvableNodes"] == {
        "n1": "2/2 CardEnforcementInsufficient"
    }
    await ext.settle()
    (event,) = [e for e in events(ext, "FilteringFailed")]
    assert (
        "CardEnforcementInsufficient: the cards' enforcement is below the level required" in event["message"]
    )


@pytest.mark.parametrize("level", [None, "none", "", "cooperative"])
async def test_the_cluster_floor_cannot_be_lowered_by_the_pod(
    start_extender: StartExtender, level: str | None
) -> None:
    pod = requiring("p", level)
    ext = await start_extender(
        nodes=[make_node("bare"), enforced("safe")], pods=[pod], require_enforcement=Level.COOPERATIVE
    )
    result = await ext.filter(pod, ["bare", "safe"])
    assert result["NodeNames"] == ["safe"]
    assert result["FailedAndUnresolvableNodes"] == {"bare": "2/2 CardEnforcementInsufficient"}


async def test_a_pod_raises_the_floor(start_extender: StartExtender) -> None:
    pod = requiring("p", "isolated")
    nodes = [enforced("core"), enforced("mig", "mig")]
    ext = await start_extender(nodes=nodes, pods=[pod], require_enforcement=Level.COOPERATIVE)
    assert (await ext.filter(pod, ["core", "mig"]))["NodeNames"] == ["mig"]


async def test_an_unreadable_requirement_is_an_error_not_no_requirement(
    start_extender: StartExtender,
) -> None:
    pod = requiring("p", "strict")
    ext = await start_extender(nodes=[make_node("bare")], pods=[pod])
    result = await ext.filter(pod, ["bare"])
    assert result["NodeNames"] is None or result["NodeNames"] == []
    assert POD_REQUIRE_ENFORCEMENT in result["Error"] and '"strict"' in result["Error"]
    assert await ext.bind("p", "bare") == {"Error": result["Error"]}
    assert POD_VGPU_ENFORCEMENT not in ((await ext.pod("p"))["metadata"].get("annotations") or {})


async def test_an_unreadable_node_annotation_counts_as_none_and_is_reported(
    start_extender: StartExtender,
) -> None:
    node = make_node("odd", annotations={NODE_ENFORCEMENT: "GPU-odd-0:hami-core,GPU-odd-0:mig"})
    pod, plain = requiring("p", "cooperative"), requiring("q", None)
    ext = await start_extender(nodes=[node], pods=[pod, plain])
    result = await ext.filter(pod, ["odd"])
    assert result["FailedAndUnresolvableNodes"] == {"odd": "2/2 CardEnforcementInsufficient"}
    assert (await ext.filter(plain, ["odd"]))["NodeNames"] == ["odd"]  # not excluded
    await ext.settle()
    (event,) = events(ext, MALFORMED_ENFORCEMENT)
    assert event["type"] == "Warning" and event["involvedObject"]["name"] == "odd"
    assert "card GPU-odd-0 is listed twice" in event["message"]


async def test_a_changed_node_annotation_is_read_again(start_extender: StartExtender) -> None:
    pod = requiring("p", "cooperative")
    ext = await start_extender(nodes=[make_node("n1")], pods=[pod])
    assert (await ext.filter(pod, ["n1"]))["NodeNames"] == []
    patch = {"metadata": {"annotations": {NODE_ENFORCEMENT: "GPU-n1-0:hami-core,GPU-n1-1:none"}}}
    await ext.apiserver.patch("/api/v1/nodes/n1", json=patch)

    async def placed() -> bool:
        names: list[str] = (await ext.filter(pod, ["n1"]))["NodeNames"]
        return names == ["n1"]

    await eventually(placed, "the extender to see the node's new enforcement")
    assert await ext.bind("p", "n1") == {"Error": ""}
    annotations = (await ext.pod("p"))["metadata"]["annotations"]
    assert decode_pod_enforcement(annotations[POD_VGPU_ENFORCEMENT]) == {"GPU-n1-0": "hami-core"}


async def test_bind_writes_the_granted_enforcement_and_warns_without_it(
    start_extender: StartExtender,
) -> None:
    ext = await start_extender(
        nodes=[make_node("bare"), enforced("safe")], pods=[make_pod("p"), make_pod("q")]
    )
    assert await ext.bind("p", "bare") == {"Error": ""}
    assert await ext.bind("q", "safe") == {"Error": ""}
    bare = (await ext.pod("p"))["metadata"]["annotations"]
    safe = (await ext.pod("q"))["metadata"]["annotations"]
    assert decode_pod_enforcement(bare[POD_VGPU_ENFORCEMENT]) == {"GPU-bare-1": "none"}
    assert decode_pod_enforcement(safe[POD_VGPU_ENFORCEMENT]) == {"GPU-safe-1": "hami-core"}
    # in the one allocation patch, beside the device lists
    patches = [r.data for r in ext.apiserver["patch", PODS] if isinstance(r.data, list)]
    paths = [{op["path"] for op in patch if op["op"] == "add"} for patch in patches]
    assert all("/metadata/annotations/hami.io~1vgpu-enforcement" in p for p in paths) and len(paths) == 2
    await ext.settle()
    (event,) = events(ext, NO_ENFORCEMENT)
    assert event["type"] == "Warning" and event["involvedObject"]["name"] == "p"
    assert event["message"].startswith(
        "placed on card GPU-bare-1 of node bare without enforcement: its memory/core limits are not held"
    )


async def test_bind_refuses_a_node_below_the_requirement(start_extender: StartExtender) -> None:
    ext = await start_extender(nodes=[make_node("bare")], pods=[requiring("p", "cooperative")])
    answer = await ext.bind("p", "bare")
    assert "2/2 CardEnforcementInsufficient" in answer["Error"]
    assert POD_VGPU_ENFORCEMENT not in ((await ext.pod("p"))["metadata"].get("annotations") or {})


def settings_of(argv: list[str], environ: dict[str, str] | None = None) -> SchedulerSettings:
    parser = argparse.ArgumentParser()
    add_arguments(parser, environ or {})
    return from_args(parser.parse_args(argv))


def test_the_floor_flag_defaults_to_none_and_falls_back_to_the_env() -> None:
    assert settings_of([]).require_enforcement is Level.NONE
    assert settings_of([]).policy.enforcement is Level.NONE
    assert settings_of(["--require-enforcement", "isolated"]).policy.enforcement is Level.ISOLATED
    env = {"HAMI_REQUIRE_ENFORCEMENT": "cooperative"}
    assert settings_of([], env).require_enforcement is Level.COOPERATIVE
    assert settings_of(["--require-enforcement=none"], env).require_enforcement is Level.NONE


@pytest.mark.parametrize("value", ["strict", "Cooperative", "", "hami-core"])
def test_a_bad_floor_is_refused_naming_the_flag(value: str) -> None:
    with pytest.raises(ConfigError) as caught:
        settings_of([f"--require-enforcement={value}"])
    assert str(caught.value) == (
        f"--require-enforcement must be one of none, cooperative, isolated, got {value!r}"
    )


async def test_a_bind_whose_binding_answer_is_lost_still_warns_without_enforcement(
    start_extender: StartExtender,
) -> None:
    ext = await start_extender(nodes=[make_node("bare", cards=1)], pods=[make_pod("p")])
    applied = lost_binding(ext.apiserver)  # applied, then 500: the undo re-reads it bound here
    assert await ext.bind("p", "bare") == {"Error": ""}
    assert applied == ["p"]
    await ext.settle()
    (event,) = events(ext, NO_ENFORCEMENT)
    assert event["type"] == "Warning" and event["involvedObject"]["name"] == "p"
    assert event["message"].startswith("placed on card GPU-bare-0 of node bare without enforcement")
    assert [e["involvedObject"]["name"] for e in events(ext, "BindingSucceed")] == ["p"]


async def test_an_enforcement_list_that_cannot_be_written_removes_an_earlier_attempts(
    start_extender: StartExtender,
) -> None:
    # a card UUID with a space: the register (JSON) carries it, hami.io/vgpu-enforcement cannot
    odd = make_node("odd", device("GPU odd-0"), annotations={NODE_ENFORCEMENT: ""})
    stale = {POD_VGPU_ENFORCEMENT: "GPU-n1-0:mig"}  # what an earlier, undone attempt left
    ext = await start_extender(nodes=[odd], pods=[make_pod("p", annotations=stale)])
    assert await ext.bind("p", "odd") == {"Error": ""}
    annotations = (await ext.pod("p"))["metadata"]["annotations"]
    assert annotations[POD_VGPU_NODE] == "odd"
    assert POD_VGPU_ENFORCEMENT not in annotations  # no record rather than a wrong one
