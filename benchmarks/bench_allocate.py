"""How long ``hami.core.allocate`` takes to place one pod: ``allocate(...).best()`` over N nodes.

Cluster: N nodes x 8 cards (80 GiB, 100 cores, 10 slots), about half of every capacity used (random
per card, fixed seed). Pod: one container, 1 card, 4000 MiB, 30 % cores. Target: 500 nodes <= 1 ms
median on one core. Further rows: the same pod with ``nvidia.com/use-gputype`` (a per-card filter in
the precheck) and with ``nvidia.com/numa-bind`` (order-dependent: the full Fit runs on every node).
"""

from __future__ import annotations

import random
import time

from benchmarks.table import Table, summary
from hami.core.allocate import Policy, allocate
from hami.core.model import ContainerRequest, Device, DeviceState, NodeState, PodRequest

SIZES = ((100, 300), (500, 200), (5000, 30))  # (nodes, repetitions)


def cluster(nodes: int, seed: int = 7) -> list[NodeState]:
    rng = random.Random(seed)
    out = []
    for n in range(nodes):
        cards = []
        for i in range(8):
            device = Device(
                uuid=f"GPU-{n}-{i}",
                index=i,
                count=10,
                memory_mib=81920,
                cores=100,
                type="NVIDIA A100-SXM4-80GB",
                numa=i // 4,
                mode="hami-core",
                health=True,
            )
            cards.append(
                DeviceState(
                    device=device,
                    used=rng.randint(0, 10),
                    used_mem=rng.randint(0, 81920),
                    used_cores=rng.randint(0, 100),
                )
            )
        out.append(NodeState(name=f"node-{n:05d}", devices=tuple(cards)))
    return out


def pod(*, use_types: tuple[str, ...] = (), numa_bind: bool = False) -> PodRequest:
    container = ContainerRequest(nums=1, memory_mib=4000, cores=30)
    return PodRequest(
        namespace="default", name="bench", containers=(container,), use_types=use_types, numa_bind=numa_bind
    )


def measure(request: PodRequest, nodes: list[NodeState], repetitions: int) -> list[float]:
    policy = Policy()
    samples = []
    for _ in range(repetitions):
        start = time.perf_counter()
        best = allocate(request, nodes, policy).best()
        samples.append(time.perf_counter() - start)
        assert best is not None
    return samples


def run() -> list[Table]:
    table = Table(
        title="allocate(pod: 1 card, 4000 MiB, 30 %).best() over N nodes x 8 cards, half used",
        columns=("nodes", "pod", "median ms", "p99 ms", "max ms", "us/node (median)"),
    )
    for nodes_count, repetitions in SIZES:
        nodes = cluster(nodes_count)
        for label, request, reps in (
            ("plain", pod(), repetitions),
            ("use-gputype A100", pod(use_types=("A100",)), max(3, repetitions // 5)),
            ("numa-bind (full Fit)", pod(numa_bind=True), max(3, repetitions // 20)),
        ):
            samples = measure(request, nodes, reps)
            median, p99, worst = summary(samples)
            per_node = f"{float(median) * 1000 / nodes_count:.2f}"
            table.rows.append((str(nodes_count), label, median, p99, worst, per_node))
    return [table]
