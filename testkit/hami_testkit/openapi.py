"""The embedded apiserver's OpenAPI v3 and strict field validation, from the real Kubernetes schema.

Owns :func:`index` (``GET /openapi/v3``: one entry per group-version the emulator serves) and
:func:`group_version` (``GET /openapi/v3/api/v1``, ``/openapi/v3/apis/<group>/<version>``): every
definition of the Kubernetes release :data:`SCHEMA_VERSION` under ``components.schemas`` (their
``x-kubernetes-group-version-kind``, patch strategies and merge keys included, which ``kubectl apply``
uses for strategic merge patches) and, for each resource, the paths with their operations and query
parameters (``fieldValidation``, ``fieldManager``, ``dryRun``, ``force``); kubectl finds there that the
server validates fields itself and sends ``fieldValidation=Strict``. :func:`unknown_fields` is that
validation: the fields of an object its kind's schema does not declare.

The schema is the one the ``kubernetes-validate`` package ships (the Kubernetes OpenAPI definitions as
JSON schema, with ``type: [T, "null"]``, which is turned back into ``type: T``). Without that package
:func:`available` is False and the apiserver answers 404 for the OpenAPI paths, as kmock does.
Simulation only. Must not import ``hami.kube``, ``webhook`` or ``nodeagent``.
"""

from __future__ import annotations

import functools
import hashlib
import json
from collections.abc import Callable, Iterable, Mapping
from importlib import resources
from importlib.util import find_spec
from typing import Any

JsonDict = dict[str, Any]

#: The Kubernetes release whose schema is served (the one /version claims).
SCHEMA_VERSION = "1.36.0"
_REF = "#/$defs/"
_QUERY = ("fieldValidation", "fieldManager", "dryRun", "force", "pretty")


def available() -> bool:
    """Is the schema of :data:`SCHEMA_VERSION` installed (``kubernetes-validate`` 1.36 or later)?"""
    if find_spec("kubernetes_validate") is None:
        return False
    return bool(_folder(False).joinpath("_definitions.json").is_file())


def _folder(strict: bool) -> Any:
    name = f"v{SCHEMA_VERSION}-local" + ("-strict" if strict else "")
    return resources.files("kubernetes_validate").joinpath("kubernetes-json-schema", name)


@functools.cache
def _document(strict: bool) -> JsonDict:
    raw: JsonDict = json.loads(_folder(strict).joinpath("_definitions.json").read_text(encoding="utf-8"))
    return raw


def _definitions(strict: bool = False) -> JsonDict:
    definitions: JsonDict = _document(strict)["$defs"]
    return definitions


def kind_schema(api_version: str, kind: str) -> tuple[JsonDict, Callable[[str], JsonDict | None]] | None:
    """The JSON schema of a kind and a resolver of its ``#/$defs/`` references (for strategic merges)."""
    group, _, version = api_version.rpartition("/")
    name = _gvk_index().get((group, version, kind))
    if name is None or not available():
        return None
    definitions = _definitions()
    return definitions[name], definitions.get


def _openapi(node: Any) -> Any:
    """JSON schema -> OpenAPI 3.0: refs under components, no ``null`` in types."""
    if isinstance(node, list):
        return [_openapi(item) for item in node]
    if not isinstance(node, dict):
        return node
    result: JsonDict = {}
    for key, value in node.items():
        if key == "$ref" and isinstance(value, str) and value.startswith(_REF):
            result[key] = "#/components/schemas/" + value[len(_REF) :]
        elif key == "type" and isinstance(value, list):
            kinds = [v for v in value if v != "null"]
            result[key] = kinds[0] if len(kinds) == 1 else kinds
        else:
            result[key] = _openapi(value)
    return result


@functools.cache
def _schemas() -> JsonDict:
    converted: JsonDict = _openapi(_definitions())
    return converted


@functools.cache
def _gvk_index() -> dict[tuple[str, str, str], str]:
    """(group, version, kind) -> definition name."""
    found = {}
    for name, schema in _definitions().items():
        for gvk in schema.get("x-kubernetes-group-version-kind") or []:
            found[(gvk.get("group", ""), gvk.get("version", ""), gvk.get("kind", ""))] = name
    return found


def _prefix(group: str, version: str) -> str:
    return f"api/{version}" if group == "" else f"apis/{group}/{version}"


def index(group_versions: Iterable[tuple[str, str]]) -> JsonDict:
    """The ``/openapi/v3`` discovery document."""
    paths = {}
    for group, version in sorted(set(group_versions)):
        prefix = _prefix(group, version)
        digest = hashlib.sha256(f"{SCHEMA_VERSION}/{prefix}".encode()).hexdigest()[:32].upper()
        paths[prefix] = {"serverRelativeURL": f"/openapi/v3/{prefix}?hash={digest}"}
    return {"paths": paths}


def _operation(gvk: Mapping[str, str], action: str, ref: str) -> JsonDict:
    query = [{"name": q, "in": "query", "schema": {"type": "string", "uniqueItems": True}} for q in _QUERY]
    body = {"content": {"application/json": {"schema": {"$ref": ref}}}}
    operation: JsonDict = {
        "x-kubernetes-action": action,
        "x-kubernetes-group-version-kind": dict(gvk),
        "parameters": query if action in ("post", "put", "patch") else query[-1:],
        "responses": {"200": body},
    }
    if action in ("post", "put", "patch"):
        operation["requestBody"] = body
    return operation


def group_version(group: str, version: str, resources_: Iterable[tuple[str, str, bool]]) -> JsonDict:
    """The OpenAPI v3 document of one group-version; ``resources_`` is ``(plural, kind, namespaced)``."""
    gvks = _gvk_index()
    paths: JsonDict = {}
    for plural, kind, namespaced in resources_:
        definition = gvks.get((group, version, kind))
        if definition is None:
            continue
        ref = f"#/components/schemas/{definition}"
        gvk = {"group": group, "version": version, "kind": kind}
        base = "/" + _prefix(group, version) + ("/namespaces/{namespace}" if namespaced else "")
        paths[f"{base}/{plural}"] = {
            "get": _operation(gvk, "list", ref),
            "post": _operation(gvk, "post", ref),
        }
        paths[f"{base}/{plural}/{{name}}"] = {
            action: _operation(gvk, action, ref) for action in ("get", "put", "patch", "delete")
        }
    return {
        "openapi": "3.0.0",
        "info": {"title": "Kubernetes", "version": f"v{SCHEMA_VERSION}"},
        "paths": paths,
        "components": {"schemas": _schemas()},
    }


@functools.cache
def _validator(kind: str, api_version: str) -> Any:
    import jsonschema  # type: ignore[import-untyped, unused-ignore]  # kubernetes-validate depends on it
    from referencing import Registry, Resource  # loaded on first use, like the schema

    group, _, version = api_version.rpartition("/")
    name = _gvk_index().get((group, version, kind))
    if name is None:
        return None
    registry: Any = Registry().with_resource("defs", Resource.from_contents(_document(strict=True)))
    schema = {"$ref": f"defs#/$defs/{name}"}
    return jsonschema.validators.Draft202012Validator(schema, registry=registry)


def unknown_fields(obj: Mapping[str, Any]) -> list[str]:
    """The paths (``spec.containers[0].foo``) of fields ``obj``'s schema does not declare."""
    validator = _validator(str(obj.get("kind", "")), str(obj.get("apiVersion", "")))
    if validator is None:
        return []
    found = []
    for error in validator.iter_errors(dict(obj)):
        if error.validator != "additionalProperties" or not isinstance(error.instance, dict):
            continue
        declared = set((error.schema or {}).get("properties") or {})
        base = ""
        for part in error.absolute_path:
            base += f"[{part}]" if isinstance(part, int) else (f".{part}" if base else str(part))
        for extra in sorted(set(error.instance) - declared):
            found.append(f"{base}.{extra}" if base else extra)
    return found
