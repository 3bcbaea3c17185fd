"""What real clients (kubectl, Helm, client-go) need from the embedded apiserver that kmock lacks.

Owns the reactions :func:`install` adds at priority 1 (above ``add_reactions``, below the tests' fault
injection at 5 and more) and the write-side helpers :class:`hami_testkit.apiserver.AdmittingEmulator` calls:

* ``/version`` claims :data:`SERVER_VERSION` (charts may require a recent Kubernetes);
* list, get and watch honour ``labelSelector`` and ``fieldSelector`` (:mod:`hami_testkit.selectors`), answer a
  ``meta.k8s.io/v1`` Table when the ``Accept`` header asks for one (:mod:`hami_testkit.tables`), carry the
  cluster's ``resourceVersion``, and a missing object is kube-apiserver's ``Status`` 404;
* watch is a JSON stream with ``Content-Type: application/json`` (or the Table media type), written by
  :func:`hami_testkit.watching.watch_stream` (``resourceVersion``, selectors, ``timeoutSeconds``, bookmarks);
* ``/openapi/v3`` (:mod:`hami_testkit.openapi`); group discovery without the subresource short names kmock
  copies; namespace paths and protobuf bodies read into kmock's Request (:func:`build_request`);
* every write is stamped (:func:`stamp_create`, :func:`stamp_update`): a cluster-wide increasing
  ``resourceVersion``, and on create ``uid``, ``creationTimestamp``, ``generation``, the namespace, and a
  name from ``generateName``.

Simulation only. Must not import ``hami.kube``, ``webhook`` or ``nodeagent``.
"""

from __future__ import annotations

import datetime
import json
import secrets
import uuid
from collections.abc import Callable, Mapping
from typing import Any

import kmock

from hami import objects
from hami_testkit.kmock_seam import Internals, internals
from hami_testkit.selectors import Selector, SelectorError
from hami_testkit.store_index import stored
from hami_testkit.tables import as_table, wants_table
from hami_testkit.watching import watch_stream

JsonDict = dict[str, Any]
#: kmock's response object (exported by kmock, missing from its ``__all__``).
Response: Any = getattr(kmock, "Response")  # noqa: B009

#: What ``/version`` says (the OpenAPI served is this minor's schema).
SERVER_VERSION: JsonDict = {
    "major": "1",
    "minor": "36",
    "gitVersion": "v1.36.0+hami-embedded",
    "gitCommit": "0000000000000000000000000000000000000000",
    "gitTreeState": "clean",
    "buildDate": "2026-01-01T00:00:00Z",
    "goVersion": "go1.25.0",
    "compiler": "gc",
    "platform": "linux/amd64",
}
TABLE_TYPE = "application/json;as=Table;v=v1;g=meta.k8s.io"


def now_utc() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


def timestamp(moment: datetime.datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def status(code: int, reason: str, message: str, details: Mapping[str, Any] | None = None) -> JsonDict:
    """A kube-apiserver ``Status`` (failure)."""
    body: JsonDict = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }
    if details:
        body["details"] = dict(details)
    return body


def answer(code: int, body: Any, content_type: str = "application/json") -> Any:
    """A complete answer (status and headers set on every call: kmock keeps a reaction's last ones)."""
    return Response(status=code, headers={"Content-Type": content_type}, payload=json.dumps(body).encode())


def not_found(plural: str, name: str, group: str = "") -> JsonDict:
    details = {"name": name, "kind": plural} | ({"group": group} if group else {})
    return status(404, "NotFound", f'{plural}{"." + group if group else ""} "{name}" not found', details)


def stamp_create(body: JsonDict, namespace: str | None, revision: int, now: datetime.datetime) -> None:
    """What kube-apiserver fills in on create (in place)."""
    meta = body.setdefault("metadata", {})
    if not meta.get("name") and meta.get("generateName"):
        meta["name"] = f"{meta['generateName']}{secrets.token_hex(3)[:5]}"
    if namespace and not meta.get("namespace"):
        meta["namespace"] = namespace
    meta.setdefault("uid", str(uuid.uuid4()))
    meta["creationTimestamp"] = timestamp(now)  # the server's, whatever the client sent
    meta.setdefault("generation", 1)
    meta["resourceVersion"] = str(revision)


def stamp_update(patch: Any, revision: int) -> None:
    """Add the new ``resourceVersion`` to a merge patch (dict) or JSON patch (list), in place."""
    if isinstance(patch, dict):
        meta = patch.get("metadata")
        if not isinstance(meta, dict):
            meta = patch["metadata"] = {}
        meta["resourceVersion"] = str(revision)
    elif isinstance(patch, list):
        patch.append({"op": "add", "path": "/metadata/resourceVersion", "value": str(revision)})


def kind_of(k: Any, resource: Any) -> str:
    """The kind of a resource from the emulator's discovery data (``Pods`` -> ``Pod``)."""
    try:
        return str(k.resources[resource].kind)
    except (KeyError, LookupError):
        if resource == NAMESPACES:
            return "Namespace"
        return str(resource.plural or "").capitalize()


class Store:
    """Read access to the emulator's objects of one request's resource."""

    def __init__(self, emulator: kmock.KubernetesEmulator) -> None:
        self.k = emulator

    def objects(self, request: kmock.Request) -> list[JsonDict]:
        """The stored objects of the request's resource, namespace (None: all) and name (None: all), in
        the store's order; one named in a namespace is read by its key, the others from the resource's
        own keys (:mod:`hami_testkit.store_index`), never by a walk over every object stored."""
        if request.resource is not None and request.name is not None and request.namespace is not None:
            try:
                found = self.k.objects[request.resource, request.namespace, request.name]
            except KeyError:
                return []
            return [] if found.deleted else [found.raw]
        return [
            obj.raw
            for (_, namespace, name), obj in stored(self.k, request.resource)
            if not obj.deleted
            and (request.namespace is None or namespace == request.namespace)
            and (request.name is None or name == request.name)
        ]

    def cluster_scoped(self, request: kmock.Request) -> list[JsonDict]:
        """The objects a read by name without a namespace finds: those of that name with no namespace
        (the one stored under no namespace read by its key; the others only when it is not there)."""
        if request.resource is not None and request.name is not None:
            try:
                found = self.k.objects[request.resource, None, request.name]
            except KeyError:
                found = None
            if found is not None and not found.deleted and not objects.namespace(found.raw):
                return [found.raw]
        return [o for o in self.objects(request) if not objects.namespace(o)]

    def revision(self) -> str:
        return str(getattr(self.k, "revision", 0))

    def kind(self, request: kmock.Request) -> str:
        return kind_of(self.k, request.resource)


def install(k: kmock.KubernetesEmulator, clock: Callable[[], datetime.datetime] = now_utc) -> None:
    """Add the reactions of the module docstring (priority 1)."""
    store = Store(k)
    k1 = k**1
    k1["get /version"] << (lambda: answer(200, SERVER_VERSION))
    k1["get /version/"] << (lambda: answer(200, SERVER_VERSION))  # kr8s asks with the slash

    def selector(request: kmock.Request) -> Selector | Any:
        try:
            return Selector.from_params(request.params)
        except SelectorError as exc:
            return answer(400, status(400, "BadRequest", str(exc)))

    def listing(request: kmock.Request) -> Any:
        assert request.resource is not None
        chosen = selector(request)
        if isinstance(chosen, Response):
            return chosen
        items = [obj for obj in store.objects(request) if chosen.matches(obj)]
        revision = store.revision()
        if wants_table(request.headers.get("Accept", "")):
            include = request.params.get("includeObject", "Metadata")
            table = as_table(str(request.resource.plural), items, clock(), include_object=include)
            table["metadata"]["resourceVersion"] = revision
            return answer(200, table, TABLE_TYPE)
        group = request.resource.group
        return answer(
            200,
            {
                "apiVersion": "v1" if group == "" else f"{group}/{request.resource.version}",
                "kind": f"{store.kind(request)}List",
                "metadata": {"resourceVersion": revision},
                "items": items,
            },
        )

    def fetch(request: kmock.Request) -> Any:
        assert request.resource is not None and request.name is not None
        # without a namespace, cluster-scoped objects only: a namespaced object needs its namespace
        found = store.cluster_scoped(request) if request.namespace is None else store.objects(request)
        if not found:
            plural, group = str(request.resource.plural), str(request.resource.group or "")
            return answer(404, not_found(plural, request.name, group))
        if wants_table(request.headers.get("Accept", "")):
            include = request.params.get("includeObject", "Metadata")
            table = as_table(str(request.resource.plural), found, clock(), include_object=include)
            return answer(200, table, TABLE_TYPE)
        return answer(200, found[0])

    def watching(request: kmock.Request) -> Any:
        chosen = selector(request)
        if isinstance(chosen, Response):
            return chosen
        table = wants_table(request.headers.get("Accept", ""))
        stream = watch_stream(k, store, request, chosen, table, clock)
        return Response(
            status=200, headers={"Content-Type": TABLE_TYPE if table else "application/json"}, payload=stream
        )

    async def group_version(request: kmock.Request) -> Any:
        """kmock's discovery of ``/apis/<group>/<version>``, without the short names and categories it
        copies onto subresources (kubectl warns that ``deploy`` could mean ``deployments/scale``)."""
        try:
            served: Any = await internals(k).discovery(request)
        except kmock.KubernetesError as exc:
            return answer(
                exc.status, status(exc.status, "NotFound", "the server could not find the requested resource")
            )
        for entry in served.get("resources") or []:
            if "/" in str(entry.get("name", "")):
                entry["shortNames"], entry["categories"] = [], []
        return answer(200, served)

    def is_group_version(request: kmock.Request) -> bool:
        parts = request.url.path.strip("/").split("/")
        return len(parts) == 3 and parts[0] == "apis"

    k1["get"][is_group_version] << group_version

    def has_resource(request: kmock.Request) -> bool:
        return bool(request.resource and request.resource.plural and not request.subresource)

    k1[kmock.action.LIST][has_resource] << listing
    k1[kmock.action.FETCH][has_resource] << fetch
    k1[kmock.action.WATCH][has_resource] << watching


def install_openapi(k: kmock.KubernetesEmulator) -> None:
    """``/openapi/v3`` and its group-version documents (404 without ``kubernetes-validate``)."""
    from hami_testkit import openapi

    if not openapi.available():
        return

    def served() -> dict[tuple[str, str], list[tuple[str, str, bool]]]:
        by_gv: dict[tuple[str, str], list[tuple[str, str, bool]]] = {}
        for resource in internals(k).served_resources():
            if not resource.plural or not isinstance(resource.version, str) or "/" in resource.plural:
                continue
            try:
                info = k.resources[resource]
            except (KeyError, LookupError):
                continue
            kind = str(info.kind or resource.plural.capitalize())
            entry = (str(resource.plural), kind, bool(info.namespaced))
            by_gv.setdefault((str(resource.group or ""), str(resource.version)), []).append(entry)
        by_gv.setdefault(("", "v1"), []).append(("namespaces", "Namespace", False))
        return by_gv

    def root() -> Any:
        return answer(200, openapi.index(served()))

    def document(request: kmock.Request) -> Any:
        parts = request.url.path.removeprefix("/openapi/v3/").strip("/").split("/")
        if len(parts) == 2 and parts[0] == "api":
            group, version = "", parts[1]
        elif len(parts) == 3 and parts[0] == "apis":
            group, version = parts[1], parts[2]
        else:
            return answer(404, status(404, "NotFound", "the server could not find the requested resource"))
        resources_ = served().get((group, version))
        if resources_ is None:
            return answer(404, status(404, "NotFound", "the server could not find the requested resource"))
        return answer(200, openapi.group_version(group, version, resources_))

    k1 = k**1
    k1["get /openapi/v3"] << root
    k1["get"][lambda request: request.url.path.startswith("/openapi/v3/")] << document


NAMESPACES = kmock.resource("v1/namespaces")


def is_namespace_path(path: str) -> bool:
    """``/api/v1/namespaces[/NAME[/status|/finalize]]``: kmock's parser reads these as a namespace prefix
    with no resource, and fails on the collection."""
    parts = path.strip("/").split("/")
    if parts[:3] != ["api", "v1", "namespaces"]:
        return False
    return len(parts) <= 4 or (len(parts) == 5 and parts[4] in ("status", "finalize"))


def build_request(raw: Any, served: int, body: bytes, text: str, data: Any) -> kmock.Request:
    """kmock's Request for a body kmock cannot read (protobuf) or a namespace path (see above)."""
    query = dict(raw.query)
    method = raw.method.upper()
    if is_namespace_path(raw.path):
        parts = raw.path.strip("/").split("/")
        resource, namespace = NAMESPACES, None
        name = parts[3] if len(parts) > 3 else None
        subresource = "/".join(parts[4:]) or None
    else:
        parsed = Internals.parse_path(raw.path)
        resource = kmock.resource(group=parsed.group, version=parsed.version, plural=parsed.plural)
        namespace, name, subresource = parsed.namespace, parsed.name, parsed.subresource
    action: kmock.action | None
    if method == "GET" and query.get("watch") in ("true", "1"):
        action = kmock.action.WATCH
    elif name is None:
        action = {"GET": kmock.action.LIST, "POST": kmock.action.CREATE}.get(method)
    else:
        actions = {"GET": kmock.action.FETCH, "PATCH": kmock.action.UPDATE, "DELETE": kmock.action.DELETE}
        action = actions.get(method)
    return kmock.Request(
        id=served,
        raw_request=raw,
        url=raw.url,
        method=raw.method,
        params=query,
        headers=dict(raw.headers),
        cookies=dict(raw.cookies),
        body=body,
        text=text,
        data=data,
        action=action,
        resource=resource,
        namespace=namespace,
        name=name,
        subresource=subresource,
    )
