"""Pod reads and writes as raw JSON dicts, and the pod → node Binding.

Owns: get/list Pods (selectors are also applied client-side, since not every API server honours them;
:func:`list_node_pods`, bind's consistent read of a node's pods),
merge-patch of a Pod's annotations and labels, conditional (RFC 6902 JSON) patches of a Pod — the ``test``
operations that make a write apply only to the object as last read (:func:`unchanged_tests`) or only while it
still carries given values (:func:`value_tests`) — and creating the ``pods/binding`` subresource. ``limit``
(seconds) shortens one call's timeout (a caller with a deadline). Imports ``hami.kube.client``,
``hami.kube.paths``, ``hami.kube.protocol`` and ``hami.objects``; must not import ``hami.scheduler`` or
services.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import Any, cast

from hami import objects
from hami.kube import paths
from hami.kube.client import call_json
from hami.kube.protocol import KubeApi
from hami.objects import RawPod

MERGE_PATCH = paths.MERGE_PATCH
JSON_PATCH = paths.JSON_PATCH


def pointer(*parts: str) -> str:
    """An RFC 6901 JSON pointer (``~`` → ``~0``, ``/`` → ``~1`` in each part)."""
    return "".join("/" + part.replace("~", "~0").replace("/", "~1") for part in parts)


async def get_pod(api: KubeApi, namespace: str, name: str, *, limit: float | None = None) -> RawPod:
    """The Pod; raises :class:`~hami.kube.client.NotFound` when it does not exist."""
    where = {"namespace": namespace, "name": name}
    pod: RawPod = await call_json(api, "GET", paths.POD, params=where, limit=limit)
    return pod


async def list_pods_with_version(api: KubeApi, *, node_name: str | None = None) -> tuple[list[RawPod], str]:
    """Pods in every namespace (only those on ``node_name`` when given) and the list's resourceVersion.
    Items that are not objects are left out."""
    query = {"fieldSelector": f"spec.nodeName={node_name}"} if node_name else None
    body = await call_json(api, "GET", paths.PODS, query=query)
    items = cast("list[RawPod]", objects.items(body))
    if node_name:
        items = [p for p in items if objects.node_name(p) == node_name]
    return items, objects.resource_version(body)


async def list_pods(api: KubeApi, *, node_name: str | None = None) -> list[RawPod]:
    """Pods in every namespace, only those bound to ``node_name`` when given."""
    items, _ = await list_pods_with_version(api, node_name=node_name)
    return items


#: The longest label value the API server stores (a node name may be longer: then no pod carries it as
#: a label value, and that list is not sent).
LABEL_VALUE_MAX = 63


async def list_node_pods(
    api: KubeApi, node_name: str, *, label: str, limit: float | None = None
) -> list[RawPod]:
    """The pods bound to ``node_name`` and the pods whose label ``label`` names it (bound or not), each
    once, as the API server holds them now: no ``resourceVersion`` is sent, so each list is a consistent
    (quorum) read, never an older cache. Two requests, sent together; a failure of either raises (the
    caller cannot know what it missed)."""
    on_node = {"fieldSelector": f"spec.nodeName={node_name}"}
    calls = [call_json(api, "GET", paths.PODS, query=on_node, limit=limit)]
    if len(node_name) <= LABEL_VALUE_MAX:
        labelled = {"labelSelector": f"{label}={node_name}"}
        calls.append(call_json(api, "GET", paths.PODS, query=labelled, limit=limit))
    answers = await asyncio.gather(*calls, return_exceptions=True)
    for answer in answers:
        if isinstance(answer, BaseException):
            raise answer
    found = {objects.pod_key(p): p for p in objects.items(answers[0]) if objects.node_name(p) == node_name}
    for body in answers[1:]:
        found.update(
            (objects.pod_key(p), p) for p in objects.items(body) if objects.labels(p).get(label) == node_name
        )
    return cast("list[RawPod]", list(found.values()))


async def patch_pod(
    api: KubeApi,
    namespace: str,
    name: str,
    *,
    annotations: Mapping[str, str | None] | None = None,
    labels: Mapping[str, str | None] | None = None,
) -> RawPod:
    """Merge-patch the Pod's annotations and labels in one request (``None`` deletes a key)."""
    metadata: dict[str, Any] = {}
    if annotations is not None:
        metadata["annotations"] = dict(annotations)
    if labels is not None:
        metadata["labels"] = dict(labels)
    pod: RawPod = await call_json(
        api,
        "PATCH",
        paths.POD,
        params={"namespace": namespace, "name": name},
        body={"metadata": metadata},
        content_type=MERGE_PATCH,
    )
    return pod


# ------------------------------------------------------------------------------ conditional patches


def unchanged_tests(pod: Mapping[str, Any]) -> list[dict[str, Any]]:
    """``test`` ops that pass only while the pod's identity and metadata maps are as in ``pod``.

    The uid (when it has one), the resourceVersion (a real API server bumps it on every change, the
    binding included), and the annotation and label maps — or the whole ``metadata`` when one of them
    is absent, since JSON patch cannot test that a key is missing.
    """
    metadata = objects.meta(pod)  # as stored: the tests must echo the values exactly
    annotations, labels = metadata.get("annotations"), metadata.get("labels")
    if not isinstance(annotations, Mapping) or not isinstance(labels, Mapping):
        return [{"op": "test", "path": "/metadata", "value": dict(metadata)}]
    tests: list[dict[str, Any]] = []
    for key in ("uid", "resourceVersion"):
        value = metadata.get(key)
        if value:
            tests.append({"op": "test", "path": pointer("metadata", key), "value": value})
    tests.append({"op": "test", "path": "/metadata/annotations", "value": dict(annotations)})
    tests.append({"op": "test", "path": "/metadata/labels", "value": dict(labels)})
    return tests


def value_tests(
    pod: Mapping[str, Any], annotations: Mapping[str, str], *, fresh: bool = True
) -> list[dict[str, Any]]:
    """``test`` ops that pass only while the pod is the same object (uid; with ``fresh`` also the same
    resourceVersion as ``pod``) and carries exactly these annotation values."""
    metadata = objects.meta(pod)
    tests: list[dict[str, Any]] = []
    keys = ("uid", "resourceVersion") if fresh else ("uid",)
    for key in keys:
        value = metadata.get(key)
        if value:
            tests.append({"op": "test", "path": pointer("metadata", key), "value": value})
    for key, value in annotations.items():
        tests.append({"op": "test", "path": pointer("metadata", "annotations", key), "value": value})
    return tests


def write_operations(
    pod: Mapping[str, Any],
    *,
    annotations: Mapping[str, str | None] | None = None,
    labels: Mapping[str, str | None] | None = None,
) -> list[dict[str, Any]]:
    """``add``/``remove`` ops that set (``None``: remove) annotation and label keys of ``pod`` as read."""
    metadata = objects.meta(pod)
    operations: list[dict[str, Any]] = []
    for field, values in (("annotations", annotations), ("labels", labels)):
        if not values:
            continue
        current = metadata.get(field)
        if not isinstance(current, Mapping):
            kept = {k: v for k, v in values.items() if v is not None}
            if kept:
                operations.append({"op": "add", "path": pointer("metadata", field), "value": kept})
            continue
        for key, value in values.items():
            if value is not None:
                operations.append({"op": "add", "path": pointer("metadata", field, key), "value": value})
            elif key in current:
                operations.append({"op": "remove", "path": pointer("metadata", field, key)})
    return operations


async def json_patch_pod(
    api: KubeApi,
    namespace: str,
    name: str,
    operations: Sequence[Mapping[str, Any]],
    *,
    limit: float | None = None,
) -> RawPod:
    """Apply an RFC 6902 JSON patch to the Pod. With ``test`` ops it is a compare-and-set: a failed
    test is answered 422 by kube-apiserver (500 ``JsonPatchTestFailed`` by the embedded one)."""
    pod: RawPod = await call_json(
        api,
        "PATCH",
        paths.POD,
        params={"namespace": namespace, "name": name},
        body=[dict(op) for op in operations],
        content_type=JSON_PATCH,
        limit=limit,
    )
    return pod


async def bind_pod(
    api: KubeApi,
    namespace: str,
    name: str,
    node: str,
    uid: str | None = None,
    *,
    limit: float | None = None,
) -> None:
    """Create the Binding that assigns the Pod to ``node`` (what kube-scheduler's binder does).

    kube-apiserver refuses (409) a pod that already has a node or whose uid is not ``uid``."""
    metadata: dict[str, Any] = {"name": name, "namespace": namespace}
    if uid:
        metadata["uid"] = uid
    body = {
        "apiVersion": "v1",
        "kind": "Binding",
        "metadata": metadata,
        "target": {"apiVersion": "v1", "kind": "Node", "name": node},
    }
    where = {"namespace": namespace, "name": name}
    await call_json(api, "POST", paths.POD_BINDING, params=where, body=body, limit=limit)
