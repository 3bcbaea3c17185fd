"""The replay's cluster: production node states, and a numpy mirror of them for the per-pod node mask.

Owns :class:`Cluster`. The source of truth is one :class:`~hami.core.model.NodeState` per node, changed
only the way the scheduler books a pod (``fit_node`` -> ``pod_usage`` -> ``apply_usage``). Beside it,
per-card arrays (free memory/cores/slots, usable, type) are refreshed from a node's state after each
booking, so that :meth:`Cluster.feasible` judges all nodes at once with the same checks as the core's
precheck for a one-container pod (slots, memory, cores, exclusive use, type constraint), plus CPU and
memory as kube-scheduler's NodeResourcesFit. :meth:`Cluster.place` books through the core: with the
cards a policy chose pinned as ``use_uuids`` (the core must agree, or :class:`CoreDisagrees`), or with
the core's own card choice for HAMi's policies.

A trace card registers 1000 MiB and 100 cores, so 1 MiB is one milli of the paper; a pod's share is
``gpumem-percentage = gpucores = gpu_milli / 10`` (absolute MiB when the share is not a multiple of 10).
Imports ``hami.core`` and numpy only.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from hami.core.allocate import Policy, fit_node
from hami.core.model import (
    NVIDIA,
    PERCENT_NOT_GIVEN,
    Allocation,
    ContainerRequest,
    Device,
    DeviceMode,
    DeviceState,
    NodeState,
    PodRequest,
    is_vendor_card,
)
from hami.core.usage import apply_usage, pod_usage
from hami.simulate.trace import MILLI, TraceNode, TracePod

I64 = np.int64
TRACE_CARD_MIB = 1000
TRACE_CARD_CORES = 100
DEFAULT_SPLIT_COUNT = 10


class CoreDisagrees(RuntimeError):
    """The mirror said a placement fits and the production core refused it (a bug, never silenced)."""


@dataclass(slots=True)
class NodeCapacity:
    """CPU (milli) and memory (MiB) a node offers pods (kube-scheduler's allocatable), and what is used."""

    cpu_milli: int
    memory_mib: int
    cpu_used: int = 0
    memory_used: int = 0


def trace_state(node: TraceNode, split_count: int) -> NodeState:
    """The :class:`NodeState` of a trace node: ``gpus`` healthy cards of type ``NVIDIA <model>``."""
    cards = tuple(
        DeviceState(
            device=Device(
                uuid=f"GPU-{node.name}-{j}",
                index=j,
                count=split_count,
                memory_mib=TRACE_CARD_MIB,
                cores=TRACE_CARD_CORES,
                type=f"{NVIDIA} {node.model}",
                mode=DeviceMode.HAMI_CORE,
                health=True,
            )
        )
        for j in range(node.gpus)
    )
    return NodeState(name=node.name, devices=cards)


def container_request(pod: TracePod, card_mib: int | None) -> ContainerRequest:
    """The HAMi request of a trace pod's cards (``None`` card size: a percentage of each card)."""
    cores = pod.gpu_milli // 10
    if card_mib is None or pod.gpu_milli % 10 == 0:
        percentage = max(1, min(100, -(-pod.gpu_milli // 10)))
        return ContainerRequest(nums=pod.num_gpu, type=NVIDIA, percentage=percentage, cores=cores)
    memory = pod.gpu_milli * card_mib // MILLI
    return ContainerRequest(
        nums=pod.num_gpu, type=NVIDIA, memory_mib=memory, percentage=PERCENT_NOT_GIVEN, cores=cores
    )


@dataclass(slots=True)
class Cluster:
    """Mutable replay state: ``states[i]`` and capacities, with their mirror arrays (row i = node i)."""

    states: list[NodeState]
    capacity: list[NodeCapacity]
    exact_card_mib: int | None = TRACE_CARD_MIB  # trace cards: shares not a multiple of 10 in MiB
    cpu_free: np.ndarray = field(init=False)
    mem_free: np.ndarray = field(init=False)
    mem_total: np.ndarray = field(init=False)  # (N, C) per card, 0 where no card
    mem_avail: np.ndarray = field(init=False)  # free MiB, -1 where the card cannot take a pod
    slot_open: np.ndarray = field(init=False)  # the card has a free slot (used < count)
    cores_total: np.ndarray = field(init=False)
    cores_free: np.ndarray = field(init=False)
    used: np.ndarray = field(init=False)  # tasks on the card
    milli: np.ndarray = field(init=False)  # free share of the card in milli, 0 where unusable
    ncards: np.ndarray = field(init=False)
    gpu_free: np.ndarray = field(init=False)  # Σ milli per node
    full_cards: np.ndarray = field(init=False)  # cards with all 1000 milli free, per node
    node_score: np.ndarray = field(init=False)  # HAMi's node score of the usage (summary.score)
    types: list[tuple[str, ...]] = field(init=False)  # lower-cased card types per node
    _type_masks: dict[tuple[str, ...], np.ndarray] = field(init=False)
    _needs: dict[int, np.ndarray] = field(init=False)  # MiB a percentage asks of each card

    def __post_init__(self) -> None:
        n = len(self.states)
        width = max([len(s.devices) for s in self.states] + [1])
        self.cpu_free = np.array([c.cpu_milli - c.cpu_used for c in self.capacity], dtype=I64)
        self.mem_free = np.array([c.memory_mib - c.memory_used for c in self.capacity], dtype=I64)
        shape = (n, width)
        self.mem_total = np.zeros(shape, dtype=I64)
        self.mem_avail = np.full(shape, -1, dtype=I64)
        self.slot_open = np.zeros(shape, dtype=bool)
        self.cores_total = np.zeros(shape, dtype=I64)
        self.cores_free = np.zeros(shape, dtype=I64)
        self.used = np.zeros(shape, dtype=I64)
        self.milli = np.zeros(shape, dtype=I64)
        self.ncards = np.array([len(s.devices) for s in self.states], dtype=I64)
        self.node_score = np.zeros(n, dtype=np.float64)
        self.gpu_free = np.zeros(n, dtype=I64)
        self.full_cards = np.zeros(n, dtype=I64)
        self._needs = {}
        self.types = [tuple(d.device.type.lower() for d in s.devices) for s in self.states]
        self._type_masks = {}
        for i in range(n):
            self._refresh(i)

    @classmethod
    def from_trace(cls, nodes: Sequence[TraceNode], split_count: int = DEFAULT_SPLIT_COUNT) -> Cluster:
        return cls(
            states=[trace_state(node, split_count) for node in nodes],
            capacity=[NodeCapacity(cpu_milli=node.cpu_milli, memory_mib=node.memory_mib) for node in nodes],
        )

    def fork(self) -> Cluster:
        """A new cluster starting from this one's current states (for the next run)."""
        capacity = [NodeCapacity(**{k: getattr(c, k) for k in NodeCapacity.__slots__}) for c in self.capacity]
        return Cluster(states=list(self.states), capacity=capacity, exact_card_mib=self.exact_card_mib)

    @property
    def names(self) -> list[str]:
        return [s.name for s in self.states]

    @property
    def capacity_milli(self) -> int:
        """Every vendor card counts 1000 milli (the denominator of unallocated GPU %)."""
        return MILLI * sum(1 for s in self.states for d in s.devices if is_vendor_card(d.device))

    def _refresh(self, i: int) -> None:
        """Row ``i`` of the mirror from ``states[i]`` (after every booking on that node)."""
        node = self.states[i]
        self.node_score[i] = node.summary.score
        for j, card in enumerate(node.devices):
            dev = card.device
            usable = (
                card.healthy
                and dev.uuid not in node.cordoned
                and is_vendor_card(dev)
                and dev.mode != DeviceMode.MIG
                and dev.memory_mib > 0
            )
            self.mem_total[i, j] = dev.memory_mib
            self.cores_total[i, j] = dev.cores
            self.cores_free[i, j] = card.free_cores
            self.used[i, j] = card.used
            self.slot_open[i, j] = card.used < dev.count
            self.mem_avail[i, j] = card.free_mem if usable else -1
            self.milli[i, j] = max(0, card.free_mem) * MILLI // dev.memory_mib if usable else 0
        self.gpu_free[i] = self.milli[i].sum()
        self.full_cards[i] = (self.milli[i] == MILLI).sum()

    def type_mask(self, spec: tuple[str, ...]) -> np.ndarray:
        """(N, C) cards whose type passes ``nvidia.com/use-gputype`` = ``spec`` (substring, any case)."""
        mask = self._type_masks.get(spec)
        if mask is None:
            wanted = tuple(s.lower() for s in spec)
            mask = np.zeros(self.mem_avail.shape, dtype=bool)
            for i, types in enumerate(self.types):
                for j, card_type in enumerate(types):
                    mask[i, j] = not wanted or any(w in card_type for w in wanted)
            self._type_masks[spec] = mask
        return mask

    def request(self, pod: TracePod, pinned: Sequence[str] = (), gpu_policy: str | None = None) -> PodRequest:
        container = container_request(pod, self.exact_card_mib) if pod.num_gpu else None
        return PodRequest(
            namespace="simulate",
            name=pod.name,
            containers=(container,),
            use_types=pod.gpu_spec,
            use_uuids=tuple(pinned),
            gpu_policy=gpu_policy,
        )

    def card_fit(self, pod: TracePod, *, slots: bool = True) -> np.ndarray:
        """(N, C): the cards that could take one of the pod's cards (checks 1..14 of Fit, one card).

        ``slots=False`` leaves out the slot check (to tell drops the slot limit alone caused).
        """
        request = container_request(pod, self.exact_card_mib)
        cores = min(request.cores, 100)
        if request.memory_mib > 0:
            need: np.ndarray | int = request.memory_mib
        else:
            cached = self._needs.get(request.percentage)
            if cached is None:
                cached = self._needs[request.percentage] = self.mem_total * request.percentage // 100
            need = cached
        fit = (self.mem_avail >= need) & (self.mem_avail >= 0) & (self.cores_free >= cores)
        if slots:
            fit &= self.slot_open
        if cores == 100:
            fit &= ~((self.cores_total == 100) & (self.used > 0))
        if cores == 0:
            fit &= ~((self.cores_total != 0) & (self.cores_free == 0))
        if pod.gpu_spec:
            fit &= self.type_mask(pod.gpu_spec)
        return fit

    def feasible(self, pod: TracePod) -> tuple[np.ndarray, np.ndarray | None]:
        """Nodes that can take ``pod`` (bool per node) and, for a GPU pod, the per-card fit."""
        ok = (self.cpu_free >= pod.cpu_milli) & (self.mem_free >= pod.memory_mib)
        if pod.num_gpu == 0:
            return ok, None
        cards = self.card_fit(pod)
        ok &= cards.any(axis=1) if pod.num_gpu == 1 else cards.sum(axis=1) >= pod.num_gpu
        return ok, cards

    def feasible_without_slots(self, pod: TracePod) -> bool:
        """Whether some node could take ``pod`` if no card's slot limit applied."""
        ok = (self.cpu_free >= pod.cpu_milli) & (self.mem_free >= pod.memory_mib)
        ok &= self.card_fit(pod, slots=False).sum(axis=1) >= pod.num_gpu
        return bool(ok.any())

    def place(self, i: int, pod: TracePod, cards: Sequence[int] | None, gpu_policy: str) -> tuple[int, ...]:
        """Book ``pod`` on node ``i`` through the core; ``cards`` pins the policy's choice (None: the core's).

        Returns the indices of the cards granted.
        """
        cap = self.capacity[i]
        cap.cpu_used += pod.cpu_milli
        cap.memory_used += pod.memory_mib
        self.cpu_free[i] -= pod.cpu_milli
        self.mem_free[i] -= pod.memory_mib
        if pod.num_gpu == 0:
            return ()
        node = self.states[i]
        judged = node
        pinned: list[str] = []
        if cards is not None:  # Fit on the pinned cards alone: the others would fail CardUuidMismatch
            pinned = [node.devices[j].device.uuid for j in cards]
            judged = replace(node, devices=tuple(node.devices[j] for j in sorted(cards)))
        decision = fit_node(self.request(pod, pinned), judged, Policy(gpu_policy=gpu_policy))
        if not isinstance(decision, Allocation):
            raise CoreDisagrees(f"{pod.name} on {node.name} cards {cards}: the core says {decision.message}")
        granted = tuple(node.positions[g.uuid] for g in decision.devices[0])
        if cards is not None and sorted(granted) != sorted(cards):
            raise CoreDisagrees(
                f"{pod.name} on {node.name}: asked for cards {cards}, the core granted {granted}"
            )
        self.states[i] = apply_usage(node, pod_usage(decision.devices, 0, init_done=False))
        self._refresh(i)
        return granted
