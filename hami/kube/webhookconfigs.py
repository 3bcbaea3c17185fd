"""Listing MutatingWebhookConfigurations, as raw JSON dicts (read-only).

Owns: the list of every MutatingWebhookConfiguration in the cluster, for ``hami doctor`` to find the one
routing pods to our webhook. Writes live in ``hami.kube.admissionconfig``. Imports ``hami.kube.client``,
``hami.kube.protocol``, ``hami.objects`` and the ``kubernetes`` client only; must not import services.
"""

from __future__ import annotations

from typing import Any

from kubernetes import client

from hami import objects
from hami.kube.client import call_json
from hami.kube.protocol import KubeApi


async def list_mutating_webhook_configurations(api: KubeApi) -> list[dict[str, Any]]:
    """Every MutatingWebhookConfiguration (cluster-scoped; needs ``list`` on them); items that are not
    objects are left out."""
    body = await call_json(api, client.AdmissionregistrationV1Api(api).list_mutating_webhook_configuration)
    return objects.items(body)
