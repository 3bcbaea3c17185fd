"""The held-out protocol: two policies replayed on generated traces over the same seeds, compared by a
paired test per trace.

Owns :func:`paired` (:class:`Paired`: the mean and sample sd of the per-seed differences, Student's
paired t and its two-sided p, wins/losses by seed), :func:`student_p`, :func:`run_trace` (one trace,
every policy x seed: the unallocated GPU % at x = 100 per run, as :class:`Run` rows),
:func:`compare` and :func:`render` (the table: per trace both means, the difference with its spread,
p, the verdict; then the worst case, the verdicts again after Holm's adjustment for testing every
trace (:func:`holm`), the mean gain, and a paired test over the traces' mean differences). A
difference is a loss or a win only when ``p < ALPHA``; otherwise it is noise. Pure: stdlib math and
the replay (numpy), no I/O, no clock of its own.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from hami.simulate.generate import Generated
from hami.simulate.replay import replay
from hami.simulate.workload import target_workload

ALPHA = 0.05


@dataclass(frozen=True, slots=True, kw_only=True)
class Run:
    """One replay: trace, policy, seed, unallocated GPU % at x = 100, CPU seconds."""

    trace: str
    policy: str
    seed: int
    at_100: float
    seconds: float


@dataclass(frozen=True, slots=True, kw_only=True)
class Paired:
    """Per-seed differences ``b - a``: their mean and sample sd, Student's t, the two-sided p, and in how
    many seeds ``b`` was lower (wins) or higher (losses)."""

    n: int
    mean: float
    sd: float
    t: float
    p: float
    wins: int
    losses: int

    @property
    def verdict(self) -> str:
        if self.p < ALPHA:
            return "lower" if self.mean < 0 else "HIGHER"
        return "noise"


def _betacf(a: float, b: float, x: float) -> float:
    """The continued fraction of the regularized incomplete beta (modified Lentz)."""
    tiny = 1e-300
    qab, qap, qam = a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 300):
        m2 = 2 * m
        aa = m * (b - m) * x / ((qam + m2) * (a + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c if abs(1.0 + aa / c) > tiny else tiny
        h *= d * c
        aa = -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c if abs(1.0 + aa / c) > tiny else tiny
        delta = d * c
        h *= delta
        if abs(delta - 1.0) < 1e-12:
            break
    return h


def _betai(a: float, b: float, x: float) -> float:
    """The regularized incomplete beta ``I_x(a, b)``."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    front = math.exp(
        math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    )
    if x < (a + 1.0) / (a + b + 2.0):
        return front * _betacf(a, b, x) / a
    return 1.0 - front * _betacf(b, a, 1.0 - x) / b


def student_p(t: float, df: int) -> float:
    """Two-sided p of Student's t with ``df`` degrees of freedom."""
    if df < 1:
        raise ValueError("a t test needs at least one degree of freedom")
    if math.isinf(t):
        return 0.0
    if math.isnan(t):
        return 1.0
    return _betai(df / 2.0, 0.5, df / (df + t * t))


def paired(a: Sequence[float], b: Sequence[float]) -> Paired:
    """Student's paired t test of ``b`` against ``a`` (same seeds, same order); at least two pairs."""
    if len(a) != len(b):
        raise ValueError(f"paired samples differ in length: {len(a)} and {len(b)}")
    if len(a) < 2:
        raise ValueError("a paired test needs at least two pairs")
    d = [y - x for x, y in zip(a, b, strict=True)]
    mean = statistics.fmean(d)
    sd = statistics.stdev(d)
    if sd == 0.0:
        t = 0.0 if mean == 0.0 else math.copysign(math.inf, mean)
    else:
        t = mean / (sd / math.sqrt(len(d)))
    return Paired(
        n=len(d),
        mean=mean,
        sd=sd,
        t=t,
        p=student_p(t, len(d) - 1),
        wins=sum(1 for x in d if x < 0),
        losses=sum(1 for x in d if x > 0),
    )


def holm(ps: Sequence[float]) -> list[float]:
    """Holm's step-down adjustment of ``ps`` for testing them all at once (each adjusted p >= its own):
    with many traces some raw p fall below ``ALPHA`` by chance alone."""
    order = sorted(range(len(ps)), key=lambda i: ps[i])
    out = [1.0] * len(ps)
    running = 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (len(ps) - rank) * ps[i]))
        out[i] = running
    return out


def run_trace(
    trace: Generated,
    policies: Sequence[str],
    seeds: Iterable[int],
    *,
    inflate: float = 1.3,
    clock: Callable[[], float] = lambda: 0.0,
) -> list[Run]:
    """Every policy x seed on one generated trace (the target workload is the trace's own); ``clock``
    (the caller's, e.g. ``time.process_time``) times each run."""
    classes = target_workload(trace.pods)
    out: list[Run] = []
    for seed in seeds:
        for policy in policies:
            started = clock()
            result = replay(trace.nodes, trace.pods, policy, seed, inflate=inflate, classes=classes)
            out.append(
                Run(
                    trace=trace.recipe.name,
                    policy=policy,
                    seed=seed,
                    at_100=result.unallocated.get(100, math.nan),
                    seconds=clock() - started,
                )
            )
    return out


@dataclass(frozen=True, slots=True, kw_only=True)
class Row:
    trace: str
    base: float  # mean over seeds
    other: float
    test: Paired


def compare(runs: Iterable[Run], base: str, other: str) -> list[Row]:
    """Per trace, ``other`` against ``base`` over the seeds both have (a trace with fewer than two such
    seeds is left out)."""
    table: dict[str, dict[str, dict[int, float]]] = {}
    for r in runs:
        table.setdefault(r.trace, {}).setdefault(r.policy, {})[r.seed] = r.at_100
    rows: list[Row] = []
    for trace in sorted(table):
        a, b = table[trace].get(base, {}), table[trace].get(other, {})
        seeds = sorted(set(a) & set(b))
        if len(seeds) < 2:
            continue
        xs, ys = [a[s] for s in seeds], [b[s] for s in seeds]
        rows.append(
            Row(trace=trace, base=statistics.fmean(xs), other=statistics.fmean(ys), test=paired(xs, ys))
        )
    return rows


def render(rows: Sequence[Row], base: str, other: str, describe: dict[str, str] | None = None) -> str:
    """The table and its summary lines (see the module docstring)."""
    if not rows:
        return "no trace with at least two seeds of both policies"
    lines = [
        f"| trace | {base} | {other} | diff (sd) | p | seeds lower/higher | verdict |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        t = r.test
        label = r.trace if not describe or r.trace not in describe else f"{r.trace} ({describe[r.trace]})"
        lines.append(
            f"| {label} | {r.base:.2f} | {r.other:.2f} | {t.mean:+.3f} ({t.sd:.3f}) | {t.p:.3f} "
            f"| {t.wins}/{t.losses} | {t.verdict} |"
        )
    worst = max(rows, key=lambda r: r.test.mean)
    adjusted = dict(zip((r.trace for r in rows), holm([r.test.p for r in rows]), strict=True))
    held = [r for r in rows if adjusted[r.trace] < ALPHA]
    diffs = [r.test.mean for r in rows]
    higher = [r for r in rows if r.test.verdict == "HIGHER"]
    lower = [r for r in rows if r.test.verdict == "lower"]
    seeds = sorted({r.test.n for r in rows})
    lines.append("")
    lines.append(
        f"{len(rows)} traces, {'/'.join(map(str, seeds))} seeds each; {other} below {base} on "
        f"{sum(d < 0 for d in diffs)}, above on {sum(d > 0 for d in diffs)}; significantly (p < {ALPHA}) "
        f"lower on {len(lower)}, higher on {len(higher)}"
    )
    lines.append(
        f"worst case {worst.trace}: {worst.test.mean:+.3f} points (sd {worst.test.sd:.3f}, "
        f"p {worst.test.p:.3f}, {worst.test.verdict}; Holm-adjusted over the {len(rows)} traces "
        f"p {adjusted[worst.trace]:.3f})"
    )
    lines.append(
        f"after Holm's adjustment: lower on {sum(r.test.mean < 0 for r in held)}, "
        f"higher on {sum(r.test.mean > 0 for r in held)}"
    )
    lines.append(
        f"mean difference {statistics.fmean(diffs):+.3f} points, median {statistics.median(diffs):+.3f}"
    )
    if len(rows) >= 2:
        over = paired([0.0] * len(diffs), diffs)
        lines.append(f"over the traces' means: t {over.t:.2f}, p {over.p:.2g}")
    return "\n".join(lines)
