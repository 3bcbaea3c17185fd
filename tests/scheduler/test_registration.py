"""The scheduler's registration-side writes: the handshake request, the InvalidNodeRegistration
Warning, and the resync pass that writes again what failed (docs/protocol.md, "Handshake")."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import kmock
import pytest

from hami.annotations import NODE_HANDSHAKE
from hami.kube.client import KubeError, load_api_client
from hami.process.tasks import TaskSet
from hami.scheduler.registration import Registration
from hami.scheduler.snapshot import Snapshot, local_time
from tests.builders import HANDSHAKE, NOW, make_node
from tests.eventually import eventually

from .faults import FaultProxy, proxy_fixture  # noqa: F401  (proxy_fixture: the `proxy` fixture)
from .kit import StartExtender

NODES = kmock.resource("v1/nodes")
REQUESTED = "Requesting_" + local_time(NOW).strftime("%Y-%m-%d %H:%M:%S")


def unanswered(name: str) -> dict[str, Any]:
    node = make_node(name)
    del node["metadata"]["annotations"][NODE_HANDSHAKE]
    return node


async def stored_handshake(apiserver: kmock.KubernetesEmulator, name: str) -> str | None:
    node = await (await apiserver.get(f"/api/v1/nodes/{name}")).json()
    return (node["metadata"].get("annotations") or {}).get(NODE_HANDSHAKE)


async def test_the_resync_pass_writes_a_handshake_whose_first_write_failed(
    start_extender: StartExtender, proxy: FaultProxy
) -> None:
    refused = proxy.defer(lambda method, path, _body: method == "PATCH" and path == "/api/v1/nodes/fresh")
    ext = await start_extender(nodes=[unanswered("fresh")], api_url=proxy.url, resync_seconds=0.05)
    await eventually(refused.seen.is_set, "the handshake the node event asked for (refused, not applied)")
    # (the resync pass may already have written it by now: startup waits for four lists, and the pass
    # runs every 0.05 s; that the refused write never landed is checked by ``refused.held`` below)
    # nothing about the node changes, so no watch event asks again: only the resync pass does

    async def written() -> bool:
        return await stored_handshake(ext.apiserver, "fresh") == REQUESTED

    await eventually(written, "the resync pass (every 0.05 s) to write the handshake")
    assert len(refused.held) == 1  # the refused write never reached the API server
    await eventually(lambda: "fresh" not in ext.ctx.snapshot.needs_handshake(), "the watch to show it")


# ------------------------------------------------------------------ the module alone, on a real API server
@pytest.fixture
async def registration(kubeconfig: Path) -> AsyncIterator[tuple[Registration, TaskSet]]:
    api = load_api_client(str(kubeconfig), request_timeout=5.0)
    background = TaskSet(expected=(KubeError,))
    try:
        yield (
            Registration(api=api, component="hami-scheduler", background=background, clock=lambda: NOW),
            background,
        )
    finally:
        await background.drain()
        api.close()


def snapshot_of(*nodes: dict[str, Any]) -> Snapshot:
    snapshot = Snapshot()
    snapshot.replace_nodes(nodes)
    return snapshot


async def test_one_pass_asks_only_for_unanswered_nodes_and_once_while_in_flight(
    apiserver: kmock.KubernetesEmulator, registration: tuple[Registration, TaskSet]
) -> None:
    writes, background = registration
    nodes = [unanswered("fresh"), make_node("answered"), unanswered("other")]
    for node in nodes:
        await apiserver.post("/api/v1/nodes", json=node)
    snapshot = snapshot_of(*nodes)
    assert writes.resync_once(snapshot) == ["fresh", "other"]
    assert writes.resync_once(snapshot) == []  # both writes still in flight: not asked twice
    await background.drain()
    assert sorted(str(r.name) for r in apiserver["patch", NODES]) == ["fresh", "other"]  # one write each
    assert await stored_handshake(apiserver, "fresh") == REQUESTED
    assert await stored_handshake(apiserver, "answered") == HANDSHAKE  # left alone


async def test_a_failed_write_is_logged_and_asked_again_by_the_next_pass(
    apiserver: kmock.KubernetesEmulator,
    registration: tuple[Registration, TaskSet],
    caplog: pytest.LogCaptureFixture,
) -> None:
    writes, background = registration
    snapshot = snapshot_of(unanswered("late"))  # seen by the watch, not yet stored where we write
    assert writes.resync_once(snapshot) == ["late"]
    await background.drain()
    assert "could not write the handshake on node late: 404" in caplog.text
    await apiserver.post("/api/v1/nodes", json=unanswered("late"))
    assert writes.resync_once(snapshot) == ["late"]  # no longer in flight: asked again
    await background.drain()
    assert await stored_handshake(apiserver, "late") == REQUESTED


async def test_an_unreadable_registration_is_one_warning_event_on_the_node(
    apiserver: kmock.KubernetesEmulator, registration: tuple[Registration, TaskSet]
) -> None:
    writes, background = registration
    node = make_node("broken", register="not json")
    writes.report_malformed(node, "hami.io/node-nvidia-register: not JSON")
    await background.drain()
    (event,) = [r.data for r in apiserver["post", kmock.resource("v1/events")]]
    assert (event["reason"], event["type"], event["involvedObject"]["name"]) == (
        "InvalidNodeRegistration",
        "Warning",
        "broken",
    )
    assert event["message"] == "node excluded from GPU scheduling: hami.io/node-nvidia-register: not JSON"
    assert event["source"]["component"] == "hami-scheduler"
