"""The embedded apiserver reads its store by key and by resource, never by a walk over every object
stored (hami_testkit.store_index), and answers exactly as before: the same objects, in the same order,
after every way the store changes; a selector still sees exactly its objects as one moves between them."""

from __future__ import annotations

import asyncio
import json
import random
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import kmock
import pytest

from hami_testkit import restapi, store_index
from hami_testkit.apiserver import AdmittingEmulator, embedded_apiserver
from hami_testkit.store_index import ResourceIndex, resources, stored

PODS = kmock.resource("v1/pods")
NODES = kmock.resource("v1/nodes")
PODS_PATH = "/api/v1/namespaces/default/pods"
MERGE = {"Content-Type": "application/merge-patch+json"}


def _walk(table: dict[Any, Any], resource: Any) -> list[Any]:
    return [key for key in table if key[0] == resource]


def test_the_index_follows_every_change_of_the_dict_in_the_dicts_order() -> None:
    rng = random.Random(7)
    table = ResourceIndex()
    plain: dict[Any, Any] = {}
    kinds = ["pods", "nodes", "events"]
    for step in range(3000):
        key = (rng.choice(kinds), rng.choice(["a", None]), f"o{rng.randrange(40)}")
        op = rng.randrange(7)
        for target in (table, plain):
            if op <= 2:
                target[key] = step
            elif op == 3 and key in target:
                del target[key]
            elif op == 4:
                target.pop(key, None)
            elif op == 5:
                target.setdefault(key, step)
            elif step % 50 == 0:
                target.update({key: step, (key[0], "b", key[2]): -step})
        if step % 500 == 499:
            table.popitem()
            plain.popitem()
        assert table == plain
        for kind in kinds:
            assert list(table.keys_of.get(kind, ())) == _walk(plain, kind)
    table.clear()
    assert table.keys_of == {} and dict(table) == {}


@pytest.fixture
async def server() -> AsyncIterator[tuple[AdmittingEmulator, aiohttp.ClientSession, str]]:
    async with embedded_apiserver() as emulator, aiohttp.ClientSession() as session:
        yield emulator, session, str(emulator.url).rstrip("/")


def _pod(name: str, node: str = "") -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": [{"name": "c", "image": "i"}]}
    if node:
        spec["nodeName"] = node
    return {"metadata": {"name": name}, "spec": spec}


async def _call(session: aiohttp.ClientSession, method: str, url: str, body: Any = None, **kw: Any) -> Any:
    async with session.request(method, url, json=body, **kw) as response:
        assert response.status < 300, (method, url, response.status, await response.text())
        return await response.json()


async def test_no_request_walks_the_whole_store(
    server: tuple[AdmittingEmulator, aiohttp.ClientSession, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Reads, creates, patches, deletes and lists of one resource touch its own objects only: the store's
    dict is never iterated (kmock 0.8 walks it on each of these requests)."""
    emulator, session, url = server
    for i in range(20):
        await _call(session, "POST", f"{url}/api/v1/nodes", {"metadata": {"name": f"n{i}"}})
    walks: list[str] = []

    def counting(name: str) -> Any:
        original = getattr(dict, name)

        def walk(self: dict[Any, Any]) -> Any:
            walks.append(name)
            return original(self)

        return walk

    for name in ("items", "keys", "values", "__iter__"):
        monkeypatch.setattr(ResourceIndex, name, counting(name))
    await _call(session, "POST", f"{url}{PODS_PATH}", _pod("p1"))
    await _call(session, "GET", f"{url}{PODS_PATH}/p1")
    await _call(session, "GET", f"{url}/api/v1/nodes/n3")
    await _call(
        session, "PATCH", f"{url}/api/v1/nodes/n3", {"metadata": {"labels": {"a": "b"}}}, headers=MERGE
    )
    await _call(session, "PATCH", f"{url}{PODS_PATH}/p1", {"metadata": {"labels": {"a": "b"}}}, headers=MERGE)
    listed = await _call(session, "GET", f"{url}/api/v1/pods", params={"fieldSelector": "spec.nodeName="})
    await _call(session, "DELETE", f"{url}{PODS_PATH}/p1")
    assert [p["metadata"]["name"] for p in listed["items"]] == ["p1"]
    assert walks == []
    resource_reads: list[Any] = []
    real_stored = store_index.stored

    def counted(k: Any, resource: Any) -> Any:
        resource_reads.append(resource)
        return real_stored(k, resource)

    monkeypatch.setattr(restapi, "stored", counted)
    await _call(session, "POST", f"{url}{PODS_PATH}", _pod("p2"))
    resource_reads.clear()
    await _call(session, "GET", f"{url}/api/v1/nodes/n7")  # cluster-scoped: by its key too
    await _call(session, "GET", f"{url}{PODS_PATH}/p2")
    assert resource_reads == []  # reads by name look at one key, not at every node or pod
    assert (PODS, "default", "p1") not in emulator.objects  # gone (the emulator keeps no deleted object)


async def test_lists_give_the_objects_a_walk_gives_in_its_order_after_every_kind_of_change(
    server: tuple[AdmittingEmulator, aiohttp.ClientSession, str],
) -> None:
    emulator, session, url = server
    for name in ("c", "a", "b"):
        await _call(session, "POST", f"{url}{PODS_PATH}", _pod(name))
    emulator.objects[PODS, "default", "direct"] = {"metadata": {"name": "direct", "namespace": "default"}}
    await _call(session, "DELETE", f"{url}{PODS_PATH}/a")
    await _call(session, "POST", f"{url}{PODS_PATH}", _pod("a"))  # re-created: now last
    await _call(session, "POST", f"{url}/api/v1/namespaces/kube-system/pods", _pod("c"))
    del emulator.objects[PODS, "default", "b"]  # a test's own hard delete
    listed = await _call(session, "GET", f"{url}/api/v1/pods")
    walk = [
        name
        for (resource, _, name), obj in list(emulator.objects.items())
        if resource == PODS and not obj.deleted
    ]
    assert [p["metadata"]["name"] for p in listed["items"]] == walk == ["c", "direct", "a", "c"]
    namespaced = await _call(session, "GET", f"{url}{PODS_PATH}")
    assert [p["metadata"]["name"] for p in namespaced["items"]] == ["c", "direct", "a"]
    assert PODS in resources(emulator) and [key for key, _ in stored(emulator, NODES)] == []
    emulator.objects.clear()
    assert (await _call(session, "GET", f"{url}/api/v1/pods"))["items"] == []


async def test_a_read_by_name_finds_exactly_its_key(
    server: tuple[AdmittingEmulator, aiohttp.ClientSession, str],
) -> None:
    """The same object kmock's strict match finds: namespace and name both, a cluster-scoped read only a
    cluster-scoped object."""
    _, session, url = server
    await _call(session, "POST", f"{url}{PODS_PATH}", _pod("p"))
    await _call(session, "POST", f"{url}/api/v1/nodes", {"metadata": {"name": "p"}})
    async with session.get(f"{url}/api/v1/namespaces/kube-system/pods/p") as response:
        assert response.status == 404
    node = await _call(session, "GET", f"{url}/api/v1/nodes/p")
    assert node["kind"] == "Node"
    patched = await _call(
        session, "PATCH", f"{url}{PODS_PATH}/p", {"metadata": {"labels": {"x": "1"}}}, headers=MERGE
    )
    assert patched["kind"] == "Pod" and patched["metadata"]["labels"] == {"x": "1"}
    deleted = await _call(session, "DELETE", f"{url}/api/v1/nodes/p")
    assert deleted["metadata"]["name"] == "p"
    async with session.get(f"{url}/api/v1/nodes/p") as response:
        assert response.status == 404


async def _lines(response: aiohttp.ClientResponse) -> AsyncIterator[dict[str, Any]]:
    while True:
        line = await asyncio.wait_for(response.content.readline(), 60)
        assert line, "the watch ended early"
        yield json.loads(line)


async def test_a_field_selector_sees_exactly_its_pods_as_one_is_bound_and_moved(
    server: tuple[AdmittingEmulator, aiohttp.ClientSession, str],
) -> None:
    """A list and a watch by ``spec.nodeName`` (the node agent's) before and after a pod is bound to its
    node, then moved off it by a patch: the watch says ADDED when it enters and DELETED when it leaves,
    and nothing about the other node's pods."""
    _, session, url = server
    await _call(session, "POST", f"{url}{PODS_PATH}", _pod("mine", "n1"))
    await _call(session, "POST", f"{url}{PODS_PATH}", _pod("other", "n2"))
    await _call(session, "POST", f"{url}{PODS_PATH}", _pod("pending"))
    selector = {"fieldSelector": "spec.nodeName=n1"}

    async def names_on_n1() -> list[str]:
        listed = await _call(session, "GET", f"{url}/api/v1/pods", params=selector)
        return [p["metadata"]["name"] for p in listed["items"]]

    assert await names_on_n1() == ["mine"]
    async with session.get(f"{url}/api/v1/pods", params={**selector, "watch": "true"}) as response:
        events = _lines(response)
        first = await anext(events)
        assert (first["type"], first["object"]["metadata"]["name"]) == ("ADDED", "mine")
        binding = {"apiVersion": "v1", "kind": "Binding", "metadata": {"name": "pending"}}
        await _call(
            session, "POST", f"{url}{PODS_PATH}/pending/binding", {**binding, "target": {"name": "n1"}}
        )
        await _call(
            session, "PATCH", f"{url}{PODS_PATH}/other", {"metadata": {"labels": {"x": "1"}}}, headers=MERGE
        )
        await _call(session, "PATCH", f"{url}{PODS_PATH}/mine", {"spec": {"nodeName": "n3"}}, headers=MERGE)
        seen = [await anext(events), await anext(events)]
    assert [(e["type"], e["object"]["metadata"]["name"]) for e in seen] == [
        ("ADDED", "pending"),
        ("DELETED", "mine"),
    ]
    assert seen[0]["object"]["spec"]["nodeName"] == "n1"
    assert await names_on_n1() == ["pending"]


def test_an_emulator_never_indexed_is_read_by_a_walk() -> None:
    """:func:`stored` and :func:`resources` still answer for a plain kmock emulator's dict."""
    plain = kmock.KubernetesEmulator()
    plain.objects[PODS, "default", "a"] = {"metadata": {"name": "a"}}
    plain.objects[NODES, None, "n"] = {"metadata": {"name": "n"}}
    assert [key for key, _ in stored(plain, PODS)] == [(PODS, "default", "a")]
    assert set(resources(plain)) == {PODS, NODES}
    assert store_index.index_store(plain) is store_index.index_store(plain)  # once
    assert [key for key, _ in stored(plain, NODES)] == [(NODES, None, "n")]
