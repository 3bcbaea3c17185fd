"""Pod reads and writes as raw JSON dicts, and the pod → node Binding.

Owns: get/list Pods (selectors are also applied client-side, since not every API server honours
them), merge-patch of a Pod's annotations and labels, creating the ``pods/binding`` subresource.
Imports ``hami.kube.client`` only; must not import ``hami.scheduler`` or services.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from hami.kube.client import call_json, core_api

MERGE_PATCH = "application/merge-patch+json"


async def get_pod(api: Any, namespace: str, name: str) -> dict[str, Any]:
    """The Pod; raises :class:`~hami.kube.client.NotFound` when it does not exist."""
    pod: dict[str, Any] = await call_json(api, core_api(api).read_namespaced_pod, name, namespace)
    return pod


async def list_pods_with_version(
    api: Any, *, node_name: str | None = None
) -> tuple[list[dict[str, Any]], str]:
    """Pods in every namespace (only those on ``node_name`` when given) and the list's resourceVersion."""
    kwargs = {"field_selector": f"spec.nodeName={node_name}"} if node_name else {}
    body = await call_json(api, core_api(api).list_pod_for_all_namespaces, **kwargs)
    items: list[dict[str, Any]] = list(body.get("items") or [])
    if node_name:
        items = [p for p in items if (p.get("spec") or {}).get("nodeName") == node_name]
    return items, str((body.get("metadata") or {}).get("resourceVersion") or "")


async def list_pods(api: Any, *, node_name: str | None = None) -> list[dict[str, Any]]:
    """Pods in every namespace, only those bound to ``node_name`` when given."""
    items, _ = await list_pods_with_version(api, node_name=node_name)
    return items


async def patch_pod(
    api: Any,
    namespace: str,
    name: str,
    *,
    annotations: Mapping[str, str | None] | None = None,
    labels: Mapping[str, str | None] | None = None,
) -> dict[str, Any]:
    """Merge-patch the Pod's annotations and labels in one request (``None`` deletes a key)."""
    metadata: dict[str, Any] = {}
    if annotations is not None:
        metadata["annotations"] = dict(annotations)
    if labels is not None:
        metadata["labels"] = dict(labels)
    pod: dict[str, Any] = await call_json(
        api,
        core_api(api).patch_namespaced_pod,
        name,
        namespace,
        {"metadata": metadata},
        _content_type=MERGE_PATCH,
    )
    return pod


async def bind_pod(api: Any, namespace: str, name: str, node: str, uid: str | None = None) -> None:
    """Create the Binding that assigns the Pod to ``node`` (what kube-scheduler's binder does)."""
    metadata: dict[str, Any] = {"name": name, "namespace": namespace}
    if uid:
        metadata["uid"] = uid
    body = {
        "apiVersion": "v1",
        "kind": "Binding",
        "metadata": metadata,
        "target": {"apiVersion": "v1", "kind": "Node", "name": node},
    }
    await call_json(api, core_api(api).create_namespaced_pod_binding, name, namespace, body)
