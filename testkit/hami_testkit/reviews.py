"""Who am I and what may I do: the self reviews kube-apiserver answers without storing anything.

``kubectl auth whoami`` creates a ``SelfSubjectReview`` (authentication.k8s.io/v1), ``kubectl auth
can-i`` a ``SelfSubjectAccessReview`` (``--list``: a ``SelfSubjectRulesReview``; both
authorization.k8s.io/v1), in protobuf (:mod:`hami_testkit.protobuf`) or JSON; kmock would store them
and answer with the body sent. Owns :func:`answer`, asked ahead of kmock on every request, which
answers them as kube-apiserver does: ``201`` with the review and its ``status``, nothing stored; any
other method on them is ``405``. The user is the one the request's bearer token names
(:meth:`hami_testkit.apiserver.AdmittingEmulator.username`) with kube-apiserver's groups (:func:`groups`).

The embedded apiserver authorizes every request (its only refusals are admission: the
ValidatingAdmissionPolicies and the webhooks), so every access review is allowed, for every user, and
the rules review lists ``*``: the answer a kube-apiserver run with ``--authorization-mode=AlwaysAllow``
gives. A body of the wrong shape is ``400 BadRequest``; an access review naming both or neither of
``resourceAttributes`` and ``nonResourceAttributes`` is ``422 Invalid``.

Simulation only; no I/O. Must not import ``hami.kube``, ``webhook`` or ``nodeagent``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from hami_testkit.restapi import JsonDict, status
from hami_testkit.subresources import NOT_ALLOWED

ANONYMOUS = "system:anonymous"
AUTHORIZATION = "authorization.k8s.io"
AUTHENTICATION = "authentication.k8s.io"
#: (group, plural) -> kind of the reviews answered here.
REVIEWS = {
    (AUTHORIZATION, "selfsubjectaccessreviews"): "SelfSubjectAccessReview",
    (AUTHORIZATION, "selfsubjectrulesreviews"): "SelfSubjectRulesReview",
    (AUTHENTICATION, "selfsubjectreviews"): "SelfSubjectReview",
}
ALLOWED_REASON = "the embedded apiserver authorizes every request (no RBAC)"


def groups(username: str) -> list[str]:
    """The groups kube-apiserver's authenticators give a user."""
    if username == ANONYMOUS:
        return ["system:unauthenticated"]
    if username.startswith("system:serviceaccount:"):
        namespace = username.split(":")[2]
        return ["system:serviceaccounts", f"system:serviceaccounts:{namespace}", "system:authenticated"]
    return ["system:authenticated"]


def answer(request: Any, username: str) -> tuple[int, JsonDict] | None:
    """kube-apiserver's answer to a self review (see the module docstring), or None for other requests."""
    resource = request.resource
    if resource is None or not resource.plural or request.subresource:
        return None
    group = str(resource.group or "")
    kind = REVIEWS.get((group, str(resource.plural)))
    if kind is None or str(resource.version) != "v1":
        return None
    if str(getattr(request.method, "value", request.method)).upper() != "POST" or request.name is not None:
        return 405, status(405, "MethodNotAllowed", NOT_ALLOWED, {})
    body = request.data
    if not isinstance(body, Mapping):
        return 400, status(400, "BadRequest", f"the request body must be a {kind} object")
    spec = body.get("spec", {})
    if not isinstance(spec, Mapping):
        return 400, status(400, "BadRequest", f"{kind}.spec must be an object")
    review: JsonDict = {"kind": kind, "apiVersion": f"{group}/v1", "metadata": {"creationTimestamp": None}}
    if kind == "SelfSubjectReview":
        user = {"username": username, "groups": groups(username)}
        return 201, {**review, "status": {"userInfo": user}}
    if kind == "SelfSubjectRulesReview":
        if not isinstance(spec.get("namespace"), str) or not spec["namespace"]:
            return 400, status(400, "BadRequest", "no namespace on request")
        rules = {
            "resourceRules": [{"verbs": ["*"], "apiGroups": ["*"], "resources": ["*"]}],
            "nonResourceRules": [{"verbs": ["*"], "nonResourceURLs": ["*"]}],
            "incomplete": False,
        }
        return 201, {**review, "spec": dict(spec), "status": rules}
    given = [key for key in ("resourceAttributes", "nonResourceAttributes") if spec.get(key) is not None]
    for key in given:
        if not isinstance(spec[key], Mapping):
            return 400, status(400, "BadRequest", f"{kind}.spec.{key} must be an object")
    if len(given) != 1:
        message = (
            f'{kind}.{group} "" is invalid: spec.resourceAttributes: Invalid value: "null": '
            "exactly one of nonResourceAttributes or resourceAttributes must be specified"
        )
        return 422, status(422, "Invalid", message, {"group": group, "kind": kind})
    return 201, {**review, "spec": dict(spec), "status": {"allowed": True, "reason": ALLOWED_REASON}}
