"""The demo's pod manifests: where they are, how they are read, and what each one expects to become.

Owns :func:`default_examples_dir` (the example pods shipped inside the package, ``hami_testkit/examples``,
found through :mod:`importlib.resources`, so ``hami demo`` finds them from a wheel or the image as
from a checkout; the repository's ``examples/`` is a link to them) and :func:`read_examples`: every
Pod document of ``*.yaml`` and ``*.yml`` in file-name order, checked strictly -- an unknown field of
the pod, its metadata, its spec, a container or a container's resources is an error naming the file,
the field path and the nearest known field (a typo such as ``resource:`` would otherwise vanish, as
the API server drops unknown fields). A comment line
``# outcome: Running|Pending|Refused|Failed|Preempted`` before a document declares what the demo
should see become of that pod. PriorityClass documents (``scheduling.k8s.io/v1``: the classes the
pods' ``priorityClassName`` names) are read too, as strictly, and created before any pod. The field
lists are Kubernetes' (``tests/testkit/test_manifests.py`` holds them equal to the pinned client's models).
Must not import ``webhook``, ``nodeagent`` or the Kubernetes client.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import resources
from importlib.resources.abc import Traversable
from typing import Any

import yaml

from hami import objects
from hami_testkit.cluster import ClusterFileError, unknown_field
from hami_testkit.kubeapi import JsonDict

OUTCOMES = ("Running", "Pending", "Refused", "Failed", "Preempted")
_OUTCOME = re.compile(r"^#\s*outcome:\s*(\S+)\s*$", re.IGNORECASE | re.MULTILINE)
_SEPARATOR = re.compile(r"^---(?:[ \t].*)?$", re.MULTILINE)

POD_FIELDS = ("apiVersion", "kind", "metadata", "spec", "status")
METADATA_FIELDS = (
    "annotations", "creationTimestamp", "deletionGracePeriodSeconds", "deletionTimestamp", "finalizers",
    "generateName", "generation", "labels", "managedFields", "name", "namespace", "ownerReferences",
    "resourceVersion", "selfLink", "uid",
)  # fmt: skip
SPEC_FIELDS = (
    "activeDeadlineSeconds", "affinity", "automountServiceAccountToken", "containers", "dnsConfig",
    "dnsPolicy", "enableServiceLinks", "ephemeralContainers", "evictionResponders", "hostAliases",
    "hostIPC", "hostNetwork", "hostPID", "hostUsers", "hostname", "hostnameOverride", "imagePullSecrets",
    "initContainers", "nodeName", "nodeSelector", "os", "overhead", "preemptionPolicy", "priority",
    "priorityClassName", "readinessGates", "resourceClaims", "resources", "restartPolicy",
    "runtimeClassName", "schedulerName", "schedulingGates", "schedulingGroup", "securityContext",
    "serviceAccount", "serviceAccountName", "setHostnameAsFQDN", "shareProcessNamespace", "subdomain",
    "terminationGracePeriodSeconds", "tolerations", "topologySpreadConstraints", "volumes",
)  # fmt: skip
CONTAINER_FIELDS = (
    "args", "command", "env", "envFrom", "image", "imagePullPolicy", "lifecycle", "livenessProbe", "name",
    "ports", "readinessProbe", "resizePolicy", "resources", "restartPolicy", "restartPolicyRules",
    "securityContext", "startupProbe", "stdin", "stdinOnce", "terminationMessagePath",
    "terminationMessagePolicy", "tty", "volumeDevices", "volumeMounts", "workingDir",
)  # fmt: skip
RESOURCES_FIELDS = ("claims", "limits", "requests")
PRIORITY_CLASS_FIELDS = (
    "apiVersion", "description", "globalDefault", "kind", "metadata", "preemptionPolicy", "value",
)  # fmt: skip


@dataclass(frozen=True, slots=True, kw_only=True)
class Example:
    """One manifest: the document (a Pod, or a PriorityClass the pods name), the file it came from, and
    the pod's declared outcome ("" if none)."""

    pod: JsonDict
    source: str
    outcome: str = ""

    @property
    def kind(self) -> str:
        return str(self.pod.get("kind"))

    @property
    def key(self) -> str:
        name = objects.name(self.pod) or str(objects.meta(self.pod).get("generateName") or "")
        if self.kind != "Pod":
            return f"{self.kind.lower()}/{name}"
        return f"{objects.namespace(self.pod) or 'default'}/{name}"


def default_examples_dir() -> Traversable:
    """The example pods packaged with ``hami`` (``testkit/hami_testkit/examples``)."""
    return resources.files("hami_testkit").joinpath("examples")


def read_examples(directory: Traversable) -> list[Example]:
    """Every Pod and PriorityClass document of ``directory/*.yaml`` and ``*.yml``, in file-name order,
    checked strictly.

    Raises :class:`~hami_testkit.cluster.ClusterFileError` naming the file and the field."""
    if not directory.is_dir():
        raise ClusterFileError(f"examples directory {str(directory)!r} does not exist (pass --examples DIR)")
    files = sorted(
        (f for f in directory.iterdir() if f.is_file() and f.name.endswith((".yaml", ".yml"))),
        key=lambda f: f.name,
    )
    examples: list[Example] = []
    for file in files:
        where = f"example {str(file)!r}"
        text = file.read_text(encoding="utf-8")
        try:
            documents = [d for d in yaml.safe_load_all(text) if d is not None]
        except yaml.YAMLError as exc:
            raise ClusterFileError(f"{where}: not valid YAML: {exc}") from exc
        segments = _segments(text)
        outcomes = [_outcome(s, where) for s in segments] if len(segments) == len(documents) else []
        for i, document in enumerate(documents):
            if isinstance(document, Mapping) and document.get("kind") == "PriorityClass":
                check_priority_class(document, where)
            elif not isinstance(document, Mapping) or document.get("kind") != "Pod":
                raise ClusterFileError(f"{where}: only Pod and PriorityClass documents are supported")
            else:
                check_pod(document, where)
            examples.append(
                Example(pod=dict(document), source=str(file), outcome=outcomes[i] if outcomes else "")
            )
    return examples


def load_examples(directory: Traversable) -> list[JsonDict]:
    """The documents of :func:`read_examples` (pods, and the PriorityClasses they name)."""
    return [example.pod for example in read_examples(directory)]


def check_pod(pod: Mapping[str, Any], where: str) -> None:
    """Refuse unknown fields where a typo would silently drop a request (pod, metadata, spec, containers,
    their resources); raises :class:`ClusterFileError` with the field path and the nearest known name."""
    _known(pod, POD_FIELDS, where, "")
    if pod.get("apiVersion") != "v1":
        raise ClusterFileError(f"{where}: apiVersion: a Pod is v1, got {pod.get('apiVersion')!r}")
    metadata, spec = pod.get("metadata"), pod.get("spec")
    if not isinstance(metadata, Mapping) or not isinstance(spec, Mapping):
        raise ClusterFileError(f"{where}: metadata and spec must be mappings")
    _known(metadata, METADATA_FIELDS, where, "metadata.")
    _known(spec, SPEC_FIELDS, where, "spec.")
    for group in ("initContainers", "containers"):
        items = spec.get(group) or []
        if not isinstance(items, list):
            raise ClusterFileError(f"{where}: spec.{group}: must be a list")
        for i, container in enumerate(items):
            path = f"spec.{group}[{i}]."
            if not isinstance(container, Mapping):
                raise ClusterFileError(f"{where}: {path[:-1]}: must be a mapping")
            _known(container, CONTAINER_FIELDS, where, path)
            res = container.get("resources")
            if res is not None:
                if not isinstance(res, Mapping):
                    raise ClusterFileError(f"{where}: {path}resources: must be a mapping")
                _known(res, RESOURCES_FIELDS, where, f"{path}resources.")


def check_priority_class(document: Mapping[str, Any], where: str) -> None:
    """A PriorityClass: known fields only, ``scheduling.k8s.io/v1``, a name and an integer ``value``."""
    _known(document, PRIORITY_CLASS_FIELDS, where, "")
    if document.get("apiVersion") != "scheduling.k8s.io/v1":
        got = document.get("apiVersion")
        raise ClusterFileError(f"{where}: apiVersion: a PriorityClass is scheduling.k8s.io/v1, got {got!r}")
    value = document.get("value")
    if not objects.name(document) or not isinstance(value, int) or isinstance(value, bool):
        raise ClusterFileError(f"{where}: a PriorityClass needs metadata.name and an integer value")


def _known(mapping: Mapping[str, Any], known: tuple[str, ...], where: str, path: str) -> None:
    for field in mapping:
        if field not in known:
            raise ClusterFileError(f"{where}: {path}{field}: {unknown_field(str(field), known)}")


def _segments(text: str) -> list[str]:
    """The text of each YAML document, comments before a ``---`` going with the document after it."""
    merged: list[str] = []
    carry = ""
    for part in _SEPARATOR.split(text):
        if all(not line.strip() or line.lstrip().startswith("#") for line in part.splitlines()):
            carry += part
            continue
        merged.append(carry + part)
        carry = ""
    if carry and merged:
        merged[-1] += carry
    return merged


def _outcome(segment: str, where: str) -> str:
    found = _OUTCOME.findall(segment)
    if not found:
        return ""
    value = str(found[-1]).capitalize()
    if value not in OUTCOMES:
        raise ClusterFileError(f"{where}: '# outcome: {found[-1]}': must be one of {', '.join(OUTCOMES)}")
    return value
