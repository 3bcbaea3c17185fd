"""Nodes, pods, bindings and events through hami.kube against the embedded API server (kmock)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import kmock
import pytest

from hami.kube.client import KubeError, NotFound, load_api_client
from hami.kube.events import record_event
from hami.kube.nodes import get_node, json_patch_node, list_nodes, patch_node_annotations
from hami.kube.pods import bind_pod, get_pod, list_pods, patch_pod

Emulator = kmock.KubernetesEmulator
NODES = kmock.resource("v1/nodes")
PODS = kmock.resource("v1/pods")


async def _node(k: Emulator, name: str, annotations: dict[str, str] | None = None) -> None:
    metadata: dict[str, Any] = {"name": name}
    if annotations is not None:
        metadata["annotations"] = annotations
    await k.post("/api/v1/nodes", json={"apiVersion": "v1", "kind": "Node", "metadata": metadata})


async def _pod(k: Emulator, name: str, node: str | None = None) -> None:
    spec: dict[str, Any] = {"containers": [{"name": "c", "image": "x"}]}
    if node:
        spec["nodeName"] = node
    body = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "default"},
        "spec": spec,
    }
    await k.post("/api/v1/namespaces/default/pods", json=body)


async def test_node_get_list_and_merge_patch_deletes_with_none(apiserver: Emulator, api: Any) -> None:
    await _node(apiserver, "n1", {"keep": "1", "drop": "2"})
    await _node(apiserver, "n2")
    patched = await patch_node_annotations(api, "n1", {"drop": None, "new": "3"})
    assert patched["metadata"]["annotations"] == {"keep": "1", "new": "3"}
    assert (await get_node(api, "n1"))["metadata"]["annotations"] == {"keep": "1", "new": "3"}
    nodes, _ = await list_nodes(api)
    assert sorted(n["metadata"]["name"] for n in nodes) == ["n1", "n2"]
    # the request really was a merge patch (strategic merge would differ on a real server)
    (patch,) = apiserver["patch", NODES]
    assert patch.headers["Content-Type"] == "application/merge-patch+json"


async def test_missing_node_raises_not_found(apiserver: Emulator, api: Any) -> None:
    with pytest.raises(NotFound) as caught:
        await get_node(api, "ghost")
    assert caught.value.status == 404


async def test_failed_json_patch_test_is_an_error_and_changes_nothing(apiserver: Emulator, api: Any) -> None:
    await _node(apiserver, "n1", {"a": "b"})
    with pytest.raises(KubeError) as caught:
        await json_patch_node(
            api,
            "n1",
            [
                {"op": "test", "path": "/metadata/annotations/a", "value": "x"},
                {"op": "replace", "path": "/metadata/annotations/a", "value": "y"},
            ],
        )
    assert caught.value.status >= 400
    assert (await get_node(api, "n1"))["metadata"]["annotations"] == {"a": "b"}


async def test_pods_patch_bind_and_node_filter(apiserver: Emulator, api: Any) -> None:
    await _pod(apiserver, "p1")
    await _pod(apiserver, "p2", node="n2")
    patched = await patch_pod(api, "default", "p1", annotations={"a": "1"}, labels={"l": "2"})
    assert patched["metadata"]["annotations"] == {"a": "1"}
    assert patched["metadata"]["labels"] == {"l": "2"}
    await bind_pod(api, "default", "p1", "n1")
    assert (await get_pod(api, "default", "p1"))["spec"]["nodeName"] == "n1"
    # the embedded server ignores field selectors: the filter must also hold client-side
    assert [p["metadata"]["name"] for p in await list_pods(api, node_name="n1")] == ["p1"]
    assert sorted(p["metadata"]["name"] for p in await list_pods(api)) == ["p1", "p2"]


async def test_events_get_unique_explicit_names(apiserver: Emulator, api: Any) -> None:
    await _pod(apiserver, "p1")
    pod = await get_pod(api, "default", "p1")
    for _ in range(2):
        await record_event(
            api,
            involved=pod,
            reason="BindingFailed",
            message="boom",
            type="Warning",
            component="hami-scheduler",
        )
    await _node(apiserver, "n1")
    await record_event(api, involved=await get_node(api, "n1"), reason="Bad", message="m", component="c")
    posts = list(apiserver["post", kmock.resource("v1/events")])
    assert len(posts) == 3
    names = {p.data["metadata"]["name"] for p in posts}
    assert len(names) == 3 and all(n.startswith(("p1.", "n1.")) for n in names)
    first = posts[0].data
    assert first["involvedObject"] == {
        "apiVersion": "v1",
        "kind": "Pod",
        "name": "p1",
        "namespace": "default",
    }
    assert (first["reason"], first["message"], first["type"]) == ("BindingFailed", "boom", "Warning")
    assert posts[2].data["involvedObject"]["kind"] == "Node"
    assert posts[2].data["metadata"]["namespace"] == "default"


async def test_a_hanging_request_fails_within_the_client_timeout(
    apiserver: Emulator, kubeconfig: Any
) -> None:
    release = asyncio.Event()

    async def hang(_: kmock.Request) -> Any:
        await release.wait()
        return 200

    apiserver["get", NODES] << hang
    client = load_api_client(str(kubeconfig), request_timeout=0.3)
    try:
        with pytest.raises(KubeError) as caught:
            await get_node(client, "n1")
        assert caught.value.status == 0 and caught.value.reason == "Timeout"
    finally:
        release.set()
        client.close()


async def test_unreadable_kubeconfig_path_is_named(tmp_path: Any) -> None:
    with pytest.raises(KubeError, match="missing-kubeconfig"):
        load_api_client(str(tmp_path / "missing-kubeconfig"))


async def test_requests_name_their_component_in_the_user_agent(
    apiserver: kmock.KubernetesEmulator, kubeconfig: Path
) -> None:
    api = load_api_client(str(kubeconfig), component="hami-scheduler")
    await apiserver.post(
        "/api/v1/nodes", json={"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n1"}}
    )
    await get_node(api, "n1")
    agents = [r.headers.get("User-Agent", "") for r in apiserver["get"] if r.url.path == "/api/v1/nodes/n1"]
    assert agents and agents[-1].startswith("hami-scheduler/")
