"""``--plot``: every policy's curve stays visible, also where two policies draw the same curve (before:
``fgd`` vanished under ``fragmentation``, a solid line of the same width drawn over it)."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import pytest

from hami.simulate.plot import plot_curves
from hami.simulate.registry import POLICIES
from hami.simulate.report import Summary

pytest.importorskip("matplotlib")

import matplotlib

matplotlib.use("Agg")
from matplotlib import image, pyplot
from matplotlib.colors import to_rgb
from matplotlib.figure import Figure

CURVE = {x: max(0.0, 100.0 - 0.8 * x) + (5.0 if x > 100 else 0.0) for x in range(0, 131)}


def _summary(policy: str) -> Summary:
    return Summary(
        trace="t",
        policy=policy,
        seeds=(1,),
        at_100=(CURVE[100], 0.0),
        curve=dict(CURVE),
        points={},
        frag_total_at_100=None,
        frag_rate_at_100=None,
        dropped={},
        slot_bound=0.0,
        pods_per_run=1.0,
        seconds_per_run=0.0,
    )


def _draw(policies: list[str], path: Path, monkeypatch: pytest.MonkeyPatch) -> Figure:
    """Plot the same curve for every policy; the figure as drawn (kept from ``pyplot.close``)."""
    drawn: list[Figure] = []
    close = pyplot.close

    def keep(figure: Any = None) -> None:
        drawn.append(figure)
        close(figure)

    monkeypatch.setattr(pyplot, "close", keep)
    plot_curves([_summary(p) for p in policies], path, "t")
    (figure,) = drawn
    return figure


def test_no_two_policies_share_a_colour_or_a_dash_and_marker(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    figure = _draw(list(POLICIES), tmp_path / "all.png", monkeypatch)
    lines = [line for line in figure.axes[0].get_lines() if not str(line.get_label()).startswith("_")]
    assert len(lines) == len(POLICIES)
    for a, b in itertools.combinations(lines, 2):
        assert to_rgb(a.get_color()) != to_rgb(b.get_color()), (a.get_label(), b.get_label())
        assert a.get_marker() != b.get_marker(), (a.get_label(), b.get_label())
    assert all(line.get_marker() not in ("None", "", None) for line in lines)
    assert len({str(line.get_linestyle()) for line in lines}) > 1  # dashes, not only solid lines


@pytest.mark.parametrize("order", [["fgd", "fragmentation"], ["fragmentation", "fgd"]])
def test_a_curve_drawn_under_the_same_curve_still_shows(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, order: list[str]
) -> None:
    """The PNG itself: pixels of the curve drawn first (outside the legend box) are still its colour."""
    png = tmp_path / "two.png"
    figure = _draw(order, png, monkeypatch)
    axes = figure.axes[0]
    first, second = (line for line in axes.get_lines() if not str(line.get_label()).startswith("_"))
    pixels = image.imread(str(png))[:, :, :3]
    height = pixels.shape[0]
    legend_box = axes.get_legend()
    assert legend_box is not None
    box = legend_box.get_window_extent()
    legend = (
        slice(int(height - box.y1) - 2, int(height - box.y0) + 2),
        slice(int(box.x0) - 2, int(box.x1) + 2),
    )
    pixels[legend] = 1.0  # the legend's swatches do not count
    counts = [
        int(((abs(pixels - to_rgb(line.get_color()))).max(axis=2) < 0.12).sum()) for line in (first, second)
    ]
    assert counts[1] > 200, counts  # the top curve is there
    assert counts[0] > counts[1] // 5, counts  # and the one under it shows too
