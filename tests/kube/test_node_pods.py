"""Bind's consistent read of a node's pods (``hami.kube.pods.list_node_pods``) against the embedded API
server (kmock): the pods bound to the node and the pods whose ``hami.io/vgpu-node`` label names it."""

from __future__ import annotations

from typing import Any

import kmock
import pytest

from hami.annotations import POD_VGPU_NODE
from hami.kube.client import KubeError
from hami.kube.pods import LABEL_VALUE_MAX, list_node_pods

Emulator = kmock.KubernetesEmulator
PODS = kmock.resource("v1/pods")


async def _pod(k: Emulator, name: str, *, node: str | None = None, label: str | None = None) -> None:
    metadata: dict[str, Any] = {"name": name, "namespace": "default"}
    if label is not None:
        metadata["labels"] = {POD_VGPU_NODE: label}
    spec: dict[str, Any] = {"containers": [{"name": "c", "image": "x"}]}
    if node:
        spec["nodeName"] = node
    await k.post(
        "/api/v1/namespaces/default/pods",
        json={"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec},
    )


async def test_bound_and_labelled_pods_each_once(apiserver: Emulator, api: Any) -> None:
    await _pod(apiserver, "bound", node="n1")
    await _pod(apiserver, "bound-labelled", node="n1", label="n1")
    await _pod(apiserver, "granted-unbound", label="n1")
    await _pod(apiserver, "label-here-bound-there", node="n2", label="n1")
    await _pod(apiserver, "elsewhere", node="n2", label="n2")
    await _pod(apiserver, "pending")
    found = await list_node_pods(api, "n1", label=POD_VGPU_NODE)
    names = sorted(p["metadata"]["name"] for p in found)
    assert names == ["bound", "bound-labelled", "granted-unbound", "label-here-bound-there"]


async def test_a_node_name_no_label_can_hold_sends_no_label_list(apiserver: Emulator, api: Any) -> None:
    """A label value is at most 63 characters: no pod can carry a longer node name as one, and a real
    API server refuses such a selector (the bind would always fail closed)."""
    long = "n" * (LABEL_VALUE_MAX + 1)
    await _pod(apiserver, "bound", node=long)
    found = await list_node_pods(api, long, label=POD_VGPU_NODE)
    assert [p["metadata"]["name"] for p in found] == ["bound"]
    lists = [r for r in apiserver["get", PODS]]
    assert len(lists) == 1
    assert "labelSelector" not in str(lists[0].url)


@pytest.mark.parametrize("failing", [0, 1])
async def test_a_failure_of_either_list_raises(apiserver: Emulator, api: Any, failing: int) -> None:
    """The caller cannot know what a failed list missed (bind then fails closed)."""
    await _pod(apiserver, "bound", node="n1")
    (apiserver**10)[kmock.action.LIST, PODS][failing : failing + 1] << 500
    with pytest.raises(KubeError):
        await list_node_pods(api, "n1", label=POD_VGPU_NODE)


async def test_a_garbled_answer_is_an_api_error(apiserver: Emulator, api: Any) -> None:
    """An answer that is not JSON fails as the API call it is (bind then fails closed and gives the
    lock back); before, the decoder's ValueError escaped bind's error handling and left the lock held."""
    (apiserver**10)[kmock.action.LIST, PODS] << b"{not json"
    with pytest.raises(KubeError, match="InvalidResponse: the API server's answer is not JSON"):
        await list_node_pods(api, "n1", label=POD_VGPU_NODE)
