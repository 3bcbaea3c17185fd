"""Run one stress :class:`~.program.Program` against the real scheduler and node agent, checking after
every step.

The world: the API server (the test kit's embedded apiserver, :mod:`~.apiserver`) behind the fault
proxy, one scheduler per replica (:class:`~.parts.Extender`, replaced by a fresh one
on ``Kill``),
and per node the agent and a kubelet model (:class:`~.parts.NodeSide`), on the cluster of
:mod:`~.cluster`. The clock moves ``Program.tick`` seconds after every step (kube-scheduler's retries
are seconds apart) and more on ``Advance``; a request parked longer than ``WRITE_LIMIT`` of it times
out unapplied when released (kube-apiserver's request timeout).

After every step the world settles (:func:`~.settle.settle`), the scheduler's snapshot catches up
(its watches deliver; with ``Program.lag`` the last replica's pod watch delivers the pods as they were
that many steps earlier, its node watch on time, until the end), and :func:`~.checker.check` runs on
the API server's objects. The world adds
the rules only it can see:

* ``lock``   a bind that started and ended within one step (so it ran alone and the lock it met is
  the one seen when it started) refused for the node lock (``hami_scheduler_binds_total{result=
  "lock_busy"}`` rose) while that lock's holder was dead (:func:`~.checker.dead_holder`); the end of
  every program probes each node whose lock has a dead holder with such a bind;
* ``write``  the scheduler's writes that land and break a rule of :mod:`~.writes`;
* ``phantom`` at the end (everything released, kubelet caught up, the clock an hour on): per card the
  scheduler counts exactly what the running pods hold, in the running scheduler and in a fresh one;
* ``hang``   every bind and Allocate finished once nothing is parked.

A violation raises :class:`Violation` with the program, the step, and the log of what happened.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from hami.kube.client import load_api_client
from hami.scheduler.config import SchedulerSettings
from hami_testkit.apiserver import write_kubeconfig
from nodeagent.config import NodeSettings
from tests.eventually import time_scale

from . import checker
from .apiserver import ApiError, Objects, running
from .checker import Served, View, bound_to, key_of, meta, phase_of
from .cluster import (
    FINAL_ADVANCE,
    HORIZON,
    LOCK_TIMEOUT,
    NAMESPACE,
    NODES,
    SETTINGS,
    SLOTS,
    WRITE_LIMIT,
    Clock,
    cards_document,
    cluster_nodes,
    make_pod,
)
from .faults import Call, FaultProxy, Rule
from .parts import Extender, NodeSide, admissible
from .program import Admit, Advance, Bind, Delete, Finish, Kill, Program, Recreate, Release, Shape, Step
from .settle import CountingExecutor, settle
from .writes import problems_of_write


class Violation(AssertionError):
    """An invariant broke; the message carries the program and what happened."""


@dataclass(eq=False)
class Actor:
    number: int
    kind: str  # "bind" | "admit"
    pod: str
    node: str
    task: asyncio.Task[str]
    extender: Extender | None = None
    phase: int = 0  # the step (or end-phase action) that started it
    lock_busy: float = 0.0  # the extender's lock_busy count when the bind started
    dead_lock: str | None = None  # why the node's lock holder was dead when the bind started
    done: bool = False


@dataclass
class World:
    program: Program
    workdir: Path
    settings: SchedulerSettings = SETTINGS
    clock: Clock = field(default_factory=Clock)
    log: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.actors: list[Actor] = []
        self.served: list[Served] = []
        self.write_problems: list[str] = []
        self.generation: dict[str, int] = {}
        self.uids: dict[str, str] = {}
        self.extenders: list[Extender] = []  # every scheduler started, dead ones included
        self.replicas: list[Extender] = []  # the live one of each replica
        self.sides: dict[str, NodeSide] = {}
        self.store: Objects
        self.proxy: FaultProxy
        self.kubeconfig = ""
        self._numbers = 0
        self._fired = 0
        self._phase = 0  # counts steps and end-phase actions
        self.final: View | None = None  # the objects at the end of a clean run
        self.pod_lists: list[Sequence[Mapping[str, Any]]] = []  # the pods at the start and after each check
        self.lagging = (
            self.program.lag > 0 and self.program.replicas > 1
        )  # until the end catches every watch up

    # ------------------------------------------------------------------------------------- lifecycle
    async def run(self) -> list[str]:
        loop = asyncio.get_running_loop()
        self.executor = CountingExecutor(loop)
        loop.set_default_executor(self.executor)
        async with running() as store:
            self.store = store
            for node in cluster_nodes():
                await self.store.create("nodes", node)
            for index in range(len(self.program.shapes)):
                await self._create(index)
            self.pod_lists.append(self.store.list("pods"))
            self.proxy = FaultProxy(store.url, clock=self.clock, limit=WRITE_LIMIT)
            self.proxy.observer = self._observe
            url = await self.proxy.start()
            self.kubeconfig = str(write_kubeconfig(self.workdir / "kubeconfig", url))
            agent_api = load_api_client(self.kubeconfig, request_timeout=120.0, component="integrity-agent")
            try:
                await self._start_nodes(agent_api)
                for _ in range(max(self.program.replicas, 1)):
                    self.replicas.append(await self._start_extender())
                for number, step in enumerate(self.program.steps):
                    await self._step(number, step)
                await self._finish()
            finally:
                for actor in self.actors:
                    actor.task.cancel()
                await self.proxy.stop()
                await asyncio.gather(*(a.task for a in self.actors), return_exceptions=True)
                for extender in self.extenders:
                    await extender.stop()
                    extender.close_api()
                agent_api.close()
        return self.log

    async def _start_nodes(self, agent_api: Any) -> None:
        settings = NodeSettings(split_count=SLOTS)
        for name, _ in NODES:
            path = self.workdir / f"{name}-cards.yaml"
            path.write_text(yaml.safe_dump(cards_document(name)))
            side = NodeSide(name, path, agent_api, settings)
            await side.start()
            self.sides[name] = side

    async def _start_extender(self) -> Extender:
        extender = Extender(self.kubeconfig, self.clock, self.clock.ticker, self.settings)
        nodes, pods = await self._objects()
        await extender.start(nodes, pods)
        self.extenders.append(extender)
        return extender

    def _replica(self, index: int) -> int:
        return index % len(self.replicas)

    # ------------------------------------------------------------------------------------ objects
    async def _objects(self) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        return self.store.list("nodes"), self.store.list("pods")

    async def _pod(self, name: str) -> dict[str, Any] | None:
        return self.store.get("pods", NAMESPACE, name)

    async def _pods_by_key(self) -> dict[tuple[str, str], dict[str, Any]]:
        _, pods = await self._objects()
        return {key_of(p): p for p in pods}

    async def _set_status(self, pod: Mapping[str, Any], status: dict[str, Any]) -> None:
        with contextlib.suppress(ApiError):  # deleted meanwhile
            await self.store.set_status(NAMESPACE, str(meta(pod).get("name")), status)

    async def _create(self, index: int) -> None:
        name = f"p{index}"
        generation = self.generation.get(name, -1) + 1
        self.generation[name] = generation
        pod = make_pod(name, generation, self.program.shapes[index])
        self.uids[name] = str(pod["metadata"]["uid"])
        await self.store.create("pods", pod)

    async def view(self) -> View:
        nodes, pods = await self._objects()
        busy = frozenset((NAMESPACE, a.pod) for a in self.actors if not a.task.done())
        return View(
            nodes=nodes,
            pods=pods,
            served=tuple(self.served),
            now=self.clock.now,
            lock_timeout=LOCK_TIMEOUT,
            busy=busy,
            horizon=HORIZON,
            bind_timeout=WRITE_LIMIT,
        )

    # -------------------------------------------------------------------------------------- steps
    def _pod_name(self, index: int) -> str:
        return f"p{index % len(self.program.shapes)}"

    def _node_name(self, index: int) -> str:
        return NODES[index % len(NODES)][0]

    async def _step(self, number: int, step: Step) -> None:
        self._phase += 1
        self.log.append(f"{number}: {step!r}")
        match step:
            case Bind(pod=p, node=n, faults=faults, replica=r):
                await self._bind(self._pod_name(p), self._node_name(n), faults, replica=self._replica(r))
            case Admit(pod=p, faults=faults):
                pod = await self._pod(self._pod_name(p))
                if pod is not None and bound_to(pod) in self.sides:
                    await self._admit(str(bound_to(pod)), self._pod_name(p), faults)
            case Release(index=i):
                if self.proxy.parked:
                    entry = self.proxy.parked[i % len(self.proxy.parked)]
                    self.proxy.release(entry)
                    late = " (timed out)" if entry.expired else ""
                    self.log.append(f"   release #{entry.number}{late}: {entry.summary}")
            case Delete(pod=p):
                if await self._pod(self._pod_name(p)) is not None:
                    await self.store.delete("pods", NAMESPACE, self._pod_name(p))
            case Recreate(pod=p):
                if await self._pod(self._pod_name(p)) is not None:
                    await self.store.delete("pods", NAMESPACE, self._pod_name(p))
                await self._create(p % len(self.program.shapes))
            case Finish(pod=p):
                pod = await self._pod(self._pod_name(p))
                if pod is not None and phase_of(pod) == "Running":
                    await self._set_status(pod, {"phase": "Succeeded"})
            case Kill(replica=r):
                await self._kill(self._replica(r))
            case Advance(seconds=s):
                self.clock.now += datetime.timedelta(seconds=s)
        await self._after(f"step {number}: {step!r}")
        self.clock.now += datetime.timedelta(seconds=self.program.tick)

    def _actor(self, kind: str, pod: str, node: str, task: asyncio.Task[str]) -> Actor:
        self._numbers += 1
        actor = Actor(number=self._numbers, kind=kind, pod=pod, node=node, task=task, phase=self._phase)
        self.actors.append(actor)
        return actor

    async def _bind(
        self, name: str, node: str, faults: tuple[Any, ...], *, uid: str | None = None, replica: int = 0
    ) -> Actor:
        pod = await self._pod(name)
        uid = uid or (str(meta(pod).get("uid")) if pod is not None else self.uids.get(name, ""))
        nodes, _ = await self._objects()
        dead = checker.dead_holder(await self.view(), next(n for n in nodes if meta(n).get("name") == node))
        extender = self.replicas[replica]
        lock_busy = extender.metric("hami_scheduler_binds_total", result="lock_busy")
        task = asyncio.get_running_loop().create_task(extender.bind(name, node, uid))
        actor = self._actor("bind", name, node, task)
        actor.extender, actor.lock_busy, actor.dead_lock = extender, lock_busy, dead
        for fault in faults:
            subject = node if fault.kind.startswith("node") else None if fault.kind == "pod-list" else name
            self.proxy.arm(
                Rule(
                    owner=actor.number,
                    who="scheduler",
                    kind=fault.kind,
                    subject=subject,
                    mode=fault.mode,
                    skip=fault.skip,
                )
            )
        return actor

    async def _admit(self, node: str, name: str, faults: tuple[Any, ...]) -> None:
        pod = await self._pod(name)
        side = self.sides[node]
        if pod is None or not admissible(pod, node):
            return
        if side.admitted(pod):
            return  # kubelet admits a pod once
        task = asyncio.get_running_loop().create_task(
            side.admit(pod, self._pods_by_key, self._set_status, self.served.append)
        )
        actor = self._actor("admit", name, node, task)
        for fault in faults:
            subject = node if fault.kind.startswith("node") else None
            self.proxy.arm(
                Rule(
                    owner=actor.number,
                    who="agent",
                    kind=fault.kind,
                    subject=subject,
                    mode=fault.mode,
                    skip=fault.skip,
                )
            )

    async def _kill(self, replica: int) -> None:
        old = self.replicas[replica]
        for actor in self.actors:
            if actor.extender is old and not actor.task.done():
                actor.task.cancel()
        await self._settle()
        await old.stop()
        self.replicas[replica] = await self._start_extender()

    # ------------------------------------------------------------------------------------ checking
    async def _settle(self) -> None:
        def quiet() -> bool:
            in_flight = sum(e.in_transit for e in self.extenders)
            return self.executor.active == self.proxy.waiting and self.proxy.inflight == 0 and in_flight == 0

        def marks() -> tuple[int, ...]:
            return (
                self.executor.submitted,
                self.executor.active,
                self.proxy.received,
                self.proxy.released,
                sum(e.received + e.answered for e in self.extenders),
                sum(a.task.done() for a in self.actors),
            )

        def describe() -> str:
            live = [f"{a.kind} {a.pod}->{a.node}" for a in self.actors if not a.task.done()]
            return (
                f"executor active {self.executor.active}, parked waiting {self.proxy.waiting}, "
                f"proxy in flight {self.proxy.inflight}, actors {live}"
            )

        await settle(quiet, marks, describe)

    async def _after(self, what: str) -> None:
        await self._settle()
        for line in self.proxy.fired[self._fired :]:
            self.log.append(f"   fault: {line}")
        self._fired = len(self.proxy.fired)
        problems: list[str] = []
        for actor in self.actors:
            if actor.done or not actor.task.done():
                continue
            actor.done = True
            self.proxy.disarm(actor.number)
            outcome = "killed" if actor.task.cancelled() else _outcome(actor.task)
            self.log.append(f"   {actor.kind} {actor.pod} -> {actor.node}: {outcome or 'ok'}")
            # judged only for a bind that ran alone, start to end, within one step: then the lock that
            # refused it is the one seen when it started, and the lock_busy count rose for it alone
            alone = actor.phase == self._phase
            if actor.kind == "bind" and actor.extender is not None and outcome and actor.dead_lock and alone:
                busy = actor.extender.metric("hami_scheduler_binds_total", result="lock_busy")
                if busy > actor.lock_busy:
                    problems.append(
                        f"[lock] bind of {actor.pod} to {actor.node} refused for the node lock, whose holder "
                        f"{actor.dead_lock}: {outcome}"
                    )
        view = await self.view()
        self.pod_lists.append(view.pods)
        for index, extender in enumerate(self.replicas):
            extender.sync(view.nodes, self._pods_seen_by(index, view))
        problems += self.write_problems + checker.check(view)
        self.write_problems = []
        if problems:
            raise Violation(self.report(what, problems))

    def _pods_seen_by(self, replica: int, view: View) -> Sequence[Mapping[str, Any]]:
        """The pods replica ``replica``'s watch has delivered: now, or for the last replica of a program
        with ``lag`` the pods as they were that many checks ago (its nodes stay current)."""
        if not self.lagging or replica != len(self.replicas) - 1:
            return view.pods
        back = len(self.pod_lists) - 1 - self.program.lag
        return self.pod_lists[max(back, 0)]

    def report(self, what: str, problems: list[str]) -> str:
        lines = ["", f"program = {self.program!r}", f"violated after {what}:"]
        lines += [f"  {p}" for p in problems]
        lines += ["log:", *(f"  {line}" for line in self.log)]
        return "\n".join(lines)

    # ------------------------------------------------------------------------------------ the end
    async def _finish(self) -> None:
        while self.proxy.parked:
            entry = self.proxy.parked[0]
            self.proxy.release(entry)
            late = " (timed out)" if entry.expired else ""
            self.log.append(f"end: release #{entry.number}{late}: {entry.summary}")
            await self._after("releasing everything at the end")
        live = [a.task for a in self.actors if not a.task.done()]
        if live:  # nothing is parked: give a timer in the code under test its chance, then settle
            await asyncio.wait(live, timeout=10.0 * time_scale())
            await self._after("waiting for the last binds and Allocates")
        hung = [f"{a.kind} {a.pod}->{a.node}" for a in self.actors if not a.task.done()]
        if hung:
            raise Violation(self.report("the end", [f"[hang] still running with nothing parked: {hung}"]))
        for node, _ in NODES:
            for pod in (await self._objects())[1]:
                if admissible(pod, node):
                    self.log.append(f"end: kubelet admits {meta(pod).get('name')} on {node}")
                    await self._admit(node, str(meta(pod).get("name")), ())
                    await self._after("kubelet catching up at the end")
        self.clock.now += WRITE_LIMIT + datetime.timedelta(seconds=1)  # every bind attempt is over
        await self._after("the clock moving past the bind timeout")
        view = await self.view()
        for stored in view.nodes:
            name = str(meta(stored).get("name"))
            if checker.dead_holder(view, stored) is None:
                continue
            probe = f"probe-{name}"
            shape = Shape("app", 1, 1, 0)
            body = make_pod(probe, 0, shape)
            await self.store.create("pods", body)
            self.log.append(f"end: probe bind {probe} -> {name}")
            self._phase += 1
            await self._bind(probe, name, (), uid=str(body["metadata"]["uid"]))
            await self._after(f"the lock probe on {name}")
            await self._admit(name, probe, ())
            await self._after(f"admitting the lock probe on {name}")
        self.lagging = False  # a late watch delivers in the end
        self.clock.now += FINAL_ADVANCE
        await self._after("the clock moving an hour on")
        fresh = await self._start_extender()
        view = await self.view()
        problems = [
            p for i, e in enumerate(self.replicas) for p in self._phantom(e, f"scheduler replica {i}", view)
        ]
        problems += self._phantom(fresh, "a restarted scheduler", view)
        if problems:
            raise Violation(self.report("the end", problems))
        self.final = view

    def _phantom(self, extender: Extender, who: str, view: View) -> list[str]:
        counted = extender.usage()
        problems = []
        for node in view.nodes:
            name = str(meta(node).get("name"))
            cards = checker.cards_of(node)
            holders, _ = checker.bound_usage(view.pods, name)
            physical = checker.card_usage(holders.items(), cards)
            for uuid in cards:
                use = physical.get(uuid, checker.Use())
                want = (use.memory, use.slots, use.cores)
                got = counted.get(uuid, (0, 0, 0))
                if got != want:
                    problems.append(
                        f"[phantom] {who} counts (memory, slots, cores) {got} on {name}/{uuid}; the pods "
                        f"that run there hold {want} ({', '.join(use.pods) or 'none'})"
                    )
        return problems

    # ------------------------------------------------------------------------------ write checks
    async def _observe(self, call: Call) -> Callable[[int], None] | None:
        """The proxy shows each scheduler write before applying it; problems count if it lands."""
        if call.who != "scheduler" or call.subject is None:
            return None
        problems = problems_of_write(await self.view(), call.kind, call.subject, call.body)
        if not problems:
            return None

        def after(status: int) -> None:
            if 200 <= status < 300:
                self.write_problems.extend(problems)

        return after


def _outcome(task: asyncio.Task[str]) -> str:
    exc = task.exception()
    if exc is not None:
        return f"raised {type(exc).__name__}: {exc}"
    return task.result()
