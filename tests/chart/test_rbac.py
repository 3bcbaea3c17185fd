"""RBAC: least privilege, every rule documented, each role bound to the pod that uses it.

The permission tables below are the chart's contract, one line per API call the component's code
makes (see the comments in the templates). A later test runs each component against kmock and
checks, with ``grant_for_request``/``allows``, that the recorded requests need exactly these.
"""

from __future__ import annotations

import re

import pytest

from .rendering import CHART, Grant, allows, grant_for_request, grants, labels, pod_spec, render

SCHEDULER = {
    Grant("", "nodes", "get"),
    Grant("", "nodes", "list"),
    Grant("", "nodes", "watch"),
    Grant("", "nodes", "patch"),
    Grant("", "pods", "get"),
    Grant("", "pods", "list"),
    Grant("", "pods", "watch"),
    Grant("", "pods", "patch"),
    Grant("", "pods/binding", "create"),
    Grant("", "events", "create"),
}
NODE_AGENT = {
    Grant("", "nodes", "get"),
    Grant("", "nodes", "patch"),
    Grant("", "pods", "get"),
    Grant("", "pods", "list"),
    Grant("", "pods", "patch"),
}
WEBHOOK = {
    Grant("", "namespaces", "list"),
    Grant("", "namespaces", "watch"),
    Grant("apiextensions.k8s.io", "customresourcedefinitions", "list"),
    Grant("apiextensions.k8s.io", "customresourcedefinitions", "watch"),
}
CERTGEN = {
    Grant("", "secrets", "create"),
    Grant("", "secrets", "get", "hami-webhook-tls"),
    Grant("", "secrets", "patch", "hami-webhook-tls"),
    Grant("admissionregistration.k8s.io", "mutatingwebhookconfigurations", "get", "hami-webhook"),
    Grant("admissionregistration.k8s.io", "mutatingwebhookconfigurations", "patch", "hami-webhook"),
}
KUBE_SCHEDULER_LEASE = {
    Grant("coordination.k8s.io", "leases", "create"),
    Grant("coordination.k8s.io", "leases", "get", "hami-scheduler"),
    Grant("coordination.k8s.io", "leases", "update", "hami-scheduler"),
}


@pytest.mark.parametrize(
    ("component", "expected"),
    [
        ("scheduler", SCHEDULER),
        ("node-agent", NODE_AGENT),
        ("webhook", WEBHOOK),
        ("certgen", CERTGEN),
        ("kube-scheduler", KUBE_SCHEDULER_LEASE),
    ],
)
def test_each_component_gets_exactly_its_permissions(component: str, expected: set[Grant]) -> None:
    assert grants(render(), component) == expected


def test_no_role_uses_wildcards_or_powerful_verbs() -> None:
    rendered = render({"webhook": {"certManager": {"enabled": False}}})
    for role in rendered.of_kind("ClusterRole") + rendered.of_kind("Role"):
        for rule in role["rules"]:
            for key in ("apiGroups", "resources", "verbs"):
                assert "*" not in rule[key], role["metadata"]["name"]
            assert not {"escalate", "bind", "impersonate", "deletecollection"} & set(rule["verbs"])
            if "secrets" in rule["resources"]:
                assert labels(role)["app.kubernetes.io/component"] == "certgen"


def test_roles_are_bound_to_the_service_account_of_the_pod_using_them() -> None:
    rendered = render()
    accounts = {
        labels(w)["app.kubernetes.io/component"]: pod_spec(w)["serviceAccountName"]
        for kind in ("Deployment", "DaemonSet")
        for w in rendered.of_kind(kind)
    }
    accounts["kube-scheduler"] = accounts["scheduler"]  # the stock scheduler runs in the same pod
    for job in rendered.of_kind("Job"):
        accounts["certgen"] = pod_spec(job)["serviceAccountName"]
    roles = {
        (r["kind"], r["metadata"]["name"]): r
        for r in rendered.of_kind("ClusterRole") + rendered.of_kind("Role")
    }
    for binding in rendered.of_kind("ClusterRoleBinding") + rendered.of_kind("RoleBinding"):
        component = labels(binding)["app.kubernetes.io/component"]
        (subject,) = binding["subjects"]
        assert subject["name"] == accounts[component], binding["metadata"]["name"]
        ref = binding["roleRef"]
        if not ref["name"].startswith(("system:", "extension-apiserver-authentication-reader")):
            assert labels(roles[(ref["kind"], ref["name"])])["app.kubernetes.io/component"] == component


def test_without_rbac_creation_no_rbac_objects_are_rendered() -> None:
    rendered = render({"rbac": {"create": False}})
    for kind in ("ServiceAccount", "ClusterRole", "Role", "ClusterRoleBinding", "RoleBinding"):
        assert rendered.of_kind(kind) == [], kind


ROLE_TEMPLATES = sorted(
    str(p.relative_to(CHART / "templates"))
    for p in (CHART / "templates").rglob("*.yaml")
    if re.search(r"^kind: (Cluster)?Role$", p.read_text(), re.M)
)


@pytest.mark.parametrize("template", ROLE_TEMPLATES)
def test_every_rule_says_why_it_is_needed(template: str) -> None:
    path = CHART / "templates" / template
    lines = path.read_text().splitlines()
    for number, line in enumerate(lines):
        if re.match(r"\s*- apiGroups:", line) and re.match(r"\s*rules:", lines[number - 1]) is None:
            assert lines[number - 1].strip().startswith("#"), f"{path.name}:{number + 1} has no comment"
        if re.match(r"\s*rules:", line):
            assert lines[number + 1].strip().startswith("#"), f"{path.name}:{number + 2} has no comment"


@pytest.mark.parametrize(
    ("method", "path", "query", "needed"),
    [
        ("GET", "/api/v1/nodes", {}, Grant("", "nodes", "list")),
        ("GET", "/api/v1/pods", {"watch": "true"}, Grant("", "pods", "watch")),
        ("GET", "/api/v1/nodes/gpu-1", {}, Grant("", "nodes", "get", "gpu-1")),
        ("PATCH", "/api/v1/namespaces/ns/pods/p", {}, Grant("", "pods", "patch", "p")),
        ("POST", "/api/v1/namespaces/ns/pods/p/binding", {}, Grant("", "pods/binding", "create", "p")),
        ("POST", "/api/v1/namespaces/ns/events", {}, Grant("", "events", "create")),
        ("GET", "/api/v1/namespaces", {"watch": "true"}, Grant("", "namespaces", "watch")),
        (
            "PATCH",
            "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations/hami-webhook",
            {},
            Grant("admissionregistration.k8s.io", "mutatingwebhookconfigurations", "patch", "hami-webhook"),
        ),
    ],
)
def test_requests_map_to_the_permission_they_need(
    method: str, path: str, query: dict[str, str], needed: Grant
) -> None:
    assert grant_for_request(method, path, query) == needed


def test_permission_check_honours_resource_names() -> None:
    granted = grants(render(), "certgen")
    assert allows(granted, Grant("", "secrets", "get", "hami-webhook-tls"))
    assert not allows(granted, Grant("", "secrets", "get", "someone-elses"))
    assert allows(granted, grant_for_request("POST", "/api/v1/namespaces/hami-system/secrets"))
    assert not allows(grants(render(), "scheduler"), grant_for_request("DELETE", "/api/v1/nodes/n1"))
