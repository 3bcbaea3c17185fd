"""One scheduling cycle per pod version: the request read once, the candidates evaluated once.

Owns :class:`Cycle` and :class:`Cycles`, the small bounded cache of cycles the context holds.
kube-scheduler sends the same pod to ``/filter``, ``/prioritize`` and ``/preempt``, and ``/bind`` reads
it again; a cycle keeps, per pod version, what every verb would otherwise compute again:

- the pod's request, read with the codec (``read_pod_request``; or the :class:`AnnotationError` that
  says why it cannot be read), and its priority;
- the latest *evaluation*: the candidate nodes' live states (``Snapshot.candidates``), the namespace
  quota, and filter's decisions over them (the core's ``allocate``). An evaluation is reused only while
  nothing it read can have changed: the snapshot's ``generation`` is the same, the clock has not passed
  the first time a node counted fit turns stale, nor gone back; otherwise it is made again. It never
  replaces bind's own decision, made on the live state under the node's queue.

A pod version is the pod as kube-scheduler sends it (or bind reads it): its key is namespace, name,
uid and ``resourceVersion``, and a cycle is reused only when the fields the request is read from (the
annotations, the containers, the init containers, the priority) are equal to the ones it was read from,
so a pod edited between two verbs (a new ``resourceVersion``), or a caller sending another body under
the same version, gets a new cycle: a decision is never reused for a pod it was not made for. The cache
holds one cycle per pod, at most :data:`CAPACITY` (the least recently used goes first), and only the
:data:`EVALUATED` cycles evaluated last keep their evaluation (it holds a state per candidate node,
which the snapshot may since have replaced); a bound or deleted pod's cycle is evicted
(:meth:`Cycles.forget`). :meth:`Cycles.kept` peeks at a pod's cycle whatever its version (bind, before
it has read the pod, to know whether it will take a node lock).

Pure apart from the snapshot it reads: must not import the Kubernetes client, aiohttp, logging, time or
asyncio.
"""

from __future__ import annotations

import datetime
import hashlib
import json
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from hami import objects
from hami.annotations import AnnotationError, read_pod_request
from hami.core.allocate import Decisions, Policy, RejectionMemo, allocate
from hami.core.model import NamespaceQuota, NodeState, PodRequest
from hami.core.rejection import Rejection
from hami.scheduler.candidates import live_candidates
from hami.scheduler.snapshot import Candidates, Snapshot, local_time
from hami.settings import DeviceConfig

#: Pods whose cycle is kept at once (kube-scheduler schedules one pod at a time; a few hundred pods
#: retried in turn still find theirs).
CAPACITY = 512
#: Cycles that keep their evaluation at once (kube-scheduler evaluates one pod at a time; a bind may
#: still be waiting for a node lock while the next pods are filtered).
EVALUATED = 8

#: (namespace, name): the slot of a pod in the cache.
PodSlot = tuple[str, str]


def _source(pod: Mapping[str, Any]) -> bytes:
    """What the request and the priority are read from, and the version's identity, as sent: a digest
    of their JSON text (compared whole, never changed by a later change of ``pod``, and 32 bytes kept per
    cycle however large the pod; bodies nest at most ``wire.MAX_DEPTH`` levels)."""
    meta, spec = objects.meta(pod), objects.spec(pod)
    fields = (
        objects.namespace(pod),
        objects.name(pod),
        objects.uid(pod),
        objects.resource_version(pod),
        meta.get("annotations"),
        spec.get("containers"),
        spec.get("initContainers"),
        spec.get("priority"),
    )
    text = json.dumps(fields, separators=(",", ":"), default=repr)
    return hashlib.blake2b(text.encode(), digest_size=32).digest()


@dataclass(slots=True, eq=False)
class Evaluation:
    """The candidates of one pod at one snapshot generation (see the module docstring)."""

    names: tuple[str, ...]
    priority: int | None
    generation: int
    at: datetime.datetime  # naive local time it was made at
    candidates: Candidates
    quotas: dict[str, NamespaceQuota]
    decisions: Decisions | None = None
    _by_name: dict[str, NodeState] | None = None

    def state(self, name: str) -> NodeState | Rejection | None:
        """``name``'s state or exclusion in this evaluation; None when it did not cover ``name``."""
        excluded = self.candidates.excluded.get(name)
        if excluded is not None:
            return excluded
        if self._by_name is None:
            self._by_name = {state.name: state for state in self.candidates.states}
        return self._by_name.get(name)

    def states_of(self, names: list[str] | tuple[str, ...]) -> list[NodeState] | None:
        """The states of those of ``names`` not excluded, in their order; None when this evaluation did
        not cover every one of them."""
        states: list[NodeState] = []
        for name in names:
            found = self.state(name)
            if found is None:
                return None
            if isinstance(found, NodeState):
                states.append(found)
        return states

    def valid(self, generation: int, local_now: datetime.datetime) -> bool:
        until = self.candidates.valid_until
        return generation == self.generation and local_now >= self.at and (until is None or local_now < until)


class Cycle:
    """One pod version's scheduling cycle: its request (or why it has none) and latest evaluation."""

    __slots__ = ("_evaluation", "_kept", "_source", "error", "priority", "request", "slot")

    def __init__(
        self, pod: Mapping[str, Any], config: DeviceConfig, kept: Callable[[Cycle], None] | None = None
    ) -> None:
        self._kept = kept  # told each time this cycle keeps a new evaluation
        self._source = _source(pod)
        self.slot: PodSlot = objects.pod_key(pod)
        self.priority = objects.priority(pod)
        self.request: PodRequest | None = None
        self.error: AnnotationError | None = None
        try:
            self.request = read_pod_request(pod, config)
        except AnnotationError as exc:
            self.error = exc
        self._evaluation: Evaluation | None = None

    def serves(self, pod: Mapping[str, Any]) -> bool:
        """Whether ``pod`` is the version this cycle was made for (equal in every field it read)."""
        return self._source == _source(pod)

    def evaluate(
        self,
        snapshot: Snapshot,
        names: list[str] | tuple[str, ...],
        now: datetime.datetime,
        priority: int | None,
    ) -> Evaluation:
        """The candidates ``names`` for this pod at ``now`` (with ``priority``: the cards held for
        nominated pods it does not outrank counted as used): the last evaluation when it still holds,
        else a new one (kept)."""
        assert self.request is not None
        local_now = local_time(now)
        generation = snapshot.current()
        kept = self._evaluation
        if (
            kept is not None
            and kept.priority == priority
            and kept.valid(generation, local_now)
            and kept.names == tuple(names)
        ):
            return kept
        request = self.request
        found = live_candidates(snapshot, names, request, now, priority)
        quotas = snapshot.quotas_for(request.namespace, exclude=(request.namespace, request.name))
        evaluation = self._evaluation = Evaluation(
            names=tuple(names),
            priority=priority,
            generation=generation,
            at=local_now,
            candidates=found,
            quotas=quotas,
        )
        if self._kept is not None:
            self._kept(self)
        return evaluation

    def drop_evaluation(self) -> None:
        """Let the last evaluation go (the next verb evaluates again)."""
        self._evaluation = None

    def decisions(
        self, evaluation: Evaluation, policy: Policy, memo: RejectionMemo | None = None
    ) -> Decisions:
        """Filter's decisions over ``evaluation`` (made once per evaluation; ``policy`` is the
        service's, the same for every call; ``memo``: the service's rejections kept across pods)."""
        assert self.request is not None
        if evaluation.decisions is None:
            evaluation.decisions = allocate(
                self.request, evaluation.candidates.states, policy, quotas=evaluation.quotas, memo=memo
            )
        return evaluation.decisions

    def states_unreserved(
        self, snapshot: Snapshot, names: list[str] | tuple[str, ...], now: datetime.datetime
    ) -> list[NodeState]:
        """The states of ``names`` (those not excluded, in order) without any nominated pod's cards held
        (prioritize's view): the last evaluation's when it still holds, held none and covered every one
        of ``names`` (kube-scheduler sends prioritize the nodes that passed filter), else read live
        (and not kept: filter's evaluation stays for bind and preempt)."""
        assert self.request is not None
        kept = self._evaluation
        if (
            kept is not None
            and not kept.candidates.reserved
            and kept.valid(snapshot.current(), local_time(now))
        ):
            states = kept.states_of(names)
            if states is not None:
                return states
        return live_candidates(snapshot, names, self.request, now).states

    def known_fit(self, snapshot: Snapshot, node: str, now: datetime.datetime, priority: int) -> bool:
        """Whether the last evaluation, still holding, found that the pod fits ``node`` (with the cards
        held for nominated pods of ``priority`` or higher counted as used). False: not known."""
        kept = self._evaluation
        if kept is None or kept.decisions is None or kept.priority != priority:
            return False
        if not kept.valid(snapshot.current(), local_time(now)):
            return False
        return isinstance(kept.state(node), NodeState) and kept.decisions.fits(node)

    def candidate(
        self, snapshot: Snapshot, node: str, now: datetime.datetime, priority: int
    ) -> NodeState | Rejection:
        """``node``'s state for this pod (``Snapshot.candidate``): the last evaluation's when it still
        holds with the same ``priority``, else the live one."""
        assert self.request is not None
        kept = self._evaluation
        local_now = local_time(now)
        if kept is not None and kept.priority == priority and kept.valid(snapshot.current(), local_now):
            found = kept.state(node)
            if found is not None:
                return found
        key = (self.request.namespace, self.request.name)
        return snapshot.candidate(node, local_now, exclude=key, priority=priority)


class Cycles:
    """The cycles of the pods being scheduled, one per pod, bounded (least recently used out first)."""

    def __init__(self, capacity: int = CAPACITY, evaluated: int = EVALUATED) -> None:
        self._capacity = capacity
        self._cycles: OrderedDict[PodSlot, Cycle] = OrderedDict()
        self._evaluated_limit = evaluated
        self._evaluated: OrderedDict[int, Cycle] = OrderedDict()  # by id: the cycles keeping one
        self.made = 0  # cycles made (a pod version read), for the tests and the benchmarks
        self.reused = 0  # lookups answered by a kept cycle
        self.evaluations = 0  # evaluations made and kept

    def of(self, pod: Mapping[str, Any], config: DeviceConfig) -> Cycle:
        """The cycle of this pod version: the kept one when ``pod`` is the version it was made for, else
        a new one (replacing the pod's older one)."""
        slot = objects.pod_key(pod)
        kept = self._cycles.get(slot)
        if kept is not None and kept.serves(pod):
            self._cycles.move_to_end(slot)
            self.reused += 1
            return kept
        if kept is not None:
            self._evaluated.pop(id(kept), None)  # an older version's cycle is over
        cycle = Cycle(pod, config, kept=self._keeps)
        self.made += 1
        self._cycles[slot] = cycle
        self._cycles.move_to_end(slot)
        while len(self._cycles) > self._capacity:
            _, gone = self._cycles.popitem(last=False)
            self._evaluated.pop(id(gone), None)
        return cycle

    def kept(self, slot: PodSlot) -> Cycle | None:
        """The pod's kept cycle, of whichever version (its place in the cache unchanged); None: none."""
        return self._cycles.get(slot)

    def _keeps(self, cycle: Cycle) -> None:
        """``cycle`` keeps a new evaluation: the cycles evaluated longest ago let theirs go."""
        self.evaluations += 1
        self._evaluated[id(cycle)] = cycle
        self._evaluated.move_to_end(id(cycle))
        while len(self._evaluated) > self._evaluated_limit:
            _, oldest = self._evaluated.popitem(last=False)
            oldest.drop_evaluation()

    def forget(self, slot: PodSlot) -> None:
        """The pod was bound or deleted: its cycle is over."""
        cycle = self._cycles.pop(slot, None)
        if cycle is not None:
            self._evaluated.pop(id(cycle), None)

    def pod_event(self, kind: str, obj: Mapping[str, Any]) -> None:
        """The pod watch's event: a deleted pod's cycle is evicted."""
        if kind == "DELETED":
            self.forget(objects.pod_key(obj))

    def __len__(self) -> int:
        return len(self._cycles)
