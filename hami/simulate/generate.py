"""Held-out traces: families of node and pod lists drawn from openb, each regenerable from its family
name and index alone.

Owns :func:`generate` (one trace of a family), :class:`Generated` and :class:`Recipe` (what was drawn),
:func:`family_seed`, and the CSV texts :func:`nodes_csv` / :func:`pods_csv` (the formats
:mod:`hami.simulate.trace` reads back). A trace is drawn from the published openb variants and node list
by five independent knobs, each on with a fixed probability, every number from
``numpy.random.default_rng([family_seed(family), index])``:

- **mixture**: 1-3 of the given variants in Dirichlet(1) proportions (pods drawn with replacement);
- **supply**: 1-2 card models removed from the node list or their nodes multiplied (x2-x4); the node
  list is a weighted draw of ``size`` openb nodes (a few hundred keep a run to seconds);
- **host**: the nodes' host memory and/or CPU scaled (x0.6-x2.0 and x0.7-x1.5, log-uniform);
- **models**: 5-40 % of the GPU pods get a constraint drawn over the models of the node list (1-3
  models, Dirichlet(0.5) popularity), the published constraints kept or first dropped;
- **multi**: the share of multi-card pods among the GPU pods scaled (x0.33-x3, log-uniform) by swapping
  pods with the other kind drawn from all variants.

Families are seed streams of the same distribution: the protocol designs on one (``design``) and
reports on another (``report``), never on the same traces. Pure: numpy and the trace values, no I/O.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from hami.simulate.trace import TraceNode, TracePod

#: The knobs and how likely each is on.
P_SUPPLY = 0.6
P_MEMORY = 0.5
P_CPU = 0.4
P_MODELS = 0.5
P_MULTI = 0.4
DEFAULT_SIZE = 300
MAX_SIZE = 100_000
MAX_MULTI_SHARE = 0.6


def family_seed(family: str) -> int:
    """A family name's seed stream (CRC-32 of its UTF-8 name: the same on every machine)."""
    return zlib.crc32(family.encode())


@dataclass(frozen=True, slots=True, kw_only=True)
class Recipe:
    """What one trace drew: the variants and their shares, the card supply per model (x multiplier, 0:
    removed), host scales, the share of GPU pods given a drawn model constraint, the multi-card factor."""

    family: str
    index: int
    mixture: tuple[tuple[str, float], ...]
    supply: tuple[tuple[str, float], ...]
    memory_scale: float
    cpu_scale: float
    constrained: float  # share of GPU pods whose constraint was drawn (0: openb's own)
    dropped_specs: bool  # openb's own constraints removed first
    multi_factor: float

    @property
    def name(self) -> str:
        return f"{self.family}-{self.index:03d}"

    def describe(self) -> str:
        """One line: ``gpushare60 .62 + gpuspec20 .38; G2 x0; mem x1.4; spec 22 %; multi x2.1``."""
        parts = [" + ".join(f"{v} {w:.2f}" for v, w in self.mixture)]
        parts += [f"{m} x{f:.1f}" for m, f in self.supply]
        if self.memory_scale != 1.0:
            parts.append(f"mem x{self.memory_scale:.2f}")
        if self.cpu_scale != 1.0:
            parts.append(f"cpu x{self.cpu_scale:.2f}")
        if self.constrained:
            parts.append(
                f"spec {100 * self.constrained:.0f} %" + (" (openb's dropped)" if self.dropped_specs else "")
            )
        if self.multi_factor != 1.0:
            parts.append(f"multi x{self.multi_factor:.2f}")
        return "; ".join(parts)


@dataclass(frozen=True, slots=True)
class Generated:
    recipe: Recipe
    nodes: tuple[TraceNode, ...]
    pods: tuple[TracePod, ...]


def _log_uniform(rng: np.random.Generator, low: float, high: float) -> float:
    return float(math.exp(rng.uniform(math.log(low), math.log(high))))


def generate(
    variants: Mapping[str, Sequence[TracePod]],
    nodes: Sequence[TraceNode],
    family: str,
    index: int,
    *,
    size: int = DEFAULT_SIZE,
) -> Generated:
    """Trace ``index`` of ``family``: ``size`` nodes drawn from ``nodes``, pods from ``variants`` (name ->
    pods), about as many pods per card as the variants have per card of ``nodes``."""
    if not variants or any(not pods for pods in variants.values()):
        raise ValueError("generate needs at least one variant, each with pods")
    if not 1 <= size <= MAX_SIZE:
        raise ValueError(f"size {size} must be between 1 and {MAX_SIZE}")
    if index < 0:
        raise ValueError(f"index {index} must be >= 0")
    gpu_nodes = [n for n in nodes if n.gpus > 0]
    if not gpu_nodes:
        raise ValueError("the node list has no GPU node")
    rng = np.random.default_rng([family_seed(family), index])
    names = sorted(variants)

    # supply: which models are removed or multiplied, then the weighted draw of `size` nodes
    models = sorted({n.model for n in gpu_nodes})
    factor = dict.fromkeys(models, 1.0)
    if rng.random() < P_SUPPLY and len(models) > 1:
        picked = rng.choice(len(models), size=min(len(models) - 1, int(rng.integers(1, 3))), replace=False)
        for k in sorted(int(x) for x in picked):
            factor[models[k]] = 0.0 if rng.random() < 0.4 else round(float(rng.uniform(2.0, 4.0)), 2)
    weights = np.array([factor[n.model] for n in gpu_nodes], dtype=np.float64)
    drawn_nodes = rng.choice(len(gpu_nodes), size=size, replace=True, p=weights / weights.sum())
    memory_scale = round(_log_uniform(rng, 0.6, 2.0), 2) if rng.random() < P_MEMORY else 1.0
    cpu_scale = round(_log_uniform(rng, 0.7, 1.5), 2) if rng.random() < P_CPU else 1.0
    out_nodes = tuple(
        TraceNode(
            name=f"gen-node-{k:04d}",
            cpu_milli=int(gpu_nodes[i].cpu_milli * cpu_scale),
            memory_mib=int(gpu_nodes[i].memory_mib * memory_scale),
            gpus=gpu_nodes[i].gpus,
            model=gpu_nodes[i].model,
        )
        for k, i in enumerate(int(x) for x in drawn_nodes)
    )

    # mixture: 1-3 variants in Dirichlet(1) shares, as many pods per card as they have on `nodes`
    k_variants = min(len(names), int(rng.integers(1, 4)))
    chosen = sorted(int(x) for x in rng.choice(len(names), size=k_variants, replace=False))
    shares = rng.dirichlet(np.ones(k_variants))
    cards = sum(n.gpus for n in gpu_nodes)
    per_card = sum(len(variants[names[c]]) for c in chosen) / k_variants / cards
    count = max(1, math.ceil(per_card * sum(n.gpus for n in out_nodes)))
    counts = rng.multinomial(count, shares)
    pods: list[TracePod] = []
    for c, many in zip(chosen, counts, strict=True):
        source = variants[names[c]]
        pods.extend(source[int(j)] for j in rng.integers(len(source), size=int(many)))
    pool = [p for name in names for p in variants[name]]

    # multi: scale the share of multi-card pods among the GPU pods
    multi_factor = round(_log_uniform(rng, 1 / 3, 3.0), 2) if rng.random() < P_MULTI else 1.0
    if multi_factor != 1.0:
        pods = _rescale_multi(pods, pool, multi_factor, rng)

    # models: constraints drawn over the node list's models
    constrained, dropped = 0.0, False
    if rng.random() < P_MODELS:
        constrained = round(float(rng.uniform(0.05, 0.4)), 2)
        dropped = bool(rng.random() < 0.5)
        pods = _constrain(pods, sorted({n.model for n in out_nodes}), constrained, dropped, rng)

    order = rng.permutation(len(pods))
    out_pods = tuple(_renamed(pods[int(j)], f"gen-pod-{k:05d}") for k, j in enumerate(order))
    recipe = Recipe(
        family=family,
        index=index,
        mixture=tuple((names[c], round(float(s), 2)) for c, s in zip(chosen, shares, strict=True)),
        supply=tuple((m, f) for m, f in factor.items() if f != 1.0),
        memory_scale=memory_scale,
        cpu_scale=cpu_scale,
        constrained=constrained,
        dropped_specs=dropped,
        multi_factor=multi_factor,
    )
    return Generated(recipe, out_nodes, out_pods)


def _renamed(pod: TracePod, name: str) -> TracePod:
    return TracePod(
        name=name,
        cpu_milli=pod.cpu_milli,
        memory_mib=pod.memory_mib,
        num_gpu=pod.num_gpu,
        gpu_milli=pod.gpu_milli,
        gpu_spec=pod.gpu_spec,
    )


def _rescale_multi(
    pods: list[TracePod], pool: Sequence[TracePod], factor: float, rng: np.random.Generator
) -> list[TracePod]:
    """Swap pods so the multi-card share of the GPU pods becomes ``factor`` x what it was (at most
    :data:`MAX_MULTI_SHARE`); replacements are drawn from the other kind's pods in ``pool``."""
    multi = [i for i, p in enumerate(pods) if p.num_gpu > 1]
    single = [i for i, p in enumerate(pods) if p.num_gpu == 1]
    multi_pool = [p for p in pool if p.num_gpu > 1]
    single_pool = [p for p in pool if p.num_gpu == 1]
    gpu = len(multi) + len(single)
    if not gpu or not multi_pool or not single_pool:
        return pods
    want = round(min(MAX_MULTI_SHARE, len(multi) / gpu * factor) * gpu)
    out = list(pods)
    if want > len(multi):
        swap, source = single, multi_pool
        n = min(want - len(multi), len(single))
    else:
        swap, source = multi, single_pool
        n = len(multi) - want
    for i in rng.choice(len(swap), size=n, replace=False) if n else ():
        out[swap[int(i)]] = source[int(rng.integers(len(source)))]
    return out


def _constrain(
    pods: list[TracePod], models: Sequence[str], share: float, drop: bool, rng: np.random.Generator
) -> list[TracePod]:
    """Give ``share`` of the GPU pods a constraint of 1-3 of ``models`` (drawn by a Dirichlet(0.5)
    popularity); with ``drop``, the other pods lose theirs."""
    popularity = rng.dirichlet(np.full(len(models), 0.5))
    out: list[TracePod] = []
    for pod in pods:
        spec = pod.gpu_spec
        if pod.num_gpu:
            if rng.random() < share:
                many = min(len(models), int(rng.choice((1, 2, 3), p=(0.5, 0.3, 0.2))))
                picked = rng.choice(len(models), size=many, replace=False, p=popularity)
                spec = tuple(models[int(k)] for k in sorted(int(x) for x in picked))
            elif drop:
                spec = ()
        out.append(
            pod
            if spec == pod.gpu_spec
            else TracePod(
                name=pod.name,
                cpu_milli=pod.cpu_milli,
                memory_mib=pod.memory_mib,
                num_gpu=pod.num_gpu,
                gpu_milli=pod.gpu_milli,
                gpu_spec=spec,
            )
        )
    return out


def nodes_csv(nodes: Sequence[TraceNode]) -> str:
    """The node list as ``sn,cpu_milli,memory_mib,gpu,model`` text."""
    rows = ["sn,cpu_milli,memory_mib,gpu,model"]
    rows += [f"{n.name},{n.cpu_milli},{n.memory_mib},{n.gpus},{n.model}" for n in nodes]
    return "\n".join(rows) + "\n"


def pods_csv(pods: Sequence[TracePod]) -> str:
    """The pod list as ``name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec`` text."""
    rows = ["name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec"]
    rows += [
        f"{p.name},{p.cpu_milli},{p.memory_mib},{p.num_gpu},{p.gpu_milli},{'|'.join(p.gpu_spec)}"
        for p in pods
    ]
    return "\n".join(rows) + "\n"


__all__ = ["Generated", "Recipe", "family_seed", "generate", "nodes_csv", "pods_csv"]
