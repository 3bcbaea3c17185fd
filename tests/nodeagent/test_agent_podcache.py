"""The node agent's pod cache (``nodeagent.podcache``) on the embedded API server: it keeps exactly this
node's pods through adds, changes and deletes, relists after 410 Gone, stops its thread; it feeds the
grant book and the exporter. Allocate never decides on it: each call pairs on one fresh list, so a pod
bound after the cache's last event is still seen, a stale copy of the chosen pod is never served, and the
MPS sweep closes a namespace only once a fresh list confirms its pod is gone."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import kmock
import pytest

from hami.annotations import POD_DEVICES_TO_ALLOCATE, BindPhase
from nodeagent.config import NodeSettings
from nodeagent.grants import GrantBook
from nodeagent.inventory import Inventory
from nodeagent.podcache import FALLBACK, RELIST, ListedPods, PodCache, PodCacheCollector
from tests.builders import create, make_pod
from tests.eventually import eventually

from .agent_helpers import (
    POD,
    annotations_of,
    card,
    create_node,
    g,
    make_allocator,
    placed,
    plugin_stub,
    refused,
    sim_inventory,
    visible,
)

Emulator = kmock.KubernetesEmulator
PODS = kmock.resource("v1/pods")


def names(cache: PodCache) -> list[str]:
    return sorted(p["metadata"]["name"] for p in cache.pods)


def watch_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "hami-watch-pods" and t.is_alive()]


@pytest.fixture
async def cache(api: Any) -> AsyncIterator[PodCache]:
    """Node n1's pod cache, its watch running; stopped (thread joined) at the end."""
    pods = PodCache(api, "n1", backoff=0.05)
    pods.start()
    yield pods
    await pods.stop()


@pytest.fixture
async def inventory(tmp_path: Path) -> Inventory:
    return await sim_inventory(tmp_path, [card("GPU-a"), card("GPU-b")])


# ------------------------------------------------------------------------------------ the cache
async def test_the_cache_follows_this_nodes_pods(apiserver: Emulator, cache: PodCache) -> None:
    await create(apiserver, make_pod("here", node="n1"))
    await create(apiserver, make_pod("there", node="n2"))  # the embedded server ignores the selector
    await create(apiserver, make_pod("unbound"))
    await cache.wait_synced()
    await eventually(lambda: names(cache) == ["here"], "the cache to hold n1's pod only")
    await apiserver.patch(POD + "here", json={"metadata": {"annotations": {"x": "1"}}})
    await eventually(
        lambda: [p["metadata"].get("annotations", {}).get("x") for p in cache.pods] == ["1"],
        "the change to reach the cache",
    )
    await apiserver.patch(POD + "unbound", json={"spec": {"nodeName": "n1"}})  # bound here now
    await eventually(lambda: names(cache) == ["here", "unbound"], "the pod bound here to join")
    await apiserver.delete(POD + "here")
    await eventually(lambda: names(cache) == ["unbound"], "the deleted pod to leave")
    assert cache.synced


async def test_a_snapshot_does_not_change_under_its_reader(apiserver: Emulator, cache: PodCache) -> None:
    await create(apiserver, make_pod("a", node="n1"))
    await eventually(lambda: names(cache) == ["a"], "the pod to be cached")
    view = await cache.view()
    await create(apiserver, make_pod("b", node="n1"))
    await eventually(lambda: names(cache) == ["a", "b"], "the second pod to be cached")
    assert [p["metadata"]["name"] for p in view.pods] == ["a"]
    assert not view.fresh


async def test_gone_relists_and_the_cache_is_right_again(apiserver: Emulator, api: Any) -> None:
    expired = {"type": "ERROR", "object": {"kind": "Status", "code": 410, "reason": "Expired"}}
    apiserver[kmock.action.WATCH, PODS][:1] << (json.dumps(expired) + "\n").encode()
    await create(apiserver, make_pod("a", node="n1"))
    pods = PodCache(api, "n1", backoff=0.05)
    pods.start()
    try:
        await eventually(lambda: pods.lists[RELIST] >= 2, "a relist after 410 Gone")
        await eventually(lambda: pods.synced and names(pods) == ["a"], "the cache synced again")
    finally:
        await pods.stop()
    assert len(apiserver[kmock.action.LIST, PODS]) >= 2


async def test_an_error_unsyncs_the_cache_until_its_next_list(api: Any) -> None:
    pods = PodCache(api, "n1")
    pods.on_list([make_pod("a", node="n1")])
    assert pods.synced
    pods.on_restart("dropped")  # a watch resumed from its resourceVersion misses nothing
    assert pods.synced
    pods.on_restart("gone_410")
    assert not pods.synced
    pods.on_list([])
    assert pods.synced and names(pods) == []


async def test_stopping_ends_the_watch_thread(apiserver: Emulator, api: Any) -> None:
    pods = PodCache(api, "n1")
    task = asyncio.create_task(pods.run())
    await pods.wait_synced()
    assert watch_threads()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert watch_threads() == []
    assert not pods.synced  # a stopped cache lists on every read


# --------------------------------------------------------------------------------------- Allocate
async def test_allocate_decides_on_a_fresh_list_even_on_a_synced_cache(
    apiserver: Emulator, api: Any, cache: PodCache, inventory: Inventory, tmp_path: Path, sock_dir: Path
) -> None:
    """The hand-out never trusts the cache: one list of the node's pods per Allocate, as without it (the
    cache's view may lack a pod bound moments ago: the next test)."""
    await create_node(apiserver, "n1")
    settings = NodeSettings()
    await placed(apiserver, api, "p", ((g("GPU-a"),),))
    stored = (await (await apiserver.get(POD + "p")).json())["metadata"]["annotations"]
    await eventually(
        lambda: [p["metadata"]["annotations"] for p in cache.pods] == [stored], "the cache to hold p"
    )
    allocator = make_allocator(api, tmp_path, inventory, settings, pods=cache)  # as nodeagent.__main__
    lists = len(apiserver[kmock.action.LIST, PODS])
    async with plugin_stub(allocator, inventory, settings, sock_dir) as stub:
        assert await visible(stub, "GPU-a-0") == "GPU-a"
    assert len(apiserver[kmock.action.LIST, PODS]) - lists == 1
    assert cache.lists[FALLBACK] == 1


async def test_a_pod_the_cache_has_not_seen_makes_the_call_ambiguous(
    apiserver: Emulator, api: Any, inventory: Inventory, tmp_path: Path, sock_dir: Path
) -> None:
    """The cache shows p cleanly waiting for GPU-a; q, bound moments ago for GPU-b, is not in it yet.
    Kubelet's call may be for either: no card for anyone (on the cache's view p would have got GPU-a,
    whichever pod kubelet was admitting)."""
    await create_node(apiserver, "n1")
    settings = NodeSettings()
    await placed(apiserver, api, "p", ((g("GPU-a"),),), lock=False)
    stale = PodCache(api, "n1")
    stale.on_list([(await (await apiserver.get(POD + "p")).json())])  # synced, never hears of q
    await placed(apiserver, api, "q", ((g("GPU-b"),),))
    allocator = make_allocator(api, tmp_path, inventory, settings, pods=stale)
    async with plugin_stub(allocator, inventory, settings, sock_dir) as stub:
        message = await refused(stub, "GPU-a-0")
    assert "default/p" in message and "default/q" in message, message
    for name in ("p", "q"):
        assert (await annotations_of(apiserver, POD + name))[POD_DEVICES_TO_ALLOCATE] != ";"


async def test_without_a_cache_each_allocate_lists(
    apiserver: Emulator, api: Any, inventory: Inventory, tmp_path: Path, sock_dir: Path
) -> None:
    """The same call without the cache (what the agent did before): one list of the node's pods."""
    await create_node(apiserver, "n1")
    settings = NodeSettings()
    await placed(apiserver, api, "p", ((g("GPU-a"),),))
    allocator = make_allocator(api, tmp_path, inventory, settings)
    lists = len(apiserver[kmock.action.LIST, PODS])
    async with plugin_stub(allocator, inventory, settings, sock_dir) as stub:
        assert await visible(stub, "GPU-a-0") == "GPU-a"
    assert len(apiserver[kmock.action.LIST, PODS]) - lists == 1


async def test_a_pod_bound_after_the_caches_last_event_is_seen(
    apiserver: Emulator, api: Any, inventory: Inventory, tmp_path: Path, sock_dir: Path
) -> None:
    """The cache is synced but has not heard of the pod kubelet admits (bound moments ago): Allocate finds
    no pod there and decides on one fresh list instead of answering NOT_FOUND."""
    await create_node(apiserver, "n1")
    settings = NodeSettings()
    stale = PodCache(api, "n1")
    stale.on_list([])  # synced, and no watch: it never hears of p
    await placed(apiserver, api, "p", ((g("GPU-b"),),))
    allocator = make_allocator(api, tmp_path, inventory, settings, pods=stale)
    async with plugin_stub(allocator, inventory, settings, sock_dir) as stub:
        assert await visible(stub, "GPU-b-0") == "GPU-b"
    assert stale.lists[FALLBACK] == 1
    assert (await annotations_of(apiserver, POD + "p"))[POD_DEVICES_TO_ALLOCATE] == ";"


async def test_a_stale_copy_of_the_chosen_pod_is_never_served(
    apiserver: Emulator, api: Any, inventory: Inventory, tmp_path: Path, sock_dir: Path
) -> None:
    """The cache still shows "old" waiting for GPU-a although it was served (and "new" was bound for GPU-b
    since): the chosen pod is read again, is not waiting any more, and the call goes to "new" on a fresh
    list; served from the stale copy, "new"'s container would have got "old"'s card."""
    await create_node(apiserver, "n1")
    settings = NodeSettings()
    await placed(apiserver, api, "old", ((g("GPU-a"),),), lock=False)
    before = await (await apiserver.get(POD + "old")).json()
    await apiserver.patch(
        POD + "old",
        json={"metadata": {"annotations": {POD_DEVICES_TO_ALLOCATE: ";", "hami.io/bind-phase": "success"}}},
    )
    await placed(apiserver, api, "new", ((g("GPU-b"),),), phase=BindPhase.ALLOCATING)
    stale = PodCache(api, "n1")
    stale.on_list([before])
    allocator = make_allocator(api, tmp_path, inventory, settings, pods=stale)
    async with plugin_stub(allocator, inventory, settings, sock_dir) as stub:
        assert await visible(stub, "GPU-a-0") == "GPU-b"
    assert stale.lists[FALLBACK] == 1


async def test_the_second_container_is_served_on_the_fresh_list(
    apiserver: Emulator, api: Any, inventory: Inventory, tmp_path: Path, sock_dir: Path
) -> None:
    """Kubelet calls once per container; the cache has not seen the first call's write. Each call lists
    afresh, so entry 1 goes out after entry 0 and no entry twice."""
    await create_node(apiserver, "n1")
    settings = NodeSettings()
    containers = [{"name": "a", "image": "x"}, {"name": "b", "image": "x"}]
    await placed(apiserver, api, "p", ((g("GPU-a"),), (g("GPU-b"),)), containers=containers)
    stale = PodCache(api, "n1")
    stale.on_list([(await (await apiserver.get(POD + "p")).json())])  # never updated after this
    allocator = make_allocator(api, tmp_path, inventory, settings, pods=stale)
    async with plugin_stub(allocator, inventory, settings, sock_dir) as stub:
        assert await visible(stub, "GPU-a-0") == "GPU-a"
        assert await visible(stub, "GPU-b-0") == "GPU-b"
    assert stale.lists[FALLBACK] == 2


# -------------------------------------------------------------------------------- other readers
async def test_the_grant_book_reads_the_cache(apiserver: Emulator, api: Any, cache: PodCache) -> None:
    await create_node(apiserver, "n1")
    await placed(apiserver, api, "p", ((g("GPU-a", 2000, 20),),), phase=BindPhase.SUCCESS, lock=False)
    await eventually(lambda: names(cache) == ["p"], "the cache to hold p")
    book = GrantBook(api=api, node_name="n1", pods=cache)
    lists = len(apiserver[kmock.action.LIST, PODS])
    (tracked,) = await book.refresh()
    assert [(x.uuid, x.memory_mib) for x in tracked.grants] == [("GPU-a", 2000)]
    assert len(apiserver[kmock.action.LIST, PODS]) == lists


async def test_an_unsynced_cache_lists_for_its_reader(apiserver: Emulator, api: Any) -> None:
    await create(apiserver, make_pod("a", node="n1"))
    pods = PodCache(api, "n1")  # never started
    view = await pods.view()
    assert view.fresh and [p["metadata"]["name"] for p in view.pods] == ["a"]
    assert pods.lists[FALLBACK] == 1
    listed = ListedPods(api, "n1")
    assert [p["metadata"]["name"] for p in (await listed.view()).pods] == ["a"] and listed.lists == 1


async def test_the_collector_reports_the_cache(api: Any) -> None:
    pods = PodCache(api, "n1")
    pods.on_list([make_pod("a", node="n1"), make_pod("b", node="n1")])
    await pods.view()
    samples = {
        (s.name, s.labels.get("reason")): s.value
        for family in PodCacheCollector(pods, "n1").collect()
        for s in family.samples
    }
    assert samples[("hami_node_pod_cache_pods", None)] == 2
    assert samples[("hami_node_pod_cache_synced", None)] == 1
    assert samples[("hami_node_pod_reads_cached_total", None)] == 1
    assert samples[("hami_node_pod_lists_total", "cache")] == 1
    assert samples[("hami_node_pod_lists_total", "fallback")] == 0


def test_docs_list_the_pod_cache_metrics(api: Any) -> None:
    docs = (Path(__file__).resolve().parents[2] / "docs" / "metrics.md").read_text()
    families = list(PodCacheCollector(PodCache(api, "n1"), "n1").describe())
    names = [f.name + ("_total" if f.type == "counter" else "") for f in families]
    assert len(names) == 4
    assert [name for name in names if f"`{name}`" not in docs] == []
