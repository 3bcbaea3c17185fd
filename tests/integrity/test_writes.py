"""The rules on the scheduler's writes flag what they exist for, and nothing a correct bind writes."""

from __future__ import annotations

import datetime
import json
from typing import Any

from hami.annotations import BindPhase
from hami.kube.nodelock import LOCK_POINTER

from .test_checker import NOW, g, lock, node, pod, view
from .writes import problems_of_write

PHASE = "/metadata/annotations/hami.io~1bind-phase"


def body(patch: Any) -> bytes:
    return json.dumps(patch).encode()


def test_marking_a_bound_pod_failed_is_flagged_an_unbound_one_is_not() -> None:
    failed = body({"metadata": {"annotations": {"hami.io/bind-phase": "failed"}}})
    bound, unbound = pod("a", g("GPU-n1-0", 1)), pod("b", g("GPU-n1-0", 1), node_name=None)
    state = view([node()], [bound, unbound])
    assert problems_of_write(state, "pod-patch", "a", failed) == [
        "[write] the scheduler marked a failed, already bound to n1"
    ]
    assert problems_of_write(state, "pod-patch", "b", failed) == []
    as_json_patch = body([{"op": "replace", "path": PHASE, "value": "failed"}])
    assert problems_of_write(state, "pod-patch", "a", as_json_patch) == [
        "[write] the scheduler marked a failed, already bound to n1"
    ]


def test_rewriting_a_bound_pods_allocation_is_flagged_writing_the_same_is_not() -> None:
    bound = pod("a", g("GPU-n1-0", 1000))
    current = bound["metadata"]["annotations"]
    allocated = current["hami.io/vgpu-devices-allocated"]
    same = body(
        {
            "metadata": {
                "annotations": {"hami.io/vgpu-node": "n1", "hami.io/vgpu-devices-allocated": allocated}
            }
        }
    )
    other = body({"metadata": {"annotations": {"hami.io/vgpu-node": "n2"}}})
    state = view([node()], [bound])
    assert problems_of_write(state, "pod-patch", "a", same) == []
    assert problems_of_write(state, "pod-patch", "a", other) == [
        "[write] the scheduler rewrote the allocation of a, already bound to n1: "
        "{'hami.io/vgpu-node': 'n1'} -> {'hami.io/vgpu-node': 'n2'}"
    ]


def test_lock_writes_releasing_a_waiting_holder_or_taking_a_live_lock_are_flagged() -> None:
    held = lock("a")
    waiting = pod("a", g("GPU-n1-0", 1))
    state = view([node(lock=held)], [waiting])
    release = body(
        [{"op": "test", "path": LOCK_POINTER, "value": held}, {"op": "remove", "path": LOCK_POINTER}]
    )
    assert problems_of_write(state, "node-patch", "n1", release) == [
        "[write] the scheduler released the lock of n1 held by default/a, bound there and "
        "waiting for Allocate"
    ]
    takeover = body(
        [
            {"op": "test", "path": LOCK_POINTER, "value": held},
            {"op": "replace", "path": LOCK_POINTER, "value": lock("b")},
        ]
    )
    assert problems_of_write(state, "node-patch", "n1", takeover) == [
        "[write] the scheduler took over the fresh lock of n1 from live holder default/a"
    ]
    refresh = body(
        [
            {"op": "test", "path": LOCK_POINTER, "value": held},
            {"op": "replace", "path": LOCK_POINTER, "value": lock("a", NOW + datetime.timedelta(seconds=5))},
        ]
    )
    assert problems_of_write(state, "node-patch", "n1", refresh) == []
    failed = pod("a", g("GPU-n1-0", 1), node_name=None, bind_phase=BindPhase.FAILED)
    dead = view([node(lock=held)], [failed], now=NOW + datetime.timedelta(seconds=31))
    assert problems_of_write(dead, "node-patch", "n1", takeover) == []  # its holder can never be allocated
    assert problems_of_write(dead, "node-patch", "n1", release) == []
    later = view([node(lock=held)], [waiting], now=NOW + datetime.timedelta(minutes=6))
    assert problems_of_write(later, "node-patch", "n1", takeover) == []  # expired: anyone may take it
