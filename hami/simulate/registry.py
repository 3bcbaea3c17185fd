"""Every placement rule ``hami simulate`` knows, by name: the paper's six and HAMi's two
(:mod:`hami.simulate.policies`) and our ``fragmentation`` (:mod:`hami.simulate.fragmentation`).

Owns :data:`POLICIES` (name -> builder, in the order tables list them), :data:`PAPER` (the paper's six)
and :func:`make_policy`. It sits above both rule modules, so neither imports the other's registry: the
rules import nothing of it, ``fragmentation`` builds on ``policies`` and never the reverse (an
import-linter contract in pyproject.toml keeps that order). Pure numpy, no I/O.
"""

from __future__ import annotations

from collections.abc import Callable

from hami.core.score import BINPACK, SPREAD
from hami.simulate.fragmentation import Fragmentation
from hami.simulate.policies import (
    FGD,
    BestFit,
    Clustering,
    Context,
    DotProd,
    Hami,
    Packing,
    Policy,
    RandomPolicy,
)

POLICIES: dict[str, Callable[[Context], Policy]] = {
    "random": RandomPolicy,
    "dotprod": DotProd,
    "clustering": Clustering,
    "packing": Packing,
    "bestfit": BestFit,
    "fgd": FGD,
    "hami-binpack": lambda ctx: Hami(ctx, BINPACK),
    "hami-spread": lambda ctx: Hami(ctx, SPREAD),
    "fragmentation": Fragmentation,
}
PAPER = ("random", "dotprod", "clustering", "packing", "bestfit", "fgd")


def make_policy(name: str, ctx: Context) -> Policy:
    build = POLICIES.get(name)
    if build is None:
        raise ValueError(f"unknown policy {name!r}; known: {', '.join(POLICIES)}")
    return build(ctx)
