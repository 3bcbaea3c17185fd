"""The chart wires the pieces together the way the code expects.

kube-scheduler's configuration calls routes the extender serves, on the port it listens on; the
webhook's Service, port, path and certificate names are what the webhook server uses; every
container's command line is accepted by that component's own flag parser, and the values it yields
match the objects around it.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import cel
import pytest
import yaml
from aiohttp import web

from hami.scheduler import config as scheduler_config
from hami.scheduler.app import create_app, create_probe_app
from hami.scheduler.main import build_context
from hami.settings import ResourceNames
from nodeagent.config import load_node_settings, parse_agent_config
from tests.builders import NO_API
from webhook.config import HANDLER_ID, WEBHOOK_NAME, parse_settings, service_hostnames
from webhook.registration import desired_webhook

from .rendering import (
    NAMESPACE,
    VALUE_SETS,
    Rendered,
    argv,
    container,
    flags,
    labels,
    mount_of_volume,
    pod_spec,
    port,
    render,
)

SETS = pytest.mark.parametrize("values", VALUE_SETS.values(), ids=VALUE_SETS.keys())
ROOT = Path(__file__).resolve().parents[2]

#: Field names of kube-scheduler's v1 Extender and ExtenderManagedResource types
#: (k8s.io/kube-scheduler/config/v1); kube-scheduler decodes its file strictly, so any other key
#: would stop it from starting.
EXTENDER_FIELDS = {
    "urlPrefix",
    "filterVerb",
    "preemptVerb",
    "prioritizeVerb",
    "weight",
    "bindVerb",
    "enableHTTPS",
    "tlsConfig",
    "httpTimeout",
    "nodeCacheCapable",
    "managedResources",
    "ignorable",
}
MANAGED_RESOURCE_FIELDS = {"name", "ignoredByScheduler"}
LEADER_ELECTION_FIELDS = {
    "leaderElect",
    "leaseDuration",
    "renewDeadline",
    "retryPeriod",
    "resourceLock",
    "resourceName",
    "resourceNamespace",
}


def served_routes() -> dict[str, set[tuple[str, str]]]:
    """The routes each listener of ``hami scheduler`` serves, read from the apps the code builds."""

    def routes(app: web.Application) -> set[tuple[str, str]]:
        return {
            (route.method, route.resource.canonical)
            for route in app.router.routes()
            if route.method != "HEAD" and route.resource is not None
        }

    ctx = build_context(scheduler_config.SchedulerSettings(), api=NO_API)
    return {"verbs": routes(create_app(ctx)), "metrics": routes(create_probe_app(ctx))}


def extender_settings(
    rendered: Rendered, ours: dict[str, Any], tmp_path: Path
) -> scheduler_config.SchedulerSettings:
    """The extender container's flags through the extender's own parser (device config copied here)."""
    parser = argparse.ArgumentParser(prog="hami scheduler")
    scheduler_config.add_arguments(parser, {})
    local = local_argv(ours, {"device-config": write_device_config(rendered, tmp_path)})
    assert local[0] == "scheduler"
    return scheduler_config.from_args(parser.parse_args(local[1:]))


def expected_names(values: dict[str, Any]) -> ResourceNames:
    names = values.get("resourceNames", {})
    defaults = ResourceNames()
    return ResourceNames(
        count=names.get("count", defaults.count),
        memory=names.get("memory", defaults.memory),
        memory_percentage=names.get("memoryPercentage", defaults.memory_percentage),
        cores=names.get("cores", defaults.cores),
        priority=names.get("priority", defaults.priority),
    )


def scheduler_name(values: dict[str, Any]) -> str:
    return str(values.get("schedulerName", "hami-scheduler"))


def kube_scheduler_config(rendered: Rendered) -> tuple[dict[str, Any], dict[str, Any]]:
    """(the scheduler Deployment, the parsed KubeSchedulerConfiguration it runs with)."""
    deployment = rendered.component("Deployment", "scheduler")
    kube = container(deployment, "kube-scheduler")
    (config_flag,) = [a for a in argv(kube) if a.startswith("--config=")]
    config_path = Path(config_flag.removeprefix("--config="))
    config_map = rendered.component("ConfigMap", "scheduler")
    assert mount_of_volume(deployment, kube, configMap=config_map["metadata"]["name"]) == str(
        config_path.parent
    )
    return deployment, yaml.safe_load(config_map["data"][config_path.name])


def write_device_config(rendered: Rendered, tmp_path: Path) -> Path:
    config_map = rendered.component("ConfigMap", "device-config")
    path = tmp_path / "device-config.yaml"
    path.write_text(config_map["data"]["device-config.yaml"])
    return path


def local_argv(ctr: dict[str, Any], replace: dict[str, Path]) -> list[str]:
    """The container's flags, with in-pod file paths swapped for local copies of the same files."""
    result = []
    for part in argv(ctr)[1:]:
        name, _, _ = part[2:].partition("=")
        result.append(f"--{name}={replace[name]}" if part.startswith("--") and name in replace else part)
    return result


# ------------------------------------------------------------------------------- scheduler
@SETS
def test_kube_scheduler_calls_the_extender_beside_it(values: dict[str, Any], tmp_path: Path) -> None:
    rendered = render(values)
    deployment, config = kube_scheduler_config(rendered)
    assert config["apiVersion"] == "kubescheduler.config.k8s.io/v1"
    assert config["kind"] == "KubeSchedulerConfiguration"
    assert [p["schedulerName"] for p in config["profiles"]] == [scheduler_name(values)]

    (extender,) = config["extenders"]
    assert set(extender) <= EXTENDER_FIELDS
    url = urlsplit(extender["urlPrefix"])
    assert (url.scheme, url.hostname, url.path) == ("http", "127.0.0.1", "")
    assert extender["enableHTTPS"] is False

    ours = container(deployment, "extender")
    settings = extender_settings(rendered, ours, tmp_path)
    # the verbs: on loopback only, where kube-scheduler in the same pod calls them; no port declared
    assert (settings.host, settings.port) == ("127.0.0.1", url.port)
    assert settings.port not in {p["containerPort"] for p in ours.get("ports", [])}
    # probes and Prometheus: the metrics listener on the pod IP
    assert (settings.metrics_host, settings.metrics_port) == ("0.0.0.0", port(ours, "metrics"))
    assert settings.metrics_port == values.get("scheduler", {}).get("metricsPort", 9395)

    routes = served_routes()
    for verb_key in ("filterVerb", "prioritizeVerb", "preemptVerb", "bindVerb"):
        verb = ("POST", f"/{extender[verb_key]}")
        assert verb in routes["verbs"] and verb not in routes["metrics"], verb_key
    for probe, path in (("readinessProbe", "/readyz"), ("livenessProbe", "/healthz")):
        assert ours[probe]["httpGet"] == {"path": path, "port": "metrics"}
        assert ("GET", path) in routes["metrics"] and ("GET", path) not in routes["verbs"]
    assert extender["nodeCacheCapable"] is True
    assert extender["weight"] >= 1
    assert re.fullmatch(r"\d+s", extender["httpTimeout"]) and int(extender["httpTimeout"][:-1]) >= 10

    managed = extender["managedResources"]
    assert all(set(m) <= MANAGED_RESOURCE_FIELDS and m["ignoredByScheduler"] is True for m in managed)
    assert [m["name"] for m in managed] == list(expected_names(values).managed)


@pytest.mark.parametrize(("given", "rendered"), [(None, 100), (0, 0), (42, 42), (100, 100)])
def test_kube_scheduler_sends_the_extender_the_share_of_nodes_the_values_say(
    given: int | None, rendered: int
) -> None:
    """percentageOfNodesToScore, top level (our one profile sets none, so it applies to it): by default
    100, so our extender sees every node kube-scheduler's own filters keep; kube-scheduler's own default
    would be its adaptive sample (docs/install.md, "Scheduling on large clusters")."""
    values = {} if given is None else {"scheduler": {"percentageOfNodesToScore": given}}
    _, config = kube_scheduler_config(render(values))
    assert config["percentageOfNodesToScore"] == rendered
    assert isinstance(config["percentageOfNodesToScore"], int)
    assert all("percentageOfNodesToScore" not in profile for profile in config["profiles"])


@SETS
def test_leader_election_uses_the_profile_lease(values: dict[str, Any]) -> None:
    rendered = render(values)
    _, config = kube_scheduler_config(rendered)
    election = config["leaderElection"]
    assert set(election) <= LEADER_ELECTION_FIELDS
    assert election["leaderElect"] is True
    assert (election["resourceName"], election["resourceNamespace"]) == (scheduler_name(values), NAMESPACE)
    if values.get("rbac", {}).get("create", True):
        role = rendered.one(
            "Role", f"{rendered.component('Deployment', 'scheduler')['metadata']['name']}-leader-election"
        )
        named = [r for r in role["rules"] if r.get("resourceNames")]
        assert named == [
            {
                "apiGroups": ["coordination.k8s.io"],
                "resources": ["leases"],
                "resourceNames": [scheduler_name(values)],
                "verbs": ["get", "update"],
            }
        ]


@SETS
def test_extender_flags_carry_the_chart_settings(values: dict[str, Any]) -> None:
    rendered = render(values)
    deployment = rendered.component("Deployment", "scheduler")
    ours = container(deployment, "extender")
    assert argv(ours)[:2] == ["hami", "scheduler"]
    given = flags(ours)
    scheduler = values.get("scheduler", {})
    assert given["scheduler-name"] == scheduler_name(values)
    assert given["node-scheduler-policy"] == scheduler.get("nodeSchedulerPolicy", "binpack")
    assert given["gpu-scheduler-policy"] == scheduler.get("gpuSchedulerPolicy", "spread")
    device_config = rendered.component("ConfigMap", "device-config")["metadata"]["name"]
    assert Path(given["device-config"]).parent == Path(
        mount_of_volume(deployment, ours, configMap=device_config)
    )


@SETS
def test_only_the_metrics_port_is_exposed(values: dict[str, Any], tmp_path: Path) -> None:
    """The Service and the ServiceMonitor lead to the metrics listener, and nothing leads to the verbs."""
    rendered = render(values)
    ours = container(rendered.component("Deployment", "scheduler"), "extender")
    settings = extender_settings(rendered, ours, tmp_path)
    service = rendered.component("Service", "scheduler")
    (service_port,) = service["spec"]["ports"]
    assert service_port["name"] == "metrics" and service_port["targetPort"] == "metrics"
    assert port(ours, service_port["targetPort"]) == settings.metrics_port
    assert ("GET", "/metrics") in served_routes()["metrics"]
    if values.get("metrics", {}).get("serviceMonitor", {}).get("enabled"):
        (endpoint,) = rendered.component("ServiceMonitor", "scheduler")["spec"]["endpoints"]
        assert (endpoint["port"], endpoint["path"]) == ("metrics", "/metrics")


@pytest.mark.parametrize(("timeout", "seconds"), [("30s", 30.0), ("45s", 45.0), ("1m30s", 90.0)])
def test_bind_stops_writing_when_kube_scheduler_stops_waiting(
    timeout: str, seconds: float, tmp_path: Path
) -> None:
    """The extender's bind deadline is kube-scheduler's extender httpTimeout, whatever the chart sets."""
    rendered = render({"scheduler": {"extender": {"httpTimeout": timeout}}})
    deployment, config = kube_scheduler_config(rendered)
    assert config["extenders"][0]["httpTimeout"] == timeout
    settings = extender_settings(rendered, container(deployment, "extender"), tmp_path)
    assert settings.bind_timeout == seconds


def test_the_fragmentation_settings_reach_the_extender(tmp_path: Path) -> None:
    values = {
        "scheduler": {
            "nodeSchedulerPolicy": "fragmentation",
            "gpuSchedulerPolicy": "fragmentation",
            "fragmentation": {"halfLifeSeconds": 600, "minPods": 5, "fallback": "2:100%:100:3,1:4000:30"},
        }
    }
    rendered = render(values)
    settings = extender_settings(
        rendered, container(rendered.component("Deployment", "scheduler"), "extender"), tmp_path
    )
    assert (settings.node_policy, settings.gpu_policy) == ("fragmentation", "fragmentation")
    assert (settings.fragmentation_half_life, settings.fragmentation_min_pods) == (600, 5)
    assert [
        (c.nums, c.memory_mib, c.percentage, c.cores, c.weight) for c in settings.fragmentation_fallback
    ] == [
        (2, 0, 100, 100, 3.0),
        (1, 4000, 101, 30, 1.0),
    ]


def test_extender_flags_are_accepted_by_its_parser() -> None:
    module = importlib.import_module("hami.scheduler.main")
    parser = argparse.ArgumentParser(prog="hami scheduler")
    module.add_arguments(parser)
    for values in VALUE_SETS.values():
        ours = container(render(values).component("Deployment", "scheduler"), "extender")
        args = parser.parse_args(argv(ours)[2:])
        assert vars(args)["scheduler_name"] == scheduler_name(values)


# ------------------------------------------------------------------------------- webhook
@SETS
def test_webhook_server_and_its_service_agree(values: dict[str, Any], tmp_path: Path) -> None:
    rendered = render(values)
    deployment = rendered.component("Deployment", "webhook")
    ours = container(deployment, "webhook")
    assert argv(ours)[0] == "hami-webhook"
    settings = parse_settings(
        local_argv(ours, {"device-config": write_device_config(rendered, tmp_path)}), env={}
    )
    service = rendered.component("Service", "webhook")
    (webhook,) = rendered.component("MutatingWebhookConfiguration", "webhook")["webhooks"]
    target = webhook["clientConfig"]["service"]

    # the API server -> Service:443 -> container port "https" -> the address Kopf listens on
    ports = {p["name"]: p for p in service["spec"]["ports"]}
    assert set(ports) == {"https", "metrics"}
    service_port = ports["https"]
    assert (target["name"], target["namespace"]) == (service["metadata"]["name"], NAMESPACE)
    assert target["port"] == service_port["port"] == 443
    assert settings.listen.port == port(ours, service_port["targetPort"])
    assert target["path"] == f"/{HANDLER_ID}"
    assert webhook["name"] == WEBHOOK_NAME
    # the certificate it checks is for the name the API server uses
    assert (settings.service_name, settings.service_namespace) == (service["metadata"]["name"], NAMESPACE)
    assert settings.manage_config is False
    assert (
        settings.failure_policy
        == webhook["failurePolicy"]
        == values.get("webhook", {}).get("failurePolicy", "Fail")
    )
    # health probes hit the health listener
    assert ours["readinessProbe"]["httpGet"]["port"] == "health"
    assert settings.health_listen.port == port(ours, "health")
    # Prometheus: Service port "metrics" -> container port "metrics" -> the metrics listener
    assert ports["metrics"]["targetPort"] == "metrics"
    assert settings.metrics_listen.port == port(ours, "metrics")
    assert settings.metrics_listen.port != settings.health_listen.port != settings.listen.port
    # the mutation uses the chart's scheduler and resource names
    assert settings.mutation.scheduler_name == scheduler_name(values)
    assert settings.mutation.device.resources == expected_names(values)


@SETS
def test_webhook_configuration_is_the_one_the_webhook_would_write(
    values: dict[str, Any], tmp_path: Path
) -> None:
    """The chart's entry equals webhook.registration.desired_webhook (apart from how it is reached)."""
    rendered = render(values)
    ours = container(rendered.component("Deployment", "webhook"), "webhook")
    settings = parse_settings(
        local_argv(ours, {"device-config": write_device_config(rendered, tmp_path)}), env={}
    )
    (entry,) = rendered.component("MutatingWebhookConfiguration", "webhook")["webhooks"]
    desired = desired_webhook(settings, client_config={})
    extra_namespaces = values.get("webhook", {}).get("namespaceSelector", {}).get("matchExpressions", [])
    desired["namespaceSelector"]["matchExpressions"] += extra_namespaces
    # the chart reaches the webhook through its Service, Kopf's own config through a URL
    entry = {k: v for k, v in entry.items() if k != "clientConfig"}
    desired = {k: v for k, v in desired.items() if k != "clientConfig"}
    assert entry == desired


@pytest.mark.parametrize(
    ("pod", "sent"),
    [
        ({"containers": [{"name": "a", "resources": {"limits": {"{count}": "1"}}}]}, True),
        ({"containers": [{"name": "a", "resources": {"requests": {"{memory}": "1000"}}}]}, True),
        (
            {
                "containers": [{"name": "a"}],
                "initContainers": [{"name": "i", "resources": {"limits": {"{cores}": "30"}}}],
            },
            True,
        ),
        (
            {
                "containers": [
                    {"name": "a", "resources": {"limits": {"cpu": "1", "other.example/gpu-other": "1"}}}
                ]
            },
            False,
        ),
        # a name the webhook's typo rules judge (webhook/typos.py): sent, refused there with a did-you-mean
        ({"containers": [{"name": "a", "resources": {"limits": {"hami.io/gpumemory": "1"}}}]}, True),
        ({"containers": [{"name": "a", "resources": {"limits": {"nvidia.com/mig-1g.10gb": "1"}}}]}, False),
        ({"containers": [{"name": "a"}]}, False),
        ({"containers": [{"name": "a", "resources": {}}]}, False),
        (
            {
                "labels": {"hami.io/webhook": "ignore"},
                "containers": [{"name": "a", "resources": {"limits": {"{count}": "1"}}}],
            },
            False,
        ),
        # an "ignored" pod pretending to be allocated already is still checked
        (
            {
                "labels": {"hami.io/webhook": "ignore"},
                "annotations": {"hami.io/vgpu-devices-allocated": "x"},
                "containers": [{"name": "a"}],
            },
            True,
        ),
        ({"labels": {"hami.io/vgpu-node": "n1"}, "containers": [{"name": "a"}]}, True),
    ],
)
@pytest.mark.parametrize("value_set", ["defaults", "custom-resource-names"])
def test_only_pods_asking_for_our_resources_are_sent(pod: dict[str, Any], sent: bool, value_set: str) -> None:
    """Evaluate the rendered CEL matchCondition (with a CEL interpreter) against pods."""
    values = VALUE_SETS[value_set]
    names = expected_names(values)
    text = json.dumps(pod)
    for token, name in (("{count}", names.count), ("{memory}", names.memory), ("{cores}", names.cores)):
        text = text.replace(token, name)
    spec = json.loads(text)
    metadata = {k: spec.pop(k) for k in ("labels", "annotations") if k in spec}
    obj = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "p", "namespace": "ns", **metadata},
        "spec": spec,
    }
    (entry,) = render(values).component("MutatingWebhookConfiguration", "webhook")["webhooks"]
    (condition,) = entry["matchConditions"]
    assert cel.evaluate(condition["expression"], {"object": obj}) is sent


def test_own_certificate_jobs_name_the_webhook_objects() -> None:
    rendered = render()
    deployment = rendered.component("Deployment", "webhook")
    ours = container(deployment, "webhook")
    tls_dir = flags(ours)["tls-dir"]
    (secret,) = [
        v["secret"]["secretName"] for v in deployment["spec"]["template"]["spec"]["volumes"] if "secret" in v
    ]
    assert mount_of_volume(deployment, ours, secret=secret) == tls_dir
    service = rendered.component("Service", "webhook")["metadata"]["name"]
    config = rendered.component("MutatingWebhookConfiguration", "webhook")["metadata"]["name"]

    jobs = {job["metadata"]["name"]: job for job in rendered.of_kind("Job")}
    create, inject = jobs["hami-certgen-create"], jobs["hami-certgen-inject"]
    assert argv(container(create, "certgen"))[:4] == ["python", "-m", "webhook.certs", "secret"]
    assert flags(container(create, "certgen")) == {
        "namespace": NAMESPACE,
        "secret": secret,
        "service": service,
        "days": "90",
        "webhook-config": config,
    }
    assert argv(container(inject, "certgen"))[:4] == ["python", "-m", "webhook.certs", "inject"]
    assert flags(container(inject, "certgen")) == {
        "namespace": NAMESPACE,
        "secret": secret,
        "webhook-config": config,
    }
    # the Secret exists before the webhook pods start; the configuration exists before its CA is injected
    assert create["metadata"]["annotations"]["helm.sh/hook"] == "pre-install,pre-upgrade"
    assert inject["metadata"]["annotations"]["helm.sh/hook"] == "post-install,post-upgrade"
    assert "cert-manager.io/inject-ca-from" not in (
        rendered.component("MutatingWebhookConfiguration", "webhook")["metadata"].get("annotations") or {}
    )
    assert rendered.of_kind("Certificate") == []


def test_certificate_jobs_use_flags_the_certs_command_has() -> None:
    for job in render().of_kind("Job"):
        command = argv(container(job, "certgen"))
        subcommand, given = command[3], flags(container(job, "certgen"))
        shown = subprocess.run(
            [sys.executable, "-m", "webhook.certs", subcommand, "--help"],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        ).stdout
        for flag in given:
            assert f"--{flag}" in shown, (subcommand, flag)


@pytest.mark.parametrize("value_set", ["cert-manager", "cert-manager-own-issuer"])
def test_cert_manager_issues_the_certificate_the_webhook_serves(value_set: str) -> None:
    rendered = render(VALUE_SETS[value_set])
    assert rendered.of_kind("Job") == [] and rendered.of_kind("CronJob") == []
    deployment = rendered.component("Deployment", "webhook")
    ours = container(deployment, "webhook")
    certificate = rendered.one("Certificate", "hami-webhook")
    assert (
        mount_of_volume(deployment, ours, secret=certificate["spec"]["secretName"]) == flags(ours)["tls-dir"]
    )
    config = rendered.component("MutatingWebhookConfiguration", "webhook")
    assert config["metadata"]["annotations"]["cert-manager.io/inject-ca-from"] == (
        f"{NAMESPACE}/{certificate['metadata']['name']}"
    )
    # exactly the names the webhook checks its certificate against
    service = rendered.component("Service", "webhook")["metadata"]["name"]
    covered = [*certificate["spec"]["dnsNames"], *certificate["spec"]["ipAddresses"]]
    assert sorted(covered) == sorted(service_hostnames(service, NAMESPACE))
    issuers = rendered.of_kind("Issuer")
    reference = certificate["spec"]["issuerRef"]
    # short-lived, renewed with a third left (the webhook switches to the renewed pair in place)
    assert (certificate["spec"]["duration"], certificate["spec"]["renewBefore"]) == ("2160h", "720h")
    if value_set == "cert-manager":
        # the chart's own CA: self-signed Issuer -> CA Certificate -> CA Issuer -> serving certificate
        by_name = {i["metadata"]["name"]: i for i in issuers}
        ca_issuer = by_name[reference["name"]]
        assert reference["kind"] == "Issuer"
        ca = rendered.one("Certificate", ca_issuer["spec"]["ca"]["secretName"])
        assert (
            ca["spec"]["isCA"] is True and ca["spec"]["secretName"] == ca_issuer["spec"]["ca"]["secretName"]
        )
        assert (ca["spec"]["duration"], ca["spec"]["renewBefore"]) == ("8760h", "2160h")
        assert ca["spec"]["privateKey"]["rotationPolicy"] == "Never"  # old serving certs keep verifying
        assert by_name[ca["spec"]["issuerRef"]["name"]]["spec"] == {"selfSigned": {}}
    else:
        assert issuers == [] and reference == {"name": "corp-ca", "kind": "ClusterIssuer"}
        assert [c["metadata"]["name"] for c in rendered.of_kind("Certificate")] == ["hami-webhook"]


# ------------------------------------------------------------------------------- node agent
@pytest.mark.parametrize(
    "value_set", ["defaults", "custom-resource-names", "everything-on", "custom-scheduler-name"]
)
def test_node_agent_flags_are_accepted_and_match_its_mounts(value_set: str, tmp_path: Path) -> None:
    values = VALUE_SETS[value_set]
    rendered = render(values)
    agent = rendered.component("DaemonSet", "node-agent")
    ours = container(agent, "node-agent")
    assert argv(ours)[0] == "hami-node-agent"
    env = {e["name"]: e for e in ours["env"]}
    assert env["NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"

    node_config = rendered.component("ConfigMap", "node-agent")
    local = {"device-config": write_device_config(rendered, tmp_path), "config": tmp_path / "config.json"}
    (tmp_path / "config.json").write_text(node_config["data"]["config.json"])
    if "sim-devices" in flags(ours):
        local["sim-devices"] = tmp_path / "sim-devices.yaml"
        (tmp_path / "sim-devices.yaml").write_text(node_config["data"]["sim-devices.yaml"])
    config = parse_agent_config(local_argv(ours, local), {"NODE_NAME": "node-1"})

    # every host directory is mounted at the same path inside (the agent hands these paths to kubelet)
    host_paths = {
        v["name"]: v["hostPath"]["path"]
        for v in agent["spec"]["template"]["spec"]["volumes"]
        if "hostPath" in v
    }
    for volume, path in host_paths.items():
        assert [m["mountPath"] for m in ours["volumeMounts"] if m["name"] == volume] == [path]
    default_dir = "/var/lib/kubelet/device-plugins"
    assert str(config.kubelet_dir) == host_paths["device-plugins"]
    assert str(config.kubelet_dir) == values.get("nodeAgent", {}).get("kubeletDir", default_dir)
    # the files it reads are in the ConfigMaps it mounts
    given = flags(ours)
    node_mount = mount_of_volume(agent, ours, configMap=node_config["metadata"]["name"])
    assert Path(given["config"]).parent == Path(node_mount)
    device_map = rendered.component("ConfigMap", "device-config")["metadata"]["name"]
    assert Path(given["device-config"]).parent == Path(mount_of_volume(agent, ours, configMap=device_map))
    # metrics port = container port = Service target
    assert str(config.metrics_listen) == f"0.0.0.0:{port(ours, 'metrics')}"
    assert config.backend == values.get("nodeAgent", {}).get("backend", "auto")
    gpu_policy = values.get("scheduler", {}).get("gpuSchedulerPolicy", "spread")
    assert config.topology_score is ("topology-aware" in gpu_policy)

    settings = load_node_settings(config)
    assert settings is not None  # both files parse with the agent's own loader
    # HAMi's hookPath is the default (issue 22): every value set here keeps it
    assert str(config.hook_path) == values.get("nodeAgent", {}).get("hookPath", "/usr/local")
    assert host_paths["hami-core"] == f"{config.hook_path}/vgpu"  # see test_node_agent_mounts
    assert host_paths["vgpu-lock"] == "/tmp/vgpulock"  # the allocator's default lock dir
    if value_set == "everything-on":
        assert agent["spec"]["template"]["spec"]["runtimeClassName"] == "nvidia"


@pytest.mark.parametrize(("given", "expected"), [(None, 300.0), (0, 0.0), (45.5, 45.5), (86400, 86400.0)])
def test_node_agent_health_recovery_reaches_the_agent(given: float | None, expected: float) -> None:
    values = {} if given is None else {"nodeAgent": {"healthRecovery": given}}
    ours = container(render(values).component("DaemonSet", "node-agent"), "node-agent")
    assert parse_agent_config(argv(ours)[1:], {"NODE_NAME": "n1"}).health_recovery == expected


# ------------------------------------------------------------------------------- network policies
#: networkPolicy.metricsFrom's default: every pod in the cluster
DEFAULT_METRICS_FROM: list[dict[str, Any]] = [{"namespaceSelector": {}}]


def admitted(policy: dict[str, Any]) -> dict[int, list[dict[str, Any]] | None]:
    """Each port the policy admits -> its ``from`` peers (None: any source)."""
    result: dict[int, list[dict[str, Any]] | None] = {}
    for rule in policy["spec"]["ingress"]:
        for entry in rule["ports"]:
            assert entry["protocol"] == "TCP"
            assert int(entry["port"]) not in result, "one rule per port"
            result[int(entry["port"])] = rule.get("from")
    return result


@SETS
def test_network_policies_admit_only_what_each_component_needs(
    values: dict[str, Any], tmp_path: Path
) -> None:
    """Per component: exactly the ports its own flag parser says it serves to others, from whom."""
    rendered = render(values)
    policies = rendered.of_kind("NetworkPolicy")
    chosen = values.get("networkPolicy", {})
    if not chosen.get("enabled", True):
        assert policies == []
        return
    metrics_from = chosen.get("metricsFrom", DEFAULT_METRICS_FROM) or None

    scheduler = extender_settings(
        rendered, container(rendered.component("Deployment", "scheduler"), "extender"), tmp_path
    )
    hook = container(rendered.component("Deployment", "webhook"), "webhook")
    webhook = parse_settings(
        local_argv(hook, {"device-config": write_device_config(rendered, tmp_path)}), env={}
    )
    expected: dict[str, dict[int, list[dict[str, Any]] | None]] = {
        # the verbs (scheduler.port) listen on loopback: no rule
        "scheduler": {scheduler.metrics_port: metrics_from},
        # the API server calls admission from the control plane's host network or outside the cluster:
        # no selector can name it; health is probed by the kubelet, which every policy admits
        "webhook": {webhook.listen.port: None, webhook.metrics_listen.port: metrics_from},
    }
    if values.get("nodeAgent", {}).get("enabled", True):
        agent = container(rendered.component("DaemonSet", "node-agent"), "node-agent")
        metrics_listen = parse_agent_config(argv(agent)[1:], {"NODE_NAME": "n1"}).metrics_listen
        expected["node-agent"] = {metrics_listen.port: metrics_from}

    assert sorted(labels(p)["app.kubernetes.io/component"] for p in policies) == sorted(expected)
    for component, ports in expected.items():
        policy = rendered.component("NetworkPolicy", component)
        selector = policy["spec"]["podSelector"]["matchLabels"]
        (workload,) = [
            w
            for kind in ("Deployment", "DaemonSet")
            for w in rendered.of_kind(kind)
            if selector.items() <= w["spec"]["template"]["metadata"]["labels"].items()
        ]
        assert labels(workload)["app.kubernetes.io/component"] == component
        assert not pod_spec(workload).get("hostNetwork")  # a NetworkPolicy does not apply to hostNetwork pods
        assert policy["spec"]["policyTypes"] == ["Ingress"]  # egress stays open: the API server
        assert admitted(policy) == ports
