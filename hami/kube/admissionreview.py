"""The AdmissionReview v1 request kube-apiserver sends a mutating webhook for a pod CREATE.

Owns :func:`pod_create_review`, the one builder of that wire object: the embedded cluster's admission
stand-in (``hami_testkit.admission_standin``) sends it to the webhooks it calls, and the webhook's tests and
benchmark post it to ``hami-webhook``. Plain dicts, no API call; must not import the Kubernetes client
(``hami_testkit`` imports this module and may not reach it).
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from typing import Any

from hami import objects

API_VERSION = "admission.k8s.io/v1"
_POD_KIND = {"group": "", "version": "v1", "kind": "Pod"}
_PODS = {"group": "", "version": "v1", "resource": "pods"}


def pod_create_review(
    pod: Mapping[str, Any],
    *,
    username: str,
    groups: Sequence[str] = ("system:authenticated",),
    namespace: str | None = None,
    uid: str | None = None,
) -> dict[str, Any]:
    """The review of creating ``pod``: ``namespace`` defaults to the pod's (kube-apiserver fills it in
    from the request path before admission), the request ``uid`` to a fresh UUID."""
    return {
        "apiVersion": API_VERSION,
        "kind": "AdmissionReview",
        "request": {
            "uid": uid or str(uuid.uuid4()),
            "kind": dict(_POD_KIND),
            "resource": dict(_PODS),
            "requestKind": dict(_POD_KIND),
            "requestResource": dict(_PODS),
            "operation": "CREATE",
            "namespace": namespace if namespace is not None else objects.namespace(pod),
            "name": objects.name(pod),
            "userInfo": {"username": username, "groups": list(groups)},
            "object": pod,
            "oldObject": None,
            "dryRun": False,
            "options": {"apiVersion": "meta.k8s.io/v1", "kind": "CreateOptions"},
        },
    }
