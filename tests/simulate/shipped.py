"""The openb trace shipped with the repository (``tests/data/openb/``, its README says what and whence):
the paths the simulator's tests and ``make bench`` read, so no test depends on anything beside the
checkout."""

from __future__ import annotations

from pathlib import Path

OPENB = Path(__file__).resolve().parents[1] / "data" / "openb"
NODES = OPENB / "openb_node_list_gpu_node.csv.gz"


def pods(variant: str) -> Path:
    """The pod list of ``variant`` (``default``, ``gpushare40``, ...)."""
    return OPENB / f"openb_pod_list_{variant}.csv.gz"
