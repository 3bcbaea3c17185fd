"""The five over-commit cases of the allocation-integrity issue, as minimal stress programs.

Each program was found by the stress test (and shrunk) on the code before the fixes, where it breaks
the rule named in its test; each must now run clean through the same world and checks as
``test_stress``. Shapes: ``Shape(layout, cards, MiB, cores)`` per GPU container; nodes ``n1`` (index 0,
two cards) and ``n2`` (index 1, one card).
"""

from __future__ import annotations

from .faults import Mode
from .program import Admit, Bind, Fault, Kill, Program, Release, Shape
from .test_stress import run

APP = Shape("app", 1, 3000, 30)


def test_case1_a_stale_bind_never_rewrites_a_pod_bound_elsewhere() -> None:
    """Was: ``[write] the scheduler rewrote the allocation of p0, already bound to n2`` and marked it
    failed. The first bind's read is held until kube-scheduler (its deadline passed) bound p0 to n2."""
    run(
        Program(
            shapes=(APP, APP),
            steps=(Bind(0, 0, (Fault("pod-get", Mode.HOLD),)), Bind(0, 1), Admit(0), Release(0)),
        )
    )


def test_case1_a_retried_bind_to_another_node_leaves_the_served_pod_alone() -> None:
    """Was: ``[served-match] pod default/p1 admitted on n2 but vgpu-node is 'n1'``."""
    two = Shape("two", 1, 3000, 30)
    run(Program(shapes=(APP, two), steps=(Bind(1, 1), Admit(1), Bind(1, 0))))


def test_case2_a_lost_binding_answer_keeps_the_bound_pod_and_its_lock() -> None:
    """Was: ``[write] the scheduler marked p0 failed, already bound to n1`` and released its lock, so
    p1 took the lock and the agent handed p1's grant to p0."""
    run(
        Program(
            shapes=(APP, APP),
            steps=(Bind(0, 0, (Fault("binding", Mode.LOST),)), Bind(1, 0), Admit(0), Admit(1)),
        )
    )


def test_case2_a_repeated_bind_of_a_bound_pod_writes_nothing() -> None:
    """Was: the second bind got 409 from the Binding, released the lock and marked the pod failed."""
    run(Program(shapes=(APP,), steps=(Bind(0, 0), Bind(0, 0), Admit(0))))


def test_case3_a_late_allocation_write_leaves_no_phantom_usage() -> None:
    """Was: ``[phantom] ... counts (2000, 1, 0) on n2/GPU-n2-0; the pods that run there hold (0, 0, 0)``."""
    run(Program(shapes=(Shape("app", 1, 2000, 0),), steps=(Bind(0, 1, (Fault("pod-patch", Mode.LATE),)),)))


def test_case3_a_bind_killed_midway_leaves_no_phantom_usage() -> None:
    """Was: ``[phantom] ... counts (3000, 1, 30) on n2/GPU-n2-0; the pods that run there hold (0, 0, 0)``.
    The scheduler dies after its allocation write landed, before the Binding: the pod stays unbound
    with ``bind-phase=allocating`` and must stop counting after the allocating horizon."""
    run(Program(shapes=(APP,), steps=(Bind(0, 1, (Fault("pod-patch", Mode.SLOW),)), Kill())))


def test_case4_an_init_only_pod_takes_the_lock_and_gets_its_own_grant() -> None:
    """Was: ``[served-match] pod default/p0 container #0 was served [('GPU-n2-0', 3000, 0)] but its
    vgpu-devices-allocated holds [('GPU-n2-0', 3000, 60)]`` (bound without the lock, paired with p1)."""
    init_only = Shape("init", 1, 3000, 60)
    mixed = Shape("mixed", 1, 3000, 0)
    run(Program(shapes=(init_only, mixed), steps=(Bind(1, 1), Bind(0, 1))))


def test_case5_a_lock_whose_holder_failed_admission_does_not_block_the_node() -> None:
    """Was: ``[lock] bind of probe-n1 to n1 refused for the node lock, whose holder default/p0 is
    Failed`` (the agent's release failed with the node read)."""
    run(Program(shapes=(APP,), steps=(Bind(0, 0), Admit(0, (Fault("node-get", Mode.LOST, 1),)))))


def test_case5_a_lock_whose_holder_is_bound_elsewhere_does_not_block_the_node() -> None:
    """A scheduler killed after taking n1's lock for p0; its successor binds p0 to n2."""
    run(Program(shapes=(APP,), steps=(Bind(0, 0, (Fault("binding", Mode.HOLD),)), Kill(), Bind(0, 1))))


def test_case5_a_lock_whose_bind_gave_up_does_not_block_the_node() -> None:
    """The lock's compare-and-set lands after the bind gave up on it (answer lost, then the re-read
    failed): the holder has ``bind-phase=failed`` and no bind in flight."""
    run(
        Program(
            shapes=(APP,),
            steps=(Bind(0, 0, (Fault("node-patch", Mode.LATE), Fault("node-get", Mode.LATE, 1))),),
        )
    )
