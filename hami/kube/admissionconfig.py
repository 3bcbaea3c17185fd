"""MutatingWebhookConfiguration reads and JSON patches, as raw JSON dicts.

Owns: get one MutatingWebhookConfiguration and apply an RFC 6902 JSON patch to it (``test`` ops make
it a compare-and-set per webhook entry; a merge patch would replace the whole ``webhooks`` list).
Used by the webhook's certificate command (``python -m webhook.certs inject``). Imports
``hami.kube.client``, ``hami.kube.paths`` and ``hami.kube.protocol`` only; must not import services.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from hami.kube import paths
from hami.kube.client import call_json
from hami.kube.protocol import KubeApi

JSON_PATCH = paths.JSON_PATCH


async def get_mutating_webhook_configuration(api: KubeApi, name: str) -> dict[str, Any]:
    """The configuration; raises :class:`~hami.kube.client.NotFound` when it does not exist."""
    config: dict[str, Any] = await call_json(
        api, "GET", paths.MUTATING_WEBHOOK_CONFIGURATION, params={"name": name}
    )
    return config


async def json_patch_mutating_webhook_configuration(
    api: KubeApi, name: str, operations: Sequence[Mapping[str, Any]]
) -> dict[str, Any]:
    """Apply a JSON patch; a failed ``test`` op fails the whole patch (422, or 500 on kmock)."""
    config: dict[str, Any] = await call_json(
        api,
        "PATCH",
        paths.MUTATING_WEBHOOK_CONFIGURATION,
        params={"name": name},
        body=[dict(op) for op in operations],
        content_type=JSON_PATCH,
    )
    return config
