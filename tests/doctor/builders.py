"""Builders for the doctor tests: raw Node, Pod and MutatingWebhookConfiguration objects as the API
returns them, with the fixed clock ``NOW``."""

from __future__ import annotations

import datetime
from typing import Any

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
from hami.scheduler.snapshot import local_time

NOW = datetime.datetime(2026, 5, 1, 10, 0, 0, tzinfo=datetime.UTC)


def ago(seconds: float) -> datetime.datetime:
    return NOW - datetime.timedelta(seconds=seconds)


def handshake(seconds_ago: float = 0) -> str:
    """``Requesting_<local time>`` written ``seconds_ago`` before NOW."""
    return encode_handshake(HandshakeKind.REQUESTING, local_time(ago(seconds_ago)))


def lock(seconds_ago: float, namespace: str | None = "default", name: str | None = "holder") -> str:
    return encode_node_lock(NodeLockValue(time=ago(seconds_ago), namespace=namespace, name=name))


def card(uuid: str, *, memory: int = 10000, health: bool = True) -> Device:
    return Device(uuid=uuid, count=10, memory_mib=memory, cores=100, type="NVIDIA A100", health=health)


def node(
    name: str,
    *cards: Device,
    register: str | None = None,
    annotations: dict[str, str] | None = None,
    labels: dict[str, str] | None = None,
    allocatable: int | None = None,
) -> dict[str, Any]:
    """A node; with cards (or ``register``) it is registered, handshake answered, allocatable > 0."""
    merged: dict[str, str] = {}
    if cards or register is not None:
        merged = {NODE_REGISTER: register if register is not None else encode_node_devices(cards)}
        merged[NODE_HANDSHAKE] = handshake()
    merged.update(annotations or {})
    count = allocatable if allocatable is not None else 10 * len(cards)
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "annotations": merged, "labels": labels or {}},
        "status": {"allocatable": {"nvidia.com/gpu": str(count)}},
    }


def pod(
    name: str,
    *,
    gpus: int = 1,
    scheduler: str | None = "hami-scheduler",
    annotations: dict[str, str] | None = None,
    labels: dict[str, str] | None = None,
    phase: str = "Running",
) -> dict[str, Any]:
    container: dict[str, Any] = {"name": "main", "image": "cuda"}
    if gpus:
        container["resources"] = {"limits": {"nvidia.com/gpu": str(gpus)}}
    spec: dict[str, Any] = {"containers": [container]}
    if scheduler is not None:
        spec["schedulerName"] = scheduler
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": "default",
            "annotations": annotations or {},
            "labels": labels or {},
        },
        "spec": spec,
        "status": {"phase": phase},
    }


def placed(
    node_name: str, uuid: str, memory: int, cores: int, *, phase: str = "success", bound_ago: float = 5
) -> dict[str, str]:
    """What bind (and the node agent, for ``success``) leaves on a pod holding one card."""
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
            {
                "apiGroups": [""],
                "apiVersions": ["v1"],
                "resources": list(resources),
                "operations": ["CREATE"],
            }
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
