"""Secret reads and writes as raw JSON dicts (values of ``data`` stay base64 text, as on the wire).

Owns: get, create and merge-patch of one namespaced Secret. Used by the webhook's certificate command
(``python -m webhook.certs secret``). Imports ``hami.kube.client``, ``hami.kube.paths`` and
``hami.kube.protocol``; must not import services.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from hami.kube import paths
from hami.kube.client import call_json
from hami.kube.protocol import KubeApi

MERGE_PATCH = paths.MERGE_PATCH


async def get_secret(api: KubeApi, namespace: str, name: str) -> dict[str, Any]:
    """The Secret; raises :class:`~hami.kube.client.NotFound` when it does not exist."""
    where = {"namespace": namespace, "name": name}
    secret: dict[str, Any] = await call_json(api, "GET", paths.SECRET, params=where)
    return secret


async def create_secret(api: KubeApi, namespace: str, body: Mapping[str, Any]) -> dict[str, Any]:
    """Create the Secret ``body``; raises :class:`~hami.kube.client.Conflict` when it already exists."""
    secret: dict[str, Any] = await call_json(
        api, "POST", paths.SECRETS, params={"namespace": namespace}, body=dict(body)
    )
    return secret


async def patch_secret(
    api: KubeApi,
    namespace: str,
    name: str,
    *,
    data: Mapping[str, str | None] | None = None,
    labels: Mapping[str, str | None] | None = None,
    annotations: Mapping[str, str | None] | None = None,
) -> dict[str, Any]:
    """Merge-patch the Secret's ``data`` (base64 values; ``None`` deletes a key), labels, annotations."""
    body: dict[str, Any] = {}
    if data is not None:
        body["data"] = dict(data)
    metadata: dict[str, Any] = {}
    if labels is not None:
        metadata["labels"] = dict(labels)
    if annotations is not None:
        metadata["annotations"] = dict(annotations)
    if metadata:
        body["metadata"] = metadata
    where = {"namespace": namespace, "name": name}
    secret: dict[str, Any] = await call_json(
        api, "PATCH", paths.SECRET, params=where, body=body, content_type=MERGE_PATCH
    )
    return secret
