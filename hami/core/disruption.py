"""PodDisruptionBudgets as preemption reads them: whether evicting one pod violates a budget.

Owns :class:`Budget` (a PDB's namespace, label selector, ``status.disruptionsAllowed`` and
``status.disruptedPods`` names; :func:`read_budget` from the raw object, :class:`BudgetError` when it
is unusable) and :func:`violates`, kube-scheduler's rule (``filterPodsWithPDBViolation`` in its
preemption framework): a pod violates a budget in its own namespace whose selector matches its labels
and that has no disruption left (``disruptionsAllowed <= 0``), unless the pod is already among the
budget's ``disruptedPods``. A selector is ``metav1.LabelSelector``: ``matchLabels`` and
``matchExpressions`` (``In``/``NotIn`` with values, ``Exists``/``DoesNotExist`` without), all ANDed;
an empty or absent selector matches nothing here, as in kube-scheduler; a malformed one (unknown
operator, values where none belong or none where some must) is a :class:`BudgetError` (kube-scheduler
skips a budget whose selector does not convert). Simplification: kube-scheduler counts a budget's
allowance down as it takes a node's victims in order; here each pod is judged against the allowance
alone, so victims that share a budget with allowance left count no violation.

Pure: must not import the Kubernetes client, aiohttp, logging, os or time.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

OPERATORS = ("In", "NotIn", "Exists", "DoesNotExist")
MAX_DISRUPTED = 10_000  # disruptedPods names kept per budget (the API server's own objects stay far below)


class BudgetError(ValueError):
    """A PodDisruptionBudget that cannot be read (its selector or status is malformed)."""


@dataclass(frozen=True, slots=True)
class Requirement:
    key: str
    operator: str
    values: frozenset[str]

    def matches(self, labels: Mapping[str, str]) -> bool:
        if self.operator == "Exists":
            return self.key in labels
        if self.operator == "DoesNotExist":
            return self.key not in labels
        if self.operator == "In":
            return self.key in labels and labels[self.key] in self.values
        return self.key not in labels or labels[self.key] not in self.values  # NotIn


@dataclass(frozen=True, slots=True)
class Budget:
    """What preemption needs of one PodDisruptionBudget."""

    namespace: str
    requirements: tuple[Requirement, ...]  # empty: the selector matches nothing
    allowed: int
    disrupted: frozenset[str] = frozenset()

    def covers(self, namespace: str, labels: Mapping[str, str]) -> bool:
        return (
            namespace == self.namespace
            and bool(self.requirements)
            and all(r.matches(labels) for r in self.requirements)
        )


def _strings(value: Any, what: str) -> list[str]:
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise BudgetError(f"{what} is not a list of strings")
    return value


def _requirements(selector: Any) -> tuple[Requirement, ...]:
    if selector is None:
        return ()
    if not isinstance(selector, Mapping):
        raise BudgetError("spec.selector is not an object")
    found: list[Requirement] = []
    labels = selector.get("matchLabels") or {}
    if not isinstance(labels, Mapping) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in labels.items()
    ):
        raise BudgetError("spec.selector.matchLabels is not a map of strings")
    found.extend(Requirement(k, "In", frozenset([v])) for k, v in labels.items())
    expressions = selector.get("matchExpressions") or []
    if not isinstance(expressions, list):
        raise BudgetError("spec.selector.matchExpressions is not a list")
    for expression in expressions:
        if not isinstance(expression, Mapping):
            raise BudgetError("a matchExpressions entry is not an object")
        key, operator = expression.get("key"), expression.get("operator")
        if not isinstance(key, str) or not key:
            raise BudgetError("a matchExpressions entry has no key")
        if operator not in OPERATORS:
            raise BudgetError(f"matchExpressions operator {str(operator)[:40]!r} is not one of {OPERATORS}")
        values = _strings(expression.get("values"), f"matchExpressions values of {key[:63]!r}")
        if operator in ("In", "NotIn") and not values:
            raise BudgetError(f"matchExpressions {operator} on {key[:63]!r} has no values")
        if operator in ("Exists", "DoesNotExist") and values:
            raise BudgetError(f"matchExpressions {operator} on {key[:63]!r} has values")
        found.append(Requirement(key, str(operator), frozenset(values)))
    return tuple(found)


def read_budget(pdb: Mapping[str, Any]) -> Budget:
    """A raw policy/v1 PodDisruptionBudget -> :class:`Budget`; raises :class:`BudgetError`."""
    parts = [pdb.get(k) for k in ("metadata", "spec", "status")]
    meta, spec, status = ({} if part is None else part for part in parts)
    if not (isinstance(meta, Mapping) and isinstance(spec, Mapping) and isinstance(status, Mapping)):
        raise BudgetError("metadata, spec or status is not an object")
    namespace = meta.get("namespace")
    if not isinstance(namespace, str) or not namespace:
        raise BudgetError("metadata.namespace is missing")
    allowed = status.get("disruptionsAllowed", 0)  # no status yet: none allowed, as kube-scheduler reads it
    if not isinstance(allowed, int) or isinstance(allowed, bool):
        raise BudgetError("status.disruptionsAllowed is not an integer")
    disrupted = status.get("disruptedPods") or {}
    if not isinstance(disrupted, Mapping) or len(disrupted) > MAX_DISRUPTED:
        raise BudgetError("status.disruptedPods is not a map of pod names (or too long)")
    return Budget(
        namespace=namespace,
        requirements=_requirements(spec.get("selector")),
        allowed=allowed,
        disrupted=frozenset(str(name) for name in disrupted),
    )


def violates(budgets: Iterable[Budget], namespace: str, name: str, labels: Mapping[str, str]) -> bool:
    """Whether evicting pod ``namespace/name`` with ``labels`` violates one of ``budgets``."""
    return any(b.allowed <= 0 and name not in b.disrupted and b.covers(namespace, labels) for b in budgets)
