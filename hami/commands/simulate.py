"""``hami simulate``: replay a trace under placement policies and print how much GPU stays unallocated.

Owns the command line (``add_arguments`` / ``run``): read and check the node and pod lists (or, with
``--kubeconfig``, the live cluster's registered cards and usage via :mod:`hami.simulate.live`), run
every policy x seed, print the table (or ``--json``: one object per policy, one per line), draw
``--plot``, and show progress on stderr (a bar on a terminal, one line per run otherwise).
Exit codes: 0 done, 2 bad input (the message names the file, line and value). The replay needs numpy
(the `sim` extra): imported when a run starts, so `--help` works without it (hami.cli names the extra).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

from hami.settings import DeviceConfig
from hami.simulate.manifests import read_manifest_pods
from hami.simulate.trace import TraceError, TraceNode, TracePod, read_nodes, read_pods, trace_name

if TYPE_CHECKING:  # the replay needs numpy (the 'sim' extra): imported when a run starts, not for --help
    from hami.simulate.cluster import Cluster
    from hami.simulate.replay import Progress
    from hami.simulate.report import Summary

MAX_SEEDS = 1000
MAX_SPLIT = 10_000
#: HAMi's deviceSplitCount default (hami.simulate.cluster.DEFAULT_SPLIT_COUNT, without importing numpy)
DEFAULT_SPLIT_COUNT = DeviceConfig().device_split_count


def parse_seeds(text: str) -> tuple[int, ...]:
    """``42..51``, ``42``, ``42,45`` or a mix (``1..3,7``): distinct seeds 0..2**32-1, at most 1000."""
    seeds: list[int] = []
    for part in text.split(","):
        part = part.strip()
        low, dots, high = part.partition("..")
        try:
            first, last = int(low), int(high if dots else low)
        except ValueError:
            raise argparse.ArgumentTypeError(f"seeds: {part!r} is not N or N..M") from None
        if not 0 <= first <= last < 2**32:
            raise argparse.ArgumentTypeError(f"seeds: {part!r} must be 0 <= N <= M < 2**32")
        if last - first + 1 + len(seeds) > MAX_SEEDS:
            raise argparse.ArgumentTypeError(f"seeds: at most {MAX_SEEDS} runs per policy")
        seeds.extend(range(first, last + 1))
    if len(set(seeds)) != len(seeds):
        raise argparse.ArgumentTypeError("seeds: a seed is given twice")
    return tuple(seeds)


def parse_policies(text: str) -> tuple[str, ...]:
    from hami.simulate.registry import POLICIES  # numpy: a missing 'sim' extra is reported by hami.cli

    names = tuple(POLICIES) if text.strip() == "all" else tuple(p.strip() for p in text.split(","))
    for name in names:
        if name not in POLICIES:
            raise argparse.ArgumentTypeError(f"unknown policy {name!r}; known: all, {', '.join(POLICIES)}")
    if len(set(names)) != len(names):
        raise argparse.ArgumentTypeError("a policy is given twice")
    return names


def parse_inflate(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number, got {text!r}") from None
    if not 0 < value <= 10:
        raise argparse.ArgumentTypeError(f"must be in (0, 10], got {text!r}")
    return value


def _count(low: int, high: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be a whole number, got {text!r}") from None
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"must be between {low} and {high}, got {text!r}")
        return value

    return parse


def _policy_names() -> str:
    try:
        from hami.simulate.registry import POLICIES
    except ImportError:
        return "listed here once the 'sim' extra is installed"
    return ", ".join(POLICIES)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--nodes", metavar="CSV", help="node list: sn,cpu_milli,memory_mib,gpu,model")
    parser.add_argument(
        "--kubeconfig",
        metavar="FILE",
        help="take the nodes from a live cluster instead: registered cards and their current usage",
    )
    parser.add_argument(
        "--pods",
        metavar="CSV",
        required=True,
        help="pod list: name,cpu_milli,memory_mib,num_gpu,gpu_milli[,gpu_spec]",
    )
    parser.add_argument(
        "--policy",
        type=parse_policies,
        default=("fgd",),
        metavar="NAME[,NAME]",
        help=f"policies to compare, or all (default fgd): {_policy_names()}",
    )
    parser.add_argument(
        "--seeds", type=parse_seeds, default=tuple(range(42, 52)), help="N..M or a list (default 42..51)"
    )
    parser.add_argument(
        "--inflate", type=parse_inflate, default=1.3, help="GPU demand to replay, x capacity (default 1.3)"
    )
    parser.add_argument(
        "--split-count",
        type=_count(1, MAX_SPLIT),
        default=DEFAULT_SPLIT_COUNT,
        help=f"slots per card, HAMi's deviceSplitCount (default {DEFAULT_SPLIT_COUNT})",
    )
    parser.add_argument("--limit", type=_count(1, 10**7), default=None, help="stop each run after N pods")
    parser.add_argument("--json", action="store_true", help="print one JSON object per policy")
    parser.add_argument(
        "--plot", metavar="FILE.png", help="draw the unallocated-GPU curves (needs matplotlib)"
    )


class ProgressLine:
    """Progress on ``stream``: a redrawn bar on a terminal, one line per finished run otherwise."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream
        self.tty = stream.isatty()

    def run(self, label: str) -> Progress:
        def report(done: int, total: int) -> None:
            if self.tty:
                filled = 30 * done // max(total, 1)
                bar = "#" * filled + "." * (30 - filled)
                end = "\n" if done == total else ""
                print(f"\r{label} [{bar}] {done}/{total} pods", end=end, file=self.stream, flush=True)
            elif done == total:
                print(f"{label}: {total} pods", file=self.stream, flush=True)

        return report


def _inputs(args: argparse.Namespace) -> tuple[Sequence[TraceNode] | None, Sequence[TracePod]]:
    if (args.nodes is None) == (args.kubeconfig is None):
        raise TraceError("give exactly one of --nodes CSV or --kubeconfig FILE")
    nodes = read_nodes(args.nodes) if args.nodes is not None else None
    pods = read_manifest_pods(args.pods) if Path(args.pods).is_dir() else read_pods(args.pods)
    return nodes, pods


def _base(args: argparse.Namespace, nodes: Sequence[TraceNode] | None) -> Sequence[TraceNode] | Cluster:
    if nodes is not None:
        return nodes
    from hami.simulate.live import load_cluster  # the only import of the Kubernetes layer

    return load_cluster(args.kubeconfig)


def simulate(args: argparse.Namespace, *, out: TextIO, err: TextIO) -> int:
    from hami.simulate.cluster import Cluster
    from hami.simulate.plot import plot_curves
    from hami.simulate.replay import RunResult, replay
    from hami.simulate.report import as_json, render_table, seeds_text, summarize
    from hami.simulate.workload import target_workload

    nodes, pods = _inputs(args)
    classes = target_workload(pods)
    name = trace_name(args.pods)
    progress = ProgressLine(err)
    base = _base(args, nodes)
    summaries: list[Summary] = []
    for policy in args.policy:
        results: list[RunResult] = []
        seconds: list[float] = []
        for k, seed in enumerate(args.seeds, 1):
            cluster = base.fork() if isinstance(base, Cluster) else base
            label = f"{name} {policy} seed {seed} ({k}/{len(args.seeds)})"
            started = time.perf_counter()
            result = replay(
                cluster,
                pods,
                policy,
                seed,
                inflate=args.inflate,
                classes=classes,
                split_count=args.split_count,
                progress=progress.run(label),
                limit=args.limit,
            )
            seconds.append(time.perf_counter() - started)
            results.append(result)
        summaries.append(summarize(name, policy, results, seconds))
    if args.json:
        for s in summaries:
            print(json.dumps(as_json(s), sort_keys=False), file=out)
    else:
        where = args.nodes if args.nodes is not None else f"the cluster of {args.kubeconfig}"
        header = (
            f"trace {name} ({len(pods)} pods; {summaries[0].pods_per_run:.0f} per run) on {where}; "
            f"seeds {seeds_text(args.seeds)}; inflate {args.inflate:g}; split count {args.split_count}"
        )
        print(render_table(summaries, header), file=out)
    if args.plot:
        plot_curves(summaries, Path(args.plot), f"{name}: unallocated GPU vs arrived demand")
    return 0


def run(args: argparse.Namespace) -> int:
    from hami.simulate.plot import PlotUnavailable  # numpy, via the report: hami.cli names the 'sim' extra

    try:
        return simulate(args, out=sys.stdout, err=sys.stderr)
    except (TraceError, ValueError, PlotUnavailable, OSError) as exc:
        print(f"hami simulate: {exc}", file=sys.stderr)
        return 2
