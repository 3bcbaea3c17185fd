"""A stress program as data: pod shapes and a list of steps, and the hypothesis strategies that draw them.

Steps name pods and nodes by number (taken modulo what exists) and parked requests by position in the
list of requests still parked, so every drawn program is valid, shrinks well, and a failing one prints
as Python that can be pasted into a regression test::

    Program(shapes=(Shape("app", 1, 3000, 30), ...),
            steps=(Bind(0, 0, (Fault("binding", Mode.LOST),)), Admit(0), Release(0), Kill(), ...))

Steps: ``Bind`` (kube-scheduler calls the extender's ``/bind``; faults armed on that bind's requests),
``Admit`` (the kubelet of the pod's node admits it: GetPreferredAllocation + Allocate per GPU
container; faults armed on the agent's requests), ``Release`` (a parked request or answer goes through),
``Delete``, ``Recreate`` (same name, new uid), ``Finish`` (a running pod Succeeded), ``Kill`` (a
scheduler replica dies at once and a new one starts from a fresh list), ``Advance`` (the clock moves on).
With ``Program.replicas`` = 2 two scheduler replicas serve binds side by side (``Bind.replica``); with
``Program.lag`` the last replica's pod watch is that many steps late (a leader hand-over, a slow watch).
"""

from __future__ import annotations

from dataclasses import dataclass

from hypothesis import strategies as st

from .faults import Mode

#: The requests a bind makes, and those an Allocate makes (see ``faults.classify``).
SCHEDULER_KINDS = ("pod-get", "pod-patch", "binding", "node-get", "node-patch", "pod-list")
AGENT_KINDS = ("pod-get", "pod-patch", "node-get", "node-patch", "pod-list")
LAYOUTS = ("app", "two", "init", "mixed")  # one GPU container; two; GPU only in init; init and app


@dataclass(frozen=True, slots=True)
class Fault:
    kind: str
    mode: Mode
    skip: int = 0  # matching requests of this bind/Allocate let through first

    def __repr__(self) -> str:
        tail = f", {self.skip}" if self.skip else ""
        return f"Fault({self.kind!r}, Mode.{self.mode.name}{tail})"


@dataclass(frozen=True, slots=True)
class Shape:
    """A pod's GPU request: ``layout`` (see :data:`LAYOUTS`), then per GPU container cards/MiB/cores."""

    layout: str
    gpus: int
    memory: int
    cores: int

    def __repr__(self) -> str:
        return f"Shape({self.layout!r}, {self.gpus}, {self.memory}, {self.cores})"


@dataclass(frozen=True, slots=True)
class Bind:
    pod: int
    node: int
    faults: tuple[Fault, ...] = ()
    replica: int = 0  # which scheduler replica kube-scheduler calls (modulo ``Program.replicas``)

    def __repr__(self) -> str:
        tail = f", replica={self.replica}" if self.replica else ""
        return f"Bind(pod={self.pod}, node={self.node}, faults={self.faults!r}{tail})"


@dataclass(frozen=True, slots=True)
class Admit:
    pod: int  # admitted by the kubelet of the node it is bound to (a no-op when unbound or not Pending)
    faults: tuple[Fault, ...] = ()


@dataclass(frozen=True, slots=True)
class Release:
    index: int


@dataclass(frozen=True, slots=True)
class Delete:
    pod: int


@dataclass(frozen=True, slots=True)
class Recreate:
    pod: int


@dataclass(frozen=True, slots=True)
class Finish:
    pod: int


@dataclass(frozen=True, slots=True)
class Kill:
    replica: int = 0


@dataclass(frozen=True, slots=True)
class Advance:
    seconds: int


Step = Bind | Admit | Release | Delete | Recreate | Finish | Kill | Advance


@dataclass(frozen=True, slots=True)
class Program:
    shapes: tuple[Shape, ...]
    steps: tuple[Step, ...]
    tick: int = 1  # seconds the clock moves with every step (0: all steps within one second)
    replicas: int = 1  # scheduler replicas running side by side, each with its own snapshot
    lag: int = 0  # with replicas > 1: the last replica's pod watch delivers this many steps late


# ------------------------------------------------------------------------------------- strategies
def fault(kinds: tuple[str, ...]) -> st.SearchStrategy[Fault]:
    return st.builds(Fault, st.sampled_from(kinds), st.sampled_from(list(Mode)), st.integers(0, 1))


def faults(kinds: tuple[str, ...]) -> st.SearchStrategy[tuple[Fault, ...]]:
    """None (a third of the time), or one or two faults."""
    return st.one_of(
        st.just(()), st.lists(fault(kinds), min_size=1, max_size=2).map(tuple), st.tuples(fault(kinds))
    )


def shapes() -> st.SearchStrategy[Shape]:
    return st.builds(
        Shape,
        st.sampled_from(LAYOUTS),
        st.sampled_from((1, 1, 2)),
        st.sampled_from((2000, 3000, 5000)),
        st.sampled_from((0, 30, 60, 100)),
    )


def steps(pods: int, nodes: int, replicas: int = 1) -> st.SearchStrategy[Step]:
    pod = st.integers(0, pods - 1)
    node = st.integers(0, nodes - 1)
    replica = st.integers(0, replicas - 1)
    bind = st.builds(Bind, pod, node, faults(SCHEDULER_KINDS), replica)
    admit = st.builds(Admit, pod, faults(AGENT_KINDS))
    release = st.builds(Release, st.integers(0, 3))
    return st.one_of(
        bind,
        admit,
        release,
        bind,
        admit,
        release,
        bind,
        bind,
        st.builds(Delete, pod),
        st.builds(Recreate, pod),
        st.builds(Finish, pod),
        st.builds(Kill, replica),
        st.builds(Advance, st.sampled_from((5, 60, 400))),
    )


def programs(
    step: st.SearchStrategy[Step] | None = None,
    *,
    pods: int = 4,
    nodes: int = 2,
    min_steps: int = 6,
    max_steps: int = 16,
    replicas: int = 1,
    lag: int = 0,
) -> st.SearchStrategy[Program]:
    """Programs over ``pods`` pods and ``nodes`` nodes, steps drawn from ``step`` (default: every kind),
    served by ``replicas`` schedulers (the last one's pod watch ``lag`` steps late)."""
    return st.builds(
        Program,
        st.lists(shapes(), min_size=pods, max_size=pods).map(tuple),
        st.lists(
            steps(pods, nodes, replicas) if step is None else step, min_size=min_steps, max_size=max_steps
        ).map(tuple),
        replicas=st.just(replicas),
        lag=st.just(lag),
    )
