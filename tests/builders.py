"""Raw Kubernetes objects for the tests, as the API server stores them (plain JSON dicts, so a test can
make them hostile), and the fixed clock they are written at.

Owns: nodes (registered cards, the handshake, allocatable), GPU pods, the annotations bind and the node
agent leave (``placed``), node-lock and handshake values, a MutatingWebhookConfiguration, and
:func:`create` (one object onto a test's embedded API server). Every annotation value is written
through the codec (``hami.annotations``), never spelled out here.

The pure core's own table builders (``Device``/``NodeState``/``PodRequest``) live in
``tests/core/builders.py``; the bounded wait is :func:`tests.eventually.eventually`.
"""

from __future__ import annotations

import datetime
from typing import Any, cast

import kmock

from hami.annotations import (
    NODE_HANDSHAKE,
    NODE_REGISTER,
    POD_BIND_PHASE,
    POD_BIND_TIME,
    HandshakeKind,
    NodeLockValue,
    allocation_annotations,
    encode_handshake,
    encode_node_devices,
    encode_node_lock,
    encode_unix_time,
)
from hami.core.model import Device, Grant
from hami.kube.protocol import KubeApi
from hami.scheduler.snapshot import local_time

#: the tests' fixed "now" (the scheduler's and the doctor's clock in their tests)
NOW = datetime.datetime(2026, 5, 1, 10, 0, 0, tzinfo=datetime.UTC)
MODEL = "NVIDIA-Tesla V100-PCIE-32GB"

#: The ``api`` of a collaborator built by a test that makes no API call through it (the verbs that
#: only read the snapshot, the exporter's parsing, an Allocator whose Allocate is not called).
NO_API = cast(KubeApi, None)


def ago(seconds: float) -> datetime.datetime:
    return NOW - datetime.timedelta(seconds=seconds)


def handshake(seconds_ago: float = 0) -> str:
    """``Requesting_<local time>``, written ``seconds_ago`` before NOW (the scheduler's question)."""
    return encode_handshake(HandshakeKind.REQUESTING, local_time(ago(seconds_ago)))


#: a handshake answered at NOW
HANDSHAKE = handshake()


def lock(seconds_ago: float, namespace: str | None = "default", name: str | None = "holder") -> str:
    """A node-lock value taken ``seconds_ago`` before NOW by ``namespace/name`` (None: HAMi's short form)."""
    return encode_node_lock(NodeLockValue(time=ago(seconds_ago), namespace=namespace, name=name))


def device(
    uuid: str,
    *,
    index: int = 0,
    count: int = 10,
    memory: int = 10000,
    cores: int = 100,
    type: str = MODEL,
    health: bool = True,
) -> Device:
    """One registered card (what the node agent writes into ``hami.io/node-nvidia-register``)."""
    return Device(
        uuid=uuid,
        index=index,
        count=count,
        memory_mib=memory,
        cores=cores,
        type=type,
        mode="hami-core",
        health=health,
    )


def card(node: str, index: int, *, count: int = 10, memory: int = 10000, cores: int = 100) -> Device:
    """Card ``index`` of ``node``: ``GPU-<node>-<index>``."""
    return device(f"GPU-{node}-{index}", index=index, count=count, memory=memory, cores=cores)


def make_node(
    name: str,
    *devices: Device,
    cards: int = 2,
    memory: int = 10000,
    count: int = 10,
    register: str | None = None,
    annotations: dict[str, str] | None = None,
    labels: dict[str, str] | None = None,
    allocatable: int | None = None,
) -> dict[str, Any]:
    """A Node. With cards (the ``devices`` given, else ``cards`` of :func:`card` with ``memory`` and
    ``count``) or a ``register`` text it is registered and healthy: handshake answered, allocatable > 0;
    with ``cards=0`` and no ``register`` it is a node without our agent. ``annotations`` go last."""
    if not devices:
        devices = tuple(card(name, i, count=count, memory=memory) for i in range(cards))
    merged: dict[str, str] = {}
    if devices or register is not None:
        merged[NODE_REGISTER] = register if register is not None else encode_node_devices(devices)
        merged[NODE_HANDSHAKE] = HANDSHAKE
    merged.update(annotations or {})
    total = allocatable if allocatable is not None else sum(d.count for d in devices)
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "annotations": merged, "labels": dict(labels or {})},
        "status": {"allocatable": {"nvidia.com/gpu": str(total)}},
    }


def make_pod(
    name: str,
    *,
    gpus: int = 1,
    memory: int | None = 1000,
    cores: int | None = 30,
    annotations: dict[str, str] | None = None,
    labels: dict[str, str] | None = None,
    namespace: str = "default",
    scheduler: str | None = "hami-scheduler",
    node: str | None = None,
    phase: str = "Pending",
    containers: list[dict[str, Any]] | None = None,
    init_containers: list[dict[str, Any]] | None = None,
    status: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """A Pod with one container asking ``gpus`` cards of ``memory`` MiB and ``cores`` % (None: not asked;
    ``gpus=0``: no GPU limits at all), or the given ``containers``. ``scheduler`` is
    ``spec.schedulerName`` (None: unset), ``node`` ``spec.nodeName``, ``status`` extra status fields
    (e.g. kubelet's container statuses). Its uid is ``uid-<name>``."""
    if containers is None:
        container: dict[str, Any] = {"name": "main", "image": "cuda"}
        if gpus:
            limits = {"nvidia.com/gpu": str(gpus)}
            if memory is not None:
                limits["nvidia.com/gpumem"] = str(memory)
            if cores is not None:
                limits["nvidia.com/gpucores"] = str(cores)
            container["resources"] = {"limits": limits}
        containers = [container]
    spec: dict[str, Any] = {"containers": containers}
    if init_containers:
        spec["initContainers"] = init_containers
    if scheduler is not None:
        spec["schedulerName"] = scheduler
    if node is not None:
        spec["nodeName"] = node
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "uid": f"uid-{name}",
            "annotations": dict(annotations or {}),
            "labels": dict(labels or {}),
        },
        "spec": spec,
        "status": {"phase": phase, **(status or {})},
    }


def placed(
    node_name: str, uuid: str, memory: int, cores: int, *, phase: str = "success", bound_ago: float = 5
) -> dict[str, str]:
    """The annotations bind (and the node agent, for ``success``) leave on a pod holding one card."""
    devices = ((Grant(uuid=uuid, memory_mib=memory, cores=cores),),)
    annotations = allocation_annotations(node=node_name, devices=devices, now=ago(bound_ago))
    annotations[POD_BIND_PHASE] = phase
    annotations[POD_BIND_TIME] = encode_unix_time(ago(bound_ago))
    return annotations


def webhook_config(
    name: str = "hami-webhook",
    *,
    ca_bundle: str = "Y2E=",
    failure_policy: str | None = "Fail",
    client_config: dict[str, Any] | None = None,
    webhook_name: str = "vgpu.hami.io",
    resources: tuple[str, ...] = ("pods",),
) -> dict[str, Any]:
    """A MutatingWebhookConfiguration with one webhook on pod CREATE (the chart's, by default)."""
    client = client_config or {
        "service": {"name": "hami-webhook", "namespace": "kube-system", "path": "/webhook", "port": 443}
    }
    if ca_bundle:
        client = {**client, "caBundle": ca_bundle}
    entry: dict[str, Any] = {
        "name": webhook_name,
        "admissionReviewVersions": ["v1"],
        "clientConfig": client,
        "rules": [
            {"apiGroups": [""], "apiVersions": ["v1"], "resources": list(resources), "operations": ["CREATE"]}
        ],
        "sideEffects": "None",
    }
    if failure_policy is not None:
        entry["failurePolicy"] = failure_policy
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "MutatingWebhookConfiguration",
        "metadata": {"name": name},
        "webhooks": [entry],
    }


_COLLECTIONS = {
    "Node": "/api/v1/nodes",
    "Pod": "/api/v1/namespaces/{namespace}/pods",
    "ResourceQuota": "/api/v1/namespaces/{namespace}/resourcequotas",
    "MutatingWebhookConfiguration": "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations",
}


async def create(apiserver: kmock.KubernetesEmulator, *objects: dict[str, Any]) -> None:
    """POST each object to its collection on this test's embedded API server (201 expected)."""
    for body in objects:
        path = _COLLECTIONS[body["kind"]].format(namespace=body["metadata"].get("namespace", "default"))
        response = await apiserver.post(path, json=body)
        assert response.status in (200, 201), (path, response.status, await response.text())


def hostile_nodes() -> list[dict[str, Any]]:
    """Registered Nodes of shapes kube-apiserver never stores (a test server keeps anything): the
    registration an int, the annotations a list, ``status.allocatable`` a string."""
    int_register = make_node("int-register")
    int_register["metadata"]["annotations"][NODE_REGISTER] = 5
    list_annotations = make_node("list-annotations", labels={"gpu": "on"})
    list_annotations["metadata"]["annotations"] = [NODE_REGISTER]
    string_allocatable = make_node("string-allocatable")
    string_allocatable["status"]["allocatable"] = "not a map"
    return [int_register, list_annotations, string_allocatable]


def nameless_node() -> dict[str, Any]:
    """A registered Node whose ``metadata`` is a string: it has no name."""
    nameless = make_node("nameless")
    nameless["metadata"] = "nameless"
    return nameless


async def create_hostile_nodes(apiserver: kmock.KubernetesEmulator) -> None:
    """:func:`hostile_nodes` on the API server, and :func:`nameless_node` (stored in place: kmock cannot
    take one over HTTP, it has no name to file it under)."""
    await create(apiserver, *hostile_nodes())
    apiserver.objects[kmock.resource("v1/nodes"), None, "nameless"] = nameless_node()
