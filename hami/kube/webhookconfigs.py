"""Listing MutatingWebhookConfigurations, as raw JSON dicts (read-only).

Owns: the list of every MutatingWebhookConfiguration in the cluster, for ``hami doctor`` to find the one
routing pods to our webhook. Writes live in ``hami.kube.admissionconfig``. Imports ``hami.kube.client``,
``hami.kube.paths``, ``hami.kube.protocol`` and ``hami.objects`` only; must not import services.
"""

from __future__ import annotations

from typing import Any

from hami import objects
from hami.kube import paths
from hami.kube.client import call_json
from hami.kube.protocol import KubeApi


async def list_mutating_webhook_configurations(api: KubeApi) -> list[dict[str, Any]]:
    """Every MutatingWebhookConfiguration (cluster-scoped; needs ``list`` on them); items that are not
    objects are left out."""
    body = await call_json(api, "GET", paths.MUTATING_WEBHOOK_CONFIGURATIONS)
    return objects.items(body)
