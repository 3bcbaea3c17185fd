"""Label and field selectors of list and watch requests, as kube-apiserver reads them.

Owns :func:`parse_labels` (``app=x``, ``app==x``, ``app!=x``, ``tier in (a,b)``, ``tier notin (a)``,
``key``, ``!key``), :func:`parse_fields` (``a.b=x``, ``a.b==x``, ``a.b!=x``, comma-joined) and
:class:`Selector`, which says whether an object matches both. Field paths are read from the object
(``spec.nodeName``, ``involvedObject.name``, ``metadata.namespace``...); a missing field reads as ``""``
(so ``spec.nodeName=`` selects unscheduled pods, as it does in Kubernetes). A malformed selector raises
:class:`SelectorError` (the apiserver answers 400). Simulation only; pure: stdlib only.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from hami import objects

_KEY = r"[A-Za-z0-9][-A-Za-z0-9_./]*"
_VALUE = r"[-A-Za-z0-9_.]*"
_SET = re.compile(rf"^\s*({_KEY})\s+(in|notin)\s+\(([^)]*)\)\s*$")
_EQUALITY = re.compile(rf"^\s*({_KEY})\s*(==|!=|=)\s*({_VALUE})\s*$")
_EXISTS = re.compile(rf"^\s*(!?)\s*({_KEY})\s*$")
_FIELD = re.compile(r"^\s*([A-Za-z][A-Za-z0-9_.]*)\s*(==|!=|=)\s*(.*?)\s*$")

Test = Callable[[Mapping[str, str]], bool]


class SelectorError(ValueError):
    """A selector the apiserver cannot parse (answered 400 BadRequest)."""


def _terms(text: str) -> list[str]:
    """Split on commas outside parentheses."""
    terms, depth, current = [], 0, ""
    for char in text:
        depth += {"(": 1, ")": -1}.get(char, 0)
        if char == "," and depth == 0:
            terms.append(current)
            current = ""
        else:
            current += char
    terms.append(current)
    return [term for term in terms if term.strip()]


def _label_test(term: str) -> Test:
    if match := _SET.match(term):
        key, operator, raw = match.groups()
        values = frozenset(v.strip() for v in raw.split(",") if v.strip())
        if operator == "in":
            return lambda labels: labels.get(key) in values
        return lambda labels: labels.get(key) not in values
    if match := _EQUALITY.match(term):
        key, operator, value = match.groups()
        if operator == "!=":
            return lambda labels: labels.get(key) != value
        return lambda labels: labels.get(key) == value
    if match := _EXISTS.match(term):
        negate, key = match.groups()
        if negate:
            return lambda labels: key not in labels
        return lambda labels: key in labels
    raise SelectorError(f"unable to parse requirement: {term.strip()!r}")


def parse_labels(text: str) -> list[Test]:
    """The requirements of a label selector (all must hold)."""
    return [_label_test(term) for term in _terms(text)]


def parse_fields(text: str) -> list[tuple[str, bool, str]]:
    """``(path, equal, value)`` per term of a field selector (all must hold)."""
    result = []
    for term in _terms(text):
        match = _FIELD.match(term)
        if match is None:
            raise SelectorError(f"invalid selector: {text!r}; can't understand {term.strip()!r}")
        path, operator, value = match.groups()
        result.append((path, operator != "!=", value))
    return result


def field_value(obj: Mapping[str, Any], path: str) -> str:
    """The value at a dotted path as a string (``""`` when absent, booleans as ``true``/``false``)."""
    node: Any = obj
    for part in path.split("."):
        if not isinstance(node, Mapping):
            return ""
        node = node.get(part)
    if node is None:
        return ""
    if isinstance(node, bool):
        return "true" if node else "false"
    return str(node)


@dataclass(frozen=True, slots=True)
class Selector:
    """The label and field selector of one request."""

    labels: list[Test] = field(default_factory=list)
    fields: list[tuple[str, bool, str]] = field(default_factory=list)

    @classmethod
    def from_params(cls, params: Mapping[str, str]) -> Selector:
        return cls(
            labels=parse_labels(params.get("labelSelector") or ""),
            fields=parse_fields(params.get("fieldSelector") or ""),
        )

    def __bool__(self) -> bool:
        return bool(self.labels or self.fields)

    def matches(self, obj: Mapping[str, Any]) -> bool:
        labels = objects.labels(obj)
        if not all(test(labels) for test in self.labels):
            return False
        return all((field_value(obj, path) == value) == equal for path, equal, value in self.fields)
