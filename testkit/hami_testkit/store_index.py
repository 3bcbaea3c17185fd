"""The embedded apiserver's store at a cost per request that does not grow with the objects stored.

kmock 0.8 keeps every object in one dict keyed by ``(resource, namespace, name)`` and answers a create,
a patch, a delete or a read by walking the whole dict for the key it already has; a list walks it too,
over every resource. With a thousand nodes, their pods and a thousand Events stored, each request paid
for some three thousand objects it never looked at. This module owns:

* :class:`ResourceIndex`, the store's dict with the keys of each resource kept aside in the store's own
  order (a key written again keeps its place, a key deleted and written again goes last, as in the
  dict), maintained by every way the dict is changed; :func:`index_store` puts it in place of kmock's
  dict (through :func:`hami_testkit.kmock_seam.internals`), :func:`stored` reads one resource's
  objects from it, in the order a walk of the whole store gives, and :func:`resources` names the
  resources stored;
* :class:`KeyedAnswers`, a mixin placed before kmock's emulator that answers kmock's own create, patch,
  delete and read fallbacks by the request's key (the same object kmock's walk finds: the one under
  exactly that resource, namespace and name), and falls back to kmock when the request names no object.

Simulation only; no I/O. Must not import ``hami.kube``, ``webhook`` or ``nodeagent``.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import kmock

from hami_testkit.kmock_seam import internals

#: A store key: ``(resource, namespace or None, name)``.
Key = tuple[Any, Any, Any]


class ResourceIndex(dict[Key, Any]):
    """The store's dict, with each resource's keys kept aside in the dict's order (see the module
    docstring). Reads are the dict's own; every change goes through the overrides below."""

    def __init__(self, items: Iterable[tuple[Key, Any]] = ()) -> None:
        super().__init__()
        self.keys_of: dict[Any, dict[Key, None]] = {}
        for key, value in items:
            self[key] = value

    def _add(self, key: Key) -> None:
        self.keys_of.setdefault(key[0], {})[key] = None

    def _drop(self, key: Key) -> None:
        keys = self.keys_of.get(key[0])
        if keys is not None:
            keys.pop(key, None)
            if not keys:
                del self.keys_of[key[0]]

    def __setitem__(self, key: Key, value: Any) -> None:
        if key not in self:
            self._add(key)
        super().__setitem__(key, value)

    def __delitem__(self, key: Key) -> None:
        super().__delitem__(key)
        self._drop(key)

    def pop(self, key: Key, *default: Any) -> Any:
        present = key in self
        value = super().pop(key, *default)
        if present:
            self._drop(key)
        return value

    def popitem(self) -> tuple[Key, Any]:
        key, value = super().popitem()
        self._drop(key)
        return key, value

    def setdefault(self, key: Key, default: Any = None) -> Any:
        if key not in self:
            self[key] = default
        return self[key]

    def update(self, *args: Any, **kwargs: Any) -> None:
        for key, value in dict(*args, **kwargs).items():
            self[key] = value

    def __ior__(self, other: Any) -> ResourceIndex:  # type: ignore[override,misc]
        self.update(other)
        return self

    def clear(self) -> None:
        super().clear()
        self.keys_of.clear()


def index_store(k: kmock.KubernetesEmulator) -> ResourceIndex:
    """Put a :class:`ResourceIndex` (holding what is stored now) in place of ``k``'s store dict, once."""
    parts = internals(k)
    table = parts.object_table
    if not isinstance(table, ResourceIndex):
        table = ResourceIndex(table.items())
        parts.replace_object_table(table)
    return table


def stored(k: Any, resource: Any) -> Iterator[tuple[Key, Any]]:
    """``(key, object)`` of every object of ``resource`` in ``k``'s store, deleted ones included, in the
    store's order (that of a walk over all of it); a snapshot, safe to change the store while reading."""
    table = internals(k).object_table
    if not isinstance(table, ResourceIndex):  # an emulator that was never indexed: kmock's walk
        return iter([(key, obj) for key, obj in list(table.items()) if key[0] == resource])
    keys = list(table.keys_of.get(resource, ()))
    return iter([(key, table[key]) for key in keys if key in table])


def resources(k: Any) -> list[Any]:
    """The resources ``k`` stores at least one object of (deleted ones included), in no set order."""
    table = internals(k).object_table
    if isinstance(table, ResourceIndex):
        return list(table.keys_of)
    return list({key[0]: None for key in list(table)})


class KeyedAnswers(kmock.KubernetesEmulator):
    """kmock's fallback answers to a read, a create, a patch and a delete, found by key instead of a walk
    over the store (see the module docstring). Placed before ``kmock.KubernetesEmulator`` in the bases."""

    async def _keyed(self, resource: Any, namespace: str | None, name: Any) -> Any:
        """The stored object under exactly this key (kmock's strict match), or None; under kmock's lock."""
        async with internals(self).store_lock:
            return internals(self).object_table.get((resource, namespace, name))

    async def _serve_fetch(self, request: kmock.Request) -> Any:
        if request.name is None:
            return await super()._serve_fetch(request)
        obj = await self._keyed(request.resource, request.namespace, request.name)
        if obj is None or obj.deleted:
            raise kmock.KubernetesObjectNotFoundError()
        return obj.raw

    async def _serve_create(self, request: kmock.Request) -> Any:
        data = request.data if isinstance(request.data, dict) else {}
        meta = data.get("metadata", {})
        name = request.name or meta.get("name")
        if name is None:
            return await super()._serve_create(request)
        obj = await self._keyed(request.resource, request.namespace or meta.get("namespace"), name)
        assert obj is not None  # stored by kmock's _handle before any reaction runs
        return obj.raw

    async def _serve_update(self, request: kmock.Request) -> Any:
        if request.name is None:
            return await super()._serve_update(request)
        obj = await self._keyed(request.resource, request.namespace, request.name)
        assert obj is not None  # changed by kmock's _handle before any reaction runs
        return obj.last.raw

    async def _serve_delete(self, request: kmock.Request) -> Any:
        if request.name is None:
            return await super()._serve_delete(request)
        obj = await self._keyed(request.resource, request.namespace, request.name)
        assert obj is not None  # deleted (softly) by kmock's _handle before any reaction runs
        return obj.last.raw
