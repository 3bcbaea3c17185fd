"""Two schedulers at once never over-commit (issue 24): two replicas of the extender bind side by side
(a leader hand-over, or two replicas by mistake) while one of them sees pod events late.

The late replica's pod watch delivers the pods as they were two steps earlier; the agents are fast
(each bound pod is admitted at once, so the node lock is released before the other replica's next
bind). Before bind read the node's pods under the lock (docs/scheduler.md, "What each step does",
steps 4 and 5), the late replica booked the cards the other had just granted (each test's "Was:"
is what it broke then). Nodes: ``n1`` (index 0) two cards, ``n2`` (index 1) one card; 8,000 MiB, 100 cores,
3 slots each.
"""

from __future__ import annotations

import pytest
from hypothesis import given

from .faults import Mode
from .program import Admit, Bind, Fault, Program, Shape, programs
from .test_stress import STRESS, run, stressed

pytestmark = pytest.mark.timeout(300)

HALF = Shape("app", 1, 5000, 30)  # two never fit one card
THIRD = Shape("app", 1, 3000, 30)
SLOT = Shape("app", 1, 2000, 0)  # three fit one card (its slots)
LATE = 2  # steps the second replica's pod watch is behind: it never saw the last bind and admission


def test_a_late_replica_does_not_book_the_card_the_other_just_granted() -> None:
    """Was: ``[bound] node n2 card GPU-n2-0 (default/p0, default/p1): memory 10000 > 8000 MiB``."""
    log = run(
        Program(
            shapes=(HALF, HALF),
            steps=(Bind(0, 1), Admit(0), Bind(1, 1, replica=1), Admit(1)),
            replicas=2,
            lag=LATE,
        )
    )
    assert any("bind p1 -> n2:" in line and "does not fit node n2" in line for line in log), log


def test_many_pods_bound_alternately_through_both_replicas_never_overcommit() -> None:
    """Ten one-slot pods bound through the two replicas in turn, each admitted at once, two to n1, two
    to n2, and again: 6 fit n1 and 3 fit n2 by slots. Was: ``[bound] node n2 card GPU-n2-0
    (default/p2, default/p3, default/p6, default/p7): slots 4 > 3``."""
    steps: list[Bind | Admit] = []
    for pod in range(10):
        steps += [Bind(pod, pod // 2 % 2, replica=pod % 2), Admit(pod)]
    log = run(Program(shapes=(SLOT,) * 10, steps=tuple(steps), replicas=2, lag=LATE))
    bound = [line for line in log if line.strip().startswith("bind") and line.endswith(": ok")]
    assert len(bound) == 9, log  # as many as fit: the refusals are for room, not errors


@pytest.mark.parametrize("mode", [Mode.FAIL, Mode.LOST, Mode.LATE])
def test_a_failed_read_of_the_node_pods_refuses_the_bind(mode: Mode) -> None:
    """The consistent read fails closed: the bind is refused with the reason (kube-scheduler retries),
    and the lock it took is given back, so the retry binds."""
    log = run(
        Program(
            shapes=(HALF, THIRD),
            steps=(
                Bind(0, 1),
                Admit(0),
                Bind(1, 1, (Fault("pod-list", mode),), replica=1),
                Bind(1, 1, replica=1),
                Admit(1),
            ),
            replicas=2,
            lag=LATE,
        )
    )
    outcomes = [line.strip() for line in log if line.strip().startswith("bind p1 -> n2:")]
    assert len(outcomes) == 2, log
    assert "reading the pods of node n2" in outcomes[0], log
    assert outcomes[1].endswith(": ok"), log


def test_a_late_answer_of_the_node_pods_still_decides_on_them() -> None:
    """The read's answer is held (a slow API server) while nothing else can grant on the locked node;
    released, the bind decides on it: p1 does not fit beside p0."""
    log = run(
        Program(
            shapes=(HALF, HALF),
            steps=(Bind(0, 1), Admit(0), Bind(1, 1, (Fault("pod-list", Mode.SLOW),), replica=1), Admit(1)),
            replicas=2,
            lag=LATE,
        )
    )
    assert any("bind p1 -> n2:" in line and "does not fit node n2" in line for line in log), log


@STRESS
@given(programs(replicas=2, lag=LATE))
def test_two_replicas_one_late_never_overcommit(program: Program) -> None:
    stressed(program)
