"""The rules behind ``hami doctor`` for the installation: the webhook routing pods to us, GPU nodes and
node locks (GPU pods and card usage are in :mod:`hami.doctor.pods`, enforcement in
:mod:`hami.doctor.enforcement`; :func:`run_checks` runs them all).

Inputs are plain data: raw JSON objects as the API returns them, the per-card usage the scheduler's
snapshot computed, the settings and the time (``now`` aware; ``local_now`` the naive local wall-clock
time the handshake stamps use). Annotation values are read with the codec only.

Pure: no I/O, no clock, no logging; must not import the Kubernetes client or ``hami.kube``.
"""

from __future__ import annotations

import datetime
from collections.abc import Collection, Iterable, Mapping, Sequence
from typing import Any

from hami import objects
from hami.annotations import (
    NO_GPU,
    NODE_HANDSHAKE,
    NODE_LOCK,
    NODE_REGISTER,
    AnnotationError,
    HandshakeKind,
    decode_handshake,
    decode_node_lock,
    node_shape_problem,
    pod_annotations,
    read_node,
)
from hami.core.model import NodeState
from hami.doctor.enforcement import check_enforcement
from hami.doctor.findings import (
    CLUSTER,
    DoctorSettings,
    Finding,
    Severity,
    finding,
    name_of,
    plural,
    pod_key,
    seconds,
)
from hami.doctor.pods import check_pods, check_usage

#: The label the chart's node agent DaemonSet selects (``kubectl label node N gpu=on``).
GPU_NODE_LABEL = ("gpu", "on")
WEBHOOK_PATH = "/webhook"

OK, WARN, FAIL = Severity.OK, Severity.WARN, Severity.FAIL


def run_checks(
    *,
    configs: Iterable[Mapping[str, Any]],
    nodes: Sequence[Mapping[str, Any]],
    pods: Sequence[Mapping[str, Any]],
    states: Iterable[NodeState],
    holders: Mapping[tuple[str, str], Sequence[str]],
    settings: DoctorSettings,
    now: datetime.datetime,
    local_now: datetime.datetime,
) -> list[Finding]:
    """Every finding, in report order: webhook, nodes, enforcement, locks, pods, usage."""
    return [
        *check_webhooks(configs, settings),
        *check_nodes(nodes, settings, local_now=local_now),
        *check_enforcement(nodes),
        *check_locks(nodes, {pod_key(p) for p in pods}, settings, now=now),
        *check_pods(pods, settings, now=now),
        *check_usage(states, holders),
    ]


# ------------------------------------------------------------------------------------------ webhook


def _target(webhook: Mapping[str, Any]) -> tuple[str, str]:
    """(path, how the API server reaches it) of a webhook's clientConfig."""
    client = webhook.get("clientConfig") or {}
    service = client.get("service")
    if isinstance(service, Mapping):
        path = str(service.get("path") or "")
        return path, f"service {service.get('namespace')}/{service.get('name')}{path}"
    url = str(client.get("url") or "")
    rest = url.partition("://")[2]
    path = "/" + rest.partition("/")[2] if "/" in rest else ""
    return path.partition("?")[0], url


def _sends_pod_create(webhook: Mapping[str, Any]) -> bool:
    for rule in webhook.get("rules") or []:
        groups, resources = rule.get("apiGroups") or [], rule.get("resources") or []
        operations = rule.get("operations") or []
        if (
            ("" in groups or "*" in groups)
            and ("pods" in resources or "*" in resources)
            and ("CREATE" in operations or "*" in operations)
        ):
            return True
    return False


def check_webhooks(configs: Iterable[Mapping[str, Any]], settings: DoctorSettings) -> list[Finding]:
    """Entries routing pods to us (path ``/webhook`` or a name containing ``hami``): a CA bundle, rules
    that send pod CREATE, and the failure policy."""
    found: list[Finding] = []
    for config in sorted(configs, key=name_of):
        for webhook in config.get("webhooks") or []:
            path, target = _target(webhook)
            name = str(webhook.get("name") or "")
            if path != WEBHOOK_PATH and "hami" not in name.lower():
                continue
            subject = f"mutatingwebhookconfiguration {name_of(config)} webhook {name}"
            if not (webhook.get("clientConfig") or {}).get("caBundle"):
                message = f"caBundle is empty: the API server cannot verify {target}"
                action = "run the chart's certificate job (python -m webhook.certs inject) or cert-manager"
                found.append(finding(FAIL, "webhook", subject, message, action))
            if not _sends_pod_create(webhook):
                message = "its rules do not send pod CREATE requests: GPU pods are never routed"
                action = "rules need apiGroups [''], resources [pods], operations [CREATE]"
                found.append(finding(FAIL, "webhook", subject, message, action))
            policy = str(webhook.get("failurePolicy") or "Fail")  # the admissionregistration/v1 default
            if policy == "Fail":
                found.append(finding(OK, "webhook", subject, f"routes pods to {target}, failurePolicy Fail"))
            else:
                message = (
                    f"failurePolicy {policy}: while the webhook is unreachable GPU pods are admitted "
                    f"unchanged and never reach {settings.scheduler_name}"
                )
                action = "set webhook.failurePolicy=Fail (safe with matchConditions, Kubernetes >= 1.28)"
                found.append(finding(WARN, "webhook", subject, message, action))
    if not found:
        message = (
            f"no MutatingWebhookConfiguration has a webhook with path {WEBHOOK_PATH} or a name containing "
            f"'hami': GPU pods are not routed to {settings.scheduler_name}"
        )
        action = "install the webhook (helm upgrade --install hami charts/hami)"
        found.append(finding(FAIL, "webhook", CLUSTER, message, action))
    return found


# -------------------------------------------------------------------------------------------- nodes


def _labelled(node: Mapping[str, Any]) -> bool:
    return objects.labels(node).get(GPU_NODE_LABEL[0]) == GPU_NODE_LABEL[1]


def _allocatable(node: Mapping[str, Any], resource: str) -> int:
    text = objects.allocatable(node).get(resource, "0")
    try:
        return int(str(text))
    except ValueError:
        return 0


def _registration(name: str, annotations: Mapping[str, str]) -> Finding:
    subject = f"node {name}"
    try:
        state = read_node(name, annotations)
    except AnnotationError as exc:
        if exc.reason == NO_GPU:
            action = f"check that the driver sees the cards on {name}, and the agent's card filter"
            return finding(WARN, "node", subject, "the node agent registers no card", action)
        message = f"registration unreadable, the scheduler excludes the node: {exc}"
        action = f"check hami-node-agent's log on {name}; it rewrites the registration every 30 s"
        return finding(FAIL, "node", subject, message, action)
    cards = [d.device for d in state.devices]
    sick = [c.uuid for c in cards if not c.health]
    if not sick:
        return finding(OK, "node", subject, f"{plural(len(cards), 'card')} registered, all healthy")
    message = f"{len(sick)} of {len(cards)} cards unhealthy: {', '.join(sick)}"
    action = f"nothing is placed on them; check the cards (nvidia-smi) and hami-node-agent on {name}"
    return finding(WARN, "node", subject, message, action)


def check_nodes(
    nodes: Iterable[Mapping[str, Any]], settings: DoctorSettings, *, local_now: datetime.datetime
) -> list[Finding]:
    """Nodes with a registration or the ``gpu=on`` label: the registration decodes (unhealthy cards
    counted), a labelled node has one, and no handshake went unanswered while allocatable is 0; and
    every Node of a shape the scheduler cannot read (``node_shape_problem``), which it excludes."""
    found: list[Finding] = []
    count = settings.config.resources.count
    label = "=".join(GPU_NODE_LABEL)
    for node in sorted(nodes, key=name_of):
        name, annotations = name_of(node), pod_annotations(node)
        shape = node_shape_problem(node)
        if shape is not None:
            message = f"malformed Node, the scheduler excludes it: {shape}"
            action = "no API server stores such a Node: check what wrote it, and fix or recreate it"
            found.append(finding(FAIL, "node", f"node {name or '(no name)'}", message, action))
            continue
        if NODE_REGISTER in annotations:
            found.append(_registration(name, annotations))
        elif _labelled(node):
            message = (
                f"labelled {label} but has no {NODE_REGISTER}: the node agent is not running there "
                "or cannot write the Node"
            )
            action = f"check the hami-node-agent pod on {name} and its log"
            found.append(finding(FAIL, "node", f"node {name}", message, action))
        else:
            continue
        handshake = decode_handshake(annotations.get(NODE_HANDSHAKE))
        if handshake.kind is not HandshakeKind.REQUESTING or handshake.time is None:
            continue
        waited = local_now - handshake.time
        if waited > settings.handshake_window and _allocatable(node, count) <= 0:
            message = (
                f"handshake {annotations[NODE_HANDSHAKE]!r} unanswered for {seconds(waited)} and {count} "
                "allocatable is 0: the scheduler excludes the node"
            )
            action = (
                "the device plugin is not registered with the kubelet: check hami-node-agent's log and "
                f"/var/lib/kubelet/device-plugins on {name}"
            )
            found.append(finding(FAIL, "node", f"node {name}", message, action))
    if not found:
        message = f"no node is labelled {label} or carries {NODE_REGISTER}"
        action = f"label the GPU nodes {label} so the node agent DaemonSet runs there"
        found.append(finding(WARN, "node", CLUSTER, message, action))
    return found


# -------------------------------------------------------------------------------------------- locks


def check_locks(
    nodes: Iterable[Mapping[str, Any]],
    pods: Collection[str],
    settings: DoctorSettings,
    *,
    now: datetime.datetime,
) -> list[Finding]:
    """Node locks that are unreadable (binds fail until removed), older than the lock timeout, or held
    by a pod that is gone (both taken over by the next bind). ``pods``: every pod as ``ns/name``."""
    found: list[Finding] = []
    held = 0
    timeout = settings.lock_timeout
    for node in sorted(nodes, key=name_of):
        name = name_of(node)
        text = pod_annotations(node).get(NODE_LOCK)
        if text is None:
            continue
        held += 1
        subject = f"node {name}"
        remove = f"kubectl annotate node {name} {NODE_LOCK}-"
        try:
            lock = decode_node_lock(text)
        except AnnotationError as exc:
            message = f"unreadable node lock, every bind on the node fails: {exc}"
            found.append(finding(FAIL, "lock", subject, message, remove))
            continue
        owner = "a legacy holder (no pod named)" if lock.legacy else f"{lock.namespace}/{lock.name}"
        if lock.expired(now, timeout):
            message = (
                f"held by {owner} for {seconds(now - lock.time)}, longer than the {seconds(timeout)} "
                "lock timeout: the next bind on the node takes it over"
            )
            action = f"the node agent did not release it: check hami-node-agent's log on {name}"
            found.append(finding(WARN, "lock", subject, message, action))
        elif not lock.legacy and owner not in pods:
            message = f"held by {owner}, which no longer exists (dangling): the next bind takes it over"
            found.append(finding(WARN, "lock", subject, message, f"nothing to do, or {remove}"))
    if not found:
        message = f"no node lock is unreadable, expired or dangling ({held} held)"
        found.append(finding(OK, "lock", CLUSTER, message))
    return found
