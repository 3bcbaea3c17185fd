"""Violations the stress test found beyond the issue's five cases, each as its shrunk program."""

from __future__ import annotations

from .faults import Mode
from .program import Bind, Fault, Program, Shape
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
