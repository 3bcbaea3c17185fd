"""Namespace GPU quotas as the scheduler sees them (docs/protocol.md, "Quotas"): limits from ResourceQuotas,
used amounts from the tracked pods.

Owns :class:`QuotaBook`: the ``spec.hard`` limits ``limits.<memory resource>`` and
``limits.<cores resource>`` of every ResourceQuota (fed by a list+watch, like nodes and pods), and per
namespace the collapsed usage (docs/protocol.md, "Usage") of its tracked pods, kept incrementally by the
snapshot with the same add/remove it applies to node usage. :meth:`QuotaBook.quota` answers the core's
:class:`~hami.core.model.NamespaceQuota` for one namespace, optionally without one pod's own usage (the
pod being decided, as ``Snapshot.candidate(..., exclude=key)`` does for nodes).

Rules: the limits are kept by the core's :class:`~hami.core.quota.LimitsBook` (shared with the
webhook's admission pre-check: whole numbers rounded up like Go's ``Quantity.Value``, the memory limit
times ``memoryFactor`` when it is > 1); with several quotas in one namespace each dimension takes the
tightest (smallest) limit; a value that is not a non-negative quantity is logged once and ignored (the
rest of that quota still counts). Every other ``spec.hard`` key is ignored; the quota's ``status`` is
never read (HAMi counts from its own pods).

No I/O: must not import the Kubernetes client or aiohttp.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from typing import Any

from hami.core.model import NamespaceQuota
from hami.core.quota import LimitsBook, QuotaError, QuotaKeys, QuotaLimits
from hami.core.usage import PodUsage

logger = logging.getLogger(__name__)


def _tightest(values: Iterable[int | None]) -> int | None:
    given = [v for v in values if v is not None]
    return min(given) if given else None


class QuotaBook:
    """ResourceQuota limits and per-namespace usage; every method runs on the event loop."""

    def __init__(self, *, memory_resource: str, cores_resource: str, memory_factor: int = 1) -> None:
        self.limits = LimitsBook(QuotaKeys.of(memory_resource, cores_resource, memory_factor))
        self._used: dict[str, tuple[int, int]] = {}
        self._reported: set[str] = set()

    @property
    def synced(self) -> bool:
        return self.limits.synced

    # ---------------------------------------------------------------------------------- quotas

    def replace(self, items: Iterable[Mapping[str, Any]]) -> None:
        """A full ResourceQuota list: upsert each, forget the ones that are gone."""
        self._report(self.limits.replace(items))

    def listed(self, items: Iterable[Mapping[str, Any]]) -> None:
        """A list is complete and each of ``items`` already came through :meth:`event`: forget the rest."""
        self.limits.listed(items)

    def event(self, kind: str, obj: Mapping[str, Any]) -> None:
        self._report(self.limits.event(kind, obj))

    def limits_of(self, obj: Mapping[str, Any]) -> QuotaLimits:
        """The GPU limits of one ResourceQuota object; malformed values are logged once and left out."""
        limits, errors = self.limits.limits_of(obj)
        self._report(errors)
        return limits

    def _report(self, errors: Iterable[QuotaError]) -> None:
        for exc in errors:
            if str(exc) not in self._reported:
                self._reported.add(str(exc))
                logger.warning("%s; the value is ignored", exc)

    # ----------------------------------------------------------------------------------- usage

    def add_usage(self, namespace: str, usage: PodUsage, sign: int = 1) -> None:
        """Count (``sign=1``) or uncount (``sign=-1``) one tracked pod's collapsed usage."""
        memory, cores = self._used.get(namespace, (0, 0))
        memory, cores = memory + sign * usage.memory, cores + sign * usage.cores
        if memory or cores:
            self._used[namespace] = (memory, cores)
        else:
            self._used.pop(namespace, None)

    def used(self, namespace: str) -> tuple[int, int]:
        """``(MiB, cores)`` the namespace's tracked pods hold."""
        return self._used.get(namespace, (0, 0))

    # ---------------------------------------------------------------------------------- queries

    def quota(self, namespace: str, exclude: PodUsage | None = None) -> NamespaceQuota | None:
        """The namespace's quota for the core (``None`` when no quota limits GPUs there), leaving out
        ``exclude`` (the usage the pod being decided already holds)."""
        limits = [found for _, found in self.limits.of(namespace)]
        if not limits:
            return None
        memory, cores = self.used(namespace)
        if exclude is not None:
            memory, cores = memory - exclude.memory, cores - exclude.cores
        return NamespaceQuota(
            memory_limit=_tightest(q.memory for q in limits),
            cores_limit=_tightest(q.cores for q in limits),
            memory_used=memory,
            cores_used=cores,
        )

    def quotas(self, namespace: str, exclude: PodUsage | None = None) -> dict[str, NamespaceQuota]:
        """``{namespace: quota}`` for ``allocate``/``fit_node``'s ``quotas=``; empty without a quota."""
        found = self.quota(namespace, exclude)
        return {} if found is None else {namespace: found}

    def __len__(self) -> int:
        return len(self.limits)
