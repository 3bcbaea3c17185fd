"""The test kit's API server answers the writes the product races on as kube-apiserver does: a Binding of
a pod that already has a node (or is being deleted, or whose uid is not the Binding's) is a 409 Conflict
that changes nothing; a JSON patch whose ``test`` fails is a 422 that stores nothing; a merge patch that
names a stale ``resourceVersion`` is a 409. Checked on both ways the suite builds it: the default
``apiserver`` fixture (kmock's emulator with :func:`hami_testkit.apiserver.add_reactions`) and
:func:`hami_testkit.apiserver.embedded_apiserver` (docs/testing.md, "The API server: kmock")."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import kmock
import pytest

from hami_testkit.apiserver import add_reactions, embedded_apiserver

PODS = "/api/v1/namespaces/default/pods"
MERGE = {"Content-Type": "application/merge-patch+json"}
JSON_PATCH = {"Content-Type": "application/json-patch+json"}


def pod(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"containers": [{"name": "c", "image": "busybox"}]},
    }


def binding(name: str, node: str, uid: str | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": "default"} | ({"uid": uid} if uid else {})
    return {"apiVersion": "v1", "kind": "Binding", "metadata": meta, "target": {"kind": "Node", "name": node}}


class Server:
    """HTTP calls to one API server (whichever way it was built)."""

    def __init__(self, session: aiohttp.ClientSession, url: str) -> None:
        self.session, self.url = session, url.rstrip("/")

    async def call(
        self, method: str, path: str, body: Any = None, headers: dict[str, str] | None = None
    ) -> tuple[int, Any]:
        heads = {"Content-Type": "application/json", **(headers or {})}
        data = None if body is None else json.dumps(body)
        async with self.session.request(method, self.url + path, data=data, headers=heads) as response:
            text = await response.text()
            return response.status, (json.loads(text) if text else None)


@pytest.fixture(params=["default fixture", "embedded apiserver"])
async def server(request: pytest.FixtureRequest) -> AsyncIterator[Server]:
    async with aiohttp.ClientSession() as session:
        if request.param == "default fixture":  # what tests/conftest.py's ``apiserver`` builds
            async with kmock.KubernetesEmulator() as apiserver, kmock.Server(apiserver):
                await add_reactions(apiserver)
                yield Server(session, str(apiserver.url))
        else:
            async with embedded_apiserver() as emulator:
                yield Server(session, str(emulator.url))


async def test_binding_a_bound_pod_again_is_a_conflict_that_changes_nothing(server: Server) -> None:
    _, created = await server.call("POST", PODS, pod("p"))
    code, _ = await server.call("POST", f"{PODS}/p/binding", binding("p", "node-1"))
    assert code == 201
    code, body = await server.call("POST", f"{PODS}/p/binding", binding("p", "node-2"))
    assert code == 409, body
    assert body["kind"] == "Status" and body["status"] == "Failure" and body["reason"] == "Conflict"
    assert body["message"] == (
        'Operation cannot be fulfilled on pods/binding "p": pod p is already assigned to node "node-1"'
    )
    assert body["details"] == {"name": "p", "kind": "pods/binding"}
    code, body = await server.call("POST", f"{PODS}/p/binding", binding("p", "node-1"))  # the same node too
    assert code == 409 and body["reason"] == "Conflict"
    _, stored = await server.call("GET", f"{PODS}/p")
    assert stored["spec"]["nodeName"] == "node-1"
    assert created["metadata"].get("uid") == stored["metadata"].get("uid")


async def test_a_binding_for_another_uid_is_a_conflict(server: Server) -> None:
    _, created = await server.call("POST", PODS, pod("p"))
    uid = created["metadata"].get("uid")
    if uid is None:  # kmock's plain emulator does not stamp a uid: give the pod one
        await server.call("PATCH", f"{PODS}/p", {"metadata": {"uid": "uid-1"}}, MERGE)
        uid = "uid-1"
    code, body = await server.call("POST", f"{PODS}/p/binding", binding("p", "node-1", uid="someone-else"))
    assert code == 409 and body["reason"] == "Conflict"
    assert body["message"] == (
        f'Operation cannot be fulfilled on pods "p": Precondition failed: UID in precondition: '
        f"someone-else, UID in object meta: {uid}"
    )
    _, stored = await server.call("GET", f"{PODS}/p")
    assert not stored["spec"].get("nodeName")
    code, _ = await server.call("POST", f"{PODS}/p/binding", binding("p", "node-1", uid=uid))
    assert code == 201


async def test_a_pod_being_deleted_is_not_bound(server: Server) -> None:
    await server.call("POST", PODS, {**pod("p"), "metadata": {**pod("p")["metadata"], "finalizers": ["x/y"]}})
    await server.call("DELETE", f"{PODS}/p")  # the finalizer keeps it, marked for deletion
    code, body = await server.call("POST", f"{PODS}/p/binding", binding("p", "node-1"))
    assert code == 409 and body["reason"] == "Conflict"
    assert body["message"].endswith("pod p is being deleted, cannot be assigned to a host")


async def test_concurrent_bindings_bind_once(server: Server) -> None:
    await server.call("POST", PODS, pod("p"))
    answers = await asyncio.gather(
        *(server.call("POST", f"{PODS}/p/binding", binding("p", f"node-{i}")) for i in range(6))
    )
    codes = sorted(code for code, _ in answers)
    assert codes == [201, 409, 409, 409, 409, 409], answers
    winner = next(i for i, (code, _) in enumerate(answers) if code == 201)
    _, stored = await server.call("GET", f"{PODS}/p")
    assert stored["spec"]["nodeName"] == f"node-{winner}"


async def test_a_failed_json_patch_test_is_422_and_stores_nothing() -> None:
    async with embedded_apiserver() as emulator, aiohttp.ClientSession() as session:
        server = Server(session, str(emulator.url))
        _, created = await server.call("POST", PODS, pod("p"))
        patch = [
            {"op": "add", "path": "/metadata/labels", "value": {"a": "1"}},
            {"op": "test", "path": "/metadata/uid", "value": "not-its-uid"},
        ]
        code, body = await server.call("PATCH", f"{PODS}/p", patch, JSON_PATCH)
        assert code == 422, body
        assert body["kind"] == "Status" and body["reason"] == "Invalid"
        _, stored = await server.call("GET", f"{PODS}/p")
        assert "labels" not in stored["metadata"]
        assert stored["metadata"]["resourceVersion"] == created["metadata"]["resourceVersion"]


async def test_a_merge_patch_naming_a_stale_resource_version_is_409() -> None:
    async with embedded_apiserver() as emulator, aiohttp.ClientSession() as session:
        server = Server(session, str(emulator.url))
        _, created = await server.call("POST", PODS, pod("p"))
        old = created["metadata"]["resourceVersion"]
        code, moved = await server.call("PATCH", f"{PODS}/p", {"metadata": {"labels": {"a": "1"}}}, MERGE)
        assert code == 200
        stale = {"metadata": {"resourceVersion": old, "labels": {"a": "2"}}}
        code, body = await server.call("PATCH", f"{PODS}/p", stale, MERGE)
        assert code == 409 and body["reason"] == "Conflict"
        assert body["message"] == (
            'Operation cannot be fulfilled on pods "p": the object has been modified; '
            "please apply your changes to the latest version and try again"
        )
        current = {
            "metadata": {"resourceVersion": moved["metadata"]["resourceVersion"], "labels": {"a": "3"}}
        }
        code, body = await server.call("PATCH", f"{PODS}/p", current, MERGE)
        assert code == 200 and body["metadata"]["labels"] == {"a": "3"}
