"""The embedded apiserver as ``hami demo`` runs it, with the stand-ins that share its process, holds a flat
amount of memory over a thousand pod lifecycles after a warm-up.

Before, the demo's process grew for as long as it was used: the apiserver kept the latest 2,000-4,000
requests, each with its aiohttp request, body and parsed data (some 10 KiB each); the last version of
every object ever deleted; and every Event forever. Growth is measured by tracemalloc (Python's own
allocations) between the end of a warm-up and the end of the run, both counted in requests, not time.
"""

from __future__ import annotations

import asyncio
import gc
import tracemalloc
from collections.abc import Mapping
from typing import Any

import aiohttp
import kmock
import pytest

from hami_testkit.apiserver import embedded_apiserver
from hami_testkit.kubeapi import SimApi, pods_path
from hami_testkit.lean import EVENT_LIMIT
from hami_testkit.scheduler_standin import SchedulerStandIn
from hami_testkit.system import DEMO_REQUEST_LOG
from hami_testkit.workloads_standin import WorkloadStandIn
from tests.eventually import eventually

TOKEN = "memory-test-token"
#: kubectl's ``get`` asks for server-side Tables
TABLE = "application/json;as=Table;v=v1;g=meta.k8s.io,application/json;g=meta.k8s.io,application/json"
#: the demo keeps EVENT_LIMIT Events; a smaller bound here fills up sooner (each cycle writes at least one
#: Event): the warm-up fills the Event store, so that the run measures the steady state
EVENTS = EVENT_LIMIT // 10
WARM_UP = EVENTS + 100
CYCLES = 500
#: generous: the run keeps ~100 KiB (dict resizes, connection state); before, such a run kept several
#: MiB (the deleted pods and the Events alone ~3 KiB a cycle, the request log up to 35 MiB more)
BOUND = 1024 * 1024


def _pod(i: int) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": f"p{i}", "namespace": "default", "labels": {"app": "memory"}},
        "spec": {
            "containers": [{"name": "c", "image": "busybox", "resources": {"limits": {"nvidia.com/gpu": 1}}}]
        },
    }


def _event(i: int) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": f"p{i}.{i:016x}", "namespace": "default"},
        "involvedObject": {"kind": "Pod", "namespace": "default", "name": f"p{i}"},
        "reason": "Tested",
        "message": "written by a client, as a node agent writes them",
        "type": "Normal",
    }


async def _cycle(session: aiohttp.ClientSession, url: str, api: SimApi, i: int) -> None:
    """What a person and the components do to one pod: create, label, list (kubectl's Tables), an Event,
    a watch that is dropped after its first line, delete."""
    headers: Mapping[str, str] = {"Authorization": f"Bearer {TOKEN}"}
    await api.create(pods_path("default"), _pod(i))
    await api.merge_patch(pods_path("default", f"p{i}"), {"metadata": {"labels": {"step": str(i)}}})
    await api.create("/api/v1/namespaces/default/events", _event(i))
    async with session.get(f"{url}{pods_path('default')}", headers={**headers, "Accept": TABLE}) as response:
        assert response.status == 200
        await response.read()
    await api.list_objects("/api/v1/namespaces/default/events")
    await api.get("/api/v1/nodes")
    if i % 10 == 0:
        params = {"watch": "true", "timeoutSeconds": "30"}
        async with session.get(f"{url}{pods_path('default')}", params=params, headers=headers) as response:
            await response.content.readline()  # then hang up, as kubectl get -w on Ctrl-C
    await api.delete(pods_path("default", f"p{i}"))


async def _run(session: aiohttp.ClientSession, url: str, api: SimApi, first: int, count: int) -> None:
    for i in range(first, first + count):
        await _cycle(session, url, api, i)


@pytest.mark.slow
@pytest.mark.timeout(1200)
async def test_memory_is_flat_over_thousands_of_pod_lifecycles() -> None:
    async with (
        embedded_apiserver(
            identities={TOKEN: "kubernetes-admin"},
            request_log=DEMO_REQUEST_LOG,
            event_limit=EVENTS,
            call_webhooks=True,
        ) as emulator,
        aiohttp.ClientSession() as session,
    ):
        url = str(emulator.url).rstrip("/")
        api = SimApi(session, url, token=TOKEN)
        scheduler = SchedulerStandIn(api, session, "http://127.0.0.1:9", warn_other_schedulers=True)
        workloads = WorkloadStandIn(api)
        tasks = [asyncio.create_task(scheduler.run()), asyncio.create_task(workloads.run())]

        async def settled() -> None:
            """The stand-ins have seen every pod go (their caches hold only live pods)."""
            await eventually(lambda: not scheduler.pods, "the scheduler stand-in to see the pods go")

        tracemalloc.start()
        try:
            await _run(session, url, api, 0, WARM_UP)
            await settled()
            gc.collect()
            before = tracemalloc.get_traced_memory()[0]
            await _run(session, url, api, WARM_UP, CYCLES)
            await settled()
            gc.collect()
            after = tracemalloc.get_traced_memory()[0]
        finally:
            tracemalloc.stop()
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        stored = [key for key, obj in emulator.objects.items() if not obj.deleted]
        events = [key for key in stored if key[0] == kmock.resource("v1/events")]
    print(f"traced growth over {CYCLES} cycles after {WARM_UP}: {(after - before) / 1024:.0f} KiB")
    assert after - before < BOUND, f"grew {(after - before) / 1024:.0f} KiB over {CYCLES} pod lifecycles"
    assert len(events) == EVENTS  # the newest kept, the rest expired
    assert not [key for key in stored if key[0] == kmock.resource("v1/pods")]
    assert len(list(emulator)) <= 2 * DEMO_REQUEST_LOG
    assert len(emulator.objects) == len(stored)  # no deleted object is kept


async def test_events_expire_an_hour_after_their_last_write_and_watchers_see_them_go(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """kube-apiserver's ``--event-ttl`` (1 h): checked at each Event write, against the emulator's clock."""
    now = [0.0]
    async with embedded_apiserver(event_limit=None) as emulator, aiohttp.ClientSession() as session:
        monkeypatch.setattr(emulator, "clock", lambda: now[0])
        url = str(emulator.url).rstrip("/")
        api = SimApi(session, url)
        path = "/api/v1/namespaces/default/events"
        await api.create(path, _event(1))
        async with session.get(f"{url}{path}", params={"watch": "true"}) as watch:
            assert b'"ADDED"' in await watch.content.readline()
            now[0] = 3599.0
            await api.create(path, _event(2))
            assert b'"ADDED"' in await watch.content.readline()
            now[0] = 3600.5
            await api.create(path, _event(3))
            seen = [await watch.content.readline() for _ in range(2)]
        names = sorted(e["metadata"]["name"] for e in await api.list_objects(path))
        assert names == [_event(2)["metadata"]["name"], _event(3)["metadata"]["name"]]
        assert any(b'"DELETED"' in line and _event(1)["metadata"]["name"].encode() in line for line in seen)
        assert (kmock.resource("v1/events"), "default", _event(1)["metadata"]["name"]) not in emulator.objects
