"""Node reads and writes as raw JSON dicts.

Owns: get/list Nodes, merge-patch and JSON-patch of a Node (annotations are written with PATCH only, never
PUT), and :func:`annotation_cas`, the compare-and-set of one node annotation that the node lock and the
card cordon list write with. Imports ``hami.kube.client``, ``hami.kube.paths``, ``hami.kube.pods`` (the JSON
pointer), ``hami.kube.protocol`` and ``hami.objects``; must not import ``hami.scheduler`` or services.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, cast

from hami import objects
from hami.kube import paths
from hami.kube.client import call_json
from hami.kube.pods import pointer
from hami.kube.protocol import KubeApi
from hami.objects import RawNode

MERGE_PATCH = paths.MERGE_PATCH
JSON_PATCH = paths.JSON_PATCH


async def get_node(api: KubeApi, name: str) -> RawNode:
    """The Node ``name``; raises :class:`~hami.kube.client.NotFound` when it does not exist."""
    node: RawNode = await call_json(api, "GET", paths.NODE, params={"name": name})
    return node


async def list_nodes(api: KubeApi) -> tuple[list[RawNode], str]:
    """Every Node (items that are not objects left out) and the list's resourceVersion (to start a
    watch from)."""
    body = await call_json(api, "GET", paths.NODES)
    return cast("list[RawNode]", objects.items(body)), objects.resource_version(body)


async def patch_node_annotations(api: KubeApi, name: str, annotations: Mapping[str, str | None]) -> RawNode:
    """Merge-patch the Node's annotations (``None`` deletes a key); returns the patched Node."""
    body = {"metadata": {"annotations": dict(annotations)}}
    node: RawNode = await call_json(
        api, "PATCH", paths.NODE, params={"name": name}, body=body, content_type=MERGE_PATCH
    )
    return node


async def json_patch_node(api: KubeApi, name: str, operations: Sequence[Mapping[str, object]]) -> RawNode:
    """Apply an RFC 6902 JSON patch to the Node (``test`` ops make it a compare-and-set)."""
    node: RawNode = await call_json(
        api,
        "PATCH",
        paths.NODE,
        params={"name": name},
        body=[dict(op) for op in operations],
        content_type=JSON_PATCH,
    )
    return node


def annotation_cas(
    metadata: Mapping[str, Any], key: str, current: str | None, value: str | None, *, fresh: bool = False
) -> list[dict[str, Any]]:
    """A JSON patch that sets annotation ``key`` to ``value`` (``None`` removes it) only while nothing
    changed since ``metadata`` (the Node's, as stored) was read with ``current`` as the key's value.

    With a value to compare, a ``test`` op on it. JSON patch cannot test that a key is absent, so
    without one the enclosing annotations object is tested instead (the whole ``metadata`` when it has
    none, which is then added); ``fresh`` also tests the object's resourceVersion there, where the
    server keeps one (a write whose answer was lost that lands after the value came and went again
    must not apply)."""
    path = pointer("metadata", "annotations", key)
    if current is not None:
        change = (
            {"op": "remove", "path": path}
            if value is None
            else {"op": "replace", "path": path, "value": value}
        )
        return [{"op": "test", "path": path, "value": current}, change]
    version = metadata.get("resourceVersion") if fresh else None
    tests = [{"op": "test", "path": "/metadata/resourceVersion", "value": version}] if version else []
    annotations = metadata.get("annotations")
    if isinstance(annotations, Mapping):
        return [
            *tests,
            {"op": "test", "path": "/metadata/annotations", "value": dict(annotations)},
            {"op": "add", "path": path, "value": value},
        ]
    return [
        {"op": "test", "path": "/metadata", "value": dict(metadata)},
        {"op": "add", "path": "/metadata/annotations", "value": {key: value}},
    ]
