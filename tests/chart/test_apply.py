"""Every rendered object is accepted by an API server (kmock): POSTed to the path its kind lives at.

The path comes from the server's discovery data (group, version, plural, namespaced), as kubectl and
Helm find it; the custom kinds the chart may render (cert-manager, Prometheus operator) are declared
first, as installing their CRDs would. Two objects with the same kind, namespace and name would
collide (409) here exactly as they would on a real cluster.
"""

from __future__ import annotations

from typing import Any

import aiohttp
import kmock
import pytest

from .rendering import NAMESPACE, VALUE_SETS, render

CRDS = {
    "cert-manager.io/v1/certificates": "Certificate",
    "cert-manager.io/v1/issuers": "Issuer",
    "monitoring.coreos.com/v1/servicemonitors": "ServiceMonitor",
}
#: The one object the chart puts outside the release namespace (kube-scheduler's auth reader binding).
OTHER_NAMESPACES = {("RoleBinding", "kube-system")}


def api_path(apiserver: kmock.KubernetesEmulator, doc: dict[str, Any]) -> tuple[str, bool]:
    """(collection path, namespaced) for ``doc``'s kind, from the server's discovery data."""
    group, _, version = doc["apiVersion"].rpartition("/")
    matches = [
        (resource, apiserver.resources[resource])
        for resource in apiserver.resources
        if resource.group == group
        and resource.version == version
        and apiserver.resources[resource].kind == doc["kind"]
    ]
    assert len(matches) == 1, f"the API server does not serve {doc['apiVersion']} {doc['kind']}"
    resource, info = matches[0]
    base = f"/api/{version}" if not group else f"/apis/{group}/{version}"
    if info.namespaced:
        return f"{base}/namespaces/{doc['metadata']['namespace']}/{resource.plural}", True
    return f"{base}/{resource.plural}", False


#: The value sets that change which objects exist (the others only change fields).
INVENTORIES = ("defaults", "cert-manager", "replicas-2", "everything-on", "minimal")


@pytest.mark.parametrize("values", [VALUE_SETS[name] for name in INVENTORIES], ids=INVENTORIES)
async def test_rendered_objects_are_created_and_read_back(
    apiserver: kmock.KubernetesEmulator, values: dict[str, Any]
) -> None:
    for key, kind in CRDS.items():
        apiserver.resources[key] = kmock.ResourceInfo(
            kind=kind, namespaced=True, verbs=["create", "get", "list"]
        )
    docs = render(values).docs
    async with aiohttp.ClientSession(base_url=str(apiserver.url)) as session:
        for doc in docs:
            collection, namespaced = api_path(apiserver, doc)
            if namespaced:
                where = doc["metadata"]["namespace"]
                assert where == NAMESPACE or (doc["kind"], where) in OTHER_NAMESPACES, doc["metadata"]
            else:
                assert "namespace" not in doc["metadata"], f"cluster-scoped {doc['kind']} with a namespace"
            async with session.post(collection, json=doc) as response:
                assert response.status in (200, 201), (
                    doc["kind"],
                    doc["metadata"]["name"],
                    await response.text(),
                )
            async with session.get(f"{collection}/{doc['metadata']['name']}") as response:
                assert response.status == 200
                stored = await response.json()
            assert (stored["kind"], stored["metadata"]["name"]) == (doc["kind"], doc["metadata"]["name"])
            assert stored.get("spec") == doc.get("spec") and stored.get("data") == doc.get("data")
    # one stored object per document: no two documents share a kind, namespace and name
    assert len(list(apiserver.objects.keys())) == len(docs)
