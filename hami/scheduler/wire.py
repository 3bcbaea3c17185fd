"""kube-scheduler's extender v1 JSON (``k8s.io/kube-scheduler/extender/v1``) as TypedDicts.

Owns the wire shapes and the one conversion from a request body to them. The Go types carry no JSON
tags, so the keys are the Go field names (``Pod``, ``Nodes``, ``NodeNames``, ...); Go decodes them
case-insensitively, so the body's keys are folded as Go matches them (``hami.core.gocompat.fold_keys``:
any casing, the later of two keys wins) and unknown keys are ignored. Pods and Nodes stay raw JSON
dicts (``dict[str, Any]``): the codec reads what it needs, nothing builds model objects.
The ``/preempt`` shapes are here too (``ExtenderPreemptionArgs`` in, ``ExtenderPreemptionResult``
out). Imports the stdlib and ``hami.core.gocompat`` only.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any, NotRequired, TypedDict, TypeVar, cast

from hami.core.gocompat import fold_keys


class NodeListWire(TypedDict, total=False):
    apiVersion: str
    kind: str
    metadata: dict[str, Any]
    items: list[dict[str, Any]]


class ExtenderArgs(TypedDict):
    """``ExtenderArgs``: the body of ``/filter`` and ``/prioritize``."""

    Pod: dict[str, Any] | None
    Nodes: NodeListWire | None  # full nodes (nodeCacheCapable: false)
    NodeNames: list[str] | None  # names only (nodeCacheCapable: true)


class ExtenderFilterResult(TypedDict):
    """``ExtenderFilterResult``: the answer to ``/filter``."""

    Nodes: NodeListWire | None
    NodeNames: list[str] | None
    FailedNodes: dict[str, str]
    FailedAndUnresolvableNodes: NotRequired[dict[str, str]]
    Error: str


class HostPriority(TypedDict):
    """One entry of ``HostPriorityList`` (the answer to ``/prioritize``); Score is 0..10."""

    Host: str
    Score: int


class ExtenderBindingArgs(TypedDict):
    """``ExtenderBindingArgs``: the body of ``/bind``."""

    PodName: str
    PodNamespace: str
    PodUID: str
    Node: str


class ExtenderBindingResult(TypedDict):
    Error: str


class WireError(ValueError):
    """A request body that is not extender JSON; the message names the field."""


#: Deepest nesting a request body may have. A Kubernetes object nests a few dozen levels at most (its
#: managedFields mirror its structure); deeper bodies are refused here, before any verb serialises or
#: walks them (Python's json nests about a thousand levels before RecursionError).
MAX_DEPTH = 200


def _object(data: bytes) -> dict[str, Any]:
    try:
        body = json.loads(data)
    except ValueError as exc:
        raise WireError(f"request body is not JSON: {exc}") from exc
    except RecursionError:  # a few bytes per level: deep nesting fits far below the body cap
        raise WireError("request body is not JSON: nested too deeply") from None
    if not isinstance(body, dict):
        raise WireError(f"request body must be a JSON object, got {type(body).__name__}")
    if _depth_exceeds(body, MAX_DEPTH):
        raise WireError(f"request body nests deeper than {MAX_DEPTH} levels")
    return body


def _depth_exceeds(value: Any, limit: int) -> bool:
    """Whether ``value`` nests deeper than ``limit`` levels (walked without recursion)."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if depth > limit:
            return True
        if isinstance(item, dict):
            stack.extend((child, depth + 1) for child in item.values() if isinstance(child, (dict, list)))
        elif isinstance(item, list):
            stack.extend((child, depth + 1) for child in item if isinstance(child, (dict, list)))
    return False


def parse_extender_args(data: bytes) -> ExtenderArgs:
    """The ``/filter`` or ``/prioritize`` body; raises :class:`WireError` naming the bad field."""
    body = fold_keys(_object(data))
    pod = body.get("pod")
    if pod is not None and not isinstance(pod, dict):
        raise WireError(f"Pod must be an object, got {json.dumps(pod)[:100]}")
    nodes: Any = body.get("nodes")
    if nodes is not None and not (isinstance(nodes, dict) and isinstance(nodes.get("items") or [], list)):
        raise WireError(f"Nodes must be a NodeList object, got {json.dumps(nodes)[:100]}")
    names = body.get("nodenames")
    if names is not None and not (isinstance(names, list) and all(isinstance(n, str) for n in names)):
        raise WireError(f"NodeNames must be a list of strings, got {json.dumps(names)[:100]}")
    for index, item in enumerate((nodes or {}).get("items") or []):
        _check_node(index, item)
    listing = cast(NodeListWire | None, nodes)
    return ExtenderArgs(Pod=pod, Nodes=listing, NodeNames=names)


def _check_node(index: int, item: Any) -> None:
    """A template Node as Go would decode it into ``v1.Node``: an object whose metadata, name and
    annotations have their types (null is Go's zero value)."""
    where = f"Nodes.items[{index}]"
    if not isinstance(item, dict):
        raise WireError(f"{where} must be a Node object, got {json.dumps(item)[:100]}")
    metadata = item.get("metadata")
    if metadata is None:
        return
    if not isinstance(metadata, dict):
        raise WireError(f"{where}.metadata must be an object, got {json.dumps(metadata)[:100]}")
    name = metadata.get("name")
    if name is not None and not isinstance(name, str):
        raise WireError(f"{where}.metadata.name must be a string, got {json.dumps(name)[:100]}")
    annotations = metadata.get("annotations")
    if annotations is not None and not (
        isinstance(annotations, dict) and all(isinstance(v, str) for v in annotations.values())
    ):
        raise WireError(f"{where}.metadata.annotations must map strings to strings")


#: What the API server accepts (DNS-1123 subdomain for pod and node names, DNS-1123 label for a
#: namespace; a uid as it writes them): anything else names no object, and is not sent to it.
_SUBDOMAIN = re.compile(r"(?=.{1,253}$)[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_NAMES = {
    "PodName": _SUBDOMAIN,
    "PodNamespace": re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?"),
    "PodUID": re.compile(r"[0-9A-Za-z][-0-9A-Za-z_.]{0,127}"),
    "Node": _SUBDOMAIN,
}
_SUBDOMAIN_RULE = "a Kubernetes name (lower-case letters, digits, '-' and '.'; at most 253 characters)"
_NAME_RULES = {
    "PodName": _SUBDOMAIN_RULE,
    "PodNamespace": "a Kubernetes namespace name (lower-case letters, digits and '-'; at most 63 characters)",
    "PodUID": "a Kubernetes uid (letters, digits, '-', '_' and '.'; at most 128 characters)",
    "Node": _SUBDOMAIN_RULE,
}


def parse_binding_args(data: bytes) -> ExtenderBindingArgs:
    """The ``/bind`` body; every field must be a string, PodName/PodNamespace/Node non-empty, each a
    name the API server could hold."""
    body = fold_keys(_object(data))
    values: dict[str, str] = {}
    for key in ("PodName", "PodNamespace", "PodUID", "Node"):
        value = body.get(key.lower(), "")
        if not isinstance(value, str):
            raise WireError(f"{key} must be a string, got {json.dumps(value)[:100]}")
        if not value and key != "PodUID":
            raise WireError(f"{key} is missing or empty")
        if value and _NAMES[key].fullmatch(value) is None:
            raise WireError(f"{key} must be {_NAME_RULES[key]}, got {json.dumps(value)[:100]}")
        values[key] = value
    return ExtenderBindingArgs(
        PodName=values["PodName"],
        PodNamespace=values["PodNamespace"],
        PodUID=values["PodUID"],
        Node=values["Node"],
    )


def filter_result(
    *,
    node_names: list[str] | None = None,
    nodes: NodeListWire | None = None,
    failed: dict[str, str] | None = None,
    unresolvable: dict[str, str] | None = None,
    error: str = "",
) -> ExtenderFilterResult:
    result = ExtenderFilterResult(Nodes=nodes, NodeNames=node_names, FailedNodes=failed or {}, Error=error)
    if unresolvable:
        result["FailedAndUnresolvableNodes"] = unresolvable
    return result


# ------------------------------------------------------------------------------------ preemption


class MetaPod(TypedDict):
    """``MetaPod``: a victim named by uid."""

    UID: str


class MetaVictims(TypedDict):
    """``MetaVictims``: a node's victims by uid (``nodeCacheCapable: true``, and every answer)."""

    Pods: list[MetaPod]
    NumPDBViolations: int


class VictimsWire(TypedDict):
    """``Victims``: a node's victims as full pods (``nodeCacheCapable: false``)."""

    Pods: list[dict[str, Any]]
    NumPDBViolations: int


class ExtenderPreemptionArgs(TypedDict):
    """``ExtenderPreemptionArgs``: the body of ``/preempt``; kube-scheduler sets one of the maps."""

    Pod: dict[str, Any] | None
    NodeNameToVictims: dict[str, VictimsWire] | None
    NodeNameToMetaVictims: dict[str, MetaVictims] | None


class ExtenderPreemptionResult(TypedDict):
    """``ExtenderPreemptionResult``: the nodes kept, each with its victims by uid."""

    NodeNameToMetaVictims: dict[str, MetaVictims]


#: Most candidate nodes one ``/preempt`` body may name (kube-scheduler sends at most all its nodes).
MAX_PREEMPT_NODES = 10_000
#: Longest victim uid accepted (Kubernetes uids have 36 characters).
MAX_UID = 128
_INT64_MAX = 2**63 - 1
_T = TypeVar("_T")


def parse_preemption_args(data: bytes) -> ExtenderPreemptionArgs:
    """The ``/preempt`` body; raises :class:`WireError` naming the bad field."""
    body = fold_keys(_object(data))
    pod = body.get("pod")
    if pod is not None and not isinstance(pod, dict):
        raise WireError(f"Pod must be an object, got {json.dumps(pod)[:100]}")
    full, meta = body.get("nodenametovictims"), body.get("nodenametometavictims")
    if full is not None and meta is not None:
        raise WireError("send NodeNameToVictims or NodeNameToMetaVictims, not both")
    return ExtenderPreemptionArgs(
        Pod=pod,
        NodeNameToVictims=None if full is None else _nodes("NodeNameToVictims", full, _full_victims),
        NodeNameToMetaVictims=None if meta is None else _nodes("NodeNameToMetaVictims", meta, _meta_victims),
    )


def _nodes(field: str, value: Any, one: Callable[[str, Any], _T]) -> dict[str, _T]:
    if not isinstance(value, dict):
        raise WireError(f"{field} must be an object keyed by node name, got {json.dumps(value)[:100]}")
    if len(value) > MAX_PREEMPT_NODES:
        raise WireError(f"{field} names {len(value)} nodes, more than {MAX_PREEMPT_NODES}")
    return {node: one(f"{field}[{json.dumps(node)[:80]}]", item) for node, item in value.items()}


def _victim_list(where: str, value: Any) -> tuple[list[Any], int]:
    """A (Meta)Victims object -> its Pods list and NumPDBViolations (null: no victims)."""
    if value is None:
        return [], 0
    if not isinstance(value, dict):
        raise WireError(
            f"{where} must be an object with Pods and NumPDBViolations, got {json.dumps(value)[:100]}"
        )
    body = fold_keys(value)
    pods = body.get("pods")
    if pods is not None and not isinstance(pods, list):
        raise WireError(f"{where}.Pods must be a list, got {json.dumps(pods)[:100]}")
    count = body.get("numpdbviolations")
    if count is None:
        count = 0
    if not isinstance(count, int) or isinstance(count, bool) or not 0 <= count <= _INT64_MAX:
        raise WireError(f"{where}.NumPDBViolations must be a count, got {json.dumps(count)[:100]}")
    return pods or [], count


def _uid(where: str, uid: Any) -> str:
    if not isinstance(uid, str) or not uid or len(uid) > MAX_UID:
        raise WireError(f"{where} must be a uid (1..{MAX_UID} characters), got {json.dumps(uid)[:100]}")
    return uid


def _meta_victims(where: str, value: Any) -> MetaVictims:
    pods, count = _victim_list(where, value)
    named: list[MetaPod] = []
    for index, item in enumerate(pods):
        if not isinstance(item, dict):
            raise WireError(
                f"{where}.Pods[{index}] must be an object with a UID, got {json.dumps(item)[:100]}"
            )
        named.append(MetaPod(UID=_uid(f"{where}.Pods[{index}].UID", fold_keys(item).get("uid"))))
    return MetaVictims(Pods=named, NumPDBViolations=count)


def _full_victims(where: str, value: Any) -> VictimsWire:
    pods, count = _victim_list(where, value)
    for index, item in enumerate(pods):
        metadata = item.get("metadata") if isinstance(item, dict) else None
        if not isinstance(metadata, dict):
            raise WireError(f"{where}.Pods[{index}] must be a Pod object with metadata")
        _uid(f"{where}.Pods[{index}].metadata.uid", metadata.get("uid"))
    return VictimsWire(Pods=pods, NumPDBViolations=count)
