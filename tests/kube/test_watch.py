"""List + watch threads against the embedded API server: listed objects arrive one by one, then the list;
events arrive, ended watches resume, 410 relists; an object whose handler fails is skipped and reported."""

from __future__ import annotations

import asyncio
import gc
import json
import sys
from collections.abc import AsyncIterator
from typing import Any

import kmock
import pytest

from hami.kube import watch
from hami.kube.watch import ListWatcher

Emulator = kmock.KubernetesEmulator
NODES = kmock.resource("v1/nodes")


class Feed:
    """Collects what a watcher hands to the loop, in order."""

    def __init__(self) -> None:
        self.queue: asyncio.Queue[tuple[str, Any]] = asyncio.Queue()

    def on_list(self, items: list[dict[str, Any]]) -> None:
        self.queue.put_nowait(("LIST", sorted(i["metadata"]["name"] for i in items)))

    def on_event(self, kind: str, obj: dict[str, Any]) -> None:
        self.queue.put_nowait((kind, obj["metadata"]["name"]))

    async def next(self) -> tuple[str, Any]:
        return await asyncio.wait_for(self.queue.get(), timeout=10)

    async def until(self, wanted: tuple[str, Any]) -> None:
        while await self.next() != wanted:
            pass

    async def listed(self, names: list[str]) -> None:
        """A list: each object handed over as ADDED (in the list's order), then the list itself."""
        assert [await self.next() for _ in names] == [("ADDED", name) for name in names]
        assert await self.next() == ("LIST", names)


@pytest.fixture
async def feed(api: Any) -> AsyncIterator[tuple[Feed, ListWatcher]]:
    feed = Feed()
    watcher = ListWatcher(
        api,
        "nodes",
        loop=asyncio.get_running_loop(),
        on_list=feed.on_list,
        on_event=feed.on_event,
        backoff=0.05,
    )
    yield feed, watcher
    await asyncio.to_thread(watcher.stop)


def _node(name: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}}


async def test_list_then_live_events(apiserver: Emulator, feed: tuple[Feed, ListWatcher]) -> None:
    events, watcher = feed
    await apiserver.post("/api/v1/nodes", json=_node("n1"))
    watcher.start()
    await events.listed(["n1"])
    await events.until(("ADDED", "n1"))  # the embedded server replays existing objects on connect
    await apiserver.post("/api/v1/nodes", json=_node("n2"))
    assert await events.next() == ("ADDED", "n2")
    await apiserver.patch("/api/v1/nodes/n1", json={"metadata": {"labels": {"x": "y"}}})
    assert await events.next() == ("MODIFIED", "n1")
    await apiserver.delete("/api/v1/nodes/n2")
    assert await events.next() == ("DELETED", "n2")


async def test_a_watch_that_ends_is_resumed(apiserver: Emulator, feed: tuple[Feed, ListWatcher]) -> None:
    events, watcher = feed
    apiserver[kmock.action.WATCH, NODES][:1] << b""  # the first watch stream ends at once
    watcher.start()
    assert await events.next() == ("LIST", [])
    await apiserver.post("/api/v1/nodes", json=_node("late"))
    await events.until(("ADDED", "late"))
    assert watcher.watches_opened >= 2
    assert watcher.lists_done == 1  # a plain end re-watches, it does not relist


async def test_gone_makes_it_list_again(apiserver: Emulator, feed: tuple[Feed, ListWatcher]) -> None:
    events, watcher = feed
    expired = {
        "type": "ERROR",
        "object": {"kind": "Status", "code": 410, "reason": "Expired", "message": "too old"},
    }
    apiserver[kmock.action.WATCH, NODES][:1] << (json.dumps(expired) + "\n").encode()
    await apiserver.post("/api/v1/nodes", json=_node("n1"))
    watcher.start()
    await events.listed(["n1"])
    await events.listed(["n1"])
    assert watcher.lists_done == 2


async def test_list_errors_are_retried(apiserver: Emulator, api: Any) -> None:
    (apiserver**10)[kmock.action.LIST, NODES][:2] << 500  # ahead of the listing reaction
    events = Feed()
    errors: list[int] = []
    watcher = ListWatcher(
        api,
        "nodes",
        loop=asyncio.get_running_loop(),
        on_list=events.on_list,
        on_event=events.on_event,
        on_error=lambda e: errors.append(e.status),
        backoff=0.01,
    )
    watcher.start()
    try:
        assert await events.next() == ("LIST", [])
    finally:
        await asyncio.to_thread(watcher.stop)
    assert errors == [500, 500]


async def test_restarts_are_reported_with_their_cause(apiserver: Emulator, api: Any) -> None:
    """An ended stream, a 410 and another watch error each restart the loop, reported in order; the
    stream open when the watcher stops is not a restart."""

    def line(code: int) -> bytes:
        error = {"type": "ERROR", "object": {"kind": "Status", "code": code, "reason": "X", "message": "m"}}
        return (json.dumps(error) + "\n").encode()

    apiserver[kmock.action.WATCH, NODES][:1] << b""
    apiserver[kmock.action.WATCH, NODES][1:2] << line(410)  # slices count the matching requests
    apiserver[kmock.action.WATCH, NODES][2:3] << line(500)
    events = Feed()
    causes: list[str] = []
    watcher = ListWatcher(
        api,
        "nodes",
        loop=asyncio.get_running_loop(),
        on_list=events.on_list,
        on_event=events.on_event,
        on_restart=causes.append,
        backoff=0.01,
    )
    watcher.start()
    try:
        for _ in range(3):  # the first list, the relist after 410, the relist after the error
            assert await events.next() == ("LIST", [])
        await apiserver.post("/api/v1/nodes", json=_node("late"))
        await events.until(("ADDED", "late"))  # the fourth watch is open and live
    finally:
        await asyncio.to_thread(watcher.stop)
    # each restart is delivered to the loop before the list it leads to, so all three have arrived
    assert causes == ["ended", "gone_410", "error"]
    assert watcher.lists_done == 3


class PoisonFeed(Feed):
    """A handler that fails on nodes labelled ``poison=yes``, as a decoder bug would."""

    def on_event(self, kind: str, obj: dict[str, Any]) -> None:
        if (obj["metadata"].get("labels") or {}).get("poison") == "yes":
            raise RecursionError(f"cannot read {obj['metadata']['name']}")
        super().on_event(kind, obj)


async def test_an_object_whose_handler_fails_is_skipped_and_the_list_goes_on(
    apiserver: Emulator, api: Any
) -> None:
    """One poisoned object neither aborts the list nor stops the watch: it is skipped, counted and
    reported once per reason (again only after it was handled well in between)."""
    poisoned = {"metadata": {"name": "bad", "labels": {"poison": "yes"}}}
    for node in (_node("a"), {**_node("bad"), **poisoned}, _node("c")):
        await apiserver.post("/api/v1/nodes", json=node)
    events = PoisonFeed()
    skips: list[tuple[str, str, str]] = []
    watcher = ListWatcher(
        api,
        "nodes",
        loop=asyncio.get_running_loop(),
        on_list=events.on_list,
        on_event=events.on_event,
        on_skip=lambda kind, obj, exc: skips.append((kind, obj["metadata"]["name"], repr(exc))),
        backoff=0.01,
    )
    watcher.start()
    try:
        assert [await events.next() for _ in range(3)] == [
            ("ADDED", "a"),
            ("ADDED", "c"),
            ("LIST", ["a", "c"]),
        ]
        assert skips == [("Node", "bad", "RecursionError('cannot read bad')")]
        await events.until(("ADDED", "c"))  # the replay on connect: "bad" fails again
        await apiserver.post("/api/v1/nodes", json=_node("late"))
        await events.until(("ADDED", "late"))  # the watch goes on
        assert watcher.skipped >= 2
        assert len(skips) == 1  # the same reason is reported once
        await apiserver.patch("/api/v1/nodes/bad", json={"metadata": {"labels": {"poison": "no"}}})
        await events.until(("MODIFIED", "bad"))  # handled well now
        await apiserver.patch("/api/v1/nodes/bad", json={"metadata": {"labels": {"poison": "yes"}}})
        await apiserver.post("/api/v1/nodes", json=_node("later"))
        await events.until(("ADDED", "later"))
        assert [name for _, name, _ in skips] == ["bad", "bad"]
    finally:
        await asyncio.to_thread(watcher.stop)


#: A fresh process that imports what the scheduler imports, starts a watch, makes a request of each
#: verb, and prints the generated API modules (``kubernetes.client.api.*``) it has imported.
FRESH_PROCESS = """
import asyncio, json, sys
import hami.scheduler.main  # noqa: F401  (what the scheduler's process imports first)
from hami.kube import nodes
from hami.kube.client import NotFound, load_api_client
from hami.kube.watch import ListWatcher

async def main():
    api = load_api_client(sys.argv[1], request_timeout=60.0)
    listed = asyncio.Event()
    watcher = ListWatcher(
        api, "nodes", loop=asyncio.get_running_loop(), on_list=lambda items: listed.set(),
        on_event=lambda kind, obj: None,
    )
    watcher.start()
    try:
        await asyncio.wait_for(listed.wait(), 120)
        await nodes.patch_node_annotations(api, "n1", {"a": "1"})
        try:
            await nodes.get_node(api, "absent")
        except NotFound:
            pass
    finally:
        await asyncio.to_thread(watcher.stop)
        api.close()
    generated = sorted(m for m in sys.modules if m.startswith("kubernetes.client.api."))
    print(json.dumps({"lists": watcher.lists_done, "generated": generated}))

asyncio.run(main())
"""


async def test_starting_a_watch_imports_no_generated_api_module(apiserver: Emulator, kubeconfig: Any) -> None:
    """Requests go through the client's lower layer, never a generated API class: the first use of one
    imports its module (CoreV1Api: 0.6 s of CPU), paid by every component at start and, in the watch
    thread, against the loop it feeds (issue 26). A fresh process: this one has them imported already."""
    await apiserver.post("/api/v1/nodes", json=_node("n1"))
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        FRESH_PROCESS,
        str(kubeconfig),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        out, err = await asyncio.wait_for(process.communicate(), 240)
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    assert process.returncode == 0, err.decode()[-2000:]
    report = json.loads(out.decode().strip().splitlines()[-1])
    assert report == {"lists": 1, "generated": []}
    assert apiserver.objects[NODES, None, "n1"].raw["metadata"]["annotations"] == {"a": "1"}


class CollectorFeed(Feed):
    """Notes whether the garbage collector ran automatically while each object was handled."""

    def __init__(self) -> None:
        super().__init__()
        self.collecting: list[tuple[str, bool]] = []

    def on_event(self, kind: str, obj: dict[str, Any]) -> None:
        self.collecting.append((f"{kind} {obj['metadata']['name']}", gc.isenabled()))
        super().on_event(kind, obj)


async def test_the_collector_is_paused_while_a_list_is_booked_and_back_after(
    apiserver: Emulator, api: Any
) -> None:
    """A list's objects are handled with the garbage collector paused (every full collection walked the
    whole growing heap: a quarter of the scheduler's CPU to read 50,000 pods), watch events with it on,
    and it is on again once the list is booked."""
    assert gc.isenabled()
    await apiserver.post("/api/v1/nodes", json=_node("n1"))
    events = CollectorFeed()
    watcher = ListWatcher(
        api, "nodes", loop=asyncio.get_running_loop(), on_list=events.on_list, on_event=events.on_event
    )
    watcher.start()
    try:
        await events.listed(["n1"])
        await events.until(("ADDED", "n1"))  # replayed by the watch
        await apiserver.post("/api/v1/nodes", json=_node("n2"))
        await events.until(("ADDED", "n2"))
    finally:
        await asyncio.to_thread(watcher.stop)
    assert events.collecting[0] == ("ADDED n1", False)  # listed
    assert events.collecting[-1] == ("ADDED n2", True)  # a watch event
    assert gc.isenabled()


def test_overlapping_pauses_resume_the_collector_once_the_last_ends() -> None:
    pause = watch.CollectorPause()
    assert gc.isenabled()
    first, second = pause.held(), pause.held()
    first.__enter__()
    second.__enter__()
    assert not gc.isenabled()
    first.__exit__(None, None, None)
    assert not gc.isenabled()  # the other list is still being booked
    second.__exit__(None, None, None)
    assert gc.isenabled()


def test_a_pause_leaves_a_collector_that_was_off_off() -> None:
    pause = watch.CollectorPause()
    gc.disable()
    try:
        with pause.held():
            assert not gc.isenabled()
        assert not gc.isenabled()
    finally:
        gc.enable()
