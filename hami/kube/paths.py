"""The API path of every resource ``hami.kube`` reads or writes, each written once.

Owns the resource paths (``{namespace}`` and ``{name}`` are filled in, quoted, by the client's
``param_serialize``: :func:`hami.kube.client.call_json`'s ``params``) and the content types of the three
patch kinds. What is sent to them belongs to the modules of each resource (``pods``, ``nodes``, ...).
Imports nothing.
"""

from __future__ import annotations

#: RFC 6902 JSON patch: a list of operations (``test`` ops make it a compare-and-set).
JSON_PATCH = "application/json-patch+json"
#: RFC 7386 JSON merge patch: an object (``null`` deletes a key).
MERGE_PATCH = "application/merge-patch+json"
#: Kubernetes' strategic merge patch (lists merged by their keys); what a JSON-patch content type with an
#: object body is sent as by the client's REST layer.
STRATEGIC_MERGE_PATCH = "application/strategic-merge-patch+json"

# core/v1
NODES = "/api/v1/nodes"
NODE = "/api/v1/nodes/{name}"
NODE_STATUS = "/api/v1/nodes/{name}/status"
PODS = "/api/v1/pods"  # every namespace
POD = "/api/v1/namespaces/{namespace}/pods/{name}"
POD_STATUS = "/api/v1/namespaces/{namespace}/pods/{name}/status"
POD_BINDING = "/api/v1/namespaces/{namespace}/pods/{name}/binding"
EVENTS = "/api/v1/namespaces/{namespace}/events"
EVENT = "/api/v1/namespaces/{namespace}/events/{name}"
RESOURCE_QUOTAS = "/api/v1/resourcequotas"  # every namespace
NAMESPACE_RESOURCE_QUOTAS = "/api/v1/namespaces/{namespace}/resourcequotas"
SECRETS = "/api/v1/namespaces/{namespace}/secrets"
SECRET = "/api/v1/namespaces/{namespace}/secrets/{name}"

# policy/v1
POD_DISRUPTION_BUDGETS = "/apis/policy/v1/poddisruptionbudgets"  # every namespace

# admissionregistration.k8s.io/v1
MUTATING_WEBHOOK_CONFIGURATIONS = "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations"
MUTATING_WEBHOOK_CONFIGURATION = f"{MUTATING_WEBHOOK_CONFIGURATIONS}/{{name}}"
