"""Raw Kubernetes objects as typed JSON: their shapes (TypedDicts) and the checked accessors that read them.

Owns: :class:`RawMeta`, :class:`RawPod`, :class:`RawNode` and their small siblings (containers, specs,
statuses, lists), ``total=False`` TypedDicts with the API's own JSON field names, covering only the
fields this project reads or writes; and pure accessors (:func:`meta`, :func:`name`, :func:`annotations`,
:func:`labels`, :func:`pod_phase`, :func:`node_name`, :func:`containers`, ...), with the few pod rules
every reader shares, each declared here once: :func:`priority` (``spec.priority``, int32, else 0),
:func:`start_time` (kube-scheduler's GetPodStartTime: ``status.startTime``, else now),
:data:`FINISHED_PHASES` / :func:`finished` and :func:`containers_init_first` (the device-annotation
order).

Objects come off the wire (the API server, a watch stream, an AdmissionReview, an extender request, a
manifest file) as plain dicts: a TypedDict says what a well-formed object holds, it checks nothing. So
every read goes through an accessor, and each accessor treats a field of the wrong JSON type as absent
and never raises, whatever it is handed: metadata that is not an object reads as ``{}``, annotations or
labels that are not an object read as empty, and entries of them whose key or value is not a string
are left out; a name that is not a string reads as ``""``; containers that are not objects are
skipped. (kube-apiserver only ever stores string maps; a test server, a hand-written manifest or a
hostile request may hold anything.) Writers that must echo a field exactly as stored (JSON patch
``test`` operations) take :func:`meta`'s mapping as it is.

Pure: stdlib only. Every layer may import it; it imports nothing of the project.
"""

# No ``from __future__ import annotations``: it would bind the name :func:`annotations` defines.
import datetime
from collections.abc import Mapping
from typing import Any, TypedDict, cast

# ------------------------------------------------------------------------------------------ shapes


class RawOwnerReference(TypedDict, total=False):
    apiVersion: str
    kind: str
    name: str
    uid: str
    controller: bool


class RawMeta(TypedDict, total=False):
    """``metadata`` of any object (``ObjectMeta``)."""

    name: str
    generateName: str
    namespace: str
    uid: str
    resourceVersion: str
    generation: int
    creationTimestamp: str
    deletionTimestamp: str
    labels: dict[str, str]
    annotations: dict[str, str]
    ownerReferences: list[RawOwnerReference]
    finalizers: list[str]


class RawResources(TypedDict, total=False):
    """A container's ``resources``: quantities are strings on the wire."""

    limits: dict[str, str]
    requests: dict[str, str]


class RawEnvVar(TypedDict, total=False):
    name: str
    value: str


class RawContainer(TypedDict, total=False):
    name: str
    image: str
    resources: RawResources
    env: list[RawEnvVar]


class RawPodSpec(TypedDict, total=False):
    nodeName: str
    schedulerName: str
    containers: list[RawContainer]
    initContainers: list[RawContainer]
    nodeSelector: dict[str, str]
    runtimeClassName: str
    priority: int
    priorityClassName: str


class RawPodStatus(TypedDict, total=False):
    phase: str
    reason: str
    message: str


class RawPod(TypedDict, total=False):
    apiVersion: str
    kind: str
    metadata: RawMeta
    spec: RawPodSpec
    status: RawPodStatus


class RawNodeSpec(TypedDict, total=False):
    unschedulable: bool


class RawNodeStatus(TypedDict, total=False):
    capacity: dict[str, str]
    allocatable: dict[str, str]


class RawNode(TypedDict, total=False):
    apiVersion: str
    kind: str
    metadata: RawMeta
    spec: RawNodeSpec
    status: RawNodeStatus


class RawListMeta(TypedDict, total=False):
    resourceVersion: str
    # ``continue`` (a Python keyword) is never read: lists are asked for whole


class RawList(TypedDict, total=False):
    """A list response (``PodList``, ``NodeList``, ...): ``items`` are checked by :func:`items`."""

    apiVersion: str
    kind: str
    metadata: RawListMeta
    items: list[dict[str, Any]]


# --------------------------------------------------------------------------------------- accessors


def _object(value: object) -> Mapping[str, Any]:
    """``value`` when it is a JSON object (a mapping), else a new empty one (never shared: a caller
    that writes into what :func:`meta` returned must not write into every other absent metadata)."""
    if type(value) is dict:  # what JSON decodes to: no abstract-class check (every accessor comes here)
        return value
    return cast("Mapping[str, Any]", value) if isinstance(value, Mapping) else {}


def _field(obj: object, key: str) -> Mapping[str, Any]:
    """``obj[key]`` when ``obj`` is an object and the field an object too, else an empty mapping."""
    if type(obj) is dict:
        value = obj.get(key)
        return value if type(value) is dict else _object(value)
    return _object(_object(obj).get(key))


def _text(obj: Mapping[str, Any], key: str) -> str:
    value = obj.get(key)
    return value if isinstance(value, str) else ""


_ONLY_STR = frozenset([str])


def _strings(value: object) -> Mapping[str, str]:
    """A string map: ``value`` itself when every entry is ``str: str``, else only those entries."""
    if (
        type(value) is dict
        and _ONLY_STR.issuperset(map(type, value))
        and _ONLY_STR.issuperset(map(type, value.values()))
    ):
        return value  # what the API stores: checked without a Python loop
    if not isinstance(value, Mapping):
        return {}
    if all(isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
        return cast("Mapping[str, str]", value)
    return {k: v for k, v in value.items() if isinstance(k, str) and isinstance(v, str)}


def meta(obj: object) -> RawMeta:
    """The object's ``metadata`` as stored (a mapping; ``{}`` when absent or not an object).

    Its fields are unchecked: read them with the accessors below, unless echoing them as stored."""
    return cast(RawMeta, _field(obj, "metadata"))


def name(obj: object) -> str:
    """``metadata.name`` (``""`` when absent or not a string)."""
    return _text(_field(obj, "metadata"), "name")


def namespace(obj: object) -> str:
    """``metadata.namespace`` (``""`` when absent, as for cluster-scoped objects, or not a string)."""
    return _text(_field(obj, "metadata"), "namespace")


def pod_key(pod: object) -> tuple[str, str]:
    """``(metadata.namespace, metadata.name)``: how every component names a pod (each ``""`` when
    absent or not a string; no namespace is made up for a pod that lacks one)."""
    return namespace(pod), name(pod)


def uid(obj: object) -> str:
    """``metadata.uid`` (``""`` when absent or not a string)."""
    return _text(_field(obj, "metadata"), "uid")


def resource_version(obj: object) -> str:
    """``metadata.resourceVersion`` of an object or a list (``""`` when absent or not a string)."""
    return _text(_field(obj, "metadata"), "resourceVersion")


def annotations(obj: object) -> Mapping[str, str]:
    """``metadata.annotations``: its string entries (empty when absent or not an object). Read-only."""
    return _strings(_field(obj, "metadata").get("annotations"))


def labels(obj: object) -> Mapping[str, str]:
    """``metadata.labels``: its string entries (empty when absent or not an object). Read-only."""
    return _strings(_field(obj, "metadata").get("labels"))


def spec(obj: object) -> Mapping[str, Any]:
    """``spec`` (empty when absent or not an object); its fields are unchecked."""
    return _field(obj, "spec")


def status(obj: object) -> Mapping[str, Any]:
    """``status`` (empty when absent or not an object); its fields are unchecked."""
    return _field(obj, "status")


def pod_phase(pod: object) -> str:
    """``status.phase`` (``Pending``, ``Running``, ``Succeeded``, ``Failed``, ``Unknown``; ``""`` when
    absent or not a string)."""
    return _text(_field(pod, "status"), "phase")


#: Phases whose containers are gone for good: a pod in one holds nothing and never runs again.
FINISHED_PHASES = frozenset({"Succeeded", "Failed"})

#: kube-scheduler's range for ``spec.priority`` (int32).
PRIORITY_MIN, PRIORITY_MAX = -(2**31), 2**31 - 1


def finished(pod: object) -> bool:
    """Whether ``status.phase`` is one of :data:`FINISHED_PHASES`."""
    return pod_phase(pod) in FINISHED_PHASES


def priority(pod: object) -> int:
    """``spec.priority`` as kube-scheduler reads it: absent, not an integer or outside int32 -> 0."""
    value = _field(pod, "spec").get("priority")
    if isinstance(value, int) and not isinstance(value, bool) and PRIORITY_MIN <= value <= PRIORITY_MAX:
        return value
    return 0


def start_time(pod: object, now: float) -> float:
    """When the pod started, in Unix seconds, as kube-scheduler's GetPodStartTime reads it (its victims
    are ordered by it: higher priority first, then the earliest start): ``status.startTime``, else
    ``now`` (not started yet, or unreadable). A caller without a clock passes ``math.inf``: "later
    than every start", which orders every pod as kube-scheduler's "now" does."""
    text = _field(pod, "status").get("startTime")
    if not isinstance(text, str) or len(text) > 64:
        return now
    try:
        stamp = datetime.datetime.fromisoformat(text)
    except ValueError:
        return now
    if stamp.tzinfo is None:
        stamp = stamp.replace(tzinfo=datetime.UTC)
    return stamp.timestamp()


def node_name(pod: object) -> str:
    """``spec.nodeName``: the node the pod is bound to (``""`` when unbound or not a string)."""
    return _text(_field(pod, "spec"), "nodeName")


def scheduler_name(pod: object) -> str:
    """``spec.schedulerName`` as written (``""`` when absent or not a string; the API server defaults it
    to ``default-scheduler``)."""
    return _text(_field(pod, "spec"), "schedulerName")


def containers(pod: object) -> list[RawContainer]:
    """``spec.containers``: the entries that are objects (none when absent or not a list)."""
    return _entries(_field(pod, "spec").get("containers"))


def init_containers(pod: object) -> list[RawContainer]:
    """``spec.initContainers``: the entries that are objects (none when absent or not a list)."""
    return _entries(_field(pod, "spec").get("initContainers"))


def containers_init_first(pod: object) -> list[RawContainer]:
    """The pod's containers in device-annotation order: init containers first, then app containers
    (entries that are not objects are left out)."""
    return [*init_containers(pod), *containers(pod)]


def _entries(value: object) -> list[RawContainer]:
    if not isinstance(value, list):
        return []
    return [cast(RawContainer, entry) for entry in value if isinstance(entry, Mapping)]


def allocatable(node: object) -> Mapping[str, Any]:
    """``status.allocatable`` of a Node (empty when absent or not an object). The values are unchecked:
    quantities are strings on the wire, but a YAML manifest may hold plain numbers."""
    return _field(_field(node, "status"), "allocatable")


def items(body: object) -> list[dict[str, Any]]:
    """``items`` of a list response: the entries that are objects (none when absent or not a list)."""
    value = _object(body).get("items")
    if not isinstance(value, list):
        return []
    return [entry for entry in value if isinstance(entry, dict)]
