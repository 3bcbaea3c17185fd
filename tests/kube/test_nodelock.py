"""The node lock: compare-and-set JSON patches on ``hami.io/mutex.lock`` against the embedded API server."""

from __future__ import annotations

import asyncio
import datetime
from typing import Any

import kmock
import pytest

from hami.annotations import NODE_LOCK
from hami.kube.client import NotFound
from hami.kube.nodelock import (
    CONTENTION,
    LOCK_POINTER,
    NodeLockBusy,
    NodeLockUnreadable,
    acquire_node_lock,
    release_node_lock,
    take_node_lock,
)
from hami_testkit.restapi import Response  # kmock.Response (exported, not in its __all__)

Emulator = kmock.KubernetesEmulator
NODES = kmock.resource("v1/nodes")
NOW = datetime.datetime(2026, 5, 1, 10, 0, 0, tzinfo=datetime.UTC)
OURS = "2026-05-01T10:00:00Z,default,p1"


async def _node(k: Emulator, annotations: dict[str, str] | None) -> None:
    metadata: dict[str, Any] = {"name": "n1"}
    if annotations is not None:
        metadata["annotations"] = annotations
    await k.post("/api/v1/nodes", json={"apiVersion": "v1", "kind": "Node", "metadata": metadata})


async def _pod(k: Emulator, name: str) -> None:
    body = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "default"}, "spec": {}}
    await k.post("/api/v1/namespaces/default/pods", json=body)


async def _lock(k: Emulator) -> str | None:
    node = await (await k.get("/api/v1/nodes/n1")).json()
    value: str | None = (node["metadata"].get("annotations") or {}).get(NODE_LOCK)
    return value


@pytest.mark.parametrize("annotations", [None, {}, {"other": "x"}, {NODE_LOCK: ""}])
async def test_a_free_node_is_locked_with_the_exact_value(
    apiserver: Emulator, api: Any, annotations: dict[str, str] | None
) -> None:
    await _node(apiserver, annotations)
    assert await acquire_node_lock(api, "n1", "default", "p1", now=NOW) == OURS
    assert await _lock(apiserver) == OURS
    stored = await (await apiserver.get("/api/v1/nodes/n1")).json()
    assert stored["metadata"]["annotations"] == {**(annotations or {}), NODE_LOCK: OURS}
    # written by one JSON patch whose first op is the compare ("test")
    patches = list(apiserver["patch", NODES])
    assert len(patches) == 1 and patches[0].data[0]["op"] == "test"


async def test_the_same_pod_reacquires_without_writing(apiserver: Emulator, api: Any) -> None:
    await _node(apiserver, {NODE_LOCK: OURS})
    later = NOW + datetime.timedelta(minutes=1)
    assert await acquire_node_lock(api, "n1", "default", "p1", now=later) == OURS
    assert len(apiserver["patch", NODES]) == 0


async def test_a_live_holder_blocks(apiserver: Emulator, api: Any) -> None:
    await _node(apiserver, {NODE_LOCK: "2026-05-01T09:58:00Z,default,holder"})
    await _pod(apiserver, "holder")
    with pytest.raises(NodeLockBusy, match="node n1 has been locked within 5m0s"):
        await acquire_node_lock(api, "n1", "default", "p1", now=NOW)
    assert await _lock(apiserver) == "2026-05-01T09:58:00Z,default,holder"


async def test_a_lock_whose_holder_pod_is_gone_is_taken_over(apiserver: Emulator, api: Any) -> None:
    await _node(apiserver, {NODE_LOCK: "2026-05-01T09:59:00Z,default,gone"})
    assert await acquire_node_lock(api, "n1", "default", "p1", now=NOW) == OURS
    assert await _lock(apiserver) == OURS


async def test_an_expired_lock_is_taken_over_even_with_a_live_holder(apiserver: Emulator, api: Any) -> None:
    await _node(apiserver, {NODE_LOCK: "2026-05-01T09:54:59Z,default,holder"})  # 5 min 1 s old
    await _pod(apiserver, "holder")
    assert await acquire_node_lock(api, "n1", "default", "p1", now=NOW) == OURS
    # exactly at the expiry it still holds
    await apiserver.patch(
        "/api/v1/nodes/n1",
        json={"metadata": {"annotations": {NODE_LOCK: "2026-05-01T09:55:00Z,default,holder"}}},
    )
    with pytest.raises(NodeLockBusy):
        await acquire_node_lock(api, "n1", "default", "p1", now=NOW)


async def test_legacy_locks_block_until_expiry_and_anyone_releases_them(
    apiserver: Emulator, api: Any
) -> None:
    await _node(apiserver, {NODE_LOCK: "2026-05-01T09:59:00Z"})
    with pytest.raises(NodeLockBusy):
        await acquire_node_lock(api, "n1", "default", "p1", now=NOW)
    assert await release_node_lock(api, "n1", "default", "someone-else") is True
    assert await _lock(apiserver) is None
    await apiserver.patch(
        "/api/v1/nodes/n1", json={"metadata": {"annotations": {NODE_LOCK: "2026-05-01T09:50:00Z"}}}
    )
    assert await acquire_node_lock(api, "n1", "default", "p1", now=NOW) == OURS


@pytest.mark.parametrize(
    "value",
    [
        "yesterday,ns",
        "yesterday",
        "2026-05-01T09:59:00Z,default",
        "2026-05-01T09:59:00Z,a,b,c",
        "x,default,p1",
    ],
)
async def test_an_unreadable_lock_is_an_error_not_contention(
    apiserver: Emulator, api: Any, value: str
) -> None:
    # HAMi's ParseNodeLock error is returned as is, not as ErrNodeLockContention: it is not retried
    # (a PodGroup member would otherwise wait 28 s for a lock that never changes) and not taken over
    # (nobody can tell who holds it, or since when); even "our own" name in it does not make it ours
    await _node(apiserver, {NODE_LOCK: value})
    with pytest.raises(NodeLockUnreadable) as caught:
        await acquire_node_lock(api, "n1", "default", "p1", now=NOW)
    assert not isinstance(caught.value, NodeLockBusy)
    message = str(caught.value)
    assert message.startswith(f'node n1 has an unreadable lock: {NODE_LOCK} "{value}": malformed lock')
    assert CONTENTION not in message
    assert len(apiserver["patch", NODES]) == 0
    assert await release_node_lock(api, "n1", "default", "p1") is False
    assert await _lock(apiserver) == value


async def test_contention_errors_end_with_hamis_wording(apiserver: Emulator, api: Any) -> None:
    # HAMi wraps every busy-lock error around ErrNodeLockContention ("node lock contention")
    await _node(apiserver, {NODE_LOCK: "2026-05-01T09:58:00Z,default,holder"})
    await _pod(apiserver, "holder")
    with pytest.raises(NodeLockBusy) as caught:
        await acquire_node_lock(api, "n1", "default", "p1", now=NOW)
    assert str(caught.value) == "node n1 has been locked within 5m0s by default/holder: node lock contention"
    legacy = {NODE_LOCK: "2026-05-01T09:59:00Z"}  # no holder to name: HAMi's text exactly
    await apiserver.patch("/api/v1/nodes/n1", json={"metadata": {"annotations": legacy}})
    with pytest.raises(NodeLockBusy) as caught:
        await acquire_node_lock(api, "n1", "default", "p1", now=NOW)
    assert str(caught.value) == "node n1 has been locked within 5m0s: node lock contention"
    assert caught.value.reason == "NodeLocked"


async def test_release_only_removes_our_own_lock(apiserver: Emulator, api: Any) -> None:
    await _node(apiserver, {NODE_LOCK: OURS, "keep": "1"})
    assert await release_node_lock(api, "n1", "default", "p2") is False
    assert await _lock(apiserver) == OURS
    assert await release_node_lock(api, "n1", "default", "p1") is True
    stored = await (await apiserver.get("/api/v1/nodes/n1")).json()
    assert stored["metadata"]["annotations"] == {"keep": "1"}
    assert await release_node_lock(api, "n1", "default", "p1") is False  # nothing left to release
    assert await release_node_lock(api, "ghost", "default", "p1") is False


async def test_a_missing_node_is_not_found(apiserver: Emulator, api: Any) -> None:
    with pytest.raises(NotFound):
        await acquire_node_lock(api, "n1", "default", "p1", now=NOW)


@pytest.mark.parametrize("status", [409, 422, 500])
async def test_a_lost_race_rereads_and_sees_the_winner(apiserver: Emulator, api: Any, status: int) -> None:
    await _node(apiserver, {NODE_LOCK: ""})
    await _pod(apiserver, "winner")

    async def someone_else_wins(_: kmock.Request) -> Response:
        winner = {NODE_LOCK: "2026-05-01T10:00:00Z,default,winner"}
        await apiserver.patch("/api/v1/nodes/n1", json={"metadata": {"annotations": winner}})
        return Response(status=status)

    (apiserver**10)["patch", NODES][:1] << someone_else_wins
    with pytest.raises(NodeLockBusy, match="by default/winner"):
        await acquire_node_lock(api, "n1", "default", "p1", now=NOW)
    assert await _lock(apiserver) == "2026-05-01T10:00:00Z,default,winner"


async def test_a_failed_patch_without_a_winner_is_retried(apiserver: Emulator, api: Any) -> None:
    await _node(apiserver, {NODE_LOCK: ""})
    (apiserver**10)["patch", NODES][:2] << 500
    assert await acquire_node_lock(api, "n1", "default", "p1", now=NOW) == OURS


async def test_concurrent_acquirers_get_exactly_one_winner(apiserver: Emulator, api: Any) -> None:
    await _node(apiserver, {NODE_LOCK: ""})
    names = [f"p{i}" for i in range(8)]
    for name in names:
        await _pod(apiserver, name)
    results = await asyncio.gather(
        *(acquire_node_lock(api, "n1", "default", n, now=NOW) for n in names), return_exceptions=True
    )
    winners = [r for r in results if isinstance(r, str)]
    assert len(winners) == 1
    assert all(isinstance(r, NodeLockBusy) for r in results if not isinstance(r, str))
    assert await _lock(apiserver) == winners[0]


async def _holder_pod(k: Emulator, name: str, *, node: str | None = None, **status: str) -> None:
    spec: dict[str, Any] = {"containers": [{"name": "c", "image": "x"}]}
    if node is not None:
        spec["nodeName"] = node
    body = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "default"},
        "spec": spec,
        "status": status or {"phase": "Pending"},
    }
    await k.post("/api/v1/namespaces/default/pods", json=body)


@pytest.mark.parametrize(
    ("node", "status", "reason"),
    [
        ("n2", {"phase": "Pending"}, "holder_elsewhere"),  # rescheduled to another node after a crash
        ("n2", {"phase": "Running"}, "holder_elsewhere"),
        ("n1", {"phase": "Succeeded"}, "holder_finished"),
        ("n1", {"phase": "Failed", "reason": "Error"}, "holder_finished"),
        ("n1", {"phase": "Failed", "reason": "UnexpectedAdmissionError"}, "holder_rejected"),
        ("n1", {"phase": "Failed", "reason": "OutOfnvidia.com/gpu"}, "holder_rejected"),
        (None, {"phase": "Failed", "reason": "OutOfcpu"}, "holder_rejected"),
    ],
    ids=[
        "elsewhere-pending",
        "elsewhere-running",
        "succeeded",
        "failed",
        "admission",
        "out-of-gpu",
        "unbound-failed",
    ],
)
async def test_a_holder_that_can_never_be_allocated_here_loses_the_lock_at_once(
    apiserver: Emulator, api: Any, node: str | None, status: dict[str, str], reason: str
) -> None:
    held = "2026-05-01T09:59:00Z,default,holder"  # 1 minute old: far from the 5 min expiry
    await _node(apiserver, {NODE_LOCK: held})
    await _holder_pod(apiserver, "holder", node=node, **status)
    assert await acquire_node_lock(api, "n1", "default", "p1", now=NOW) == OURS
    assert await _lock(apiserver) == OURS
    await apiserver.patch("/api/v1/nodes/n1", json={"metadata": {"annotations": {NODE_LOCK: held}}})
    grant = await take_node_lock(api, "n1", "default", "p2", now=NOW)
    assert (grant.written, grant.takeover, grant.previous) == (True, reason, held)


@pytest.mark.parametrize(
    ("node", "status"),
    [(None, {"phase": "Pending"}), ("n1", {"phase": "Pending"}), ("n1", {"phase": "Running"}), ("n1", {})],
    ids=["pending-unbound", "pending-here", "running-here", "no-status"],
)
async def test_a_holder_that_may_still_be_allocated_here_keeps_the_lock(
    apiserver: Emulator, api: Any, node: str | None, status: dict[str, str]
) -> None:
    held = "2026-05-01T09:59:00Z,default,holder"
    await _node(apiserver, {NODE_LOCK: held})
    await _holder_pod(apiserver, "holder", node=node, **status)
    with pytest.raises(NodeLockBusy, match="by default/holder"):
        await acquire_node_lock(api, "n1", "default", "p1", now=NOW)
    assert await _lock(apiserver) == held


async def test_grants_say_whether_this_call_wrote_the_lock(apiserver: Emulator, api: Any) -> None:
    await _node(apiserver, {})
    first = await take_node_lock(api, "n1", "default", "p1", now=NOW)
    assert (first.value, first.written, first.takeover, first.previous) == (OURS, True, None, None)
    again = await take_node_lock(api, "n1", "default", "p1", now=NOW + datetime.timedelta(seconds=5))
    assert (again.value, again.written) == (OURS, False)  # re-entrant: nothing written
    expired = await take_node_lock(api, "n1", "default", "p2", now=NOW + datetime.timedelta(minutes=6))
    assert (expired.written, expired.takeover, expired.previous) == (True, "expired", OURS)


async def test_a_release_given_a_value_removes_only_that_value(apiserver: Emulator, api: Any) -> None:
    # the same pod re-took the lock since (a newer bind attempt): the older attempt must not free it
    newer = "2026-05-01T10:00:30Z,default,p1"
    await _node(apiserver, {NODE_LOCK: newer})
    assert await release_node_lock(api, "n1", "default", "p1", value=OURS) is False
    assert await _lock(apiserver) == newer
    assert await release_node_lock(api, "n1", "default", "p1", value=newer) is True
    assert await _lock(apiserver) is None


async def _failed_holder(k: Emulator, bind_time: str) -> None:
    body = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "holder",
            "namespace": "default",
            "annotations": {"hami.io/bind-phase": "failed", "hami.io/bind-time": bind_time},
        },
        "spec": {},
        "status": {"phase": "Pending"},
    }
    await k.post("/api/v1/namespaces/default/pods", json=body)


@pytest.mark.parametrize(
    ("bind_time", "reason"),
    [
        (str(int(NOW.timestamp()) - 60), "holder_failed"),  # failed at the lock's very second
        (str(int(NOW.timestamp()) - 30), "holder_failed"),  # failed after taking the lock
        (str(int(NOW.timestamp()) - 61), None),  # an attempt took the lock after that failure
        ("garbled", None),
    ],
    ids=["same-second", "after", "lock-is-newer", "garbled"],
)
async def test_a_holder_whose_bind_gave_up_after_taking_the_lock_loses_it(
    apiserver: Emulator, api: Any, bind_time: str, reason: str | None
) -> None:
    held = "2026-05-01T09:59:00Z,default,holder"  # NOW - 60 s
    await _node(apiserver, {NODE_LOCK: held})
    await _failed_holder(apiserver, bind_time)
    if reason is None:
        with pytest.raises(NodeLockBusy, match="by default/holder"):
            await take_node_lock(api, "n1", "default", "p1", now=NOW)
        assert await _lock(apiserver) == held
    else:
        grant = await take_node_lock(api, "n1", "default", "p1", now=NOW)
        assert (grant.value, grant.takeover) == (OURS, reason)


async def test_refresh_retakes_the_pods_own_lock_with_the_new_time(apiserver: Emulator, api: Any) -> None:
    older = "2026-05-01T09:59:00Z,default,p1"
    await _node(apiserver, {NODE_LOCK: older})
    grant = await take_node_lock(api, "n1", "default", "p1", now=NOW, refresh=True)
    assert (grant.value, grant.written, grant.previous) == (OURS, True, older)
    assert await _lock(apiserver) == OURS
    (patch,) = apiserver["patch", NODES]
    assert patch.data[0] == {"op": "test", "path": LOCK_POINTER, "value": older}  # compare-and-set
    same = await take_node_lock(api, "n1", "default", "p1", now=NOW, refresh=True)
    assert (same.value, same.written) == (OURS, True)  # the value it would write is there already
    assert len(apiserver["patch", NODES]) == 1


@pytest.mark.parametrize("value", [5, ["2026-05-01T09:59:00Z,default,holder"], {"time": "x"}])
async def test_a_lock_of_another_json_type_is_unreadable_not_free(
    apiserver: Emulator, api: Any, value: Any
) -> None:
    """A lock value that is not a string (no API server stores one; kmock does) is unreadable: never
    read as absent and overwritten, never released."""
    await apiserver.post(
        "/api/v1/nodes",
        json={
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": "n1", "annotations": {NODE_LOCK: value}},
        },
    )
    with pytest.raises(NodeLockUnreadable) as caught:
        await acquire_node_lock(api, "n1", "default", "p1", now=NOW)
    assert str(caught.value).startswith(f"node n1 has an unreadable lock: {NODE_LOCK} ")
    assert "not a string" in str(caught.value)
    assert await release_node_lock(api, "n1", "default", "p1") is False
    assert len(apiserver["patch", NODES]) == 0
    assert await _lock(apiserver) == value


@pytest.mark.parametrize(
    "holder",
    [
        {"spec": "bound", "status": {"phase": "Pending"}},  # spec not an object: unbound
        {"spec": {"nodeName": "n1"}, "status": ["Failed"]},  # status not an object: no phase
        {"spec": {}, "metadata": {"name": "holder", "namespace": "default", "annotations": ["x"]}},
    ],
    ids=["spec", "status", "annotations"],
)
async def test_a_holder_of_a_hostile_shape_keeps_its_lock(
    apiserver: Emulator, api: Any, holder: dict[str, Any]
) -> None:
    """The holder's fields of the wrong JSON type read as absent: a pending holder that may still be
    allocated here, so its fresh lock is contention (before: AttributeError)."""
    held = "2026-05-01T09:59:00Z,default,holder"
    await _node(apiserver, {NODE_LOCK: held})
    body = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "holder", "namespace": "default"},
        **holder,
    }
    await apiserver.post("/api/v1/namespaces/default/pods", json=body)
    with pytest.raises(NodeLockBusy):
        await acquire_node_lock(api, "n1", "default", "p1", now=NOW)
    assert await _lock(apiserver) == held


async def test_a_node_whose_annotations_are_not_an_object_is_locked_as_a_free_one(
    apiserver: Emulator, api: Any
) -> None:
    """Annotations that are not an object hold no lock: the compare-and-set tests the whole metadata
    and writes an annotations object with the lock (before: AttributeError)."""
    await apiserver.post(
        "/api/v1/nodes",
        json={"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n1", "annotations": ["x"]}},
    )
    assert await acquire_node_lock(api, "n1", "default", "p1", now=NOW) == OURS
    assert await _lock(apiserver) == OURS
    assert await release_node_lock(api, "n1", "default", "p1") is True
