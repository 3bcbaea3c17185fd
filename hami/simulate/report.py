"""What ``hami simulate`` prints: runs of one policy summed up over seeds, as a table or as JSON.

Owns :class:`Summary` (:func:`summarize`), :func:`as_json` (the issue's object: ``trace``, ``policy``,
``seeds``, ``at_100`` {mean, sd}, ``curve`` {"<x>": mean}, ``frag_total_at_100``,
``seconds_per_run``, plus ``points``, ``dropped`` and ``frag_rate_at_100``) and :func:`render_table`.
Means are over seeds; ``sd`` is the sample standard deviation (0 for one seed), as the paper reports.
Pure: no I/O.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from hami.simulate.replay import RunResult
from hami.simulate.trace import KINDS

POINTS = (90, 100, 110, 130)


@dataclass(frozen=True, slots=True, kw_only=True)
class Summary:
    trace: str
    policy: str
    seeds: tuple[int, ...]
    at_100: tuple[float, float]  # mean, sd of unallocated GPU % at x = 100
    curve: dict[int, float]  # x -> mean unallocated GPU % over the seeds that reached x
    points: dict[int, float | None]
    frag_total_at_100: float | None
    frag_rate_at_100: float | None
    dropped: dict[str, float]  # mean drops per run, by pod kind
    slot_bound: float
    pods_per_run: float
    seconds_per_run: float


def _mean_at(results: Sequence[RunResult], field: str, x: int) -> float | None:
    values = [getattr(r, field)[x] for r in results if x in getattr(r, field)]
    return statistics.fmean(values) if values else None


def summarize(trace: str, policy: str, results: Sequence[RunResult], seconds: Sequence[float]) -> Summary:
    if not results:
        raise ValueError("no runs to summarize")
    at_100 = [r.unallocated[100] for r in results if 100 in r.unallocated]
    xs = sorted({x for r in results for x in r.unallocated})
    curve = {x: v for x in xs if (v := _mean_at(results, "unallocated", x)) is not None}
    return Summary(
        trace=trace,
        policy=policy,
        seeds=tuple(r.seed for r in results),
        at_100=(
            statistics.fmean(at_100) if at_100 else float("nan"),
            statistics.stdev(at_100) if len(at_100) > 1 else (0.0 if at_100 else float("nan")),
        ),
        curve=curve,
        points={x: curve.get(x) for x in POINTS},
        frag_total_at_100=_mean_at(results, "frag_total", 100),
        frag_rate_at_100=_mean_at(results, "frag_rate", 100),
        dropped={k: statistics.fmean(r.dropped.get(k, 0) for r in results) for k in KINDS},
        slot_bound=statistics.fmean(r.slot_bound for r in results),
        pods_per_run=statistics.fmean(r.pods for r in results),
        seconds_per_run=statistics.fmean(seconds) if seconds else 0.0,
    )


def _round(value: float | None, digits: int = 4) -> float | None:
    return None if value is None or value != value else round(value, digits)


def as_json(s: Summary) -> dict[str, Any]:
    """The ``--json`` object of one policy."""
    return {
        "trace": s.trace,
        "policy": s.policy,
        "seeds": list(s.seeds),
        "at_100": {"mean": _round(s.at_100[0]), "sd": _round(s.at_100[1])},
        "curve": {str(x): _round(v) for x, v in s.curve.items()},
        "frag_total_at_100": _round(s.frag_total_at_100),
        "seconds_per_run": _round(s.seconds_per_run, 3),
        "points": {str(x): _round(v) for x, v in s.points.items()},
        "frag_rate_at_100": _round(s.frag_rate_at_100),
        "dropped": {k: _round(v, 2) for k, v in s.dropped.items()},
        "slot_bound_drops": _round(s.slot_bound, 2),
        "pods_per_run": _round(s.pods_per_run, 1),
    }


def _cell(value: float | None) -> str:
    return "-" if value is None or value != value else f"{value:.2f}"


def seeds_text(seeds: Sequence[int]) -> str:
    """``42..51`` for a consecutive run, else the list."""
    ordered = list(seeds)
    if len(ordered) > 2 and ordered == list(range(ordered[0], ordered[0] + len(ordered))):
        return f"{ordered[0]}..{ordered[-1]}"
    return ",".join(str(s) for s in ordered)


def render_table(summaries: Sequence[Summary], header: str) -> str:
    """One row per policy: unallocated GPU % at 90/100/110/130 % arrived, frag/total, drops, s/run."""
    columns = (
        "policy",
        "@90",
        "@100 (mean ± sd)",
        "@110",
        "@130",
        "frag/total@100",
        "dropped cpu/share/1-gpu/multi",
        "s/run",
    )
    rows = [
        (
            s.policy,
            _cell(s.points[90]),
            f"{_cell(s.at_100[0])} ± {_cell(s.at_100[1])}",
            _cell(s.points[110]),
            _cell(s.points[130]),
            _cell(s.frag_total_at_100),
            "/".join(f"{s.dropped[k]:.0f}" for k in KINDS),
            f"{s.seconds_per_run:.1f}",
        )
        for s in summaries
    ]
    widths = [max(len(c), *(len(r[k]) for r in rows)) for k, c in enumerate(columns)]
    lines = [header, "unallocated GPU % at x % of GPU capacity arrived (mean over seeds)", ""]
    lines.append("  ".join(c.ljust(w) for c, w in zip(columns, widths, strict=True)).rstrip())
    lines.append("  ".join("-" * w for w in widths))
    lines += ["  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    bound = [s for s in summaries if s.slot_bound > 0]
    if bound:
        lines.append("")
        lines += [
            f"{s.policy}: {s.slot_bound:.1f} drops per run were due to the card slot limit" for s in bound
        ]
    return "\n".join(lines)
