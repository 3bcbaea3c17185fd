"""``--plot FILE.png``: the unallocated-GPU curves of the policies run, as the paper's Fig. 9(a) shows them.

Owns :func:`plot_curves`. x: arrived GPU demand in % of capacity; y: unallocated GPU % (mean over the
seeds); one line per policy; a dotted line at x = 100 where the paper compares. matplotlib (the ``sim``
extra) is imported here only, with the non-interactive Agg backend; :class:`PlotUnavailable` says how to
install it when it is missing.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from hami.simulate.report import Summary


class PlotUnavailable(RuntimeError):
    """matplotlib is not installed."""


def plot_curves(summaries: Sequence[Summary], path: str | Path, title: str) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        from matplotlib import pyplot
    except ImportError:
        raise PlotUnavailable("--plot needs matplotlib: pip install 'hami-py[sim]'") from None
    figure, axes = pyplot.subplots(figsize=(7.5, 4.5), dpi=120)
    try:
        for s in summaries:
            xs = [x for x in sorted(s.curve) if x >= 50]
            label = f"{s.policy} ({s.at_100[0]:.2f} % at 100)"
            axes.plot(xs, [s.curve[x] for x in xs], label=label, linewidth=1.6)
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
