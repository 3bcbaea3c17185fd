"""Hostile bodies on ``/prioritize`` and ``/bind`` (``/filter``'s are in test_filter, the 413s in
test_body_limit): each gets a clear answer that names the problem, writes nothing, and the service goes
on serving. ``/prioritize`` has no error field (``HostPriorityList``), so its refusals are HTTP 400;
``/bind`` answers HTTP 200 with ``Error`` (kube-scheduler shows it on the pod), an empty body 400
(docs/protocol.md, "Extender"). Also ``/prioritize`` with template ``Nodes`` (full Node objects, the form
kube-scheduler sends when ``nodeCacheCapable`` is false): they are judged from their own annotations.
"""

from __future__ import annotations

import json
from typing import Any

import kmock
import pytest

from hami.annotations import POD_DEVICES_ALLOCATED, POD_VGPU_NODE
from tests.builders import make_node, make_pod

from .kit import Extender, StartExtender

MIB = 1024 * 1024
PODS = kmock.resource("v1/pods")
NODES = kmock.resource("v1/nodes")
GOOD_BIND = {"PodName": "p", "PodNamespace": "default", "PodUID": "uid-p", "Node": "n1"}


async def raw(ext: Extender, path: str, data: bytes | str) -> tuple[int, str]:
    response = await ext.client.post(path, data=data, headers={"Content-Type": "application/json"})
    return response.status, await response.text()


def nested(depth: int) -> str:
    """A JSON array nested ``depth`` levels deep (a few bytes per level: deep, yet far below 1 MiB)."""
    return "[" * depth + "]" * depth


async def still_serving(ext: Extender) -> None:
    """A good request still gets its answer: nothing above broke the service."""
    assert await ext.prioritize(make_pod("ok"), ["n1"]) == [{"Host": "n1", "Score": 0}]
    assert (await ext.probes.get("/healthz")).status == 200


def no_writes(ext: Extender) -> None:
    assert len(ext.apiserver["patch", PODS]) == 0
    assert len(ext.apiserver["patch", NODES]) == 0
    assert len(ext.apiserver["post", PODS, kmock.subresource("binding")]) == 0


# ----------------------------------------------------------------------------------- /prioritize


PRIORITIZE_REFUSED = [
    (b"", "Please send a request body"),
    (b"{nope", "request body is not JSON"),
    (b"\xff\xfe\x00", "request body is not JSON"),
    (b"[]", "request body must be a JSON object, got list"),
    (b'"Pod"', "request body must be a JSON object, got str"),
    (b"42", "request body must be a JSON object, got int"),
    (b"null", "request body must be a JSON object, got NoneType"),
    (b'{"Pod": "p", "NodeNames": ["n1"]}', 'Pod must be an object, got "p"'),
    (b'{"Pod": [], "NodeNames": ["n1"]}', "Pod must be an object, got []"),
    (b'{"Pod": {}, "NodeNames": "n1"}', 'NodeNames must be a list of strings, got "n1"'),
    (b'{"Pod": {}, "NodeNames": ["n1", 2]}', 'NodeNames must be a list of strings, got ["n1", 2]'),
    (b'{"Pod": {}, "NodeNames": null, "Nodes": []}', "Nodes must be a NodeList object, got []"),
    (b'{"Pod": {}, "NodeNames": null, "Nodes": {"items": 5}}', "Nodes must be a NodeList object"),
    (b'{"Pod": {}, "NodeNames": null, "Nodes": {"items": [5]}}', "Nodes.items[0] must be a Node object"),
    (b'{"Pod": {}, "NodeNames": null, "Nodes": {"items": [{"metadata": 5}]}}', "Nodes.items[0].metadata"),
]


@pytest.mark.parametrize(("body", "reason"), PRIORITIZE_REFUSED)
async def test_prioritize_refuses_a_bad_body_with_400_and_the_reason(
    start_extender: StartExtender, body: bytes, reason: str
) -> None:
    ext = await start_extender(nodes=[make_node("n1")])
    status, text = await raw(ext, "/prioritize", body)
    assert status == 400, text
    assert reason in text
    await still_serving(ext)


async def test_prioritize_survives_deep_nesting(start_extender: StartExtender) -> None:
    # 100,000 levels in 200 KB: Python's json would raise RecursionError (not a ValueError)
    ext = await start_extender(nodes=[make_node("n1")])
    for body in (nested(100_000), '{"Pod": ' + nested(100_000) + "}"):
        status, text = await raw(ext, "/prioritize", body)
        assert status == 400, text
        assert "request body is not JSON" in text
    await still_serving(ext)


@pytest.mark.parametrize(
    "pod",
    [
        {"metadata": 5, "spec": "x"},
        {"metadata": {"annotations": ["x"], "name": 7}, "spec": {"containers": "x"}},
        {"spec": {"containers": [5, None, {"resources": "x"}]}},
        {"spec": {"containers": [{"resources": {"limits": {"nvidia.com/gpu": {"x": 1}}}}]}},
        {"spec": {"containers": [{"resources": {"limits": {"nvidia.com/gpu": "1e999999999"}}}]}},
    ],
    ids=["not-objects", "wrong-types", "bad-containers", "bad-quantity-type", "huge-quantity"],
)
async def test_prioritize_scores_an_unreadable_pod_zero(start_extender: StartExtender, pod: Any) -> None:
    # a Pod that is an object but not a readable one: no GPU request can be read, every node scores 0
    ext = await start_extender(nodes=[make_node("n1")])
    assert await ext.post("/prioritize", {"Pod": pod, "NodeNames": ["n1", "n2"]}) == [
        {"Host": "n1", "Score": 0},
        {"Host": "n2", "Score": 0},
    ]
    await still_serving(ext)


async def test_prioritize_of_many_nodes_under_the_limit(start_extender: StartExtender) -> None:
    # a body just under 1 MiB of node names: every name answered, in order (unknown ones score 0)
    ext = await start_extender(nodes=[make_node("n1")])
    names = [f"node-{i:06d}" for i in range(65_000)]
    body = json.dumps({"Pod": make_pod("p"), "NodeNames": names}).encode()
    assert MIB // 2 < len(body) < MIB
    status, text = await raw(ext, "/prioritize", body)
    assert status == 200, text[:200]
    scores = json.loads(text)
    assert [s["Host"] for s in scores] == names
    assert {s["Score"] for s in scores} == {0}
    await still_serving(ext)


async def test_prioritize_without_a_pod_scores_zero(start_extender: StartExtender) -> None:
    ext = await start_extender(nodes=[make_node("n1")])
    assert await ext.post("/prioritize", {"NodeNames": ["n1"]}) == [{"Host": "n1", "Score": 0}]


# ------------------------------------------------------------------------- /prioritize, template Nodes


async def test_prioritize_judges_template_nodes_from_their_own_annotations(
    start_extender: StartExtender,
) -> None:
    # "n1" is also a real node with a pod on it (binpack 4, spread 6 when asked by name); the template
    # of the same name is judged from its annotations alone, with nothing used
    used = make_pod("used", memory=5000, cores=50)
    used["metadata"]["annotations"] = {
        POD_VGPU_NODE: "n1",
        POD_DEVICES_ALLOCATED: "GPU-n1-0,NVIDIA,5000,50:;",
    }
    ext = await start_extender(nodes=[make_node("n1", cards=1)], pods=[used])
    spread = make_pod("q", annotations={"hami.io/node-scheduler-policy": "spread"})
    assert await ext.prioritize(spread, ["n1"]) == [{"Host": "n1", "Score": 6}]
    templates = {"items": [make_node("n1", cards=1), make_node("tpl-bad", register="x"), make_node("tpl-2")]}
    body = {"Pod": spread, "Nodes": templates, "NodeNames": None}
    assert await ext.post("/prioritize", body) == [
        {"Host": "n1", "Score": 10},  # empty: the real node's pod does not count
        {"Host": "tpl-bad", "Score": 0},  # unregistered: excluded
        {"Host": "tpl-2", "Score": 10},
    ]
    binpack = {**body, "Pod": make_pod("b")}
    assert await ext.post("/prioritize", binpack) == [
        {"Host": "n1", "Score": 0},
        {"Host": "tpl-bad", "Score": 0},
        {"Host": "tpl-2", "Score": 0},
    ]
    # lower-case keys, as Go decodes them; a template without a name is answered under ""
    lower = {"pod": spread, "nodes": {"items": [{"metadata": {}}]}}
    assert await ext.post("/prioritize", lower) == [{"Host": "", "Score": 0}]
    no_writes(ext)


# ------------------------------------------------------------------------------------------- /bind


BIND_REFUSED = [
    (b"{nope", "request body is not JSON"),
    (b"[1, 2]", "request body must be a JSON object, got list"),
    (b"null", "request body must be a JSON object, got NoneType"),
    (b"{}", "PodName is missing or empty"),
    (json.dumps({**GOOD_BIND, "Node": ""}).encode(), "Node is missing or empty"),
    (
        json.dumps({k: v for k, v in GOOD_BIND.items() if k != "PodNamespace"}).encode(),
        "PodNamespace is missing",
    ),
    (json.dumps({**GOOD_BIND, "PodName": 5}).encode(), "PodName must be a string, got 5"),
    (json.dumps({**GOOD_BIND, "Node": None}).encode(), "Node must be a string, got null"),
    (json.dumps({**GOOD_BIND, "PodUID": ["u"]}).encode(), 'PodUID must be a string, got ["u"]'),
    (
        json.dumps({**GOOD_BIND, "PodNamespace": {"a": 1}}).encode(),
        'PodNamespace must be a string, got {"a": 1}',
    ),
    (nested(100_000).encode(), "request body is not JSON"),
]


@pytest.mark.parametrize(("body", "reason"), BIND_REFUSED)
async def test_bind_answers_a_bad_body_with_the_reason_and_writes_nothing(
    start_extender: StartExtender, body: bytes, reason: str
) -> None:
    ext = await start_extender(nodes=[make_node("n1")], pods=[make_pod("p")])
    status, text = await raw(ext, "/bind", body)
    assert status == 200, text
    assert reason in json.loads(text)["Error"]
    no_writes(ext)
    assert len(ext.apiserver["post", kmock.resource("v1/events")]) == 0
    # the service goes on: the same pod binds with a good body afterwards
    assert await ext.bind("p", "n1") == {"Error": ""}


async def test_bind_with_an_empty_body_is_400(start_extender: StartExtender) -> None:
    ext = await start_extender(nodes=[make_node("n1")])
    assert await raw(ext, "/bind", b"") == (400, "Please send a request body")
    await still_serving(ext)


@pytest.mark.parametrize(
    "field",
    [
        ("PodName", "p/../../x"),
        ("PodName", "x" * 300_000),
        ("PodNamespace", "../kube-system"),
        ("Node", "n1/status"),
        ("Node", "n" * 300_000),
        ("Node", "N1"),
        ("PodUID", "uid p"),
        ("PodUID", "u" * 129),
    ],
    ids=[
        "name-path",
        "name-huge",
        "namespace-path",
        "node-path",
        "node-huge",
        "node-upper",
        "uid-space",
        "uid-long",
    ],
)
async def test_bind_of_names_that_are_not_kubernetes_names(
    start_extender: StartExtender, field: tuple[str, str]
) -> None:
    # not names the API server could hold: refused without a request to it, nothing written
    ext = await start_extender(nodes=[make_node("n1")], pods=[make_pod("p")])
    key, value = field
    result = await ext.post("/bind", {**GOOD_BIND, key: value})
    assert result["Error"].startswith(f"{key} must be a Kubernetes "), result["Error"][:200]
    assert len(result["Error"]) < 300  # the value is quoted shortened
    assert [r for r in ext.apiserver["get"] if r.name] == []  # no pod or node was read
    no_writes(ext)
    assert await ext.bind("p", "n1") == {"Error": ""}


async def test_bind_ignores_unknown_fields_and_reads_keys_as_go_does(start_extender: StartExtender) -> None:
    ext = await start_extender(nodes=[make_node("n1")], pods=[make_pod("p")])
    body = {"podname": "p", "PODNAMESPACE": "default", "PodUid": "uid-p", "node": "n1", "Extra": {"x": [1]}}
    assert await ext.post("/bind", body) == {"Error": ""}
    assert (await ext.pod("p"))["spec"]["nodeName"] == "n1"


def _deep_body(depth: int) -> str:
    """A /filter body whose pod's first container carries a value nested ``depth`` levels: it decodes
    (Python's json nests about a thousand levels) but every later walk of it recurses that deep."""
    pod = make_pod("deep")
    pod["spec"]["containers"][0]["args"] = "DEEP"
    return json.dumps({"Pod": pod, "NodeNames": ["n1"]}).replace('"DEEP"', nested(depth))


async def test_a_body_nested_deeper_than_any_object_is_refused_on_every_verb(
    start_extender: StartExtender,
) -> None:
    """A body nesting deeper than any Kubernetes object (600 levels: Python's json decodes it) is refused
    by name before a verb walks it: each walk (the scheduling cycle's digest serialises the pod) would
    recurse that deep, and near Python's recursion limit a walk deeper in the stack than the decoder
    failed with an HTTP 500. Before, 600 levels were accepted."""
    ext = await start_extender(nodes=[make_node("n1")])
    body = _deep_body(600)
    status, text = await raw(ext, "/filter", body)
    assert status == 200, text
    assert "nests deeper than 200 levels" in json.loads(text)["Error"]
    status, text = await raw(ext, "/prioritize", body)
    assert status == 400 and "nests deeper than 200 levels" in text, text
    await still_serving(ext)
    status, text = await raw(ext, "/filter", _deep_body(150))  # deep, but within the bound
    assert status == 200 and json.loads(text)["NodeNames"] == ["n1"], text
