"""A printed benchmark table and small statistics helpers shared by every benchmark module."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True, kw_only=True)
class Table:
    title: str
    columns: tuple[str, ...]
    rows: list[tuple[str, ...]] = field(default_factory=list)

    def render(self) -> str:
        widths = [
            max(len(c), *(len(r[i]) for r in self.rows)) if self.rows else len(c)
            for i, c in enumerate(self.columns)
        ]
        line = "  ".join(c.ljust(w) for c, w in zip(self.columns, widths, strict=True))
        out = [f"## {self.title}", line, "  ".join("-" * w for w in widths)]
        out += ["  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)) for r in self.rows]
        return "\n".join(out)


def percentile(samples: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100) of ``samples`` by nearest rank."""
    ordered = sorted(samples)
    rank = max(0, min(len(ordered) - 1, round(q / 100 * len(ordered)) - 1))
    return ordered[rank]


def ms(seconds: float) -> str:
    return f"{seconds * 1000:.3f}"


def summary(samples: Sequence[float]) -> tuple[str, str, str]:
    """median, p99, max in milliseconds."""
    return ms(statistics.median(samples)), ms(percentile(samples, 99)), ms(max(samples))
