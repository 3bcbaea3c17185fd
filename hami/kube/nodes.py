"""Node reads and writes as raw JSON dicts.

Owns: get/list Nodes, merge-patch and JSON-patch of a Node (annotations are written with PATCH only, never
PUT). Imports ``hami.kube.client``, ``hami.kube.protocol`` and ``hami.objects``; must not import
``hami.scheduler`` or services.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import cast

from hami import objects
from hami.kube.client import call_json, core_api
from hami.kube.protocol import KubeApi
from hami.objects import RawNode

MERGE_PATCH = "application/merge-patch+json"
JSON_PATCH = "application/json-patch+json"


async def get_node(api: KubeApi, name: str) -> RawNode:
    """The Node ``name``; raises :class:`~hami.kube.client.NotFound` when it does not exist."""
    node: RawNode = await call_json(api, core_api(api).read_node, name)
    return node


async def list_nodes(api: KubeApi) -> tuple[list[RawNode], str]:
    """Every Node (items that are not objects left out) and the list's resourceVersion (to start a
    watch from)."""
    body = await call_json(api, core_api(api).list_node)
    return cast("list[RawNode]", objects.items(body)), objects.resource_version(body)


async def patch_node_annotations(api: KubeApi, name: str, annotations: Mapping[str, str | None]) -> RawNode:
    """Merge-patch the Node's annotations (``None`` deletes a key); returns the patched Node."""
    body = {"metadata": {"annotations": dict(annotations)}}
    node: RawNode = await call_json(api, core_api(api).patch_node, name, body, _content_type=MERGE_PATCH)
    return node


async def json_patch_node(api: KubeApi, name: str, operations: Sequence[Mapping[str, object]]) -> RawNode:
    """Apply an RFC 6902 JSON patch to the Node (``test`` ops make it a compare-and-set)."""
    node: RawNode = await call_json(
        api, core_api(api).patch_node, name, [dict(op) for op in operations], _content_type=JSON_PATCH
    )
    return node
