"""``hami heldout``: the held-out protocol of docs/policies.md — generated trace families, two policies
replayed over the same seeds, a paired test per trace.

Owns the command line (``add_arguments`` / ``run``) of three actions:

- ``generate``: write each trace of a family (``DIR/<family>-<index>/nodes.csv``, ``pods.csv``,
  ``recipe.txt``) so anyone can replay it with ``hami simulate``;
- ``run``: replay the policies on a family's traces (generated in memory, the same as ``generate``
  writes) and append one JSON line per (trace, policy, seed) to ``--results``; runs already there are
  skipped, so a run can be stopped and resumed, or split over processes (``--start``/``--traces``);
- ``table``: the comparison from a results file (per trace the means, the difference with its sd, the
  paired t test's p and verdict; the worst case and the mean difference).

The published variants are read from ``--openb DIR`` (``openb_pod_list_*.csv`` and
``openb_node_list_gpu_node.csv``, each maybe gzipped: ``tests/data/openb`` holds them). Exit codes: 0
done, 2 bad input (the message names the file and field). The replay needs numpy (the ``sim`` extra),
imported when an action starts.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from hami.commands.simulate import parse_policies, parse_seeds
from hami.simulate.trace import TraceError, openb_folder, read_nodes, read_pods

if TYPE_CHECKING:
    from hami.simulate.generate import Generated
    from hami.simulate.protocol import Run

MAX_TRACES = 10_000


def _positive(high: int) -> Any:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be a whole number, got {text!r}") from None
        if not 0 <= value <= high:
            raise argparse.ArgumentTypeError(f"must be between 0 and {high}, got {text!r}")
        return value

    return parse


def _family(text: str) -> str:
    if not text or len(text) > 63 or not all(c.isalnum() or c in "-_" for c in text):
        raise argparse.ArgumentTypeError(f"family {text!r}: 1-63 letters, digits, - or _")
    return text


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("action", choices=("generate", "run", "table"))
    parser.add_argument("--openb", metavar="DIR", help="the openb variants and node list (generate, run)")
    parser.add_argument("--family", type=_family, default="report", help="the family's name (default report)")
    parser.add_argument(
        "--start", type=_positive(MAX_TRACES), default=0, help="first trace index (default 0)"
    )
    parser.add_argument(
        "--traces", type=_positive(MAX_TRACES), default=40, help="how many traces (default 40)"
    )
    parser.add_argument("--size", type=_positive(100_000), default=300, help="nodes per trace (default 300)")
    parser.add_argument("--out", metavar="DIR", help="generate: where the traces go")
    parser.add_argument("--results", metavar="FILE.jsonl", help="run: appended to; table: read")
    parser.add_argument(
        "--policy",
        type=parse_policies,
        default=("fgd", "fragmentation"),
        help="BASE,OTHER (default fgd,fragmentation)",
    )
    parser.add_argument(
        "--seeds", type=parse_seeds, default=tuple(range(42, 47)), help="N..M (default 42..46)"
    )


def _variants(folder: str | None) -> tuple[dict[str, Any], Any]:
    if folder is None:
        raise TraceError("--openb DIR is required: the folder with openb_pod_list_*.csv and the node list")
    nodes, files = openb_folder(folder)
    return {name: read_pods(f) for name, f in files.items()}, read_nodes(nodes)


def _traces(args: argparse.Namespace) -> list[Generated]:
    from hami.simulate.generate import generate

    if args.size < 1:
        raise TraceError("--size must be at least 1")
    variants, nodes = _variants(args.openb)
    return [
        generate(variants, nodes, args.family, index, size=args.size)
        for index in range(args.start, args.start + args.traces)
    ]


def _generate(args: argparse.Namespace, out: TextIO) -> int:
    from hami.simulate.generate import nodes_csv, pods_csv

    if args.out is None:
        raise TraceError("--out DIR is required")
    for trace in _traces(args):
        where = Path(args.out) / trace.recipe.name
        where.mkdir(parents=True, exist_ok=True)
        (where / "nodes.csv").write_text(nodes_csv(trace.nodes))
        (where / "pods.csv").write_text(pods_csv(trace.pods))
        (where / "recipe.txt").write_text(trace.recipe.describe() + "\n")
        print(
            f"{where}: {len(trace.nodes)} nodes, {len(trace.pods)} pods; {trace.recipe.describe()}", file=out
        )
    return 0


def read_results(path: Path) -> list[Run]:
    """The runs of a results file, one JSON object per line (``trace``, ``policy``, ``seed``, ``at_100``,
    ``seconds``); none when it does not exist yet. Shared with ``hami published``."""
    from hami.simulate.protocol import Run

    if not path.exists():
        return []
    runs: list[Run] = []
    for line_no, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            runs.append(
                Run(
                    trace=str(row["trace"]),
                    policy=str(row["policy"]),
                    seed=int(row["seed"]),
                    at_100=math.nan if row["at_100"] is None else float(row["at_100"]),
                    seconds=float(row["seconds"]),
                )
            )
        except (ValueError, KeyError, TypeError) as exc:
            raise TraceError(f"{path}:{line_no}: not a result line ({exc})") from None
    return runs


def _run(args: argparse.Namespace, out: TextIO) -> int:
    from hami.simulate.protocol import run_trace

    if args.results is None:
        raise TraceError("--results FILE.jsonl is required")
    path = Path(args.results)
    done = {(r.trace, r.policy, r.seed) for r in read_results(path)}
    for trace in _traces(args):
        seeds = [s for s in args.seeds if any((trace.recipe.name, p, s) not in done for p in args.policy)]
        if not seeds:
            continue
        runs = run_trace(trace, args.policy, seeds, clock=time.process_time)
        with path.open("a") as handle:
            for r in runs:
                if (r.trace, r.policy, r.seed) in done:
                    continue
                handle.write(
                    json.dumps(
                        {
                            "trace": r.trace,
                            "policy": r.policy,
                            "seed": r.seed,
                            "at_100": None if math.isnan(r.at_100) else round(r.at_100, 4),
                            "seconds": round(r.seconds, 3),
                            "recipe": trace.recipe.describe(),
                        }
                    )
                    + "\n"
                )
        print(f"{trace.recipe.name}: {len(runs)} runs; {trace.recipe.describe()}", file=out, flush=True)
    return 0


def _table(args: argparse.Namespace, out: TextIO) -> int:
    from hami.simulate.protocol import compare, render

    if args.results is None:
        raise TraceError("--results FILE.jsonl is required")
    if len(args.policy) != 2:
        raise TraceError("--policy needs exactly two policies, BASE,OTHER")
    runs = read_results(Path(args.results))
    recipes: dict[str, str] = {}
    for line in Path(args.results).read_text().splitlines():
        row = json.loads(line) if line.strip() else {}
        if isinstance(row.get("recipe"), str):
            recipes[str(row["trace"])] = row["recipe"]
    base, other = args.policy
    print(render(compare(runs, base, other), base, other, recipes), file=out)
    return 0


def run(args: argparse.Namespace) -> int:
    actions = {"generate": _generate, "run": _run, "table": _table}
    try:
        return actions[args.action](args, sys.stdout)
    except (TraceError, ValueError, OSError) as exc:
        print(f"hami heldout {args.action}: {exc}", file=sys.stderr)
        return 2
