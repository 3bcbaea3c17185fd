"""Which subresources the embedded apiserver serves, and kube-apiserver's answer for the others.

kmock reads ``/api/v1/namespaces/NS/pods/NAME/log`` as the pod with a subresource and answers it as the
pod (``kubectl logs`` printed the pod's JSON and exited 0; a DELETE of ``pods/NAME/status`` deleted the
pod). Owns :class:`Subresources`: the table of what is served (:data:`SERVED`: every resource's
``status`` read and patched, ``pods/binding`` created; a stand-in that serves more adds its own with
:meth:`Subresources.serve`) and :meth:`Subresources.refusal`, asked before anything else on every
request, which answers the rest as kube-apiserver answers a route it does not have:

* a served subresource with a method it does not take: ``405 MethodNotAllowed`` ("the server does not
  allow this method on the requested resource");
* a subresource Kubernetes has for that resource but this cluster does not serve (``log``, ``exec``,
  ``attach``, ``portforward``, ``proxy``, ``eviction``, ``scale``, ...): the object's own ``404`` when
  it does not exist, else ``404 NotFound`` saying what is not served and why (the embedded cluster runs
  no containers);
* any other subresource: ``404 NotFound`` ("the server could not find the requested resource").

Simulation only; no I/O. Must not import ``hami.kube``, ``webhook`` or ``nodeagent``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

from hami_testkit.restapi import JsonDict, not_found, status

#: (API group, plural, subresource) -> the HTTP methods served; plural ``*``: every resource.
SERVED: Mapping[tuple[str, str, str], frozenset[str]] = {
    ("*", "*", "status"): frozenset({"GET", "PATCH"}),
    ("", "pods", "binding"): frozenset({"POST"}),
}
#: Subresources that reach a container (kubelet) or a network endpoint: there are none here.
NEEDS_CONTAINERS = frozenset({"log", "exec", "attach", "portforward", "proxy"})
NOT_FOUND = "the server could not find the requested resource"
NOT_ALLOWED = "the server does not allow this method on the requested resource"


class Subresources:
    """The served subresources of one apiserver (see the module docstring)."""

    def __init__(self, served: Mapping[tuple[str, str, str], Iterable[str]] = SERVED) -> None:
        self._served = {key: frozenset(m.upper() for m in methods) for key, methods in served.items()}

    def serve(self, group: str, plural: str, subresource: str, methods: Iterable[str]) -> None:
        """Serve ``plural/subresource`` of ``group`` for ``methods`` too (its reaction is the caller's)."""
        key = (group, plural, subresource)
        self._served[key] = self._served.get(key, frozenset()) | {m.upper() for m in methods}

    def methods(self, group: str, plural: str, subresource: str) -> frozenset[str] | None:
        """The methods served for the subresource, or None when it is not served at all."""
        found = [
            methods
            for (g, p, s), methods in self._served.items()
            if s == subresource and (g, p) in ((group, plural), ("*", "*"))
        ]
        return frozenset().union(*found) if found else None

    def refusal(
        self,
        request: Any,
        known: Callable[[Any], Iterable[str]],
        exists: Callable[[Any], bool],
    ) -> tuple[int, JsonDict] | None:
        """kube-apiserver's answer for a subresource request this apiserver does not serve, or None.

        ``known(resource)`` names the subresources Kubernetes has for the resource (discovery);
        ``exists(request)`` says whether the object the request names is stored.
        """
        resource, subresource = request.resource, request.subresource
        if resource is None or not resource.plural or not subresource or request.name is None:
            return None
        group, plural = str(resource.group or ""), str(resource.plural)
        sub = str(subresource).split("/", 1)[0]
        methods = self.methods(group, plural, sub)
        method = str(getattr(request.method, "value", request.method)).upper()
        if methods is not None:
            return None if method in methods else (405, status(405, "MethodNotAllowed", NOT_ALLOWED, {}))
        if sub not in set(known(resource)) and sub not in NEEDS_CONTAINERS:
            return 404, status(404, "NotFound", NOT_FOUND, {})
        if not exists(request):
            return 404, not_found(plural, str(request.name), group)
        why = " (it runs no containers)" if sub in NEEDS_CONTAINERS else ""
        message = f"{NOT_FOUND}: the embedded cluster does not serve {plural}/{sub}{why}"
        return 404, status(404, "NotFound", message, {"name": str(request.name), "kind": plural})
