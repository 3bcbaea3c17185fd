"""Node reads and writes as raw JSON dicts.

Owns: get/list Nodes, merge-patch and JSON-patch of a Node (annotations are written with PATCH only,
never PUT). Imports ``hami.kube.client`` only; must not import ``hami.scheduler`` or services.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from hami.kube.client import call_json, core_api

MERGE_PATCH = "application/merge-patch+json"
JSON_PATCH = "application/json-patch+json"


async def get_node(api: Any, name: str) -> dict[str, Any]:
    """The Node ``name``; raises :class:`~hami.kube.client.NotFound` when it does not exist."""
    node: dict[str, Any] = await call_json(api, core_api(api).read_node, name)
    return node


async def list_nodes(api: Any) -> tuple[list[dict[str, Any]], str]:
    """Every Node and the list's resourceVersion (to start a watch from)."""
    body = await call_json(api, core_api(api).list_node)
    return list(body.get("items") or []), str((body.get("metadata") or {}).get("resourceVersion") or "")


async def patch_node_annotations(
    api: Any, name: str, annotations: Mapping[str, str | None]
) -> dict[str, Any]:
    """Merge-patch the Node's annotations (``None`` deletes a key); returns the patched Node."""
    body = {"metadata": {"annotations": dict(annotations)}}
    node: dict[str, Any] = await call_json(
        api, core_api(api).patch_node, name, body, _content_type=MERGE_PATCH
    )
    return node


async def json_patch_node(api: Any, name: str, operations: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Apply an RFC 6902 JSON patch to the Node (``test`` ops make it a compare-and-set)."""
    node: dict[str, Any] = await call_json(
        api, core_api(api).patch_node, name, [dict(op) for op in operations], _content_type=JSON_PATCH
    )
    return node
