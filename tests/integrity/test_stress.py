"""Property-based stress: random interleavings of binds, lost and late answers, Allocate calls, kills,
deletes and recreations against the real scheduler and node agent on the embedded API server; after
every step the invariants of ``checker`` and ``world`` must hold (no card over memory, cores or slots;
Allocate hands every pod its own grant; no lock outlives its holder; no phantom usage at the end).

Four profiles, 50 programs each (200 interleavings per run), derandomized so CI draws the same programs
every time; a failing program is printed as pasteable Python (``program = Program(...)``) with the log
of what happened, and hypothesis shrinks it first.
"""

from __future__ import annotations

import asyncio
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from .faults import Mode
from .program import (
    AGENT_KINDS,
    SCHEDULER_KINDS,
    Admit,
    Advance,
    Bind,
    Delete,
    Fault,
    Finish,
    Kill,
    Program,
    Recreate,
    Release,
    Step,
    faults,
    programs,
    shapes,
)
from .world import World

EXAMPLES = int(__import__("os").environ.get("INTEGRITY_EXAMPLES", "50"))
STRESS = settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


def run(program: Program) -> list[str]:
    with tempfile.TemporaryDirectory(prefix="integrity-") as workdir:
        return asyncio.run(World(program, Path(workdir)).run())


@STRESS
@given(programs())
def test_mixed_programs_keep_every_invariant(program: Program) -> None:
    run(program)


def _profile(
    *steps: st.SearchStrategy[Step], pods: int = 4, max_steps: int = 16
) -> st.SearchStrategy[Program]:
    return st.builds(
        Program,
        st.lists(shapes(), min_size=pods, max_size=pods).map(tuple),
        st.lists(st.one_of(*steps), min_size=1, max_size=max_steps).map(tuple),
    )


POD = st.integers(0, 3)
NODE = st.integers(0, 1)
FAULTY_BIND = st.builds(
    Bind,
    POD,
    NODE,
    st.lists(
        st.builds(Fault, st.sampled_from(SCHEDULER_KINDS), st.sampled_from(list(Mode)), st.integers(0, 1)),
        min_size=1,
        max_size=2,
    ).map(tuple),
)
BIND = st.builds(Bind, POD, NODE, faults(SCHEDULER_KINDS))
ADMIT = st.builds(Admit, NODE, POD, faults(AGENT_KINDS))
RELEASE = st.builds(Release, st.integers(0, 3))


@STRESS
@given(_profile(FAULTY_BIND, FAULTY_BIND, BIND, ADMIT, RELEASE, RELEASE))
def test_lost_and_late_answers_never_overcommit(program: Program) -> None:
    run(program)


@STRESS
@given(_profile(BIND, BIND, ADMIT, RELEASE, st.just(Kill()), st.builds(Advance, st.sampled_from((60, 400)))))
def test_kills_and_lock_expiry_never_overcommit(program: Program) -> None:
    run(program)


@STRESS
@given(
    _profile(
        BIND,
        BIND,
        ADMIT,
        RELEASE,
        st.builds(Delete, POD),
        st.builds(Recreate, POD),
        st.builds(Finish, POD),
    )
)
def test_deletes_recreations_and_completions_never_overcommit(program: Program) -> None:
    run(program)
