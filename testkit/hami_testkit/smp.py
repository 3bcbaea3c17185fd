"""Strategic merge patches (what ``kubectl apply`` and ``kubectl edit`` send for built-in kinds), turned into
the JSON merge patch kmock applies.

Owns :func:`strategic_merge`: the patched object, with lists merged the way the kind's schema says
(``x-kubernetes-patch-strategy: merge`` and ``x-kubernetes-patch-merge-key``: containers by ``name``,
ports by ``containerPort``...; a list without a strategy is replaced), ``null`` deleting a key, and the
directives ``$patch: replace|delete`` and ``$deleteFromPrimitiveList/<field>`` (``$setElementOrder`` and
``$retainKeys`` are dropped); and :func:`merge_patch_between`, the RFC 7386 patch that turns one object
into another (lists whole). The schema walker takes a ``resolve`` callable (definition name -> schema)
so this module stays pure: stdlib only. Simulation only.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

Schema = Mapping[str, Any]
Resolve = Callable[[str], Schema | None]
_REF = "#/$defs/"


def _deref(schema: Schema | None, resolve: Resolve) -> Schema:
    seen = 0
    while schema is not None and "$ref" in schema and seen < 50:
        ref = str(schema["$ref"])
        schema = resolve(ref[len(_REF) :]) if ref.startswith(_REF) else None
        seen += 1
    return schema or {}


def _field(schema: Schema, key: str, resolve: Resolve) -> Schema:
    """The (dereferenced) schema of a property, or of a map value."""
    properties = schema.get("properties") or {}
    if key in properties:
        return {
            **_deref(properties[key], resolve),
            **{k: v for k, v in properties[key].items() if k != "$ref"},
        }
    extra = schema.get("additionalProperties")
    return _deref(extra, resolve) if isinstance(extra, Mapping) else {}


def _merge_list(original: list[Any], patch: list[Any], schema: Schema, resolve: Resolve) -> list[Any]:
    strategy = str(schema.get("x-kubernetes-patch-strategy") or "")
    key = schema.get("x-kubernetes-patch-merge-key")
    if "merge" not in strategy.split(","):
        return [_clean(item) for item in patch]
    items = _deref(schema.get("items"), resolve)
    if not key:  # a list of primitives merged as a set
        return list(original) + [item for item in patch if item not in original]
    result = [dict(item) if isinstance(item, Mapping) else item for item in original]
    for element in patch:
        if not isinstance(element, Mapping):
            continue
        at = next(
            (i for i, o in enumerate(result) if isinstance(o, Mapping) and o.get(key) == element.get(key)),
            None,
        )
        if element.get("$patch") == "delete":
            if at is not None:
                del result[at]
        elif at is None:
            result.append(_clean(element))
        else:
            result[at] = strategic_merge(result[at], element, items, resolve)
    return result


def _clean(value: Any) -> Any:
    """A patch value with its directives removed (what is stored when nothing is there to merge with)."""
    if isinstance(value, Mapping):
        return {k: _clean(v) for k, v in value.items() if not str(k).startswith("$") and v is not None}
    if isinstance(value, list):
        return [_clean(item) for item in value]
    return value


def strategic_merge(
    original: Mapping[str, Any], patch: Mapping[str, Any], schema: Schema, resolve: Resolve
) -> Any:
    """``original`` with the strategic merge ``patch`` applied (``schema``: the object's, dereferenced)."""
    if patch.get("$patch") == "replace":
        return _clean(patch)
    if patch.get("$patch") == "delete":
        return None
    result: dict[str, Any] = dict(original)
    for key, value in patch.items():
        if key.startswith("$deleteFromPrimitiveList/"):
            field = key.split("/", 1)[1]
            if isinstance(result.get(field), list) and isinstance(value, list):
                result[field] = [item for item in result[field] if item not in value]
            continue
        if key.startswith("$"):
            continue
        if value is None:
            result.pop(key, None)
            continue
        sub = _field(schema, key, resolve)
        current = result.get(key)
        if isinstance(value, Mapping) and isinstance(current, Mapping):
            merged = strategic_merge(current, value, sub, resolve)
            if merged is None:
                result.pop(key, None)
            else:
                result[key] = merged
        elif isinstance(value, list) and isinstance(current, list):
            result[key] = _merge_list(current, value, sub, resolve)
        else:
            result[key] = _clean(value)
    return result


def merge_patch_between(old: Any, new: Any) -> Any:
    """The RFC 7386 merge patch that turns ``old`` into ``new`` (dicts recursively, lists whole)."""
    if not isinstance(old, Mapping) or not isinstance(new, Mapping):
        return new
    patch: dict[str, Any] = {key: None for key in old if key not in new}
    for key, value in new.items():
        if key not in old:
            patch[key] = value
        elif old[key] != value:
            patch[key] = merge_patch_between(old[key], value) if isinstance(value, Mapping) else value
    return patch
