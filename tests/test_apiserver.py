"""The embedded API server's reactions behave as the real apiserver does for what we use."""

import asyncio
from pathlib import Path

import kmock
from kubernetes import client, config


async def test_binding_sets_node_name_and_lists_carry_kind(apiserver: kmock.KubernetesEmulator) -> None:
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "default"}, "spec": {}}
    await apiserver.post("/api/v1/namespaces/default/pods", json=pod)
    binding = {"apiVersion": "v1", "kind": "Binding", "metadata": {"name": "p"}, "target": {"name": "node-1"}}
    response = await apiserver.post("/api/v1/namespaces/default/pods/p/binding", json=binding)
    assert response.status == 201  # kube-apiserver: 201 Created, a Status of Success
    stored = await (await apiserver.get("/api/v1/namespaces/default/pods/p")).json()
    assert stored["spec"]["nodeName"] == "node-1"
    listing = await (await apiserver.get("/api/v1/namespaces/default/pods")).json()
    assert listing["kind"] == "PodList"
    assert [item["metadata"]["name"] for item in listing["items"]] == ["p"]
    core = await (await apiserver.get("/api/v1")).json()
    assert core["groupVersion"] == "v1"


async def test_official_client_reads_through_the_kubeconfig(
    apiserver: kmock.KubernetesEmulator, kubeconfig: Path
) -> None:
    await apiserver.post(
        "/api/v1/nodes", json={"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n1"}}
    )
    configuration = client.Configuration()
    # the client's own loader is untyped
    config.load_kube_config(config_file=str(kubeconfig), client_configuration=configuration)  # type: ignore[no-untyped-call]
    with client.ApiClient(configuration) as api:
        # the sync client must run off the loop that serves the emulator
        nodes = await asyncio.to_thread(client.CoreV1Api(api).list_node)
    assert [n.metadata.name if n.metadata else None for n in nodes.items] == ["n1"]


async def test_binding_a_missing_pod_is_not_found(apiserver: kmock.KubernetesEmulator) -> None:
    binding = {"apiVersion": "v1", "kind": "Binding", "metadata": {"name": "ghost"}, "target": {"name": "n1"}}
    response = await apiserver.post("/api/v1/namespaces/default/pods/ghost/binding", json=binding)
    assert response.status == 404
