"""SIMULATION ONLY: kube-controller-manager's garbage collector for the workload stand-in's kinds.

:class:`GarbageCollector` follows ``metadata.ownerReferences`` from ReplicaSets and pods to their owners
among Deployments, ReplicaSets and Jobs (the kinds :mod:`hami_testkit.workloads_standin` plays), and does
what deleting an owner asks for:

* **Background** (kubectl's and Helm's default): once the owner is gone, a dependent whose every owner
  of these kinds is gone is deleted (its own dependents follow on a later pass); a dependent that still
  has a live owner only loses the dangling reference. A reference to any other kind is not ours to judge
  and keeps the dependent.
* **Foreground** (the owner has ``deletionTimestamp`` and the ``foregroundDeletion`` finalizer): its
  dependents are deleted, and the finalizer removed once none is left (the apiserver then deletes the
  owner). kube waits only for dependents with ``blockOwnerDeletion``; this waits for all of them.
* **Orphan** (the ``orphan`` finalizer): the owner's reference is removed from each dependent, then the
  finalizer.

Who puts the finalizers there is the apiserver's part of a delete with ``propagationPolicy``
Foreground or Orphan. Must not import ``hami.kube``, ``webhook`` or ``nodeagent``.
"""

from __future__ import annotations

import collections
import logging
from collections.abc import Mapping, Sequence
from typing import Any

from hami import objects
from hami_testkit.kubeapi import ApiError, JsonDict, SimApi

logger = logging.getLogger("hami_testkit.garbage_collector")

FOREGROUND = "foregroundDeletion"
ORPHAN = "orphan"
#: (apiVersion, kind) -> collection path template of the owners this collector judges
OWNER_KINDS = {
    ("apps/v1", "Deployment"): "/apis/apps/v1/namespaces/{ns}/deployments/{name}",
    ("apps/v1", "ReplicaSet"): "/apis/apps/v1/namespaces/{ns}/replicasets/{name}",
    ("batch/v1", "Job"): "/apis/batch/v1/namespaces/{ns}/jobs/{name}",
}
DEPENDENT_KINDS = {
    ("v1", "Pod"): "/api/v1/namespaces/{ns}/pods/{name}",
    ("apps/v1", "ReplicaSet"): "/apis/apps/v1/namespaces/{ns}/replicasets/{name}",
}


def _path(obj: Mapping[str, Any], table: Mapping[tuple[str, str], str]) -> str | None:
    template = table.get((str(obj.get("apiVersion") or ""), str(obj.get("kind") or "")))
    if template is None:
        return None
    return template.format(ns=objects.namespace(obj), name=objects.name(obj))


def _references(obj: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    refs = objects.meta(obj).get("ownerReferences")
    return [r for r in refs if isinstance(r, Mapping)] if isinstance(refs, list) else []


def _ours(ref: Mapping[str, Any]) -> bool:
    return (str(ref.get("apiVersion") or ""), str(ref.get("kind") or "")) in OWNER_KINDS


#: how many of its latest deletions the collector remembers
DELETED_KEPT = 100


class GarbageCollector:
    """Cascading deletion over ownerReferences (see the module docstring)."""

    def __init__(self, api: SimApi) -> None:
        self._api = api
        #: (namespace, name, kind) of the latest objects it deleted (tests, diagnostics); bounded, so a
        #: long-running demo does not grow with every cascaded deletion
        self.deleted: collections.deque[tuple[str, str, str]] = collections.deque(maxlen=DELETED_KEPT)

    async def collect(self, *, owners: Sequence[JsonDict], dependents: Sequence[JsonDict]) -> bool:
        """One pass; True when it wrote anything. ``owners`` must be read after ``dependents``."""
        live = {objects.uid(o): o for o in owners if objects.uid(o)}
        wrote = False
        for owner in owners:
            finalizers = objects.meta(owner).get("finalizers") or []
            marked = objects.meta(owner).get("deletionTimestamp") and isinstance(finalizers, list)
            if marked and (FOREGROUND in finalizers or ORPHAN in finalizers):
                wrote |= await self._finalize(owner, finalizers, dependents)
        for dependent in dependents:
            refs = _references(dependent)
            if not refs:
                continue
            dangling = [r for r in refs if _ours(r) and str(r.get("uid") or "") not in live]
            if not dangling:
                continue
            if len(dangling) == len(refs):
                wrote |= await self._delete(dependent)
            else:
                kept = [r for r in refs if r not in dangling]
                wrote |= await self._set_references(dependent, kept)
        return wrote

    async def _finalize(self, owner: JsonDict, finalizers: list[Any], dependents: Sequence[JsonDict]) -> bool:
        uid = objects.uid(owner)
        mine = [d for d in dependents if any(str(r.get("uid") or "") == uid for r in _references(d))]
        if FOREGROUND in finalizers and mine:
            for dependent in mine:
                await self._delete(dependent)
            return True
        if ORPHAN in finalizers:
            for dependent in mine:
                kept = [r for r in _references(dependent) if str(r.get("uid") or "") != uid]
                await self._set_references(dependent, kept)
        path = _path(owner, OWNER_KINDS)
        if path is None:
            return bool(mine)
        remaining = [f for f in finalizers if f not in (FOREGROUND, ORPHAN)]
        try:
            await self._api.merge_patch(path, {"metadata": {"finalizers": remaining}})
        except ApiError as exc:
            if exc.status != 404:
                raise
        return True

    async def _delete(self, dependent: JsonDict) -> bool:
        path = _path(dependent, DEPENDENT_KINDS)
        if path is None or objects.meta(dependent).get("deletionTimestamp"):
            return False
        try:
            await self._api.delete(path)
        except ApiError as exc:
            if exc.status != 404:
                raise
        kind = str(dependent.get("kind") or "")
        logger.info(
            "garbage collector: deleted %s %s/%s", kind, objects.namespace(dependent), objects.name(dependent)
        )
        self.deleted.append((objects.namespace(dependent), objects.name(dependent), kind))
        return True

    async def _set_references(self, dependent: JsonDict, kept: list[Mapping[str, Any]]) -> bool:
        path = _path(dependent, DEPENDENT_KINDS)
        if path is None:
            return False
        body = {"metadata": {"ownerReferences": [dict(r) for r in kept] or None}}
        try:
            await self._api.merge_patch(path, body)
        except ApiError as exc:
            if exc.status != 404:
                raise
        return True
