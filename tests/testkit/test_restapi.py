"""The embedded apiserver speaks what real clients expect: Tables, selectors, JSON watch streams with
resourceVersion, kube-apiserver's Status errors, namespaces, protobuf bodies, PUT, server-side apply,
OpenAPI v3 and strict field validation. Everything over HTTP, as kubectl and client-go talk."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest

from hami_testkit.apiserver import embedded_apiserver
from hami_testkit.kubeproto import k8s_pb2
from hami_testkit.protobuf import MAGIC
from hami_testkit.restapi import SERVER_VERSION, TABLE_TYPE
from hami_testkit.tables import human_duration

TABLE = "application/json;as=Table;v=v1;g=meta.k8s.io,application/json"
PODS = "/api/v1/namespaces/default/pods"


def pod(name: str, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {"app": name}},
        "spec": {"containers": [{"name": "c", "image": "busybox"}], **spec},
    }


class Client:
    def __init__(self, session: aiohttp.ClientSession, url: str) -> None:
        self.session, self.url = session, url

    async def call(self, method: str, path: str, body: Any = None, **kw: Any) -> tuple[int, Any, str]:
        headers = kw.pop("headers", {})
        data = kw.pop("data", None)
        if body is not None:
            data = json.dumps(body)
            headers.setdefault("Content-Type", "application/json")
        async with self.session.request(method, self.url + path, data=data, headers=headers, **kw) as r:
            text = await r.text()
            return r.status, (json.loads(text) if text else None), r.headers.get("Content-Type", "")


@pytest.fixture
async def client() -> AsyncIterator[Client]:
    async with embedded_apiserver() as emulator, aiohttp.ClientSession() as session:
        yield Client(session, str(emulator.url).rstrip("/"))


async def test_version_is_recent_enough_for_the_chart(client: Client) -> None:
    _, version, _ = await client.call("GET", "/version")
    assert version == SERVER_VERSION and (int(version["major"]), int(version["minor"])) >= (1, 28)


async def test_create_stamps_metadata_and_a_growing_resource_version(client: Client) -> None:
    code, first, _ = await client.call("POST", PODS, pod("a"))
    _, second, _ = await client.call("POST", PODS, {**pod("b"), "metadata": {"generateName": "job-"}})
    assert code == 201 or code == 200
    meta = first["metadata"]
    assert meta["uid"] and meta["creationTimestamp"].endswith("Z") and meta["namespace"] == "default"
    assert first["status"] == {"phase": "Pending"}
    assert second["metadata"]["name"].startswith("job-") and len(second["metadata"]["name"]) == 9
    assert int(second["metadata"]["resourceVersion"]) > int(meta["resourceVersion"])
    _, patched, _ = await client.call(
        "PATCH",
        f"{PODS}/a",
        {"metadata": {"labels": {"x": "1"}}},
        headers={"Content-Type": "application/merge-patch+json"},
    )
    assert int(patched["metadata"]["resourceVersion"]) > int(second["metadata"]["resourceVersion"])
    assert patched["metadata"]["uid"] == meta["uid"]


async def test_missing_objects_are_kube_apiserver_status_404(client: Client) -> None:
    code, body, _ = await client.call("GET", f"{PODS}/nope")
    assert code == 404
    assert body == {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": 'pods "nope" not found',
        "reason": "NotFound",
        "details": {"name": "nope", "kind": "pods"},
        "code": 404,
    }
    code, body, _ = await client.call("DELETE", f"{PODS}/nope")
    assert (code, body["reason"], body["message"]) == (404, "NotFound", 'pods "nope" not found')
    await client.call("POST", PODS, pod("a"))
    code, body, _ = await client.call("POST", PODS, pod("a"))
    assert (code, body["reason"], body["message"]) == (409, "AlreadyExists", 'pods "a" already exists')
    assert "kmock" not in json.dumps(body) and "traceback" not in json.dumps(body)


async def test_label_and_field_selectors_filter_lists(client: Client) -> None:
    await client.call("POST", PODS, pod("a", nodeName="n1"))
    await client.call("POST", PODS, pod("b"))
    await client.call("POST", "/api/v1/namespaces/other/pods", pod("c", nodeName="n1"))

    async def names(path: str, **params: str) -> list[str]:
        _, body, _ = await client.call("GET", path, params=params)
        return sorted(item["metadata"]["name"] for item in body["items"])

    assert await names(PODS, labelSelector="app=a") == ["a"]
    assert await names(PODS, labelSelector="app in (a,b),app!=b") == ["a"]
    assert await names(PODS, labelSelector="!app") == []
    assert await names("/api/v1/pods", fieldSelector="spec.nodeName=n1") == ["a", "c"]
    assert await names("/api/v1/pods", fieldSelector="spec.nodeName=") == ["b"]
    assert await names("/api/v1/pods", fieldSelector="metadata.namespace!=default") == ["c"]
    code, body, _ = await client.call("GET", PODS, params={"labelSelector": "app in (a"})
    assert (code, body["reason"]) == (400, "BadRequest")


async def test_tables_have_kubectl_s_columns(client: Client) -> None:
    running = pod("a", nodeName="n1")
    await client.call("POST", PODS, running)
    status = {
        "phase": "Running",
        "podIP": "10.0.0.7",
        "containerStatuses": [{"name": "c", "ready": True, "restartCount": 2, "state": {"running": {}}}],
    }
    await client.call(
        "PATCH",
        f"{PODS}/a/status",
        {"status": status},
        headers={"Content-Type": "application/merge-patch+json"},
    )
    code, table, content_type = await client.call("GET", PODS, headers={"Accept": TABLE})
    assert code == 200 and content_type.startswith("application/json")
    assert table["kind"] == "Table" and table["apiVersion"] == "meta.k8s.io/v1"
    columns = [c["name"] for c in table["columnDefinitions"] if c["priority"] == 0]
    assert columns == ["Name", "Ready", "Status", "Restarts", "Age"]
    cells = table["rows"][0]["cells"]
    assert cells[:4] == ["a", "1/1", "Running", "2"] and cells[5:7] == ["10.0.0.7", "n1"]
    assert table["rows"][0]["object"]["kind"] == "PartialObjectMetadata"
    node: dict[str, Any] = {"metadata": {"name": "n1", "labels": {"node-role.kubernetes.io/worker": ""}}}
    node["status"] = {
        "conditions": [{"type": "Ready", "status": "True"}],
        "nodeInfo": {"kubeletVersion": "v1.36.0"},
    }
    await client.call("POST", "/api/v1/nodes", node)
    _, table, _ = await client.call("GET", "/api/v1/nodes/n1", headers={"Accept": TABLE})
    assert [c["name"] for c in table["columnDefinitions"] if c["priority"] == 0] == [
        "Name", "Status", "Roles", "Age", "Version"
    ]  # fmt: skip
    assert table["rows"][0]["cells"][:5] == ["n1", "Ready", "worker", table["rows"][0]["cells"][3], "v1.36.0"]
    event = {
        "metadata": {"name": "a.1"},
        "involvedObject": {"kind": "Pod", "name": "a", "namespace": "default"},
        "reason": "FilteringFailed",
        "message": "no node fits",
        "type": "Warning",
        "count": 3,
    }
    await client.call("POST", "/api/v1/namespaces/default/events", event)
    _, table, _ = await client.call("GET", "/api/v1/namespaces/default/events", headers={"Accept": TABLE})
    shown = [c["name"] for c in table["columnDefinitions"] if c["priority"] == 0]
    assert shown == ["Last Seen", "Type", "Reason", "Object", "Message"]
    cells = table["rows"][0]["cells"]
    assert (
        cells[1:4] == ["Warning", "FilteringFailed", "pod/a"] and cells[6] == "no node fits" and cells[8] == 3
    )


def test_ages_read_like_kubectl_s() -> None:
    assert [human_duration(s) for s in (5, 119, 200, 3600 * 2 + 60, 86400 * 3 + 3600)] == [
        "5s", "119s", "3m20s", "121m", "3d1h"
    ]  # fmt: skip


async def _events(response: aiohttp.ClientResponse, count: int) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = []
    while len(events) < count:
        line = await asyncio.wait_for(response.content.readline(), 30)
        assert line, "the watch ended early"
        events.append(json.loads(line))
    return events


async def test_watch_is_a_json_stream_from_a_resource_version(client: Client) -> None:
    _, created, _ = await client.call("POST", PODS, pod("a"))
    _, listed, _ = await client.call("GET", PODS)
    since = listed["metadata"]["resourceVersion"]
    assert int(since) >= int(created["metadata"]["resourceVersion"])
    params = {"watch": "true", "resourceVersion": since, "fieldSelector": "spec.nodeName=n1"}
    async with client.session.get(client.url + PODS, params=params) as response:
        assert response.headers["Content-Type"] == "application/json"
        await client.call("POST", PODS, pod("b"))  # not on n1: not sent
        await client.call(
            "PATCH",
            f"{PODS}/a",
            {"spec": {"nodeName": "n1"}},
            headers={"Content-Type": "application/merge-patch+json"},
        )
        await client.call("DELETE", f"{PODS}/a")
        events = await _events(response, 2)
    # "a" was listed before the watch: it is not replayed; it enters the selector (ADDED), then goes
    assert [(e["type"], e["object"]["metadata"]["name"]) for e in events] == [
        ("ADDED", "a"),
        ("DELETED", "a"),
    ]


async def test_table_watch_and_timeout(client: Client) -> None:
    await client.call("POST", PODS, pod("a"))
    params = {"watch": "true", "timeoutSeconds": "1"}
    async with client.session.get(client.url + PODS, params=params, headers={"Accept": TABLE}) as response:
        assert response.headers["Content-Type"] == TABLE_TYPE
        events = await _events(response, 1)
        rest = await asyncio.wait_for(response.content.read(), 30)  # ends by itself after timeoutSeconds
    assert events[0]["type"] == "ADDED" and events[0]["object"]["kind"] == "Table"
    assert events[0]["object"]["rows"][0]["cells"][0] == "a" and rest == b""


async def test_streaming_list_ends_its_initial_events_with_a_bookmark(client: Client) -> None:
    await client.call("POST", PODS, pod("a"))
    params = {
        "watch": "true",
        "sendInitialEvents": "true",
        "allowWatchBookmarks": "true",
        "resourceVersion": "",
    }
    async with client.session.get(client.url + PODS, params=params) as response:
        events = await _events(response, 2)
    assert events[0]["type"] == "ADDED"
    assert events[1]["type"] == "BOOKMARK" and events[1]["object"]["kind"] == "Pod"
    assert events[1]["object"]["metadata"]["annotations"] == {"k8s.io/initial-events-end": "true"}


async def test_namespaces_can_be_created_listed_and_deleted(client: Client) -> None:
    _, listed, _ = await client.call("GET", "/api/v1/namespaces")
    assert {"default", "kube-system"} <= {n["metadata"]["name"] for n in listed["items"]}
    code, created, _ = await client.call("POST", "/api/v1/namespaces", {"metadata": {"name": "team-a"}})
    assert code in (200, 201) and created["kind"] == "Namespace" and created["metadata"]["uid"]
    code, _, _ = await client.call("GET", "/api/v1/namespaces/team-a")
    assert code == 200
    code, body, _ = await client.call("POST", "/api/v1/namespaces", {"metadata": {"name": "team-a"}})
    assert (code, body["message"]) == (409, 'namespaces "team-a" already exists')
    await client.call("DELETE", "/api/v1/namespaces/team-a")
    code, body, _ = await client.call("GET", "/api/v1/namespaces/team-a")
    assert (code, body["message"]) == (404, 'namespaces "team-a" not found')


def _proto(kind: str, raw: bytes) -> bytes:
    def field(number: int, value: bytes) -> bytes:
        return bytes([number << 3 | 2, len(value)]) + value

    type_meta = field(1, b"v1") + field(2, kind.encode())
    return MAGIC + field(1, type_meta) + field(2, raw)


async def test_protobuf_secrets_and_namespaces_are_read(client: Client) -> None:
    """client-go's typed clients (Helm's release storage, kubectl create namespace) send protobuf."""

    def field(number: int, value: bytes) -> bytes:
        return bytes([number << 3 | 2, len(value)]) + value

    meta = field(1, b"sh.helm.release.v1.hami.v1") + field(11, field(1, b"owner") + field(2, b"helm"))
    secret = (
        field(1, meta)
        + field(2, field(1, b"release") + field(2, b"\x1f\x8b\x08\xff"))
        + field(3, b"helm.sh/release.v1")
    )
    headers = {"Content-Type": "application/vnd.kubernetes.protobuf"}
    path = "/api/v1/namespaces/default/secrets"
    code, stored, _ = await client.call("POST", path, data=_proto("Secret", secret), headers=headers)
    assert code in (200, 201), stored
    assert stored["data"] == {"release": "H4sI/w=="} and stored["type"] == "helm.sh/release.v1"
    assert stored["metadata"]["labels"] == {"owner": "helm"}
    code, created, _ = await client.call(
        "POST", "/api/v1/namespaces", data=_proto("Namespace", field(1, field(1, b"team-b"))), headers=headers
    )
    assert code in (200, 201) and created["metadata"]["name"] == "team-b"
    code, body, _ = await client.call("POST", path, data=_proto("Service", b""), headers=headers)
    assert (code, body["reason"]) == (415, "UnsupportedMediaType")


async def test_put_replaces_and_refuses_a_stale_resource_version(client: Client) -> None:
    path = "/api/v1/namespaces/default/configmaps"
    _, stored, _ = await client.call("POST", path, {"metadata": {"name": "c"}, "data": {"a": "1", "b": "2"}})
    replaced = {**stored, "data": {"a": "3"}}
    code, body, _ = await client.call("PUT", f"{path}/c", replaced)
    assert code == 200 and body["data"] == {"a": "3"} and body["metadata"]["uid"] == stored["metadata"]["uid"]
    code, body, _ = await client.call("PUT", f"{path}/c", replaced)  # the old resourceVersion again
    assert (code, body["reason"]) == (409, "Conflict")
    code, body, _ = await client.call("PUT", f"{PODS}/x", pod("x"))
    assert code in (404, 405)


async def test_server_side_apply_creates_then_merges(client: Client) -> None:
    path = "/api/v1/namespaces/default/configmaps/cfg"
    headers = {"Content-Type": "application/apply-patch+yaml"}
    applied = "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: cfg\ndata:\n  a: '1'\n"
    code, body, _ = await client.call(
        "PATCH", path, data=applied, headers=headers, params={"fieldManager": "helm"}
    )
    assert code in (200, 201) and body["data"] == {"a": "1"} and body["metadata"]["uid"]
    code, body, _ = await client.call(
        "PATCH", path, data=applied.replace("'1'", "'2'"), headers=headers, params={"fieldManager": "helm"}
    )
    assert code == 200 and body["data"] == {"a": "2"}


async def test_openapi_v3_lets_kubectl_validate_on_the_server(client: Client) -> None:
    _, index, _ = await client.call("GET", "/openapi/v3")
    url = index["paths"]["api/v1"]["serverRelativeURL"]
    _, document, _ = await client.call("GET", url)
    patch = document["paths"]["/api/v1/namespaces/{namespace}/pods/{name}"]["patch"]
    assert patch["x-kubernetes-group-version-kind"] == {"group": "", "version": "v1", "kind": "Pod"}
    assert "fieldValidation" in {p["name"] for p in patch["parameters"]}
    containers = document["components"]["schemas"]["io.k8s.api.core.v1.PodSpec"]["properties"]["containers"]
    assert containers["x-kubernetes-patch-merge-key"] == "name"
    typo = pod("t")
    typo["spec"]["containers"][0]["resurces"] = {}
    code, body, _ = await client.call("POST", PODS, typo, params={"fieldValidation": "Strict"})
    assert code == 400
    assert 'strict decoding error: unknown field "spec.containers[0].resurces"' in body["message"]
    code, _, _ = await client.call("GET", f"{PODS}/t")
    assert code == 404  # nothing stored


async def test_strategic_merge_patches_merge_lists_by_their_keys(client: Client) -> None:
    """``kubectl apply`` re-applying a changed manifest sends a strategic merge patch: containers merge by
    name, ports by containerPort; ``$patch: delete`` removes an element; finalizers lose listed values."""
    path = "/apis/apps/v1/namespaces/default/deployments"
    container = {
        "name": "c",
        "image": "nginx:1",
        "ports": [{"containerPort": 80}],
        "env": [{"name": "A", "value": "1"}],
    }
    sidecar = {"name": "side", "image": "busybox"}
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "web", "finalizers": ["a/x", "b/y"]},
        "spec": {"template": {"spec": {"containers": [container, sidecar]}}},
    }
    await client.call("POST", path, deployment)
    patch = {
        "metadata": {"$deleteFromPrimitiveList/finalizers": ["a/x"]},
        "spec": {
            "template": {
                "spec": {
                    "$setElementOrder/containers": [{"name": "c"}, {"name": "side"}],
                    "containers": [
                        {"name": "c", "image": "nginx:2", "ports": [{"containerPort": 443}]},
                        {"name": "side", "$patch": "delete"},
                    ],
                }
            }
        },
    }
    headers = {"Content-Type": "application/strategic-merge-patch+json"}
    code, body, _ = await client.call("PATCH", f"{path}/web", patch, headers=headers)
    assert code == 200, body
    (merged,) = body["spec"]["template"]["spec"]["containers"]
    assert merged == {
        "name": "c",
        "image": "nginx:2",
        "ports": [{"containerPort": 80}, {"containerPort": 443}],
        "env": [{"name": "A", "value": "1"}],
    }
    assert body["metadata"]["finalizers"] == ["b/y"]
    assert not any(key.startswith("$") for key in json.dumps(body).split('"') if key)


def _envelope(api_version: str, kind: str, message: Any) -> bytes:
    """A body as client-go's protobuf serializer writes it: the magic, then runtime.Unknown."""
    type_meta = k8s_pb2.TypeMeta(apiVersion=api_version, kind=kind)
    envelope: bytes = k8s_pb2.Unknown(typeMeta=type_meta, raw=message.SerializeToString()).SerializeToString()
    return MAGIC + envelope


PROTOBUF = {"Content-Type": "application/vnd.kubernetes.protobuf"}


@pytest.mark.parametrize("sub", ["log", "exec", "attach", "portforward", "proxy", "eviction"])
async def test_unserved_subresources_are_kube_apiserver_404s_not_the_pod(client: Client, sub: str) -> None:
    await client.call("POST", PODS, pod("a"))
    for method in ("GET", "POST"):
        code, body, _ = await client.call(method, f"{PODS}/a/{sub}", params={"container": "c"})
        assert (code, body["kind"], body["reason"]) == (404, "Status", "NotFound"), body
        assert f"the embedded cluster does not serve pods/{sub}" in body["message"]
    code, body, _ = await client.call("GET", f"{PODS}/missing/{sub}")
    assert (code, body["message"]) == (404, 'pods "missing" not found')


async def test_unknown_subresources_and_methods_are_404_and_405_and_change_nothing(client: Client) -> None:
    _, created, _ = await client.call("POST", PODS, pod("a"))
    code, body, _ = await client.call("GET", f"{PODS}/a/nonsense")
    assert (code, body["reason"], body["message"]) == (
        404,
        "NotFound",
        "the server could not find the requested resource",
    )
    for method, sub in (("DELETE", "status"), ("PUT", "status"), ("GET", "binding"), ("DELETE", "binding")):
        code, body, _ = await client.call(method, f"{PODS}/a/{sub}", pod("a"))
        assert (code, body["reason"]) == (405, "MethodNotAllowed"), (method, sub, body)
        assert body["message"] == "the server does not allow this method on the requested resource"
    code, still, _ = await client.call("GET", f"{PODS}/a")
    assert code == 200 and still["metadata"]["uid"] == created["metadata"]["uid"]


async def test_served_subresources_keep_working(client: Client) -> None:
    await client.call("POST", PODS, pod("a"))
    merge = {"Content-Type": "application/merge-patch+json"}
    code, body, _ = await client.call(
        "PATCH", f"{PODS}/a/status", {"status": {"phase": "Running"}}, headers=merge
    )
    assert code == 200 and body["status"]["phase"] == "Running"
    code, body, _ = await client.call("GET", f"{PODS}/a/status")
    assert code == 200 and body["status"]["phase"] == "Running"
    binding = {"apiVersion": "v1", "kind": "Binding", "metadata": {"name": "a"}, "target": {"name": "n1"}}
    malformed_bindings: list[Any] = [[], {"target": "n1"}, {"target": {"name": 7}}, {"kind": "Binding"}]
    for malformed in malformed_bindings:
        code, body, _ = await client.call("POST", f"{PODS}/a/binding", malformed)
        assert (code, body["reason"]) == (400, "BadRequest"), (malformed, body)  # was 500
    code, body, _ = await client.call(
        "POST", f"{PODS}/gone/binding", {**binding, "metadata": {"name": "gone"}}
    )
    assert code == 404, body
    code, body, _ = await client.call("POST", f"{PODS}/a/binding", binding)
    assert code == 201, body  # its own status, not the last refusal's (kmock kept that)
    _, bound, _ = await client.call("GET", f"{PODS}/a")
    assert bound["spec"]["nodeName"] == "n1"


async def test_self_reviews_answer_in_json_and_protobuf() -> None:
    """kubectl auth whoami / can-i: the token's user, allowed (the embedded apiserver has no RBAC)."""
    admin = aiohttp.ClientSession(headers={"Authorization": "Bearer t0ken"})
    async with embedded_apiserver(identities={"t0ken": "kubernetes-admin"}) as emulator, admin as session:
        client = Client(session, str(emulator.url).rstrip("/"))
        whoami = "/apis/authentication.k8s.io/v1/selfsubjectreviews"
        review = {"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"}
        code, body, _ = await client.call("POST", whoami, review)
        assert code == 201 and body["status"]["userInfo"] == {
            "username": "kubernetes-admin",
            "groups": ["system:authenticated"],
        }
        data = _envelope("authentication.k8s.io/v1", "SelfSubjectReview", k8s_pb2.SelfSubjectReview())
        code, body, _ = await client.call("POST", whoami, data=data, headers=dict(PROTOBUF))
        assert code == 201 and body["status"]["userInfo"]["username"] == "kubernetes-admin"
        # as kubectl sends it: Go writes the empty status struct (field 2) and its empty userInfo
        review_pb = k8s_pb2.SelfSubjectReview()
        review_pb.ParseFromString(b"\x12\x02\x0a\x00")
        data = _envelope("authentication.k8s.io/v1", "SelfSubjectReview", review_pb)
        code, body, _ = await client.call("POST", whoami, data=data, headers=dict(PROTOBUF))
        assert code == 201 and body["status"]["userInfo"]["username"] == "kubernetes-admin", body

        can_i = "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews"
        attributes = k8s_pb2.ResourceAttributes(namespace="default", verb="create", resource="pods")
        access = k8s_pb2.SelfSubjectAccessReview(
            spec=k8s_pb2.SelfSubjectAccessReviewSpec(resourceAttributes=attributes)
        )
        data = _envelope("authorization.k8s.io/v1", "SelfSubjectAccessReview", access)
        code, body, _ = await client.call("POST", can_i, data=data, headers=dict(PROTOBUF))
        assert code == 201 and body["status"]["allowed"] is True
        assert body["spec"]["resourceAttributes"] == {
            "namespace": "default",
            "verb": "create",
            "resource": "pods",
        }
        json_review = {"spec": {"nonResourceAttributes": {"path": "/metrics", "verb": "get"}}}
        code, body, _ = await client.call("POST", can_i, json_review)
        assert code == 201 and body["status"]["allowed"] is True
        code, body, _ = await client.call("POST", can_i, {"spec": {}})
        assert (code, body["reason"]) == (422, "Invalid")
        code, body, _ = await client.call("POST", can_i, {"spec": {"resourceAttributes": "pods"}})
        assert (code, body["reason"]) == (400, "BadRequest")
        code, body, _ = await client.call("GET", can_i)
        assert (code, body["reason"]) == (405, "MethodNotAllowed")
        rules = "/apis/authorization.k8s.io/v1/selfsubjectrulesreviews"
        code, body, _ = await client.call("POST", rules, {"spec": {"namespace": "default"}})
        assert code == 201 and body["status"]["resourceRules"] == [
            {"verbs": ["*"], "apiGroups": ["*"], "resources": ["*"]}
        ]
        code, _, _ = await client.call("GET", "/apis/authorization.k8s.io/v1/selfsubjectrulesreviews")
        assert code == 405
    async with embedded_apiserver() as emulator, aiohttp.ClientSession() as session:
        client = Client(session, str(emulator.url).rstrip("/"))
        code, body, _ = await client.call("POST", whoami, review)
        assert body["status"]["userInfo"] == {
            "username": "system:anonymous",
            "groups": ["system:unauthenticated"],
        }


async def test_deletes_read_delete_options_in_json_protobuf_and_the_query(client: Client) -> None:
    path = "/api/v1/namespaces/default/configmaps"
    for name in ("a", "b", "c", "d", "e"):
        await client.call("POST", path, {"metadata": {"name": name}})

    async def exists(name: str) -> bool:
        code, _, _ = await client.call("GET", f"{path}/{name}")
        return code == 200

    # client-go's typed clients (Helm purging its release Secrets) send DeleteOptions in protobuf
    options = k8s_pb2.DeleteOptions(propagationPolicy="Background")
    code, body, _ = await client.call(
        "DELETE", f"{path}/a", data=_envelope("v1", "DeleteOptions", options), headers=dict(PROTOBUF)
    )
    assert code == 200 and body["metadata"]["name"] == "a" and not await exists("a")
    code, _, _ = await client.call(
        "DELETE", f"{path}/b", {"kind": "DeleteOptions", "propagationPolicy": "Foreground"}
    )
    assert code == 200 and not await exists("b")
    code, _, _ = await client.call("DELETE", f"{path}/c", params={"propagationPolicy": "Orphan"})
    assert code == 200 and not await exists("c")
    # a dry run deletes nothing; a wrong precondition is a conflict; bad options are refused
    dry = k8s_pb2.DeleteOptions(dryRun=["All"])
    code, body, _ = await client.call(
        "DELETE", f"{path}/d", data=_envelope("meta.k8s.io/v1", "DeleteOptions", dry), headers=dict(PROTOBUF)
    )
    assert code == 200 and body["metadata"]["name"] == "d" and await exists("d")
    stale = k8s_pb2.DeleteOptions(preconditions=k8s_pb2.Preconditions(uid="not-its-uid"))
    code, body, _ = await client.call(
        "DELETE", f"{path}/d", data=_envelope("v1", "DeleteOptions", stale), headers=dict(PROTOBUF)
    )
    assert (code, body["reason"]) == (409, "Conflict") and "Precondition failed: UID" in body["message"]
    refused = [
        ({"propagationPolicy": "Sometimes"}, 422),
        ({"propagationPolicy": "Orphan", "orphanDependents": True}, 422),
        ({"dryRun": ["Some"]}, 422),
        ({"gracePeriodSeconds": "soon"}, 400),
        ({"gracePeriodSeconds": 10**26}, 400),  # kube-apiserver's is an int64
        ({"kind": "Pod"}, 400),
        ([], 400),
    ]
    for options_json, expected in refused:
        code, body, _ = await client.call("DELETE", f"{path}/d", options_json)
        assert (code, body["kind"]) == (expected, "Status"), (options_json, body)
    code, body, _ = await client.call(
        "DELETE", f"{path}/d", data=b"{not json", headers={"Content-Type": "application/json"}
    )
    assert code == 400
    assert await exists("d") and await exists("e")
    code, body, _ = await client.call("DELETE", f"{path}/d", params={"gracePeriodSeconds": "0"})
    assert code == 200 and not await exists("d")


async def test_protobuf_bodies_that_cannot_be_read_are_415(client: Client) -> None:
    path = "/api/v1/namespaces/default/secrets"
    bad_name = b"\x0a\x03\x0a\x01\xff"  # metadata.name is not UTF-8
    bodies = [
        b"not protobuf",
        MAGIC + b"\xff\xff\xff",
        MAGIC
        + k8s_pb2.Unknown(
            typeMeta=k8s_pb2.TypeMeta(apiVersion="v1", kind="Secret"), raw=bad_name
        ).SerializeToString(),
        MAGIC
        + k8s_pb2.Unknown(
            typeMeta=k8s_pb2.TypeMeta(apiVersion="v1", kind="Secret"), raw=b"\xff"
        ).SerializeToString(),
    ]
    for data in bodies:
        code, body, _ = await client.call("POST", path, data=data, headers=dict(PROTOBUF))
        assert (code, body["reason"]) == (415, "UnsupportedMediaType"), data
    _, listed, _ = await client.call("GET", path)
    assert listed["items"] == []


def _go_meta(name: str) -> Any:
    """ObjectMeta as Go's marshaller writes an unset one: every non-pointer string, empty."""
    return k8s_pb2.ObjectMeta(
        name=name, generateName="", namespace="", selfLink="", uid="", resourceVersion="", generation=0
    )


def _go_pod_spec(**limits: str) -> Any:
    resources = k8s_pb2.ResourceRequirements(
        limits={k: k8s_pb2.Quantity(string=v) for k, v in limits.items()}
    )
    container = k8s_pb2.Container(name="c", image="x", workingDir="", resources=resources, stdin=False)
    return k8s_pb2.PodSpec(
        containers=[container], restartPolicy="", nodeName="", schedulerName="", hostNetwork=False
    )


async def test_typed_clients_workloads_are_read_from_protobuf(client: Client) -> None:
    """kubectl create deployment/job send protobuf: Go's unset fields are left out, pointer zeros kept
    (before: 415 for Deployments and Jobs, and a Secret stored with ``uid: ""``)."""
    template = k8s_pb2.PodTemplateSpec(metadata=_go_meta(""), spec=_go_pod_spec(**{"nvidia.com/gpu": "1"}))
    template.metadata.labels["app"] = "web"
    rolling = k8s_pb2.RollingUpdateDeployment(
        maxSurge=k8s_pb2.IntOrString(type=1, strVal="25%"), maxUnavailable=k8s_pb2.IntOrString(intVal=1)
    )
    deployment = k8s_pb2.Deployment(
        metadata=_go_meta("web"),
        spec=k8s_pb2.DeploymentSpec(
            replicas=0,
            selector=k8s_pb2.LabelSelector(matchLabels={"app": "web"}),
            template=template,
            strategy=k8s_pb2.DeploymentStrategy(type="", rollingUpdate=rolling),
            minReadySeconds=0,
            paused=False,
        ),
        status=k8s_pb2.DeploymentStatus(observedGeneration=0, replicas=0),
    )
    path = "/apis/apps/v1/namespaces/default/deployments"
    data = _envelope("apps/v1", "Deployment", deployment)
    code, stored, _ = await client.call("POST", path, data=data, headers=dict(PROTOBUF))
    assert code in (200, 201), stored
    assert stored["metadata"]["uid"] and "selfLink" not in stored["metadata"]
    assert stored["spec"] == {
        "replicas": 0,
        "selector": {"matchLabels": {"app": "web"}},
        "strategy": {"rollingUpdate": {"maxSurge": "25%", "maxUnavailable": 1}},
        "template": {
            "metadata": {"labels": {"app": "web"}},
            "spec": {
                "containers": [{"name": "c", "image": "x", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]
            },
        },
    }
    assert stored["status"] == {}
    job = k8s_pb2.Job(
        metadata=_go_meta("once"),
        spec=k8s_pb2.JobSpec(backoffLimit=0, template=k8s_pb2.PodTemplateSpec(spec=_go_pod_spec())),
    )
    job.spec.template.spec.restartPolicy = "Never"
    path = "/apis/batch/v1/namespaces/default/jobs"
    code, stored, _ = await client.call(
        "POST", path, data=_envelope("batch/v1", "Job", job), headers=dict(PROTOBUF)
    )
    assert code in (200, 201), stored
    assert stored["spec"]["backoffLimit"] == 0 and stored["spec"]["template"]["spec"] == {
        "containers": [{"name": "c", "image": "x", "resources": {}}],
        "restartPolicy": "Never",
    }
    replicas = k8s_pb2.ReplicaSet(metadata=_go_meta("rs"), spec=k8s_pb2.ReplicaSetSpec(replicas=2))
    path = "/apis/apps/v1/namespaces/default/replicasets"
    code, stored, _ = await client.call(
        "POST", path, data=_envelope("apps/v1", "ReplicaSet", replicas), headers=dict(PROTOBUF)
    )
    assert code in (200, 201) and stored["spec"] == {"replicas": 2}, stored
    secret = k8s_pb2.Secret(metadata=_go_meta("s"), type="")
    path = "/api/v1/namespaces/default/secrets"
    code, stored, _ = await client.call(
        "POST", path, data=_envelope("v1", "Secret", secret), headers=dict(PROTOBUF)
    )
    assert code in (200, 201) and stored["metadata"]["uid"] and "type" not in stored, stored


async def test_protobuf_fields_not_read_are_refused_not_dropped(client: Client) -> None:
    """A field the messages do not list (here PodSpec's volumes, field 1) is refused when it carries a
    value, naming where; carrying its zero value it loses nothing and is accepted."""
    path = "/api/v1/namespaces/default/pods"
    cases = ((b"\x0a\x00", True), (b"\x0a\x04\x0a\x00\x10\x00", True), (b"\x0a\x03\x0a\x01v", False))
    for extra, accepted in cases:
        spec = k8s_pb2.PodSpec()
        spec.ParseFromString(_go_pod_spec().SerializeToString() + extra)
        data = _envelope("v1", "Pod", k8s_pb2.Pod(metadata=_go_meta("p"), spec=spec))
        code, body, _ = await client.call("POST", path, data=data, headers=dict(PROTOBUF))
        if accepted:
            assert code in (200, 201) and body["spec"]["containers"][0]["name"] == "c", body
            await client.call("DELETE", f"{path}/p")
        else:
            assert (code, body["reason"]) == (415, "UnsupportedMediaType"), body
            assert "v1 Pod: spec: field 1 of PodSpec is not read by this apiserver" in body["message"]
            assert "kubectl apply -f" in body["message"]
    quantity = k8s_pb2.ResourceRequirements(limits={"cpu": k8s_pb2.Quantity(string="1")})
    bad_kind = k8s_pb2.Pod(spec=k8s_pb2.PodSpec(containers=[k8s_pb2.Container(name="c", resources=quantity)]))
    bad_kind.spec.containers[0].resources.limits["cpu"].ParseFromString(b"\x0a\x011\x10\x07")
    code, body, _ = await client.call(
        "POST", path, data=_envelope("v1", "Pod", bad_kind), headers=dict(PROTOBUF)
    )
    assert code == 415 and "spec.containers[0].resources.limits[cpu]: field 2 of Quantity" in body["message"]


def _nested(levels: int) -> bytes:
    """Field 1 holding field 1 holding ... ``levels`` deep, all empty: a zero only a deep walk can see."""
    data = b""
    for _ in range(levels):
        size, varint = len(data), b""
        while size >= 0x80:
            varint += bytes([size & 0x7F | 0x80])
            size >>= 7
        data = b"\x0a" + varint + bytes([size]) + data
    return data


async def test_deeply_nested_unknown_protobuf_fields_are_refused_not_a_crash(client: Client) -> None:
    """Before, each level recursed: 400 levels (1.5 KB) killed the process (SIGSEGV)."""
    path = "/api/v1/namespaces/default/pods"
    spec = k8s_pb2.PodSpec()
    spec.ParseFromString(_go_pod_spec().SerializeToString() + _nested(5_000))
    data = _envelope("v1", "Pod", k8s_pb2.Pod(metadata=_go_meta("p"), spec=spec))
    code, body, _ = await client.call("POST", path, data=data, headers=dict(PROTOBUF))
    assert (code, body["reason"]) == (415, "UnsupportedMediaType"), body
    assert "field 1 of PodSpec is not read" in body["message"]
    code, _, _ = await client.call("GET", path)
    assert code == 200  # still serving


async def test_protobuf_kinds_not_read_are_415_naming_the_kind_and_the_way_round(client: Client) -> None:
    path = "/apis/batch/v1/namespaces/default/cronjobs"
    code, body, _ = await client.call(
        "POST", path, data=_envelope("batch/v1", "CronJob", k8s_pb2.Job()), headers=dict(PROTOBUF)
    )
    assert (code, body["reason"]) == (415, "UnsupportedMediaType")
    assert "batch/v1 CronJob is not read from protobuf by this apiserver (it reads " in body["message"]
    assert (
        "kubectl apply -f FILE, or kubectl create ... --dry-run=client -o json | kubectl apply -f -"
        in (body["message"])
    )


async def test_scale_is_served_by_the_apiserver_itself(client: Client) -> None:
    """``kubectl scale`` edits spec.replicas through the scale subresource: apiserver behaviour, so every
    embedded apiserver serves it (``hami demo --bare`` answered 404 "does not serve deployments/scale")."""
    path = "/apis/apps/v1/namespaces/default/deployments"
    template = {"metadata": {"labels": {"app": "web"}}, "spec": {"containers": [{"name": "c", "image": "x"}]}}
    spec = {"replicas": 2, "selector": {"matchLabels": {"app": "web"}}, "template": template}
    await client.call("POST", path, {"metadata": {"name": "web"}, "spec": spec})
    code, scale, _ = await client.call("GET", f"{path}/web/scale")
    assert (code, scale["kind"], scale["spec"], scale["status"]["selector"]) == (
        200,
        "Scale",
        {"replicas": 2},
        "app=web",
    )
    merge = {"Content-Type": "application/merge-patch+json"}
    code, scale, _ = await client.call("PATCH", f"{path}/web/scale", {"spec": {"replicas": 5}}, headers=merge)
    assert (code, scale["kind"], scale["spec"]) == (200, "Scale", {"replicas": 5}), scale
    _, stored, _ = await client.call("GET", f"{path}/web")
    assert stored["spec"]["replicas"] == 5 and stored["spec"]["template"] == template
    code, body, _ = await client.call("GET", f"{path}/missing/scale")
    assert (code, body["reason"]) == (404, "NotFound")
    code, body, _ = await client.call("DELETE", f"{path}/web/scale")
    assert (code, body["reason"]) == (405, "MethodNotAllowed")
