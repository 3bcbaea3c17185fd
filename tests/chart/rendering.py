"""Render ``charts/hami`` with Helm's own library (``helm-python-sdk``, no helm binary) and read the result.

Owns: the value sets the chart tests run over, rendering (cached per value set: Helm's output is a pure
function of the values), lookups in the rendered documents, container flag parsing, the Kubernetes
schema check (``kubernetes-validate``'s bundled schemas, validators cached per kind and version) and
``grants()``, which turns a component's rendered roles into ``(group, resource, verb)`` triples so an
RBAC test can compare them with the API calls a component was seen to make.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import helm_python as helm
import jsonschema
import yaml
from referencing import Registry, Resource

CHART = Path(__file__).resolve().parents[2] / "charts" / "hami"
RELEASE = "hami"
NAMESPACE = "hami-system"

#: Custom resources the chart may render; their schemas are not in kubernetes-validate.
CUSTOM_KINDS = {
    "Certificate": "cert-manager.io/v1",
    "Issuer": "cert-manager.io/v1",
    "ServiceMonitor": "monitoring.coreos.com/v1",
}

CUSTOM_RESOURCES = {
    "example.com/vgpu": "count",
    "example.com/vgpu-memory": "memory",
    "example.com/vgpu-memory-pct": "memoryPercentage",
    "example.com/vgpu-cores": "cores",
    "example.com/vgpu-priority": "priority",
}

#: What every rendering here starts from (:func:`with_base`): the chart requires ``image.registry``, since
#: no image is published (tests/chart/test_image.py); the one shared value tests that render or install
#: the chart give it.
BASE_VALUES: dict[str, Any] = {"image": {"registry": "registry.test"}}


def with_base(values: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """``values`` over :data:`BASE_VALUES` (nested mappings merged, anything else replaced)."""

    def merge(base: Mapping[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
        merged = dict(base)
        for key, value in over.items():
            below = merged.get(key)
            if isinstance(below, Mapping) and isinstance(value, Mapping):
                merged[key] = merge(below, value)
            else:
                merged[key] = value
        return merged

    return merge(BASE_VALUES, values or {})


#: id -> values; every chart test that depends on values runs over these.
VALUE_SETS: dict[str, dict[str, Any]] = {
    "defaults": {},
    "cert-manager": {"webhook": {"certManager": {"enabled": True}}},
    "cert-manager-own-issuer": {
        "webhook": {
            "certManager": {"enabled": True, "issuerRef": {"name": "corp-ca", "kind": "ClusterIssuer"}}
        }
    },
    "replicas-2": {"scheduler": {"replicas": 2}, "webhook": {"replicas": 2}},
    "custom-resource-names": {
        "resourceNames": {field: name for name, field in CUSTOM_RESOURCES.items()},
        "devices": {"nvidia": {"deviceSplitCount": 4, "deviceMemoryScaling": 1.5, "defaultCores": 20}},
    },
    "custom-scheduler-name": {
        "schedulerName": "gpu-share",
        "scheduler": {
            "nodeSchedulerPolicy": "spread",
            "gpuSchedulerPolicy": "topology-aware",
            "port": 8181,
            "metricsPort": 9595,
        },
        "webhook": {"port": 10443, "healthPort": 10081, "metricsPort": 10082, "failurePolicy": "Ignore"},
    },
    "everything-on": {
        "fullnameOverride": "gpu",
        "image": {"registry": "registry.example.com", "tag": "1.2.3"},
        "imagePullSecrets": [{"name": "pull"}],
        "metrics": {
            "serviceMonitor": {"enabled": True, "labels": {"release": "prom"}},
            "dashboard": {"enabled": True},
        },
        "nodeAgent": {
            "legacyMetrics": True,
            "backend": "sim",
            "simDevices": {"cards": [{"uuid": "GPU-sim-0", "model": "NVIDIA A100", "memory_mib": 40960}]},
            "nodeConfig": [{"name": "node-1", "devicesplitcount": 4, "devicememoryscaling": 1.5}],
            "hookPath": "/usr/local",
            "runtimeClassName": "nvidia",
            "metricsPort": 9500,
        },
        "webhook": {"namespaceSelector": {"matchExpressions": [{"key": "team", "operator": "Exists"}]}},
        "scheduler": {"kubeScheduler": {"image": {"tag": "v1.30.4"}}},
        "networkPolicy": {"metricsFrom": [{"namespaceSelector": {"matchLabels": {"name": "monitoring"}}}]},
    },
    "minimal": {
        "rbac": {"create": False},
        "nodeAgent": {"enabled": False},
        "networkPolicy": {"enabled": False},
    },
}


@dataclass(frozen=True)
class Rendered:
    """One rendering: the template files and every manifest document in them."""

    files: Mapping[str, str]
    docs: tuple[dict[str, Any], ...]

    def of_kind(self, kind: str) -> list[dict[str, Any]]:
        return [doc for doc in self.docs if doc["kind"] == kind]

    def one(self, kind: str, name: str | None = None) -> dict[str, Any]:
        found = [doc for doc in self.of_kind(kind) if name is None or doc["metadata"]["name"] == name]
        assert len(found) == 1, (
            f"expected one {kind} {name or ''}, found {[d['metadata']['name'] for d in found]}"
        )
        return found[0]

    def component(self, kind: str, component: str) -> dict[str, Any]:
        """The one object of ``kind`` labelled app.kubernetes.io/component=``component``."""
        found = [
            doc for doc in self.of_kind(kind) if labels(doc).get("app.kubernetes.io/component") == component
        ]
        assert len(found) == 1, f"expected one {kind} of component {component}, found {len(found)}"
        return found[0]


def labels(doc: Mapping[str, Any]) -> dict[str, str]:
    return dict(doc["metadata"].get("labels") or {})


@functools.cache
def _render(values_json: str) -> Rendered:
    with helm.Chart.load(str(CHART)) as chart:
        files = chart.render(json.loads(values_json), name=RELEASE, namespace=NAMESPACE)
    docs = tuple(
        doc
        for path, text in sorted(files.items())
        if path.endswith((".yaml", ".yml"))
        for doc in yaml.safe_load_all(text)
        if doc
    )
    return Rendered(files=files, docs=docs)


def render(values: Mapping[str, Any] | None = None) -> Rendered:
    """The chart rendered with ``values`` over :data:`BASE_VALUES`."""
    return _render(json.dumps(with_base(values), sort_keys=True))


def pod_spec(workload: Mapping[str, Any]) -> dict[str, Any]:
    spec: dict[str, Any] = workload["spec"]["template"]["spec"]
    return spec


def container(workload: Mapping[str, Any], name: str) -> dict[str, Any]:
    found: list[dict[str, Any]] = [c for c in pod_spec(workload)["containers"] if c["name"] == name]
    assert len(found) == 1, f"no container {name} in {workload['metadata']['name']}"
    return found[0]


def argv(ctr: Mapping[str, Any]) -> list[str]:
    """The full command line (command + args), as the container runtime runs it."""
    return [str(part) for part in [*ctr.get("command", []), *ctr.get("args", [])]]


def flags(ctr: Mapping[str, Any]) -> dict[str, str]:
    """``--name=value`` flags of a container's command line (bare ``--name`` maps to "")."""
    result: dict[str, str] = {}
    for part in argv(ctr):
        if part.startswith("--"):
            name, _, value = part[2:].partition("=")
            result[name] = value
    return result


def port(ctr: Mapping[str, Any], name: str) -> int:
    found = [p["containerPort"] for p in ctr.get("ports", []) if p.get("name") == name]
    assert len(found) == 1, f"no port {name} on container {ctr['name']}"
    return int(found[0])


def mount_of_volume(workload: Mapping[str, Any], ctr: Mapping[str, Any], **source: str) -> str:
    """Where ``ctr`` mounts the volume whose source matches, e.g. ``configMap="x"`` or ``secret="y"``."""
    ((kind, name),) = source.items()
    key = {"configMap": "name", "secret": "secretName"}[kind]
    volumes = [v["name"] for v in pod_spec(workload)["volumes"] if (v.get(kind) or {}).get(key) == name]
    assert len(volumes) == 1, f"no {kind} volume {name}"
    mounts = [m["mountPath"] for m in ctr["volumeMounts"] if m["name"] == volumes[0]]
    assert len(mounts) == 1, f"{ctr['name']} does not mount {kind} {name}"
    return str(mounts[0])


# ------------------------------------------------------------------------------------- schemas
def _schema_dir(version: str) -> Any:
    return resources.files("kubernetes_validate").joinpath(
        "kubernetes-json-schema", f"v{version}.0-local-strict"
    )


@functools.cache
def _definitions(version: str) -> Resource[Any]:
    return Resource.from_contents(json.loads(_schema_dir(version).joinpath("_definitions.json").read_text()))


@functools.cache
def _validator(version: str, kind: str, api_version: str) -> jsonschema.protocols.Validator:
    # kubernetes-validate's file naming: rbac.authorization.k8s.io/v1 -> rbac-v1, apps/v1 -> apps-v1
    group_version = re.sub(r"^([^./]*)(?:\.[^/]*)?/", r"\1-", api_version)
    schema = json.loads(_schema_dir(version).joinpath(f"{kind.lower()}-{group_version}.json").read_text())
    registry: Registry[Any] = Resource.from_contents(schema) @ (_definitions(version) @ Registry())
    return jsonschema.Draft202012Validator(schema, registry=registry)


def schema_errors(doc: Mapping[str, Any], version: str) -> list[str]:
    """Every violation of the strict Kubernetes ``version`` schema (unknown fields included)."""
    validator = _validator(version, doc["kind"], doc["apiVersion"])
    return [
        f"{doc['kind']}/{doc['metadata']['name']} {'.'.join(map(str, error.path))}: {error.message}"
        for error in validator.iter_errors(doc)
    ]


# ------------------------------------------------------------------------------------------- RBAC
@dataclass(frozen=True, order=True)
class Grant:
    group: str
    resource: str
    verb: str
    #: the object name the rule is limited to ("" = any)
    name: str = ""


def _rule_grants(rule: Mapping[str, Any]) -> Iterator[Grant]:
    for group in rule.get("apiGroups", []):
        for resource in rule.get("resources", []):
            for verb in rule.get("verbs", []):
                for name in rule.get("resourceNames") or [""]:
                    yield Grant(group=group, resource=resource, verb=verb, name=name)


def grants(rendered: Rendered, component: str) -> set[Grant]:
    """Everything the roles labelled with ``component`` allow (ClusterRoles and Roles together)."""
    result: set[Grant] = set()
    for kind in ("ClusterRole", "Role"):
        for role in rendered.of_kind(kind):
            if labels(role).get("app.kubernetes.io/component") == component:
                for rule in role.get("rules", []):
                    result.update(_rule_grants(rule))
    return result


def grant_for_request(method: str, path: str, query: Mapping[str, str] | None = None) -> Grant:
    """The RBAC permission an API request needs, as the API server's authorizer derives it.

    ``GET /api/v1/nodes`` -> list, ``GET /api/v1/nodes?watch=true`` -> watch, ``GET /api/v1/nodes/n1`` ->
    get (limited to n1), ``POST .../pods/p/binding`` -> create on ``pods/binding``. Lets an RBAC test map
    the requests kmock recorded from a component onto :func:`grants` of that component.
    """
    parts = [p for p in path.split("?")[0].strip("/").split("/") if p]
    if parts[:1] == ["api"]:
        group, rest = "", parts[2:]
    elif parts[:1] == ["apis"]:
        group, rest = parts[1], parts[3:]
    else:
        raise ValueError(f"not a resource path: {path}")
    if rest[:1] == ["namespaces"] and len(rest) >= 3:
        rest = rest[2:]  # namespaced object or collection (a bare .../namespaces/NAME is the namespace)
    resource, name, sub = rest[0], rest[1] if len(rest) > 1 else "", rest[2] if len(rest) > 2 else ""
    watching = (query or {}).get("watch") in ("true", "1")
    verb = {
        "GET": "watch" if watching else ("get" if name else "list"),
        "POST": "create",
        "PUT": "update",
        "PATCH": "patch",
        "DELETE": "delete" if name else "deletecollection",
    }[method.upper()]
    if sub:
        return Grant(group=group, resource=f"{resource}/{sub}", verb=verb, name=name)
    return Grant(
        group=group,
        resource=resource,
        verb=verb,
        name=name if verb not in ("create", "list", "watch") else "",
    )


def is_resource_path(path: str) -> bool:
    """Whether a request path names a resource (RBAC applies), not API discovery (``/api``,
    ``/api/v1``, ``/apis``, ``/apis/GROUP``, ``/apis/GROUP/VERSION``), which every authenticated
    account may read (the built-in ``system:discovery`` role)."""
    parts = [p for p in path.split("?")[0].strip("/").split("/") if p]
    if parts[:1] == ["api"]:
        return len(parts) > 2
    if parts[:1] == ["apis"]:
        return len(parts) > 3
    return parts not in (["version"], ["healthz"], ["readyz"], ["livez"])


def allows(granted: set[Grant], needed: Grant) -> bool:
    """Whether ``granted`` covers ``needed`` (a rule without resourceNames covers every name)."""
    return any(
        (g.group, g.resource, g.verb) == (needed.group, needed.resource, needed.verb)
        and g.name in ("", needed.name)
        for g in granted
    )
