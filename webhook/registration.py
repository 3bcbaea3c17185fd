"""The MutatingWebhookConfiguration entry this webhook wants, for ``--manage-config``. PURE.

Owns the scoping Kopf's managed configuration cannot express (Kopf 1.45 writes ``timeoutSeconds: 30``,
no ``namespaceSelector``, no ``matchConditions``, no ``reinvocationPolicy``): :func:`desired_webhook`
builds the whole entry, :func:`up_to_date` tells whether the stored one already has it. The Kopf wiring
(``webhook.handlers``) re-applies it whenever Kopf rewrites the configuration (start-up, certificate
rotation). Must not import kopf, aiohttp or the Kubernetes client.

Scope, so a webhook outage can never block unrelated pods:

* ``namespaceSelector``: namespaces labelled ``hami.io/webhook: ignore`` are skipped entirely.
* ``matchConditions`` (CEL, Kubernetes >= 1.28): a pod is sent when it

  - carries an internal annotation or the ``hami.io/vgpu-node`` label (the forged-allocation refusal),
  - sets ``NVIDIA_VISIBLE_DEVICES`` in an init or app container (the device-list refusal), or
  - asks for a managed resource in an init or app container, or names a resource the typo rules judge
    (:mod:`webhook.typos`: a name that is not ours in ``hami.io/`` or in the namespace of a configured
    card, memory or cores name -- ``nvidia.com/`` by default -- except NVIDIA's ``nvidia.com/mig-*`` and
    ``nvidia.com/*.shared``), whatever
    scheduler it names, unless it is labelled ``hami.io/webhook: ignore`` and does not name our
    scheduler. The webhook then admits another device plugin's resource untouched (``nvidia.com/hostdev``
    of NVIDIA's network operator); the price is that such a pod waits on the webhook like a GPU pod.

  So a pod cannot escape the protective refusals by labelling itself ignored (which is why the pod
  label is matched here and not with an ``objectSelector``), while an ignored pod that stays away from
  our scheduler is never held up by a webhook outage.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from hami.annotations import INTERNAL_POD_ANNOTATIONS, POD_VGPU_NODE, WEBHOOK_IGNORE_LABEL
from hami.settings import ResourceNames
from webhook.config import HANDLER_ID, WEBHOOK_NAME, WebhookSettings
from webhook.isolation import ENV_VISIBLE_DEVICES
from webhook.typos import judged_namespaces, ours

TIMEOUT_SECONDS = 10
MATCH_CONDITION_NAME = "hami-gpu-pods"


def _cel_list(items: Sequence[str]) -> str:
    return "[" + ", ".join(f"'{item}'" for item in items) + "]"


def match_expression(resources: ResourceNames, scheduler_name: str) -> str:
    """The CEL condition: forged keys, or a device list, or (asks for a managed resource or names a
    judged one, and routed to us or not ignored). The chart's template writes the same text (a chart
    test holds them equal)."""
    managed = _cel_list([r for r in resources.managed if r])
    judged = _cel_list(judged_namespaces(resources))
    known = _cel_list(ours(resources))
    internal = _cel_list(INTERNAL_POD_ANNOTATIONS)
    containers = (
        "(has(object.spec.initContainers) ? object.spec.initContainers : [])"
        " + (has(object.spec.containers) ? object.spec.containers : [])"
    )
    asks = (
        f"({containers}).exists(c, has(c.resources) && ("
        f"(has(c.resources.limits) && {managed}.exists(r, r in c.resources.limits)) || "
        f"(has(c.resources.requests) && {managed}.exists(r, r in c.resources.requests))))"
    )
    suspect = (
        f"{judged}.exists(p, r.startsWith(p)) && !(r in {known}) && !(r.startsWith('nvidia.com/')"
        " && (r.startsWith('nvidia.com/mig-') || r.endsWith('.shared')))"
    )
    names = (
        f"({containers}).exists(c, has(c.resources) && ("
        f"(has(c.resources.limits) && c.resources.limits.exists(r, {suspect})) || "
        f"(has(c.resources.requests) && c.resources.requests.exists(r, {suspect}))))"
    )
    visible = f"({containers}).exists(c, has(c.env) && c.env.exists(e, e.name == '{ENV_VISIBLE_DEVICES}'))"
    ignored = (
        f"(has(object.metadata.labels) && '{WEBHOOK_IGNORE_LABEL}' in object.metadata.labels"
        f" && object.metadata.labels['{WEBHOOK_IGNORE_LABEL}'] == 'ignore')"
    )
    routed = f"(has(object.spec.schedulerName) && object.spec.schedulerName == '{scheduler_name}')"
    forged = (
        f"(has(object.metadata.annotations) && {internal}.exists(k, k in object.metadata.annotations))"
        f" || (has(object.metadata.labels) && '{POD_VGPU_NODE}' in object.metadata.labels)"
    )
    return f"{forged} || {visible} || (({asks} || {names}) && (!{ignored} || {routed}))"


def desired_webhook(settings: WebhookSettings, client_config: Mapping[str, Any]) -> dict[str, Any]:
    """The whole webhook entry; ``client_config`` is what Kopf's server published (url, caBundle)."""
    config = dict(client_config)
    if "url" in config:
        config["url"] = f"{str(config['url']).rstrip('/')}/{HANDLER_ID}"
    return {
        "name": WEBHOOK_NAME,
        "admissionReviewVersions": ["v1"],
        "clientConfig": config,
        "rules": [
            {
                "apiGroups": [""],
                "apiVersions": ["v1"],
                "resources": ["pods"],
                "operations": ["CREATE"],
                "scope": "Namespaced",
            }
        ],
        "failurePolicy": settings.failure_policy,
        "matchPolicy": "Equivalent",
        "sideEffects": "None",
        "timeoutSeconds": TIMEOUT_SECONDS,
        "reinvocationPolicy": "Never",
        "namespaceSelector": {
            "matchExpressions": [{"key": WEBHOOK_IGNORE_LABEL, "operator": "NotIn", "values": ["ignore"]}]
        },
        "matchConditions": [
            {
                "name": MATCH_CONDITION_NAME,
                "expression": match_expression(
                    settings.mutation.device.resources, settings.mutation.scheduler_name
                ),
            }
        ],
    }


def up_to_date(stored: Sequence[Mapping[str, Any]], desired: Mapping[str, Any]) -> bool:
    """True when the stored list is our one entry with every field we set (server defaults ignored)."""
    if len(stored) != 1:
        return False
    entry = stored[0]
    return all(entry.get(key) == value for key, value in desired.items())
