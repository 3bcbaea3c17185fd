"""The chart renders, lints clean, validates against the Kubernetes schemas and honours its values."""

from __future__ import annotations

import re
from typing import Any

import helm_python as helm
import pytest
import yaml

from hami.settings import DeviceConfig, ResourceNames, from_device_config

from .rendering import (
    BASE_VALUES,
    CHART,
    CUSTOM_KINDS,
    NAMESPACE,
    VALUE_SETS,
    container,
    labels,
    pod_spec,
    render,
    schema_errors,
)

SETS = pytest.mark.parametrize("values", VALUE_SETS.values(), ids=VALUE_SETS.keys())
#: The oldest Kubernetes the chart supports (Chart.yaml kubeVersion) and a current one.
KUBE_VERSIONS = ("1.28", "1.32")
WORKLOADS = ("Deployment", "DaemonSet", "Job")
#: Kinds the chart renders only for newer clusters -> the first Kubernetes minor that has them.
NEWER_KINDS = {"ValidatingAdmissionPolicy": (1, 30), "ValidatingAdmissionPolicyBinding": (1, 30)}


@SETS
def test_lint_reports_no_errors_or_warnings(values: dict[str, Any]) -> None:
    report = helm.lint(str(CHART), values, strict=True, namespace=NAMESPACE)
    problems = [m for m in report["messages"] if m["severity"] >= 2]
    assert report["errors"] == [] and problems == []


@SETS
@pytest.mark.parametrize("version", KUBE_VERSIONS)
def test_every_document_is_a_valid_kubernetes_object(values: dict[str, Any], version: str) -> None:
    rendered = render(values)
    assert rendered.docs
    errors: list[str] = []
    for doc in rendered.docs:
        if doc["kind"] in CUSTOM_KINDS:
            assert doc["apiVersion"] == CUSTOM_KINDS[doc["kind"]]
            continue
        if tuple(map(int, version.split("."))) < NEWER_KINDS.get(doc["kind"], (0, 0)):
            continue  # the chart refuses to render it there (tests/chart/test_policy.py)
        errors.extend(schema_errors(doc, version))
    assert errors == []


def test_schema_check_catches_a_bad_object() -> None:
    """The validator itself is live: an unknown field and a wrong type are reported."""
    deployment = render().one("Deployment", "hami-scheduler")
    broken = yaml.safe_load(yaml.safe_dump(deployment))
    broken["spec"]["replicas"] = "two"
    broken["spec"]["template"]["spec"]["containerz"] = []
    errors = schema_errors(broken, "1.32")
    assert any("replicas" in e for e in errors) and any("containerz" in e for e in errors)


@pytest.mark.parametrize(
    ("values", "complaint"),
    [
        ({"scheduler": {"replicaz": 2}}, "replicaz"),
        ({"webhook": {"failurePolicy": "fail"}}, "/webhook/failurePolicy"),
        ({"scheduler": {"nodeSchedulerPolicy": "random"}}, "/scheduler/nodeSchedulerPolicy"),
        ({"scheduler": {"gpuSchedulerPolicy": "binpack,fastest"}}, "/scheduler/gpuSchedulerPolicy"),
        ({"scheduler": {"gpuSchedulerPolicy": "fragmentation,numa"}}, "/scheduler/gpuSchedulerPolicy"),
        ({"scheduler": {"fragmentation": {"fallback": "halves"}}}, "/scheduler/fragmentation/fallback"),
        (
            {"scheduler": {"fragmentation": {"halfLifeSeconds": 0}}},
            "/scheduler/fragmentation/halfLifeSeconds",
        ),
        ({"resourceNames": {"count": "nvidia.com/g p u"}}, "/resourceNames/count"),
        ({"devices": {"nvidia": {"deviceSplitCount": 0}}}, "/devices/nvidia/deviceSplitCount"),
        ({"nodeAgent": {"backend": "cuda"}}, "/nodeAgent/backend"),
        ({"nodeAgent": {"healthRecovery": -1}}, "/nodeAgent/healthRecovery"),
        ({"scheduler": {"extender": {"httpTimeout": "30 seconds"}}}, "/scheduler/extender/httpTimeout"),
        ({"schedulerName": "Hami_Scheduler"}, "/schedulerName"),
        ({"scheduler": {"metricsPort": 0}}, "/scheduler/metricsPort"),
        ({"networkPolicy": {"enabled": "yes"}}, "/networkPolicy/enabled"),
        ({"networkPolicy": {"metricsFrom": [{"namespaceSelectr": {}}]}}, "/networkPolicy/metricsFrom/0"),
        ({"scheduler": {"percentageOfNodesToScore": 101}}, "/scheduler/percentageOfNodesToScore': maximum"),
        ({"scheduler": {"percentageOfNodesToScore": -1}}, "/scheduler/percentageOfNodesToScore': minimum"),
        (
            {"scheduler": {"percentageOfNodesToScore": "x"}},
            "/scheduler/percentageOfNodesToScore': got string, want integer",
        ),
        (
            {"scheduler": {"percentageOfNodesToScore": 42.5}},
            "/scheduler/percentageOfNodesToScore': got number, want integer",
        ),
    ],
)
def test_values_schema_names_the_bad_key(values: dict[str, Any], complaint: str) -> None:
    with helm.Chart.load(str(CHART)) as chart, pytest.raises(helm.HelmError) as error:
        chart.render(values, name="hami", namespace=NAMESPACE)
    assert complaint in str(error.value)


@pytest.mark.parametrize("replicas", [1, 2, 3])
def test_disruption_budget_only_with_more_than_one_scheduler(replicas: int) -> None:
    rendered = render({"scheduler": {"replicas": replicas}})
    budgets = rendered.of_kind("PodDisruptionBudget")
    deployment = rendered.one("Deployment", "hami-scheduler")
    assert deployment["spec"]["replicas"] == replicas
    if replicas == 1:
        assert budgets == []
        assert "affinity" not in pod_spec(deployment)
        return
    (budget,) = budgets
    assert budget["spec"]["minAvailable"] == 1
    assert budget["spec"]["selector"]["matchLabels"] == deployment["spec"]["selector"]["matchLabels"]
    spread = pod_spec(deployment)["affinity"]["podAntiAffinity"][
        "preferredDuringSchedulingIgnoredDuringExecution"
    ]
    assert spread[0]["podAffinityTerm"]["topologyKey"] == "kubernetes.io/hostname"


@SETS
def test_selectors_select_their_own_pods(values: dict[str, Any]) -> None:
    rendered = render(values)
    for kind in ("Deployment", "DaemonSet"):
        for workload in rendered.of_kind(kind):
            template_labels = workload["spec"]["template"]["metadata"]["labels"]
            assert workload["spec"]["selector"]["matchLabels"].items() <= template_labels.items()
            # our own pods never go through our webhook
            assert template_labels["hami.io/webhook"] == "ignore"
    for service in rendered.of_kind("Service"):
        selected = [
            w
            for kind in ("Deployment", "DaemonSet")
            for w in rendered.of_kind(kind)
            if service["spec"]["selector"].items() <= w["spec"]["template"]["metadata"]["labels"].items()
        ]
        assert len(selected) == 1, service["metadata"]["name"]
        ports = {p["name"] for c in pod_spec(selected[0])["containers"] for p in c.get("ports", [])}
        assert {p["targetPort"] for p in service["spec"]["ports"]} <= ports


@SETS
def test_referenced_objects_are_rendered(values: dict[str, Any]) -> None:
    """Every ConfigMap, ServiceAccount and Secret a pod needs comes from this chart (or its hooks)."""
    rendered = render(values)
    config_maps = {d["metadata"]["name"] for d in rendered.of_kind("ConfigMap")}
    accounts = {d["metadata"]["name"] for d in rendered.of_kind("ServiceAccount")}
    tls_secrets = {d["spec"]["secretName"] for d in rendered.of_kind("Certificate")} | {
        arg.removeprefix("--secret=")
        for job in rendered.of_kind("Job")
        for arg in container(job, "certgen")["command"]
        if arg.startswith("--secret=")
    }
    rbac = values.get("rbac", {}).get("create", True)
    for kind in WORKLOADS:
        for workload in rendered.of_kind(kind):
            spec = pod_spec(workload)
            assert spec["serviceAccountName"] in accounts or not rbac
            for volume in spec.get("volumes", []):
                if "configMap" in volume:
                    assert volume["configMap"]["name"] in config_maps
                if "secret" in volume:
                    assert volume["secret"]["secretName"] in tls_secrets


def test_kube_scheduler_follows_the_cluster_version_unless_pinned() -> None:
    def image(values: dict[str, Any]) -> str:
        return str(container(render(values).one("Deployment", "hami-scheduler"), "kube-scheduler")["image"])

    # Offline rendering reports Helm's own default cluster version; the tag is that version, suffix-free.
    assert re.fullmatch(r"registry\.k8s\.io/kube-scheduler:v\d+\.\d+\.\d+", image({}))
    pinned = {"scheduler": {"kubeScheduler": {"image": {"registry": "mirror.example", "tag": "v1.30.4"}}}}
    assert image(pinned) == "mirror.example/kube-scheduler:v1.30.4"


def test_our_image_defaults_to_the_app_version() -> None:
    with helm.Chart.load(str(CHART)) as chart:
        app_version = chart.metadata["appVersion"]
    rendered = render()
    images = {
        c["image"] for kind in WORKLOADS for w in rendered.of_kind(kind) for c in pod_spec(w)["containers"]
    }
    assert f"{BASE_VALUES['image']['registry']}/hami-py:{app_version}" in images
    custom = render(VALUE_SETS["everything-on"])
    agent = container(custom.one("DaemonSet", "gpu-node-agent"), "node-agent")
    assert agent["image"] == "registry.example.com/hami-py:1.2.3"
    assert pod_spec(custom.one("DaemonSet", "gpu-node-agent"))["imagePullSecrets"] == [{"name": "pull"}]


@SETS
def test_device_config_is_what_our_settings_read(values: dict[str, Any]) -> None:
    rendered = render(values)
    (config_map,) = [
        d
        for d in rendered.of_kind("ConfigMap")
        if labels(d)["app.kubernetes.io/component"] == "device-config"
    ]
    parsed = from_device_config(yaml.safe_load(config_map["data"]["device-config.yaml"]))
    names = values.get("resourceNames", {})
    nvidia = values.get("devices", {}).get("nvidia", {})
    expected = DeviceConfig(
        resources=ResourceNames(
            count=names.get("count", "nvidia.com/gpu"),
            memory=names.get("memory", "nvidia.com/gpumem"),
            memory_percentage=names.get("memoryPercentage", "nvidia.com/gpumem-percentage"),
            cores=names.get("cores", "nvidia.com/gpucores"),
            priority=names.get("priority", "nvidia.com/priority"),
        ),
        device_split_count=nvidia.get("deviceSplitCount", 10),
        device_memory_scaling=nvidia.get("deviceMemoryScaling", 1.0),
        default_cores=nvidia.get("defaultCores", 0),
        gpu_core_policy="default",
    )
    assert parsed == expected


def test_full_device_config_override_is_used_verbatim() -> None:
    content = "nvidia:\n  resourceCountName: acme.io/gpu\n  deviceSplitCount: 3\n"
    rendered = render({"deviceConfigContent": content})
    config_map = rendered.one("ConfigMap", "hami-device-config")
    assert config_map["data"]["device-config.yaml"] == content
    assert from_device_config(yaml.safe_load(content)).device_split_count == 3


def test_pods_roll_when_their_configuration_changes() -> None:
    def checksums(values: dict[str, Any]) -> dict[str, dict[str, str]]:
        rendered = render(values)
        return {
            w["metadata"]["name"]: {
                k: v
                for k, v in w["spec"]["template"]["metadata"]["annotations"].items()
                if k.startswith("checksum/")
            }
            for kind in ("Deployment", "DaemonSet")
            for w in rendered.of_kind(kind)
        }

    before = checksums({})
    after = checksums({"devices": {"nvidia": {"deviceSplitCount": 5}}})
    for name in before:
        assert before[name]["checksum/device-config"] != after[name]["checksum/device-config"], name
    renamed = checksums({"schedulerName": "other"})
    assert (
        renamed["hami-scheduler"]["checksum/scheduler-config"]
        != before["hami-scheduler"]["checksum/scheduler-config"]
    )
    per_node = checksums({"nodeAgent": {"nodeConfig": [{"name": "n1", "devicesplitcount": 2}]}})
    assert (
        per_node["hami-node-agent"]["checksum/node-config"]
        != before["hami-node-agent"]["checksum/node-config"]
    )


def test_node_agent_runs_only_on_labelled_gpu_nodes() -> None:
    rendered = render()
    agent = rendered.one("DaemonSet", "hami-node-agent")
    assert pod_spec(agent)["nodeSelector"] == {"gpu": "on"}
    # Helm merges maps with the defaults: the default label is dropped by setting it to null
    custom = render({"nodeAgent": {"nodeSelector": {"gpu": None, "accelerator": "nvidia"}}})
    assert pod_spec(custom.one("DaemonSet", "hami-node-agent"))["nodeSelector"] == {"accelerator": "nvidia"}
    assert render({"nodeAgent": {"enabled": False}}).of_kind("DaemonSet") == []


def test_service_monitors_only_when_asked() -> None:
    assert render().of_kind("ServiceMonitor") == []
    rendered = render(VALUE_SETS["everything-on"])
    monitors = {m["metadata"]["name"]: m for m in rendered.of_kind("ServiceMonitor")}
    assert set(monitors) == {"gpu-scheduler", "gpu-webhook", "gpu-node-agent"}
    for name, monitor in monitors.items():
        service = rendered.one("Service", name)
        assert monitor["spec"]["selector"]["matchLabels"].items() <= labels(service).items()
        assert monitor["metadata"]["labels"]["release"] == "prom"
        (endpoint,) = monitor["spec"]["endpoints"]
        assert endpoint["port"] in {p["name"] for p in service["spec"]["ports"]}
        assert endpoint["path"] == "/metrics"
