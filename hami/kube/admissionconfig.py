"""MutatingWebhookConfiguration reads and JSON patches, as raw JSON dicts.

Owns: get one MutatingWebhookConfiguration and apply an RFC 6902 JSON patch to it (``test`` ops make
it a compare-and-set per webhook entry; a merge patch would replace the whole ``webhooks`` list).
Used by the webhook's certificate command (``python -m webhook.certs inject``). Imports
``hami.kube.client``, ``hami.kube.protocol`` and the ``kubernetes`` client only; must not import services.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from kubernetes import client

from hami.kube.client import call_json
from hami.kube.protocol import KubeApi

JSON_PATCH = "application/json-patch+json"


def _admission_api(api: KubeApi) -> Any:
    return client.AdmissionregistrationV1Api(api)


async def get_mutating_webhook_configuration(api: KubeApi, name: str) -> dict[str, Any]:
    """The configuration; raises :class:`~hami.kube.client.NotFound` when it does not exist."""
    config: dict[str, Any] = await call_json(
        api, _admission_api(api).read_mutating_webhook_configuration, name
    )
    return config


async def json_patch_mutating_webhook_configuration(
    api: KubeApi, name: str, operations: Sequence[Mapping[str, Any]]
) -> dict[str, Any]:
    """Apply a JSON patch; a failed ``test`` op fails the whole patch (422, or 500 on kmock)."""
    config: dict[str, Any] = await call_json(
        api,
        _admission_api(api).patch_mutating_webhook_configuration,
        name,
        [dict(op) for op in operations],
        _content_type=JSON_PATCH,
    )
    return config
