"""SIMULATION ONLY: the ``scale`` subresource of Deployments and ReplicaSets on the embedded apiserver
(what ``kubectl scale`` reads and patches).

kmock treats ``.../deployments/NAME/scale`` as the Deployment itself: a merge patch of the Scale
(``{"spec": {"replicas": N}}``) lands on the Deployment's ``spec.replicas``, which is what
kube-apiserver's scale storage does too. :func:`install_scale` adds the reactions that answer GET and
PATCH there with an ``autoscaling/v1`` ``Scale`` (``spec.replicas``, ``status.replicas`` and the
selector as a string) instead of the whole object, and tells the apiserver's subresource table that
``scale`` is served (where it has one). :func:`hami_testkit.apiserver.embedded_apiserver` installs it in
every embedded apiserver (it is apiserver behaviour: the bare cluster, which runs no workload
controller, scales the stored ``spec.replicas`` too). Must not import ``hami.kube``, ``webhook`` or
``nodeagent``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import kmock

from hami import objects

#: (API group, plural) of the resources whose ``scale`` is served
SCALED = (("apps", "deployments"), ("apps", "replicasets"))
_RESPONSE: Any = getattr(kmock, "Response")  # noqa: B009  (exported by kmock, missing from __all__)


def selector_text(selector: object) -> str:
    """A label selector's ``matchLabels`` and ``matchExpressions`` as a selector string."""
    if not isinstance(selector, Mapping):
        return ""
    parts = [f"{k}={v}" for k, v in sorted((selector.get("matchLabels") or {}).items())]
    for expression in selector.get("matchExpressions") or []:
        if not isinstance(expression, Mapping):
            continue
        key, operator = str(expression.get("key") or ""), str(expression.get("operator") or "")
        values = ",".join(str(v) for v in expression.get("values") or [])
        parts.append(
            {"In": f"{key} in ({values})", "NotIn": f"{key} notin ({values})", "Exists": key}.get(
                operator, f"!{key}"
            )
        )
    return ",".join(parts)


def scale_of(obj: Mapping[str, Any]) -> dict[str, Any]:
    """The ``autoscaling/v1`` Scale of a Deployment or ReplicaSet."""
    meta = objects.meta(obj)
    replicas = objects.spec(obj).get("replicas")
    return {
        "kind": "Scale",
        "apiVersion": "autoscaling/v1",
        "metadata": {
            key: meta[key]  # type: ignore[literal-required]
            for key in ("name", "namespace", "uid", "resourceVersion", "creationTimestamp")
            if key in meta
        },
        "spec": {"replicas": replicas if isinstance(replicas, int) else 1},
        "status": {
            "replicas": int(objects.status(obj).get("replicas") or 0),
            "selector": selector_text(objects.spec(obj).get("selector")),
        },
    }


def install_scale(k: kmock.KubernetesEmulator) -> None:
    """Answer GET and PATCH of ``deployments/scale`` and ``replicasets/scale`` with a Scale."""
    table = getattr(k, "subresources", None)
    if table is not None and hasattr(table, "serve"):
        for group, plural in SCALED:
            table.serve(group, plural, "scale", ("GET", "PATCH"))

    def is_scale(request: kmock.Request) -> bool:
        resource = request.resource
        return bool(
            resource is not None
            and (resource.group, resource.plural) in SCALED
            and request.subresource == "scale"
            and request.name
            and request.method in (kmock.method.GET, kmock.method.PATCH)
        )

    def answer(request: kmock.Request) -> Any:
        assert request.resource is not None and request.name is not None  # is_scale
        key = (request.resource, request.namespace, request.name)
        if key not in k.objects or k.objects[key].deleted:
            kind = str(request.resource.plural)
            body = {
                "kind": "Status",
                "apiVersion": "v1",
                "metadata": {},
                "status": "Failure",
                "message": f'{kind}.apps "{request.name}" not found',
                "reason": "NotFound",
                "details": {"name": request.name, "group": "apps", "kind": kind},
                "code": 404,
            }
            return _RESPONSE(
                status=404, headers={"Content-Type": "application/json"}, payload=json.dumps(body).encode()
            )
        payload = json.dumps(scale_of(k.objects[key].raw)).encode()
        return _RESPONSE(status=200, headers={"Content-Type": "application/json"}, payload=payload)

    (k**2)[kmock.subresource("scale")][is_scale] << answer  # the cheap criterion first: every request
