"""The MPS sweep on the agent's pod cache: a pass where every namespace's pod is cached makes no list; a
namespace whose pod the cache does not show (bound moments ago) is closed only once a fresh list confirms
the pod is gone."""

from __future__ import annotations

from typing import Any

import kmock

from nodeagent.mps.keeper import close_gone
from nodeagent.mps.protocol import CardLimit
from nodeagent.podcache import FALLBACK, PodCache
from tests.builders import create, make_pod

from .kit import MpsKit

PODS = kmock.resource("v1/pods")
LIMITS = [CardLimit("GPU-a", 512, 10)]


async def test_a_pod_the_cache_misses_keeps_its_namespace(
    apiserver: kmock.KubernetesEmulator, api: Any, mps_kit: MpsKit
) -> None:
    running, fresh = make_pod("running", node="n1", phase="Running"), make_pod("fresh", node="n1")
    await create(apiserver, running, fresh)
    cache = PodCache(api, "n1")
    cache.on_list([running])  # synced, but it has not heard of "fresh" yet
    control = mps_kit.control()
    await control.start()
    for name in ("uid-running-0", "uid-fresh-0", "uid-gone-0"):
        await control.open_namespace(name, LIMITS)
    closed = await close_gone(control, api=api, node_name="n1", pods=cache)
    assert closed == ["uid-gone-0"]
    assert sorted(control.namespaces) == ["uid-fresh-0", "uid-running-0"]
    assert cache.lists[FALLBACK] == 1


async def test_a_pass_with_every_pod_cached_lists_nothing(
    apiserver: kmock.KubernetesEmulator, api: Any, mps_kit: MpsKit
) -> None:
    running = make_pod("running", node="n1", phase="Running")
    await create(apiserver, running)
    cache = PodCache(api, "n1")
    cache.on_list([running])
    control = mps_kit.control()
    await control.start()
    await control.open_namespace("uid-running-0", LIMITS)
    lists = len(apiserver[kmock.action.LIST, PODS])
    assert await close_gone(control, api=api, node_name="n1", pods=cache) == []
    assert len(apiserver[kmock.action.LIST, PODS]) == lists
    assert control.namespaces == ("uid-running-0",)
