"""The cluster's PodDisruptionBudgets as /preempt needs them, kept live by a list+watch.

Owns :class:`DisruptionBook`: every policy/v1 PodDisruptionBudget read by the core's
:func:`~hami.core.disruption.read_budget` (fed like ResourceQuotas: ``event`` per object, ``listed``
when a list is complete), by namespace, and :meth:`DisruptionBook.violates`, whether evicting one pod
violates one of them (:func:`hami.core.disruption.violates`, kube-scheduler's rule). A budget that
cannot be read raises from :meth:`event` after its previous version is forgotten, so the watch skips
it and records a Warning Event on it (it then protects nothing, as kube-scheduler ignores a budget
whose selector does not convert).

No I/O: must not import the Kubernetes client or aiohttp.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from hami import objects
from hami.core.disruption import Budget, read_budget, violates


class DisruptionBook:
    """PodDisruptionBudgets by namespace and name; every method runs on the event loop."""

    def __init__(self) -> None:
        self._by_namespace: dict[str, dict[str, Budget]] = {}
        self.synced = False

    def __contains__(self, key: object) -> bool:
        """``(namespace, name) in book``: whether that budget is known."""
        if not isinstance(key, tuple) or len(key) != 2:
            return False
        return key[1] in self._by_namespace.get(key[0], {})

    def _forget(self, namespace: str, name: str) -> None:
        budgets = self._by_namespace.get(namespace)
        if budgets is not None:
            budgets.pop(name, None)
            if not budgets:
                del self._by_namespace[namespace]

    def event(self, kind: str, obj: Mapping[str, Any]) -> None:
        """One watch event (or listed object, as ``ADDED``); raises on a budget that cannot be read."""
        namespace, name = objects.namespace(obj), objects.name(obj)
        self._forget(namespace, name)
        if kind == "DELETED":
            return
        budget = read_budget(obj)
        self._by_namespace.setdefault(budget.namespace, {})[name] = budget

    def listed(self, items: Iterable[Mapping[str, Any]]) -> None:
        """A list is complete, each of ``items`` already applied through :meth:`event`: forget the rest."""
        keep = {(objects.namespace(o), objects.name(o)) for o in items}
        for namespace, budgets in list(self._by_namespace.items()):
            for name in [n for n in budgets if (namespace, n) not in keep]:
                self._forget(namespace, name)
        self.synced = True

    def violates(self, namespace: str, name: str, labels: Mapping[str, str]) -> bool:
        """Whether evicting pod ``namespace/name`` with ``labels`` violates a budget."""
        budgets = self._by_namespace.get(namespace)
        return budgets is not None and violates(budgets.values(), namespace, name, labels)
