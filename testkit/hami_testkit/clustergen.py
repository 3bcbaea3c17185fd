"""A generated cluster for ``hami demo --generate N``: N simulated nodes with a card mix, instead of a
cluster file.

Owns the card-mix text (:func:`parse_mix`), the openb node list's mix (:data:`OPENB_MIX`: how many nodes
of each card model and count the published ``openb_node_list_gpu_node.csv`` has; :func:`mix_from_nodes`
derives one from any node list ``hami.simulate.trace`` reads), the card models a mix may name
(:data:`MODELS`: openb's model names and their card), and :func:`generate_cluster`, which apportions N
nodes to the mix's shapes (largest remainder: the mix is kept exactly, whatever N), orders them by a seeded
shuffle and gives each node its cards (UUIDs drawn from the seed, the first half on NUMA node 0, the rest
on 1). The same size, mix and seed give the same cluster. Simulation only. Must not import ``webhook``,
``nodeagent`` or the Kubernetes client.

A mix is comma-separated ``MODEL[xCARDS][:WEIGHT]`` items (``T4x4:2,V100M32x8``: two 4-card T4 nodes
for each 8-card V100 32 GB node; CARDS default 8, WEIGHT 1), or ``openb`` for :data:`OPENB_MIX`.
"""

from __future__ import annotations

import random
import re
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from hami.simulate.trace import TraceNode
from hami_testkit.cluster import ClusterFileError, ClusterSpec, NodeSpec


@dataclass(frozen=True, slots=True)
class CardModel:
    """A card a mix can name: the model the agent reports and its memory."""

    model: str
    memory_mib: int


#: openb's model names (and A100, for a newer cluster) -> the card simulated. openb names its two Alibaba
#: models G2 and G3 without saying what they are: they are simulated as 32 GiB cards.
MODELS = {
    "P100": CardModel("Tesla P100-PCIE-16GB", 16384),
    "T4": CardModel("Tesla T4", 15360),
    "V100M16": CardModel("Tesla V100-SXM2-16GB", 16384),
    "V100M32": CardModel("Tesla V100-SXM2-32GB", 32768),
    "A10": CardModel("NVIDIA A10", 23028),
    "G2": CardModel("NVIDIA G2", 32768),
    "G3": CardModel("NVIDIA G3", 32768),
    "A100": CardModel("NVIDIA A100-SXM4-80GB", 81920),
}
MAX_CARDS = 16
MAX_NODES = 100_000


@dataclass(frozen=True, slots=True)
class Shape:
    """Nodes of ``cards`` cards of ``model`` (a key of :data:`MODELS`), ``weight`` of the mix."""

    model: str
    cards: int
    weight: float


#: The openb node list (openb_node_list_gpu_node.csv, 1,213 GPU nodes): nodes per model and card count.
OPENB_MIX = (
    Shape("G2", 8, 549),
    Shape("T4", 2, 387),
    Shape("P100", 2, 131),
    Shape("G3", 8, 39),
    Shape("V100M16", 4, 28),
    Shape("V100M32", 8, 21),
    Shape("V100M16", 1, 19),
    Shape("T4", 4, 17),
    Shape("V100M32", 4, 9),
    Shape("V100M16", 8, 8),
    Shape("P100", 1, 3),
    Shape("A10", 1, 2),
)

_ITEM = re.compile(
    r"^(?P<model>[A-Za-z0-9]+?)(?:x(?P<cards>[0-9]{1,3}))?(?::(?P<weight>[0-9]{1,9}(?:\.[0-9]{1,6})?))?$"
)


def parse_mix(text: str) -> tuple[Shape, ...]:
    """``openb`` or ``MODEL[xCARDS][:WEIGHT],...`` (module docstring); raises :class:`ClusterFileError`
    naming the item."""
    if text.strip() == "openb":
        return OPENB_MIX
    shapes = []
    for item in (part.strip() for part in text.split(",")):
        match = _ITEM.match(item)
        if match is None:
            raise ClusterFileError(f"--card-mix: {item!r} is not MODEL[xCARDS][:WEIGHT] (e.g. T4x4:2)")
        model = match["model"]
        if model not in MODELS:
            raise ClusterFileError(
                f"--card-mix: unknown model {model!r} in {item!r}; known: {', '.join(MODELS)}"
            )
        cards = int(match["cards"] or 8)
        weight = float(match["weight"] or 1)
        if not 1 <= cards <= MAX_CARDS:
            raise ClusterFileError(f"--card-mix: {item!r}: cards must be 1 to {MAX_CARDS}, got {cards}")
        if weight <= 0:
            raise ClusterFileError(f"--card-mix: {item!r}: the weight must be positive, got {weight:g}")
        shapes.append(Shape(model, cards, weight))
    return tuple(shapes)


def mix_from_nodes(nodes: Iterable[TraceNode], *, source: str) -> tuple[Shape, ...]:
    """The mix of a node list (``hami.simulate.trace.read_nodes``): nodes per model and card count; a
    model :data:`MODELS` does not know, or a node without cards, is refused by name."""
    counts: dict[tuple[str, int], int] = {}
    for node in nodes:
        if node.model not in MODELS:
            raise ClusterFileError(f"{source}: node {node.name}: unknown card model {node.model!r}")
        if not 1 <= node.gpus <= MAX_CARDS:
            raise ClusterFileError(
                f"{source}: node {node.name}: {node.gpus} cards, expected 1 to {MAX_CARDS}"
            )
        counts[node.model, node.gpus] = counts.get((node.model, node.gpus), 0) + 1
    if not counts:
        raise ClusterFileError(f"{source}: no GPU node")
    return tuple(Shape(model, cards, count) for (model, cards), count in counts.items())


def apportion(size: int, shapes: Sequence[Shape]) -> list[int]:
    """Nodes per shape: proportional to the weights, rounded by the largest remainder (sums to ``size``)."""
    total = sum(s.weight for s in shapes)
    exact = [size * s.weight / total for s in shapes]
    counts = [int(x) for x in exact]
    order = sorted(range(len(shapes)), key=lambda i: (-(exact[i] - counts[i]), i))
    for i in order[: size - sum(counts)]:
        counts[i] += 1
    return counts


def generate_cluster(
    size: int, shapes: Sequence[Shape], *, seed: int = 0, prefix: str = "gpu"
) -> ClusterSpec:
    """``size`` nodes named ``<prefix>-00001``... with the mix of ``shapes`` (module docstring)."""
    if not 1 <= size <= MAX_NODES:
        raise ClusterFileError(f"--generate: the node count must be 1 to {MAX_NODES}, got {size}")
    if not shapes:
        raise ClusterFileError("--card-mix: no card model")
    rng = random.Random(seed)
    kinds = [
        shape for shape, count in zip(shapes, apportion(size, shapes), strict=True) for _ in range(count)
    ]
    rng.shuffle(kinds)
    width = max(5, len(str(size)))
    nodes = []
    for i, shape in enumerate(kinds, start=1):
        card = MODELS[shape.model]
        name = f"{prefix}-{i:0{width}d}"
        cards = tuple(
            {
                "uuid": f"GPU-{uuid.UUID(int=rng.getrandbits(128), version=4)}",
                "model": card.model,
                "memory_mib": card.memory_mib,
                "numa": 0 if j < max(1, shape.cards // 2) else 1,
                "healthy": True,
            }
            for j in range(shape.cards)
        )
        labels = {"gpu": "on", "hami.io/demo-model": shape.model}
        nodes.append(NodeSpec(name=name, labels=labels, cards=cards))
    mix = ",".join(f"{s.model}x{s.cards}:{s.weight:g}" for s in shapes)
    return ClusterSpec(nodes=tuple(nodes), source=f"generated: {size} nodes, mix {mix}, seed {seed}")


def describe_mix(cluster: ClusterSpec) -> str:
    """``549 x G2x8, 387 x T4x2, ...``: the nodes of each shape, most first."""
    counts: dict[str, int] = {}
    for node in cluster.nodes:
        key = f"{node.labels.get('hami.io/demo-model', '?')}x{len(node.cards)}"
        counts[key] = counts.get(key, 0) + 1
    return ", ".join(f"{n} x {key}" for key, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))
