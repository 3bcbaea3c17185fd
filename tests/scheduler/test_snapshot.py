"""The snapshot alone (no API server): incremental usage, bookings, registration and handshake rules."""

from __future__ import annotations

import datetime
from typing import Any

from hami.annotations import (
    NODE_HANDSHAKE,
    NODE_LOCK,
    NODE_REGISTER,
    POD_DEVICES_ALLOCATED,
    POD_VGPU_NODE,
    decode_pod_devices,
)
from hami.core.model import NodeState
from hami.core.usage import pod_usage
from hami.scheduler.snapshot import PodRecord, Snapshot, local_time

from .kit import NOW, make_node, make_pod

LOCAL_NOW = local_time(NOW)


def _gpu_pod(name: str, node: str, devices: str, **extra: Any) -> dict[str, Any]:
    pod = make_pod(name)
    pod["metadata"]["annotations"] = {POD_VGPU_NODE: node, POD_DEVICES_ALLOCATED: devices}
    for key, value in extra.items():
        pod[key] = value
    return pod


def _state(snapshot: Snapshot, node: str) -> NodeState:
    found = snapshot.candidate(node, LOCAL_NOW)
    assert not isinstance(found, str), found
    return found


def _used(snapshot: Snapshot, node: str) -> list[tuple[int, int, int]]:
    return [(d.used, d.used_mem, d.used_cores) for d in _state(snapshot, node).devices]


def _snapshot(*nodes: dict[str, Any], **kwargs: Any) -> Snapshot:
    snapshot = Snapshot(**kwargs)
    snapshot.replace_nodes(list(nodes))
    snapshot.replace_pods([])
    return snapshot


def test_pod_events_apply_incrementally_and_idempotently() -> None:
    snapshot = _snapshot(make_node("n1"), make_node("n2"))
    other = _state(snapshot, "n2")
    pod = _gpu_pod("p", "n1", "GPU-n1-0,NVIDIA,1000,30:;")
    snapshot.pod_event("ADDED", pod)
    assert _used(snapshot, "n1") == [(1, 1000, 30), (0, 0, 0)]
    snapshot.pod_event("ADDED", pod)  # a reconnecting watch re-sends everything as ADDED
    snapshot.pod_event("MODIFIED", pod)
    assert _used(snapshot, "n1") == [(1, 1000, 30), (0, 0, 0)]
    assert _state(snapshot, "n2") is other  # an event on n1 never touches n2
    moved = _gpu_pod("p", "n1", "GPU-n1-1,NVIDIA,2000,40:;")
    snapshot.pod_event("MODIFIED", moved)
    assert _used(snapshot, "n1") == [(0, 0, 0), (1, 2000, 40)]
    snapshot.pod_event("DELETED", moved)
    assert _used(snapshot, "n1") == [(0, 0, 0), (0, 0, 0)]


def test_which_pods_count() -> None:
    snapshot = _snapshot(make_node("n1", cards=1))
    done = _gpu_pod("done", "n1", "GPU-n1-0,NVIDIA,100,1:;", status={"phase": "Succeeded"})
    deleting = _gpu_pod("deleting", "n1", "GPU-n1-0,NVIDIA,200,2:;")
    deleting["metadata"]["deletionTimestamp"] = "2026-05-01T09:00:00Z"
    failed_unbound = _gpu_pod("failed", "n1", "GPU-n1-0,NVIDIA,400,4:;")
    failed_unbound["metadata"]["annotations"]["hami.io/bind-phase"] = "failed"
    failed_bound = _gpu_pod("failed-bound", "n1", "GPU-n1-0,NVIDIA,800,8:;")
    failed_bound["metadata"]["annotations"]["hami.io/bind-phase"] = "failed"
    failed_bound["spec"]["nodeName"] = "n1"
    garbled = _gpu_pod("garbled", "n1", "GPU-n1-0,NVIDIA:;")
    unknown_card = _gpu_pod("elsewhere", "n1", "GPU-other,NVIDIA,1600,16:;")
    for pod in (done, deleting, failed_unbound, failed_bound, garbled, unknown_card):
        snapshot.pod_event("ADDED", pod)
    # counted: deleting (200/2) and failed-bound (800/8); the unknown card is ignored
    assert _used(snapshot, "n1") == [(2, 1000, 10)]


def test_init_containers_drop_out_once_they_succeeded() -> None:
    snapshot = _snapshot(make_node("n1", cards=1))
    pod = _gpu_pod("p", "n1", "GPU-n1-0,NVIDIA,5000,20:;GPU-n1-0,NVIDIA,4000,20:;")
    pod["spec"]["initContainers"] = [{"name": "init", "image": "x"}]
    snapshot.pod_event("ADDED", pod)
    assert _used(snapshot, "n1") == [(1, 5000, 20)]  # max(init, app) per field, one slot
    pod["status"]["initContainerStatuses"] = [{"name": "init", "state": {"terminated": {"exitCode": 0}}}]
    snapshot.pod_event("MODIFIED", pod)
    assert _used(snapshot, "n1") == [(1, 4000, 20)]
    del pod["status"]["initContainerStatuses"]
    snapshot.pod_event("MODIFIED", pod)  # sticky: it never re-inflates
    assert _used(snapshot, "n1") == [(1, 4000, 20)]


def test_bookings_win_until_confirmed_and_cancel_restores() -> None:
    snapshot = _snapshot(make_node("n1", cards=1))
    text = "GPU-n1-0,NVIDIA,3000,30:;"
    booked = PodRecord(
        node="n1", usage=pod_usage(decode_pod_devices(text), 0, init_done=False), allocated=text
    )
    snapshot.pod_event("ADDED", make_pod("p"))  # the pod as the watch knows it: no allocation yet
    snapshot.book(("default", "p"), booked)
    assert _used(snapshot, "n1") == [(1, 3000, 30)]
    snapshot.pod_event("MODIFIED", make_pod("p"))  # a late event from before the bind's patch
    assert _used(snapshot, "n1") == [(1, 3000, 30)]
    snapshot.pod_event("MODIFIED", _gpu_pod("p", "n1", text))  # the patch arrives: confirmed
    snapshot.cancel(("default", "p"))  # nothing left to cancel: the observed record stays
    assert _used(snapshot, "n1") == [(1, 3000, 30)]
    snapshot.book(("default", "q"), PodRecord(node="n1", usage=booked.usage, allocated=text))
    assert _used(snapshot, "n1") == [(2, 6000, 60)]
    snapshot.cancel(("default", "q"))
    assert _used(snapshot, "n1") == [(1, 3000, 30)]


def test_a_pods_own_usage_is_left_out_when_deciding_for_it() -> None:
    snapshot = _snapshot(make_node("n1", cards=1))
    snapshot.pod_event("ADDED", _gpu_pod("p", "n1", "GPU-n1-0,NVIDIA,3000,30:;"))
    own = snapshot.candidate("n1", LOCAL_NOW, exclude=("default", "p"))
    assert not isinstance(own, str)
    assert own.devices[0].used_mem == 0
    assert _used(snapshot, "n1") == [(1, 3000, 30)]


def test_registration_changes_rebuild_usage_and_late_nodes_get_their_pods() -> None:
    snapshot = _snapshot()
    snapshot.pod_event("ADDED", _gpu_pod("p", "n1", "GPU-n1-1,NVIDIA,1000,10:;"))
    assert snapshot.problem("n1", LOCAL_NOW) == "node unregistered"
    snapshot.node_event("ADDED", make_node("n1", cards=1))
    assert _used(snapshot, "n1") == [(0, 0, 0)]  # card 1 is not registered yet
    snapshot.node_event("MODIFIED", make_node("n1", cards=2))
    assert _used(snapshot, "n1") == [(0, 0, 0), (1, 1000, 10)]


def test_relists_forget_what_is_gone() -> None:
    snapshot = _snapshot(make_node("n1", cards=1), make_node("n2"))
    snapshot.pod_event("ADDED", _gpu_pod("p", "n1", "GPU-n1-0,NVIDIA,1000,10:;"))
    snapshot.replace_pods([])
    snapshot.replace_nodes([make_node("n1", cards=1)])
    assert _used(snapshot, "n1") == [(0, 0, 0)]
    assert snapshot.problem("n2", LOCAL_NOW) == "node unregistered"


def test_malformed_registrations_are_reported_once_per_text() -> None:
    reports: list[tuple[str, str]] = []
    snapshot = _snapshot(
        on_malformed=lambda node, message: reports.append((node["metadata"]["name"], message))
    )
    bad = make_node("bad", register="[{]")
    snapshot.node_event("ADDED", bad)
    snapshot.node_event("MODIFIED", bad)
    snapshot.node_event("ADDED", make_node("empty", register="[]"))  # no cards: excluded, not malformed
    snapshot.node_event("ADDED", make_node("missing", annotations={}))
    missing = make_node("missing")
    del missing["metadata"]["annotations"][NODE_REGISTER]
    snapshot.node_event("MODIFIED", missing)
    assert [name for name, _ in reports] == ["bad"]
    assert str(snapshot.problem("bad", LOCAL_NOW)).startswith(
        'node unregistered: hami.io/node-nvidia-register "[{]"'
    )
    assert str(snapshot.problem("empty", LOCAL_NOW)).endswith("no gpu found on node")
    assert str(snapshot.problem("missing", LOCAL_NOW)).endswith(
        "annos not found hami.io/node-nvidia-register"
    )
    snapshot.node_event("MODIFIED", make_node("bad"))
    assert snapshot.problem("bad", LOCAL_NOW) is None


def test_handshake_requests_and_stale_nodes() -> None:
    asked: list[str] = []
    snapshot = _snapshot(on_handshake=asked.append)
    fresh = make_node("fresh")
    del fresh["metadata"]["annotations"][NODE_HANDSHAKE]
    snapshot.node_event("ADDED", fresh)
    snapshot.node_event("ADDED", make_node("answered"))
    assert asked == ["fresh"]
    assert snapshot.needs_handshake() == ["fresh"]
    stamp = (LOCAL_NOW - datetime.timedelta(seconds=61)).strftime("%Y-%m-%d %H:%M:%S")
    stale = make_node("stale", annotations={NODE_HANDSHAKE: f"Requesting_{stamp}"})
    stale["status"]["allocatable"] = {"nvidia.com/gpu": "0"}
    snapshot.node_event("ADDED", stale)
    assert "allocatable is 0" in str(snapshot.problem("stale", LOCAL_NOW))
    assert snapshot.problem("stale", NOW) == snapshot.problem("stale", LOCAL_NOW)  # aware times convert
    # inside the window it is still fine
    assert snapshot.problem("stale", LOCAL_NOW - datetime.timedelta(seconds=2)) is None
    stale["status"]["allocatable"] = {"nvidia.com/gpu": "20"}
    snapshot.node_event("MODIFIED", stale)
    assert snapshot.problem("stale", LOCAL_NOW) is None


async def test_lock_changes_wake_waiters() -> None:
    snapshot = _snapshot(make_node("n1"))
    waiter = snapshot.lock_change("n1")
    snapshot.node_event("MODIFIED", make_node("n1"))  # nothing about the lock changed
    assert not waiter.done()
    snapshot.node_event(
        "MODIFIED", make_node("n1", annotations={NODE_LOCK: "2026-05-01T10:00:00Z,default,p"})
    )
    assert waiter.done()
    assert snapshot.lock_of("n1") == "2026-05-01T10:00:00Z,default,p"
