"""Violations the stress test found beyond the issue's five cases, each as its shrunk program."""

from __future__ import annotations

from .faults import Mode
from .program import Admit, Bind, Fault, Program, Release, Shape
from .test_stress import run

APP = Shape("app", 1, 3000, 30)


def test_a_late_lock_release_of_an_earlier_attempt_leaves_the_next_lock_alone() -> None:
    """Two attempts of one pod within the same second write the same lock value
    (``<time>,<namespace>,<pod>``). The first attempt fails after taking the lock (its re-read of the
    pod fails) and its release is answered 504 but lands later; by then the second attempt holds the
    lock with the identical value, so the compare-and-set of the stale release matches and removes the
    lock of a pod bound to the node and waiting for Allocate. Was:
    ``[write] the scheduler released the lock of n1 held by default/p0, bound there and waiting for
    Allocate``."""
    first = Bind(0, 0, (Fault("node-patch", Mode.LATE, 1), Fault("pod-get", Mode.FAIL, 1)))
    run(Program(shapes=(APP,), steps=(first, Bind(0, 0)), tick=0))


def test_a_late_lock_write_does_not_lock_the_node_again_after_allocate() -> None:
    """The bind's compare-and-set of the lock is answered 504 but lands later; the bind re-reads, takes
    the lock again and binds; the agent serves the pod and releases the lock; then the late write lands:
    it tested only the annotation map, which is as it was, so the lock is back, held by a pod whose every
    container was served, and blocks the node until it expires. Was: ``[lock] node n2: lock
    '2026-05-01T10:00:00Z,default,p0' outlived its holder: default/p0 has every container served``."""
    run(Program(shapes=(APP,), steps=(Bind(0, 1, (Fault("node-patch", Mode.LATE),)), Admit(0), Release(0))))


def test_a_lock_left_by_an_attempt_that_gave_up_unmarked_does_not_block_the_node() -> None:
    """p3 failed once (no room on n1: ``bind-phase=failed``). Its next bind, to n2, sends the lock's
    compare-and-set, which is answered 504 but lands later, and gives up when its re-read of the pod is
    lost, without marking the pod again (the lock's outcome was unknown). The lock, newer than the
    failure, names a failed pod with no bind in flight; past the bind timeout no attempt can still own
    it, yet it blocks n2 until the 5-minute lock timeout. Was: ``[lock] bind of probe-n2 to n2 refused
    for the node lock, whose holder default/p3 has bind-phase=failed, no bind in flight and a lock older
    than the bind timeout``."""
    exclusive, small = Shape("two", 1, 5000, 100), Shape("two", 1, 3000, 0)
    gives_up = Bind(3, 1, (Fault("pod-get", Mode.LOST, 1), Fault("node-patch", Mode.LATE)))
    run(Program(shapes=(exclusive, exclusive, exclusive, small), steps=(Bind(0, 0), Bind(3, 0), gives_up)))
