"""The embedded API server: kmock's emulator plus the reactions a real apiserver has and kmock lacks.

Owns the three reactions kmock lacks (docs/testing.md, "The API server: kmock"): ``pods/binding`` (sets
``spec.nodeName`` through the emulator's own PATCH so watchers see it), the core discovery fix (``/api/v1``
must say ``groupVersion: v1`` for kubectl), and ``kind``/``apiVersion`` on list responses; every embedded
apiserver also serves ``deployments|replicasets/scale`` (:mod:`hami_testkit.scale`, ``kubectl scale``).
Used by the test suite and by ``hami demo``. Simulation only: nothing in production imports this module.

Also owns :class:`AdmittingEmulator`, what :func:`embedded_apiserver` serves: kmock stores a write before
any reaction runs, so the two steps a pod write passes in kube-apiserver before it is stored are done
there, ahead of kmock: **authentication** by bearer token (a static token -> username table, like
kube-apiserver's ``--token-auth-file``; no or an unknown token is ``system:anonymous``) and the
**ValidatingAdmissionPolicies** stored in the emulator with their bindings
(:mod:`hami_testkit.admission_policy`), on pod and ``pods/status`` CREATE and PATCH. A denial is answered
the way kube-apiserver answers it (a ``Status`` with the policy's reason and code) and stores nothing.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import contextvars
import json
import socket
import uuid
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp.web
import jsonpatch
import kmock

from hami import objects
from hami_testkit.admission_policy import review
from hami_testkit.admission_standin import AdmissionStandIn
from hami_testkit.kubeapi import SimApi
from hami_testkit.lean import EVENT_LIMIT, LeanHandler, unsupported
from hami_testkit.protobuf import CONTENT_TYPE as PROTOBUF
from hami_testkit.protobuf import ProtobufError, decode
from hami_testkit.restapi import NAMESPACES as NAMESPACE_RESOURCE
from hami_testkit.restapi import (
    build_request,
    install,
    install_openapi,
    is_namespace_path,
    not_found,
    now_utc,
    stamp_create,
    status,
)
from hami_testkit.reviews import ANONYMOUS, groups
from hami_testkit.reviews import answer as review_answer
from hami_testkit.scale import install_scale
from hami_testkit.store_index import KeyedAnswers, index_store, resources, stored
from hami_testkit.subresources import Subresources
from hami_testkit.tls import ServingTLS
from hami_testkit.writes import before_store, error_status

#: The token of the kubeconfig :func:`write_kubeconfig` writes when given none.
DEFAULT_TOKEN = "embedded-cluster-token"
_POLICY_GROUP = "admissionregistration.k8s.io"
#: The request being served (for error answers that name its object).
_CURRENT: contextvars.ContextVar[kmock.Request] = contextvars.ContextVar("request")
#: The namespaces of a new cluster.
NAMESPACES = ("default", "kube-system", "kube-public", "kube-node-lease")
PODS = kmock.resource("v1/pods")
#: How many latest requests the embedded apiserver keeps for the DSL's views (kmock keeps all).
REQUEST_LOG = 2000


class AdmittingEmulator(KeyedAnswers, LeanHandler):
    """kmock's emulator with token authentication and ValidatingAdmissionPolicies on pod writes, at a
    constant cost per request (:class:`~hami_testkit.lean.LeanHandler` sits between kmock's emulator and its
    request handler) and per object stored (:mod:`hami_testkit.store_index`: kmock's fallbacks answered by
    key, each resource's objects read without a walk over the others)."""

    identities: dict[str, str]
    #: The cluster's last resourceVersion (every write takes the next one).
    revision: int = 0
    #: Calls the mutating webhooks on pod CREATE when set (see :func:`embedded_apiserver`).
    admission: AdmissionStandIn | None = None
    #: The HTTPS listener's URL and its CA (PEM), when it has one (``embedded_apiserver(tls=True)``).
    tls_url: str = ""
    ca_pem: bytes = b""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        index_store(self)
        #: The subresources served; the others answered as kube-apiserver answers (a stand-in that
        #: serves one more adds it here: ``emulator.subresources.serve(...)``).
        self.subresources = Subresources()

    def set_identities(self, identities: Mapping[str, str]) -> None:
        """Bearer token -> username (kube-apiserver's static token file)."""
        self.identities = dict(identities)

    def username(self, request: kmock.Request) -> str:
        header = next((v for k, v in request.headers.items() if k.lower() == "authorization"), "")
        scheme, _, token = header.partition(" ")
        table: Mapping[str, str] = getattr(self, "identities", {})  # unset until set_identities
        return table.get(token, ANONYMOUS) if scheme.lower() == "bearer" else ANONYMOUS

    async def _parse(self, raw_request: aiohttp.web.BaseRequest) -> kmock.Request:
        """Protobuf bodies (:mod:`hami_testkit.protobuf`) and namespace paths read here, the rest by kmock."""
        protobuf = PROTOBUF in raw_request.content_type
        if not protobuf and not is_namespace_path(raw_request.path):
            return await super()._parse(raw_request)
        body = await raw_request.read()
        data: Any = None
        if protobuf:
            try:
                data = decode(body)
            except ProtobufError as exc:
                raise unsupported(raw_request.content_type, str(exc)) from exc
            text = json.dumps(data)
        else:
            text = body.decode("utf-8", errors="replace")
            with contextlib.suppress(ValueError):
                data = json.loads(text) if text.strip() else None
        return build_request(raw_request, self.served, body, text, data)

    async def _render_error(self, exc: Exception) -> aiohttp.web.StreamResponse:
        code, body = error_status(exc, _CURRENT.get(None))
        return aiohttp.web.json_response(body, status=code)

    async def _handle(self, request: kmock.Request) -> aiohttp.web.StreamResponse:
        _CURRENT.set(request)
        refused = self.subresources.refusal(request, self._known_subresources, self._exists)
        if refused is None:
            refused = review_answer(request, self.username(request))
        if refused is not None:
            code, body = refused
            return aiohttp.web.json_response(body, status=code)
        early = await before_store(self, request)
        if early is not None:
            return early
        admission = self._admission_request(request)
        if admission is not None:
            policies = self._stored("validatingadmissionpolicies")
            bindings = self._stored("validatingadmissionpolicybindings")
            denial = review(policies, bindings, admission) if policies and bindings else None
            if denial is not None:
                error = kmock.KubernetesError(
                    status=denial.code,
                    reason=denial.reason,
                    message=denial.message,
                    details={"name": admission["name"], "kind": "pods"},
                )
                return await self._render_error(error)
        return await super()._handle(request)

    def _known_subresources(self, resource: kmock.resource) -> set[str]:
        """Kubernetes' subresources of ``resource`` (the bundled discovery data)."""
        try:
            return set(self.resources[resource].subresources)
        except (KeyError, LookupError):
            return set()

    def _exists(self, request: kmock.Request) -> bool:
        if request.resource is None or request.name is None:
            return False
        key = (request.resource, request.namespace, request.name)
        return key in self.objects and not self.objects[key].deleted

    def _stored(self, plural: str) -> list[dict[str, Any]]:
        return [
            dict(obj.raw)
            for resource in resources(self)
            if resource.group == _POLICY_GROUP and resource.plural == plural
            for _, obj in stored(self, resource)
            if not obj.deleted
        ]

    def _admission_request(self, request: kmock.Request) -> dict[str, Any] | None:
        """The AdmissionRequest of a pod CREATE or PATCH (None for anything else, or a patch that does not
        apply: kmock then answers it as it would)."""
        resource = request.resource
        if resource is None or resource.group != "" or resource.plural != "pods":
            return None
        if request.action == kmock.action.CREATE and isinstance(request.data, dict):
            name = objects.name(request.data) or None
            namespace = request.namespace or objects.namespace(request.data) or None
            operation, old, new = "CREATE", None, request.data
        elif request.action == kmock.action.UPDATE and request.name is not None:
            name, namespace, operation = request.name, request.namespace, "UPDATE"
            try:
                stored = self.objects[resource, namespace, name]
            except KeyError:
                return None
            if stored.deleted:
                return None
            old = dict(stored.raw)
            try:
                new = _patched(old, request.data)
            except (jsonpatch.JsonPatchException, jsonpatch.JsonPointerException, TypeError, ValueError):
                return None
        else:
            return None
        username = self.username(request)
        return {
            "uid": str(uuid.uuid4()),
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "subResource": request.subresource or "",
            "name": name,
            "namespace": namespace,
            "operation": operation,
            "userInfo": {"username": username, "groups": groups(username)},
            "object": new,
            "oldObject": old,
            "dryRun": False,
        }


def _patched(old: Mapping[str, Any], patch: Any) -> dict[str, Any]:
    """What kmock will store: a JSON patch (list) or a merge patch (dict; strategic merge is merged too)."""
    if isinstance(patch, list):
        result: dict[str, Any] = jsonpatch.apply_patch(dict(old), patch, in_place=False)
        return result
    if not isinstance(patch, dict):
        raise TypeError(f"unsupported patch body {type(patch).__name__}")
    return _merge(old, patch)


def _merge(target: Any, patch: Mapping[str, Any]) -> dict[str, Any]:
    """RFC 7386: dicts merge recursively, ``null`` removes a key, anything else replaces."""
    result = dict(target) if isinstance(target, Mapping) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        elif isinstance(value, Mapping):
            result[key] = _merge(result.get(key), value)
        else:
            result[key] = value
    return result


async def assign_pod(
    k: kmock.KubernetesEmulator, namespace: str, name: str, node: str, uid: str = ""
) -> tuple[int, dict[str, Any]]:
    """``POST pods/<name>/binding`` as kube-apiserver answers it: ``(status, body)``.

    A missing pod is 404; a pod being deleted, one that already has a node (the same one included) or
    one whose uid is not the Binding's ``metadata.uid`` is 409 Conflict with kube-apiserver's message,
    and nothing changes; else ``spec.nodeName`` is set through the emulator's own merge PATCH (watchers
    see a ``MODIFIED`` event). The caller serialises Bindings (:func:`add_reactions` holds a lock), so
    of concurrent Bindings of one pod exactly one lands."""
    key = (PODS, namespace, name)
    if key not in k.objects or k.objects[key].deleted:
        return 404, not_found("pods", name)
    pod = dict(k.objects[key].raw)
    meta = objects.meta(pod)
    current_uid = str(meta.get("uid") or "")
    if uid and current_uid and uid != current_uid:  # (kmock's plain emulator stores pods without a uid)
        why = f"Precondition failed: UID in precondition: {uid}, UID in object meta: {current_uid}"
        return 409, _conflict("pods", name, why)
    if meta.get("deletionTimestamp"):
        return 409, _conflict(
            "pods/binding", name, f"pod {name} is being deleted, cannot be assigned to a host"
        )
    assigned = objects.spec(pod).get("nodeName")
    if assigned:
        return 409, _conflict("pods/binding", name, f'pod {name} is already assigned to node "{assigned}"')
    path = f"/api/v1/namespaces/{namespace}/pods/{name}"
    response = await k.patch(path, json={"spec": {"nodeName": node}})
    if response.status != 200:  # e.g. the pod is gone: answer with the patch's own status
        answer: dict[str, Any] = await response.json()
        return response.status, answer
    return 201, {"apiVersion": "v1", "kind": "Status", "status": "Success", "code": 201}


def _conflict(resource: str, name: str, why: str) -> dict[str, Any]:
    """kube-apiserver's ``errors.NewConflict``: 409 Conflict naming the resource and the object."""
    message = f'Operation cannot be fulfilled on {resource} "{name}": {why}'
    return status(409, "Conflict", message, {"name": name, "kind": resource})


async def add_reactions(k: kmock.KubernetesEmulator) -> None:
    """Load the bundled discovery data and install the binding, discovery and list-kind reactions."""
    k.resources.load_bundled()
    binding = asyncio.Lock()

    async def bind(request: kmock.Request) -> Any:
        data = request.data
        target = data.get("target") if isinstance(data, dict) else None
        target = target.get("name") if isinstance(target, dict) else None
        if not isinstance(target, str) or not target:
            message = "a Binding must name its target node in target.name"
            return kmock.Response(status=400, payload=status(400, "BadRequest", message))  # type: ignore[attr-defined]
        uid = objects.uid(data) if isinstance(data, dict) else ""
        # always a Response with its status: kmock keeps the status of the last one returned for the
        # reaction's later answers (a 404 once made every later Binding a 404 with a Success body)
        async with binding:  # one Binding at a time: the check and the write are one step
            code, body = await assign_pod(k, str(request.namespace), str(request.name), target, uid)
        return kmock.Response(status=code, payload=body)  # type: ignore[attr-defined]

    k["post", kmock.resource("v1/pods"), kmock.subresource("binding")] << bind

    response = await k.get("/api/v1")
    core = await response.json()
    core["groupVersion"] = "v1"
    for entry in core.get("resources") or []:  # subresources have no short names or categories
        if "/" in str(entry.get("name", "")):
            entry["shortNames"], entry["categories"] = [], []
    k["get /api/v1"] << core

    async def listing(request: kmock.Request) -> Any:
        assert request.resource is not None  # guaranteed by is_listing
        items = [
            obj.raw
            for (_, namespace, _), obj in stored(k, request.resource)
            if not obj.deleted and (request.namespace is None or namespace == request.namespace)
        ]
        group = request.resource.group
        group_version = "v1" if group == "" else f"{group}/{request.resource.version}"
        kind = k.resources[request.resource].kind
        return {
            "apiVersion": group_version,
            "kind": f"{kind}List",
            "metadata": {"resourceVersion": ""},
            "items": items,
        }

    def is_listing(request: kmock.Request) -> bool:
        return bool(request.resource and request.resource.plural)

    k[kmock.action.LIST][is_listing] << listing


def write_kubeconfig(path: Path, server_url: str, token: str = DEFAULT_TOKEN, ca_pem: bytes = b"") -> Path:
    """Write a kubeconfig pointing at ``server_url`` with ``token`` (kubectl and clients accept it); an
    ``https`` server's CA is ``ca_pem``. kubectl and Helm send the token only to an ``https`` server."""
    authority = f"    certificate-authority-data: {base64.b64encode(ca_pem).decode()}\n" if ca_pem else ""
    path.write_text(
        "apiVersion: v1\n"
        "kind: Config\n"
        "clusters:\n"
        f"- name: embedded\n  cluster:\n    server: {server_url}\n{authority}"
        f"users:\n- name: embedded\n  user:\n    token: {token}\n"
        "contexts:\n- name: embedded\n  context:\n    cluster: embedded\n    user: embedded\n"
        "current-context: embedded\n"
    )
    return path


@asynccontextmanager
async def embedded_apiserver(
    host: str = "127.0.0.1",
    port: int = 0,
    *,
    identities: Mapping[str, str] | None = None,
    request_log: int | None = REQUEST_LOG,
    event_limit: int | None = EVENT_LIMIT,
    call_webhooks: bool = False,
    tls: bool = False,
) -> AsyncIterator[AdmittingEmulator]:
    """Run an emulator with the reactions on ``host:port`` (0 = an OS-chosen port); yields it.

    ``identities`` maps bearer tokens to usernames (see :class:`AdmittingEmulator`); ``request_log`` is
    about how many latest requests it keeps for assertions (None: all; a number also drops deleted
    objects from the store); ``event_limit`` how many Events it keeps at most (None: those of the last
    hour, as kube-apiserver; see :class:`~hami_testkit.lean.LeanHandler`); ``call_webhooks`` makes it call
    the stored mutating webhooks on pod CREATE, as kube-apiserver does. The server's URL is
    ``str(emulator.url)`` once started. With ``tls`` the same server also listens with HTTPS on another
    OS-chosen port of ``host`` (``emulator.tls_url``, its CA ``emulator.ca_pem``: :mod:`hami_testkit.tls`):
    the address for kubectl and Helm, which send credentials only over HTTPS.
    """
    async with contextlib.AsyncExitStack() as stack:
        k = await stack.enter_async_context(AdmittingEmulator())
        await stack.enter_async_context(kmock.Server(k, host=host, port=port))
        k.request_log = request_log
        k.event_limit = event_limit
        k.set_identities(identities or {})
        await add_reactions(k)
        install(k)
        install_openapi(k)
        install_scale(k)  # `kubectl scale` edits spec.replicas: the apiserver's own, controllers or not
        if tls:
            await _serve_tls(stack, k, host)
        if call_webhooks:
            session = await stack.enter_async_context(aiohttp.ClientSession())
            k.admission = AdmissionStandIn(SimApi(session, str(k.url)), session, server_admits=True)
        for name in NAMESPACES:  # stored directly: not requests anyone made
            k.revision += 1
            namespace = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}
            stamp_create(namespace, None, k.revision, now_utc())
            k.objects[NAMESPACE_RESOURCE, None, name] = {**namespace, "status": {"phase": "Active"}}
        yield k


async def _serve_tls(stack: contextlib.AsyncExitStack, k: AdmittingEmulator, host: str) -> None:
    """A second listener for ``k``, with HTTPS (see :func:`embedded_apiserver`)."""
    serving = ServingTLS.new(host)
    runner = aiohttp.web.ServerRunner(aiohttp.web.Server(k))
    await runner.setup()
    stack.push_async_callback(runner.cleanup)
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    sock.bind((host, 0))
    site = aiohttp.web.SockSite(runner, sock, ssl_context=serving.server_context())
    await site.start()
    port = sock.getsockname()[1]
    k.tls_url = f"https://{f'[{host}]' if ':' in host else host}:{port}"
    k.ca_pem = serving.ca_pem
