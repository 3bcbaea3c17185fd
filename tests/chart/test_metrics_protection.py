"""``metrics.protection``: the three /metrics endpoints behind kube-rbac-proxy, the way the ecosystem does it.

With ``kube-rbac-proxy`` each component (the scheduler's extender, the webhook, the node agent) binds its
metrics listener to loopback only, and a sidecar serves HTTPS on the component's public metrics port,
admitting a scraper only after the API server has authenticated it (TokenReview; or a client certificate
from the configured CA) and authorised ``get`` on ``/metrics`` (SubjectAccessReview). The Service, the
ServiceMonitor and the NetworkPolicy keep the same port, which now leads to the proxy; the kubelet's
probes go through the proxy on the health paths only. The proxies run under the component's account,
which gains exactly the two review rights; scrapers get ``/metrics`` through the metrics-reader role.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import aiohttp
import helm_python as helm
import kmock
import pytest
import yaml

from nodeagent.config import parse_agent_config
from webhook.config import parse_settings

from .rendering import (
    CHART,
    CUSTOM_KINDS,
    NAMESPACE,
    Grant,
    Rendered,
    container,
    flags,
    grants,
    labels,
    pod_spec,
    port,
    render,
    schema_errors,
)
from .test_apply import CRDS, api_path

READERS = [{"kind": "ServiceAccount", "name": "prometheus-k8s", "namespace": "monitoring"}]
PROTECTED: dict[str, Any] = {
    "metrics": {
        "protection": "kube-rbac-proxy",
        "serviceMonitor": {"enabled": True},
        "kubeRbacProxy": {"readers": READERS},
    }
}
WITH_TLS: dict[str, Any] = {
    "metrics": {
        "protection": "kube-rbac-proxy",
        "kubeRbacProxy": {"tlsSecret": "metrics-tls", "clientCAConfigMap": "scraper-ca"},
    }
}
#: component -> (workload kind, container, values key holding metricsPort, health paths on that listener)
COMPONENTS = {
    "scheduler": ("Deployment", "extender", "scheduler", {"/healthz", "/readyz"}),
    "webhook": ("Deployment", "webhook", "webhook", set()),
    "node-agent": ("DaemonSet", "node-agent", "nodeAgent", {"/healthz"}),
}
REVIEWS = {
    Grant("authentication.k8s.io", "tokenreviews", "create"),
    Grant("authorization.k8s.io", "subjectaccessreviews", "create"),
}
DEFAULTS = yaml.safe_load((CHART / "values.yaml").read_text())


def public_port(component: str) -> int:
    return int(DEFAULTS[COMPONENTS[component][2]]["metricsPort"])


def metrics_listen(component: str, ours: dict[str, Any], tmp_path: Path) -> str:
    """Where the component binds /metrics, as its own flag parser reads its command line."""
    command = [str(p) for p in [*ours.get("command", []), *ours.get("args", [])]]
    if component == "node-agent":
        return str(parse_agent_config(command[1:], {"NODE_NAME": "n1"}).metrics_listen)
    if component == "webhook":
        device_config = tmp_path / "device-config.yaml"
        device_config.write_text("nvidia: {}\n")
        local = [
            f"--device-config={device_config}" if p.startswith("--device-config=") else p for p in command
        ]
        return str(parse_settings(local[1:], env={}).metrics_listen)
    return flags(ours)["metrics-listen"]  # the scheduler's parser is checked in test_wiring


def proxy_args(proxy: dict[str, Any]) -> dict[str, str]:
    return flags({"args": proxy["args"]})


def workload(rendered: Rendered, component: str) -> dict[str, Any]:
    return rendered.component(COMPONENTS[component][0], component)


@pytest.mark.parametrize("component", COMPONENTS)
def test_without_protection_metrics_are_served_directly(component: str, tmp_path: Path) -> None:
    rendered = render()
    pod = workload(rendered, component)
    assert "metrics-proxy" not in [c["name"] for c in pod_spec(pod)["containers"]]
    ours = container(pod, COMPONENTS[component][1])
    assert metrics_listen(component, ours, tmp_path) == f"0.0.0.0:{public_port(component)}"
    assert not [r for r in rendered.of_kind("ClusterRole") if r["metadata"]["name"].endswith("-metrics-auth")]


@pytest.mark.parametrize("component", COMPONENTS)
def test_metrics_listen_on_loopback_and_the_proxy_serves_the_public_port(
    component: str, tmp_path: Path
) -> None:
    rendered = render(PROTECTED)
    pod = workload(rendered, component)
    ours = container(pod, COMPONENTS[component][1])
    proxy = container(pod, "metrics-proxy")
    args = proxy_args(proxy)
    listen = metrics_listen(component, ours, tmp_path)
    assert listen == "127.0.0.1:9099"
    assert args["upstream"] == f"http://{listen}/"
    public = public_port(component)
    assert args["secure-listen-address"] == f"0.0.0.0:{public}"
    assert port(proxy, "metrics") == public
    assert "metrics" not in {p.get("name") for p in ours.get("ports", [])}  # only the proxy's is named so

    # the Service's metrics port and the NetworkPolicy lead to the proxy
    (service_port,) = [
        p for p in rendered.component("Service", component)["spec"]["ports"] if p["name"] == "metrics"
    ]
    assert service_port["targetPort"] == "metrics" and service_port["port"] == public
    for policy in rendered.of_kind("NetworkPolicy"):
        if labels(policy)["app.kubernetes.io/component"] == component:
            admitted = {p["port"] for rule in policy["spec"]["ingress"] for p in rule.get("ports", [])}
            assert public in admitted

    # only health paths pass without a token, and the kubelet probes exactly those, over HTTPS
    expected_health = COMPONENTS[component][3]
    ignored = set(args["ignore-paths"].split(",")) if "ignore-paths" in args else set()
    assert ignored == expected_health
    for probe in ("readinessProbe", "livenessProbe"):
        get = (ours.get(probe) or {}).get("httpGet")
        if get and get["port"] == "metrics":
            assert get["scheme"] == "HTTPS" and get["path"] in ignored, (probe, get)

    # Prometheus scrapes the same port over HTTPS with its ServiceAccount token
    (endpoint,) = rendered.component("ServiceMonitor", component)["spec"]["endpoints"]
    assert (endpoint["port"], endpoint["path"], endpoint["scheme"]) == ("metrics", "/metrics", "https")
    assert endpoint["bearerTokenFile"] == "/var/run/secrets/kubernetes.io/serviceaccount/token"

    context = proxy["securityContext"]
    assert context["runAsNonRoot"] is True and context["readOnlyRootFilesystem"] is True
    assert context["allowPrivilegeEscalation"] is False and context["capabilities"]["drop"] == ["ALL"]


@pytest.mark.parametrize("component", COMPONENTS)
def test_each_proxy_may_review_tokens_and_access_and_nothing_more(component: str) -> None:
    protected, plain = render(PROTECTED), render()
    assert grants(protected, component) - grants(plain, component) == REVIEWS
    assert grants(plain, component) <= grants(protected, component)
    account = pod_spec(workload(protected, component))["serviceAccountName"]
    (binding,) = [
        b
        for b in protected.of_kind("ClusterRoleBinding")
        if b["metadata"]["name"].endswith("-metrics-auth")
        and labels(b)["app.kubernetes.io/component"] == component
    ]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": account, "namespace": NAMESPACE}]


def test_scrapers_get_metrics_through_the_reader_role() -> None:
    rendered = render(PROTECTED)
    role = rendered.one("ClusterRole", "hami-metrics-reader")
    assert role["rules"] == [{"nonResourceURLs": ["/metrics"], "verbs": ["get"]}]
    binding = rendered.one("ClusterRoleBinding", "hami-metrics-reader")
    assert binding["roleRef"]["name"] == "hami-metrics-reader" and binding["subjects"] == READERS
    # without readers the role is there to bind, but nobody is bound
    alone = render({"metrics": {"protection": "kube-rbac-proxy"}})
    assert alone.one("ClusterRole", "hami-metrics-reader")
    assert [
        b for b in alone.of_kind("ClusterRoleBinding") if b["metadata"]["name"] == "hami-metrics-reader"
    ] == []


@pytest.mark.parametrize("component", COMPONENTS)
def test_own_certificate_and_client_certificates(component: str) -> None:
    """TLS client auth: certificates from the CA in the ConfigMap authenticate as their CN."""
    pod = workload(render(WITH_TLS), component)
    proxy = container(pod, "metrics-proxy")
    args = proxy_args(proxy)
    mounts = {m["mountPath"]: m["name"] for m in proxy["volumeMounts"]}
    volumes = {v["name"]: v for v in pod_spec(pod)["volumes"]}
    cert_dir, ca_dir = Path(args["tls-cert-file"]).parent, Path(args["client-ca-file"]).parent
    assert Path(args["tls-private-key-file"]).parent == cert_dir
    assert volumes[mounts[str(cert_dir)]]["secret"]["secretName"] == "metrics-tls"
    assert volumes[mounts[str(ca_dir)]]["configMap"]["name"] == "scraper-ca"


@pytest.mark.parametrize("values", [PROTECTED, WITH_TLS], ids=["protected", "tls"])
def test_protected_chart_lints_and_validates(values: dict[str, Any]) -> None:
    report = helm.lint(str(CHART), values, strict=True, namespace=NAMESPACE)
    assert report["errors"] == [] and [m for m in report["messages"] if m["severity"] >= 2] == []
    errors = [
        e
        for doc in render(values).docs
        if doc["kind"] not in CUSTOM_KINDS
        for e in schema_errors(doc, "1.32")
    ]
    assert errors == []


def test_an_unknown_protection_is_refused() -> None:
    with pytest.raises(Exception, match="protection"):
        render({"metrics": {"protection": "basic-auth"}})


async def test_protected_objects_are_accepted_by_an_api_server(apiserver: kmock.KubernetesEmulator) -> None:
    """Created on the embedded API server: no two documents collide, every kind is served."""
    for key, kind in CRDS.items():
        apiserver.resources[key] = kmock.ResourceInfo(
            kind=kind, namespaced=True, verbs=["create", "get", "list"]
        )
    docs = render(PROTECTED).docs
    async with aiohttp.ClientSession(base_url=str(apiserver.url)) as session:
        for doc in docs:
            collection, _ = api_path(apiserver, doc)
            async with session.post(collection, json=doc) as response:
                assert response.status in (200, 201), (
                    doc["kind"],
                    doc["metadata"]["name"],
                    await response.text(),
                )
    assert len(list(apiserver.objects.keys())) == len(docs)
