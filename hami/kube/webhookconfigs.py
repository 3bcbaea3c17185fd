"""Listing MutatingWebhookConfigurations, as raw JSON dicts (read-only).

Owns: the list of every MutatingWebhookConfiguration in the cluster, for ``hami doctor`` to find the
one routing pods to our webhook. Writes live in ``hami.kube.admissionconfig``. Imports
``hami.kube.client`` and the ``kubernetes`` client only; must not import services.
"""

from __future__ import annotations

from typing import Any

from kubernetes import client

from hami.kube.client import call_json


async def list_mutating_webhook_configurations(api: Any) -> list[dict[str, Any]]:
    """Every MutatingWebhookConfiguration (cluster-scoped; needs ``list`` on them)."""
    body = await call_json(api, client.AdmissionregistrationV1Api(api).list_mutating_webhook_configuration)
    return list(body.get("items") or [])
