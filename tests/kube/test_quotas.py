"""ResourceQuotas from the embedded API server: listed per namespace or cluster-wide, and watched."""

from __future__ import annotations

import asyncio
from typing import Any

import kmock

from hami.kube.quotas import list_resource_quotas
from hami.kube.watch import ListWatcher


def _quota(name: str, namespace: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ResourceQuota",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"hard": {"limits.nvidia.com/gpumem": "4000"}},
    }


async def _create(apiserver: kmock.KubernetesEmulator, name: str, namespace: str) -> None:
    response = await apiserver.post(
        f"/api/v1/namespaces/{namespace}/resourcequotas", json=_quota(name, namespace)
    )
    assert response.status in (200, 201)


async def test_list_in_one_namespace_and_in_all(apiserver: kmock.KubernetesEmulator, api: Any) -> None:
    await _create(apiserver, "a", "team")
    await _create(apiserver, "b", "other")
    assert [q["metadata"]["name"] for q in await list_resource_quotas(api, "team")] == ["a"]
    everything = await list_resource_quotas(api)
    assert sorted((q["metadata"]["namespace"], q["metadata"]["name"]) for q in everything) == [
        ("other", "b"),
        ("team", "a"),
    ]
    assert everything[0]["spec"]["hard"] == {"limits.nvidia.com/gpumem": "4000"}  # raw JSON, as stored


async def test_quotas_are_listed_then_watched(apiserver: kmock.KubernetesEmulator, api: Any) -> None:
    await _create(apiserver, "a", "team")
    seen: asyncio.Queue[tuple[str, Any]] = asyncio.Queue()
    watcher = ListWatcher(
        api,
        "resourcequotas",
        loop=asyncio.get_running_loop(),
        on_list=lambda items: seen.put_nowait(("LIST", [i["metadata"]["name"] for i in items])),
        on_event=lambda kind, obj: seen.put_nowait((kind, obj["metadata"]["name"])),
        backoff=0.05,
    )
    watcher.start()

    async def until(wanted: tuple[str, Any]) -> None:
        while await asyncio.wait_for(seen.get(), timeout=10) != wanted:
            pass

    try:
        assert await asyncio.wait_for(seen.get(), timeout=10) == ("ADDED", "a")  # listed: one by one
        assert await asyncio.wait_for(seen.get(), timeout=10) == ("LIST", ["a"])  # then the list is complete
        await _create(apiserver, "b", "team")
        await until(("ADDED", "b"))
        await apiserver.delete("/api/v1/namespaces/team/resourcequotas/a")
        await until(("DELETED", "a"))
    finally:
        await asyncio.to_thread(watcher.stop)
    paths = {r.url.path for r in apiserver[kmock.action.WATCH]}
    assert paths == {"/api/v1/resourcequotas"}  # one cluster-wide watch
