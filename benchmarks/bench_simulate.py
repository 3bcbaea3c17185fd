"""How long one ``hami simulate`` run takes (process CPU time, so a busy machine does not inflate it):
the default openb trace (1,213 nodes, about 10,800 arrivals
at 130 % of GPU capacity), one seed, per policy. Target: every policy <= 30 s per run on one core.

Baseline, measured in the same run: ``random`` (the node mask and the booking through the core with no
scoring), so the ratio column shows what each policy's scoring costs on top. The trace is the one shipped
in ``tests/data/openb`` (or the openb folder ``HAMI_BENCH_OPENB`` names); ``HAMI_BENCH_SIMULATE_POLICIES``
(comma list) limits the policies.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from benchmarks.table import Table
from hami.simulate.registry import POLICIES
from hami.simulate.replay import replay
from hami.simulate.trace import openb_folder, read_nodes, read_pods
from hami.simulate.workload import target_workload

TARGET_SECONDS = 30.0
BASELINE = "random"


def _openb() -> Path:
    default = Path(__file__).resolve().parents[1] / "tests" / "data" / "openb"
    return Path(os.environ.get("HAMI_BENCH_OPENB", default))


def run() -> list[Table]:
    node_file, pod_files = openb_folder(_openb())
    title = "hami simulate: seconds per run, default openb trace, seed 42"
    columns = ("policy", "pods", "CPU s/run", "wall s/run", "us/pod (CPU)", "x random", "<= 30 s")
    table = Table(title=title, columns=columns)
    nodes = read_nodes(node_file)
    pods = read_pods(pod_files["default"])
    classes = target_workload(pods)
    wanted = os.environ.get("HAMI_BENCH_SIMULATE_POLICIES")
    names = [n for n in POLICIES if n != BASELINE and (not wanted or n in wanted.split(","))]
    timings: dict[str, tuple[int, float, float]] = {}
    for name in [BASELINE, *names]:
        cpu, wall = time.process_time(), time.perf_counter()
        result = replay(nodes, pods, name, 42, classes=classes)
        timings[name] = (result.pods, time.process_time() - cpu, time.perf_counter() - wall)
    base = timings[BASELINE][1]
    for name, (count, seconds, wall_seconds) in timings.items():
        ok = "yes" if seconds <= TARGET_SECONDS else "NO"
        per_pod = f"{seconds / count * 1e6:.0f}"
        table.rows.append(
            (name, str(count), f"{seconds:.1f}", f"{wall_seconds:.1f}", per_pod, f"{seconds / base:.2f}", ok)
        )
    return [table]
