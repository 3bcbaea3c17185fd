"""The world drives the real scheduler and agent: a fault-free program ends with every pod bound,
admitted with its own grant and every lock handed back; a fault shows in the log where it fired."""

from __future__ import annotations

import asyncio
from pathlib import Path

from hami.annotations import NODE_LOCK, read_pod_devices

from .checker import bound_to, meta, phase_of
from .faults import Mode
from .program import Admit, Bind, Fault, Program, Shape
from .world import World


def test_a_fault_free_program_binds_admits_and_hands_every_lock_back(tmp_path: Path) -> None:
    shapes = (
        Shape("app", 1, 3000, 30),
        Shape("two", 1, 2000, 20),
        Shape("init", 1, 3000, 0),
        Shape("mixed", 1, 1000, 10),
    )
    steps = (Bind(0, 0), Admit(0), Bind(1, 0), Admit(1), Bind(2, 1), Admit(2), Bind(3, 1), Admit(3))
    world = World(Program(shapes=shapes, steps=steps), tmp_path)
    log = asyncio.run(world.run())
    assert [line.strip() for line in log if line.startswith("   ")] == [
        "bind p0 -> n1: ok",
        "admit p0 -> n1: admitted",
        "bind p1 -> n1: ok",
        "admit p1 -> n1: admitted",
        "bind p2 -> n2: ok",
        "admit p2 -> n2: admitted",
        "bind p3 -> n2: ok",
        "admit p3 -> n2: admitted",
    ]
    assert world.final is not None
    pods = {meta(p)["name"]: p for p in world.final.pods}
    assert {name: (bound_to(p), phase_of(p)) for name, p in pods.items()} == {
        "p0": ("n1", "Running"),
        "p1": ("n1", "Running"),
        "p2": ("n2", "Running"),
        "p3": ("n2", "Running"),
    }
    for served in world.served:  # what kubelet got is the pod's own grant, container by container
        devices = read_pod_devices(pods[served.name])
        assert devices is not None and devices[served.index] == served.grants
    assert sorted((s.name, s.index) for s in world.served) == [
        ("p0", 0),
        ("p1", 0),
        ("p1", 1),
        ("p2", 0),
        ("p3", 0),
        ("p3", 1),
    ]
    assert [(meta(n).get("annotations") or {}).get(NODE_LOCK) for n in world.final.nodes] == [None, None]


def test_a_held_binding_parks_the_bind_until_released(tmp_path: Path) -> None:
    program = Program(
        shapes=(Shape("app", 1, 3000, 30),), steps=(Bind(0, 0, (Fault("binding", Mode.HOLD),)), Admit(0))
    )
    log = asyncio.run(World(program, tmp_path).run())
    assert log == [
        "0: Bind(pod=0, node=0, faults=(Fault('binding', Mode.HOLD),))",
        "   fault: hold POST /api/v1/namespaces/default/pods/p0/binding (scheduler)",
        "1: Admit(pod=0, faults=())",  # not bound yet: kubelet has nothing to admit
        "end: release #1: hold POST /api/v1/namespaces/default/pods/p0/binding (scheduler)",
        "   bind p0 -> n1: ok",
        "end: kubelet admits p0 on n1",
        "   admit p0 -> n1: admitted",
    ]
