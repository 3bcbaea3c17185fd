"""RBAC: least privilege, every rule documented, each role bound to the pod that uses it.

The permission tables below are the chart's contract, one line per API call the component's code
makes (see the comments in the templates). The certificate Jobs' command lines run against kmock
here, and the requests they make map (``grant_for_request``) onto exactly their grants; the webhook's
(the ResourceQuota list + watch of its admission pre-check) is checked the same way in
``tests/webhook/test_chart_mode.py``.
"""

from __future__ import annotations

import asyncio
import base64
import re
from datetime import UTC, datetime, timedelta
from pathlib import Path

import kmock
import pytest

from webhook import tlsbundle
from webhook.certgen import main as certgen_main
from webhook.config import service_hostnames

from .rendering import (
    CHART,
    NAMESPACE,
    Grant,
    allows,
    argv,
    container,
    flags,
    grant_for_request,
    grants,
    labels,
    pod_spec,
    render,
)

MWC_COLLECTION = "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations"

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
    Grant("", "resourcequotas", "list"),
    Grant("", "resourcequotas", "watch"),
    Grant("policy", "poddisruptionbudgets", "list"),  # /preempt's budgets
    Grant("policy", "poddisruptionbudgets", "watch"),
    Grant("", "events", "create"),
    Grant("", "events", "patch"),  # a repeated FilteringFailed raises the Event's count
}
NODE_AGENT = {  # pods list + watch: the node-scoped pod cache and Allocate's fresh list; no pods get
    Grant("", "nodes", "get"),
    Grant("", "nodes", "patch"),
    Grant("", "pods", "list"),
    Grant("", "pods", "watch"),
    Grant("", "pods", "patch"),
    Grant("", "events", "create"),
}
#: The admission ResourceQuota pre-check keeps every quota's GPU limits by list + watch; Kopf reads only
#: discovery (tests/webhook/test_chart_mode.py).
WEBHOOK = {Grant("", "resourcequotas", "list"), Grant("", "resourcequotas", "watch")}
CERTGEN = {
    Grant("", "secrets", "create"),
    Grant("", "secrets", "get", "hami-webhook-tls"),
    Grant("", "secrets", "patch", "hami-webhook-tls"),
    Grant("admissionregistration.k8s.io", "mutatingwebhookconfigurations", "get", "hami-webhook"),
    Grant("admissionregistration.k8s.io", "mutatingwebhookconfigurations", "patch", "hami-webhook"),
}
#: The rotation CronJob (webhook/cert-rotation.yaml): re-issues and re-injects, never creates the Secret.
CERT_ROTATION = {
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
        ("cert-rotation", CERT_ROTATION),
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
                assert labels(role)["app.kubernetes.io/component"] in ("certgen", "cert-rotation")


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
    for cron in rendered.of_kind("CronJob"):
        accounts[labels(cron)["app.kubernetes.io/component"]] = pod_spec(cron["spec"]["jobTemplate"])[
            "serviceAccountName"
        ]
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
        ("GET", "/api/v1/resourcequotas", {"watch": "true"}, Grant("", "resourcequotas", "watch")),
        ("GET", "/api/v1/namespaces/team/resourcequotas", {}, Grant("", "resourcequotas", "list")),
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


async def test_certificate_jobs_need_exactly_their_grants(
    apiserver: kmock.KubernetesEmulator, kubeconfig: Path
) -> None:
    """Run the rendered Jobs' command lines (install, then an upgrade that must re-issue) against the
    embedded API server; the requests they make need exactly the certgen roles' grants."""
    rendered = render()
    jobs = {job["metadata"]["name"].rpartition("-")[2]: job for job in rendered.of_kind("Job")}
    create, inject = (argv(container(jobs[k], "certgen"))[3:] for k in ("create", "inject"))
    config = rendered.component("MutatingWebhookConfiguration", "webhook")
    secret = flags(container(jobs["create"], "certgen"))["secret"]

    async def run(command: list[str]) -> None:
        assert await asyncio.to_thread(certgen_main, [*command, f"--kubeconfig={kubeconfig}"], {}) == 0

    await run(create)  # pre-install: no configuration yet
    response = await apiserver.post(MWC_COLLECTION, json=config)  # Helm creates the chart's objects
    assert response.status in (200, 201)
    await run(inject)  # post-install
    # an upgrade with a certificate about to expire: re-issued, published first
    hostnames = service_hostnames(rendered.component("Service", "webhook")["metadata"]["name"], NAMESPACE)
    expiring = tlsbundle.generate(hostnames, now=datetime.now(UTC) - timedelta(days=350))
    data = {"ca.crt": expiring.ca_cert, "tls.crt": expiring.cert, "tls.key": expiring.key}
    encoded = {key: base64.b64encode(value).decode() for key, value in data.items()}
    response = await apiserver.patch(
        f"/api/v1/namespaces/{NAMESPACE}/secrets/{secret}", json={"data": encoded}
    )
    assert response.status == 200
    await run(create)
    await run(inject)

    made = [
        grant_for_request(str(r.method.value), r.url.path, dict(r.params))
        for r in list(apiserver)
        if r.headers.get("User-Agent", "").startswith("hami-certgen/")  # the command's client
    ]
    assert set(made) == grants(rendered, "certgen") == CERTGEN
