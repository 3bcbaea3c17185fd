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
from hami.annotations.holding import allocating_until
from hami.core.model import NodeState
from hami.core.rejection import Reason
from hami.core.usage import pod_usage
from hami.scheduler.nodecache import MAX_PENDING
from hami.scheduler.snapshot import PodRecord, Snapshot, local_time
from tests.builders import NOW, hostile_nodes, make_node, make_pod, nameless_node

LOCAL_NOW = local_time(NOW)


def _gpu_pod(name: str, node: str, devices: str, **extra: Any) -> dict[str, Any]:
    pod = make_pod(name)
    pod["metadata"]["annotations"] = {POD_VGPU_NODE: node, POD_DEVICES_ALLOCATED: devices}
    for key, value in extra.items():
        pod[key] = value
    return pod


def _state(snapshot: Snapshot, node: str) -> NodeState:
    found = snapshot.candidate(node, LOCAL_NOW)
    assert isinstance(found, NodeState), found
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


def test_a_long_pod_list_on_one_node_books_every_pod_exactly() -> None:
    """A list books its pods without building the node's state per pod (the changes are folded when the
    state is read, or every MAX_PENDING of them): each way of reading the view (the verbs' walk, the
    node entries, one node's state) sees every pod, and events after the list count as before."""
    snapshot = _snapshot(make_node("n1", count=1000, memory=10**6), make_node("n2"))
    pods = [
        _gpu_pod(f"p{i}", "n1", f"GPU-n1-{i % 2},NVIDIA,{100 + i},{i % 3}:;")
        for i in range(3 * MAX_PENDING + 5)
    ]
    snapshot.replace_pods(pods)
    assert len(snapshot.nodes._pending.get("n1", ())) <= MAX_PENDING  # bounded while nobody reads
    used = [
        [
            len(pods[card::2]),
            sum(100 + i for i in range(card, len(pods), 2)),
            sum(i % 3 for i in range(card, len(pods), 2)),
        ]
        for card in (0, 1)
    ]
    (state,) = snapshot.candidates(["n1"], LOCAL_NOW).states
    assert [[d.used, d.used_mem, d.used_cores] for d in state.devices] == used
    snapshot.pod_event("DELETED", pods[0])  # card 0: 100 MiB, 0 cores
    used[0] = [used[0][0] - 1, used[0][1] - 100, used[0][2]]
    (entry,) = [e for e in snapshot.entries() if e.name == "n1"]
    assert entry.state is not None
    assert [[d.used, d.used_mem, d.used_cores] for d in entry.state.devices] == used
    snapshot.pod_event("MODIFIED", _gpu_pod("p1", "n1", "GPU-n1-0,NVIDIA,101,1:;"))  # card 1 -> card 0
    used = [
        [used[0][0] + 1, used[0][1] + 101, used[0][2] + 1],
        [used[1][0] - 1, used[1][1] - 101, used[1][2] - 1],
    ]
    assert [list(figures) for figures in _used(snapshot, "n1")] == used


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
    assert isinstance(own, NodeState)
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


def test_a_relist_keeps_the_bookings_made_after_it_was_taken() -> None:
    """docs/scheduler.md, "The live view of the cluster": a pod booked after the list was taken (created
    after it, so not in it) still counts when the list arrives; a booking older than the list whose pod
    the list lacks is forgotten (the pod was deleted). Was: both forgotten, the cards free until the
    watch caught up (tests/integrity/test_relist.py: a quota over-committed)."""
    text = "GPU-n1-0,NVIDIA,3000,30:;"
    record = PodRecord(
        node="n1", usage=pod_usage(decode_pod_devices(text), 0, init_done=False), allocated=text
    )
    snapshot = _snapshot(make_node("n1", cards=1))
    snapshot.book(("default", "old"), record)  # its pod is deleted before the list is taken
    snapshot.pods_listing()
    snapshot.book(("default", "new"), record)
    snapshot.replace_pods([])
    assert _used(snapshot, "n1") == [(1, 3000, 30)]
    assert snapshot.record(("default", "new")) == record
    assert snapshot.record(("default", "old")) is None
    snapshot.replace_pods([])  # a later list with no listing mark: nothing booked since it
    assert _used(snapshot, "n1") == [(0, 0, 0)]


def test_a_booking_kept_by_a_relist_goes_when_the_watch_never_shows_its_pod() -> None:
    """A booking made after the list was taken, for a pod deleted before the API server took the list:
    the list lacks it and the watch that follows (from the list's resourceVersion, after the deletion)
    never shows it. It counts for one allocating horizon, then goes; a pod the watch shows stays booked.
    Was: counted until some later relist (found by review)."""
    text = "GPU-n1-0,NVIDIA,3000,30:;"
    record = PodRecord(
        node="n1", usage=pod_usage(decode_pod_devices(text), 0, init_done=False), allocated=text
    )
    now = [NOW]
    snapshot = _snapshot(make_node("n1", cards=1), clock=lambda: now[0])
    snapshot.pods_listing()
    snapshot.book(("default", "gone"), record)  # then force-deleted before the list is taken
    snapshot.book(("default", "new"), record)  # created after the list was taken
    snapshot.replace_pods([])
    snapshot.pod_event("ADDED", make_pod("new"))  # the watch shows "new" (not yet bound), never "gone"
    assert _used(snapshot, "n1") == [(2, 6000, 60)]
    now[0] = NOW + datetime.timedelta(seconds=59)
    assert snapshot.record(("default", "gone")) == record
    now[0] = NOW + datetime.timedelta(seconds=60)  # the allocating horizon (2 x the bind timeout)
    snapshot.current()
    assert snapshot.record(("default", "gone")) is None
    assert snapshot.record(("default", "new")) == record
    assert _used(snapshot, "n1") == [(1, 3000, 30)]


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


def test_each_handshake_change_is_acted_on_while_an_unchanged_one_is_decoded_once() -> None:
    """The handshake is decoded once per text; every change of it, or of the allocatable count beside
    an unchanged text, still counts."""
    asked: list[str] = []
    snapshot = _snapshot(on_handshake=asked.append)
    stamp = (LOCAL_NOW - datetime.timedelta(seconds=61)).strftime("%Y-%m-%d %H:%M:%S")
    node = make_node("n1", annotations={NODE_HANDSHAKE: f"Requesting_{stamp}"})
    node["status"]["allocatable"] = {"nvidia.com/gpu": "20"}
    snapshot.node_event("ADDED", node)
    assert snapshot.problem("n1", LOCAL_NOW) is None
    assert snapshot.needs_handshake() == []
    node["status"]["allocatable"] = {"nvidia.com/gpu": "0"}  # the same text: stale now
    snapshot.node_event("MODIFIED", node)
    assert "allocatable is 0" in str(snapshot.problem("n1", LOCAL_NOW))
    node["metadata"]["annotations"][NODE_HANDSHAKE] = f"Reported {stamp}"  # the agent answered
    snapshot.node_event("MODIFIED", node)
    assert asked == ["n1"]
    assert snapshot.needs_handshake() == ["n1"]
    assert snapshot.problem("n1", LOCAL_NOW) is None  # only a Requesting stamp makes a node stale
    snapshot.node_event("MODIFIED", node)  # unchanged: not asked again
    assert asked == ["n1"]
    later = (LOCAL_NOW - datetime.timedelta(seconds=1)).strftime("%Y-%m-%d %H:%M:%S")
    node["metadata"]["annotations"][NODE_HANDSHAKE] = f"Requesting_{later}"  # our request landed
    snapshot.node_event("MODIFIED", node)
    assert snapshot.needs_handshake() == []
    assert snapshot.problem("n1", LOCAL_NOW) is None  # inside the window of the new stamp
    assert "allocatable is 0" in str(snapshot.problem("n1", LOCAL_NOW + datetime.timedelta(seconds=60)))


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


def _allocating(name: str, node: str, devices: str, bind_time: str | None, **extra: Any) -> dict[str, Any]:
    """A pod whose bind wrote its grant (bind-phase allocating) and is not bound yet."""
    pod = _gpu_pod(name, node, devices, **extra)
    pod["metadata"]["annotations"]["hami.io/bind-phase"] = "allocating"
    if bind_time is not None:
        pod["metadata"]["annotations"]["hami.io/bind-time"] = bind_time
    return pod


def _seconds(delta: int) -> str:
    return str(int(NOW.timestamp()) + delta)


def test_an_unbound_allocation_counts_until_the_horizon_then_never_again() -> None:
    now = [NOW]
    snapshot = _snapshot(make_node("n1", cards=1), clock=lambda: now[0])
    young = _allocating("young", "n1", "GPU-n1-0,NVIDIA,1000,10:;", _seconds(-30))
    snapshot.pod_event("ADDED", young)
    assert _used(snapshot, "n1") == [(1, 1000, 10)]
    now[0] = NOW + datetime.timedelta(seconds=29)
    assert _used(snapshot, "n1") == [(1, 1000, 10)]
    now[0] = NOW + datetime.timedelta(seconds=30)  # bind-time + 60 s: no bind can still be running
    assert _used(snapshot, "n1") == [(0, 0, 0)]
    assert snapshot.tracked_count() == 0
    snapshot.pod_event("MODIFIED", young)  # a late event (or a late write) does not bring it back
    assert _used(snapshot, "n1") == [(0, 0, 0)]
    young["spec"]["nodeName"] = "n1"  # its Binding did happen after all: a bound pod always counts
    snapshot.pod_event("MODIFIED", young)
    assert _used(snapshot, "n1") == [(1, 1000, 10)]


def test_only_unbound_allocating_pods_expire() -> None:
    snapshot = _snapshot(make_node("n1", cards=1), clock=lambda: NOW + datetime.timedelta(hours=1))
    old = _seconds(-3600)
    success = _allocating("success", "n1", "GPU-n1-0,NVIDIA,100,1:;", old)
    success["metadata"]["annotations"]["hami.io/bind-phase"] = "success"
    plain = _gpu_pod("filtered", "n1", "GPU-n1-0,NVIDIA,200,2:;")  # HAMi's Filter-time annotations
    bound = _allocating("bound", "n1", "GPU-n1-0,NVIDIA,400,4:;", old)
    bound["spec"]["nodeName"] = "n1"
    no_time = _allocating("no-time", "n1", "GPU-n1-0,NVIDIA,800,8:;", None)
    garbled_time = _allocating("garbled-time", "n1", "GPU-n1-0,NVIDIA,1600,16:;", "soon")
    expired = _allocating("expired", "n1", "GPU-n1-0,NVIDIA,3200,32:;", old)
    for pod in (success, plain, bound, no_time, garbled_time, expired):
        snapshot.pod_event("ADDED", pod)
    # counted: success (100/1), filtered (200/2), bound (400/4); an allocating pod without a
    # readable bind-time has no bind in flight either
    assert _used(snapshot, "n1") == [(3, 700, 7)]


def test_without_a_clock_unbound_allocations_keep_counting() -> None:
    snapshot = _snapshot(make_node("n1", cards=1))
    snapshot.pod_event("ADDED", _allocating("p", "n1", "GPU-n1-0,NVIDIA,1000,10:;", _seconds(-3600)))
    assert _used(snapshot, "n1") == [(1, 1000, 10)]
    snapshot.expire(NOW)  # the caller may still expire them with its own time
    assert _used(snapshot, "n1") == [(1, 1000, 10)]  # nothing was scheduled to expire without a clock


def test_a_restart_rebuilds_the_same_view_from_a_list() -> None:
    now = [NOW]
    pods = [
        _allocating("young", "n1", "GPU-n1-0,NVIDIA,1000,10:;", _seconds(-10)),
        _allocating("old", "n1", "GPU-n1-0,NVIDIA,2000,20:;", _seconds(-70)),
        _gpu_pod("bound", "n1", "GPU-n1-0,NVIDIA,4000,40:;", spec={"nodeName": "n1", "containers": []}),
    ]
    live = _snapshot(make_node("n1", cards=1), clock=lambda: now[0])
    for pod in pods:
        live.pod_event("ADDED", pod)
    rebuilt = Snapshot(clock=lambda: now[0])
    rebuilt.replace_nodes([make_node("n1", cards=1)])
    rebuilt.replace_pods(pods)
    assert _used(live, "n1") == _used(rebuilt, "n1") == [(2, 5000, 50)]
    now[0] = NOW + datetime.timedelta(seconds=50)
    assert _used(live, "n1") == _used(rebuilt, "n1") == [(1, 4000, 40)]


def test_a_pod_bound_to_another_node_than_its_grant_does_not_count() -> None:
    snapshot = _snapshot(make_node("n1", cards=1), make_node("n2", cards=1))
    moved = _gpu_pod("moved", "n1", "GPU-n1-0,NVIDIA,1000,10:;", spec={"nodeName": "n2", "containers": []})
    snapshot.pod_event("ADDED", moved)
    assert _used(snapshot, "n1") == [(0, 0, 0)]
    assert _used(snapshot, "n2") == [(0, 0, 0)]


def test_allocating_until_is_the_bind_time_plus_the_horizon() -> None:
    pod = _allocating("p", "n1", "GPU-n1-0,NVIDIA,1000,10:;", _seconds(0))
    assert allocating_until(pod) == NOW + datetime.timedelta(seconds=60)
    assert allocating_until(pod, datetime.timedelta(seconds=5)) == NOW + datetime.timedelta(seconds=5)
    pod["spec"]["nodeName"] = "n1"
    assert allocating_until(pod) is None
    assert allocating_until(_gpu_pod("q", "n1", "GPU-n1-0,NVIDIA,1000,10:;")) is None
    huge = _allocating("h", "n1", "GPU-n1-0,NVIDIA,1000,10:;", "9" * 30)  # out of range: long past
    until = allocating_until(huge)
    assert until is not None and until < NOW


def test_a_node_of_a_hostile_shape_is_excluded_and_the_others_work() -> None:
    """A node whose registration is not a string, whose annotations or allocatable are not objects,
    or whose metadata is not an object is excluded with a reason saying which field (the doctor and
    ``hami simulate --kubeconfig`` read such lists through the snapshot without a watcher's skip)."""
    reports: list[str] = []
    snapshot = _snapshot(on_malformed=lambda node, message: reports.append(message))
    snapshot.replace_nodes([make_node("good"), *hostile_nodes(), nameless_node()])
    snapshot.replace_pods([_gpu_pod("p", "good", "GPU-good-0,NVIDIA,1000,30:;")])
    assert _used(snapshot, "good") == [(1, 1000, 30), (0, 0, 0)]
    problems = {
        name: snapshot.exclusion(name, LOCAL_NOW)
        for name in ("int-register", "list-annotations", "string-allocatable")
    }
    assert snapshot.needs_handshake() == []  # no handshake is written to a node of a hostile shape
    for name, rejection in problems.items():
        assert rejection is not None and rejection.reasons == {Reason.NODE_MALFORMED: 1}, (name, rejection)
    assert problems["int-register"] is not None
    assert f"{NODE_REGISTER} is not a string" in problems["int-register"].message
    assert problems["list-annotations"] is not None
    assert "metadata.annotations is not an object" in problems["list-annotations"].message
    assert problems["string-allocatable"] is not None
    assert "status.allocatable is not an object" in problems["string-allocatable"].message
    assert [e.name for e in snapshot.entries() if e.state is not None] == ["good"]
    assert len(reports) == 3  # each named node reported once; the nameless one has no name to report
    snapshot.node_event("MODIFIED", make_node("int-register"))  # repaired: usable again
    assert snapshot.exclusion("int-register", LOCAL_NOW) is None


def test_a_pod_of_a_hostile_shape_is_read_not_raised_on() -> None:
    """A pod whose metadata, spec or status is not an object (kube-apiserver never stores one) holds no
    card and breaks nothing: the fragmentation workload and the holding rule read it as absent fields."""
    snapshot = _snapshot(make_node("n1"))
    for field in ("metadata", "spec", "status"):
        pod = _gpu_pod("p", "n1", "GPU-n1-0,NVIDIA,1000,30:;")
        pod[field] = "not an object"
        snapshot.pod_event("ADDED", pod)
    assert set(snapshot.tracked()) == {("default", "p")}  # spec or status odd: its grant still counts
    assert _used(snapshot, "n1") == [(1, 1000, 30), (0, 0, 0)]
