"""``--plot FILE.png``: the unallocated-GPU curves of the policies run, as the paper's Fig. 9(a) shows them.

Owns :func:`plot_curves` and :func:`style` (each policy's colour, line style and marker). x: arrived GPU
demand in % of capacity; y: unallocated GPU % (mean over the seeds); one line per policy; a dotted line
at x = 100 where the paper compares. Policies often draw the same curve (``fgd`` and ``fragmentation``
on most traces), so no two policies share a colour *or* a dash-and-marker pattern, and the curves drawn
later are thinner: a curve under another one still shows between its dashes and markers. matplotlib
(the ``sim`` extra) is imported here only, with the non-interactive Agg backend; :class:`PlotUnavailable`
says how to install it when it is missing.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from hami.simulate.report import Summary


class PlotUnavailable(RuntimeError):
    """matplotlib is not installed."""


@dataclass(frozen=True, slots=True)
class Style:
    color: str
    linestyle: str | tuple[int, tuple[int, ...]]
    marker: str


#: Colours far apart (Okabe-Ito, colour-blind safe, then a few more), dash patterns and markers; policy
#: ``i`` of a plot takes colour ``i``, dash ``i`` and marker ``i`` of these (wrapping), so two policies
#: never share all three.
_COLORS = ("#000000", "#E69F00", "#56B4E9", "#009E73", "#D55E00", "#0072B2", "#CC79A7", "#999933", "#882255")
_DASHES: tuple[str | tuple[int, tuple[int, ...]], ...] = (
    "-",
    (0, (6, 3)),
    (0, (1, 2)),
    (0, (8, 3, 2, 3)),
    (0, (3, 3)),
    (0, (8, 2, 1, 2, 1, 2)),
    (0, (12, 4)),
    (0, (2, 4)),
    (0, (5, 2, 5, 6)),
)
_MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*", "<")
#: A fixed place for the known policies, so each keeps its look from plot to plot.
_KNOWN = (
    "random",
    "dotprod",
    "clustering",
    "packing",
    "bestfit",
    "fgd",
    "hami-binpack",
    "hami-spread",
    "fragmentation",
)


def style(policies: Sequence[str]) -> dict[str, Style]:
    """Each policy's look: the known ones their fixed place, others the next free places in turn."""
    taken = {_KNOWN.index(p) for p in policies if p in _KNOWN}
    free = (i for i in range(len(_KNOWN) + len(policies)) if i not in taken)
    places = {p: _KNOWN.index(p) if p in _KNOWN else next(free) for p in policies}
    return {
        p: Style(_COLORS[i % len(_COLORS)], _DASHES[i % len(_DASHES)], _MARKERS[i % len(_MARKERS)])
        for p, i in places.items()
    }


def plot_curves(summaries: Sequence[Summary], path: str | Path, title: str) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        from matplotlib import pyplot
    except ImportError:
        raise PlotUnavailable("--plot needs matplotlib: pip install 'hami-py[sim]'") from None
    looks = style([s.policy for s in summaries])
    figure, axes = pyplot.subplots(figsize=(7.5, 4.5), dpi=120)
    every = max(len(summaries), 4)  # each curve's markers at x values of its own
    try:
        for n, s in enumerate(summaries):
            xs = [x for x in sorted(s.curve) if x >= 50]
            look = looks[s.policy]
            label = f"{s.policy} ({s.at_100[0]:.2f} % at 100)"
            axes.plot(
                xs,
                [s.curve[x] for x in xs],
                label=label,
                color=look.color,
                linestyle=look.linestyle,
                linewidth=max(2.6 - 0.2 * n, 1.0),  # later curves thinner: an earlier one shows around
                marker=look.marker,
                markevery=(n % every, every) if len(xs) > 3 * every else None,  # interleaved
                markersize=4,
                markerfacecolor="none",
            )
        axes.axvline(100, color="grey", linestyle=":", linewidth=1)
        axes.set_xlabel("arrived GPU demand (% of cluster GPU capacity)")
        axes.set_ylabel("unallocated GPU (%)")
        axes.set_title(title)
        axes.grid(True, alpha=0.3)
        axes.legend(fontsize=8)
        figure.tight_layout()
        figure.savefig(str(path))
    finally:
        pyplot.close(figure)
