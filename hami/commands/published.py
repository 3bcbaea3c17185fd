"""``hami published``: the measured table of docs/policies.md ("Measured") — every placement policy on the
nine published openb variants — replayed and printed.

Owns the command line (``add_arguments`` / ``run``) of two actions:

- ``run``: replay the table's plan (:func:`hami.simulate.published.plan`: trace x policy x seed) on the
  variants in ``--openb DIR`` (``tests/data/openb``) and append one JSON line per run to ``--results``
  (the format of ``hami heldout run``); runs already there are skipped, so a run can be stopped and
  resumed, or split over processes with ``--traces`` / ``--policy`` / ``--seeds`` (each narrows the plan);
- ``table``: the Markdown table from a results file (:func:`hami.simulate.published.render`), as
  docs/policies.md shows it; a run the plan needs and the file lacks is an error.

Exit codes: 0 done, 2 bad input (the message names the file and field). The replay needs numpy (the
``sim`` extra), imported when ``run`` starts.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path
from typing import TextIO

from hami.commands.heldout import read_results
from hami.commands.simulate import parse_policies, parse_seeds
from hami.simulate.published import TRACES, plan, render
from hami.simulate.trace import TraceError, openb_folder, read_nodes, read_pods


def parse_traces(text: str) -> tuple[str, ...]:
    names = tuple(t.strip() for t in text.split(","))
    for name in names:
        if name not in TRACES:
            raise argparse.ArgumentTypeError(f"unknown trace {name!r}; the table's: {', '.join(TRACES)}")
    return names


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("action", choices=("run", "table"))
    parser.add_argument("--openb", metavar="DIR", help="run: the published variants and node list")
    parser.add_argument(
        "--results", metavar="FILE.jsonl", required=True, help="run: appended to; table: read"
    )
    parser.add_argument("--traces", type=parse_traces, default=TRACES, help="run: only these (comma list)")
    parser.add_argument("--policy", type=parse_policies, default=None, help="run: only these (comma list)")
    parser.add_argument(
        "--seeds", type=parse_seeds, default=None, help="run: only these seeds (N..M or a list)"
    )


def _run(args: argparse.Namespace, out: TextIO) -> int:
    from hami.simulate.replay import replay
    from hami.simulate.workload import target_workload

    if args.openb is None:
        raise TraceError("--openb DIR is required: the folder with openb_pod_list_*.csv and the node list")
    path = Path(args.results)
    done = {(r.trace, r.policy, r.seed) for r in read_results(path)}
    todo = [
        (t, p, s)
        for t, p, s in plan()
        if t in args.traces
        and (args.policy is None or p in args.policy)
        and (args.seeds is None or s in args.seeds)
        and (t, p, s) not in done
    ]
    node_file, pod_files = openb_folder(args.openb)
    nodes = read_nodes(node_file)
    for trace in dict.fromkeys(t for t, _, _ in todo):
        if trace not in pod_files:
            raise TraceError(f"{args.openb}: no pod list of {trace}")
        pods = read_pods(pod_files[trace])
        classes = target_workload(pods)
        for _, policy, seed in (key for key in todo if key[0] == trace):
            started = time.process_time()
            at_100 = replay(nodes, pods, policy, seed, classes=classes).unallocated.get(100, math.nan)
            seconds = time.process_time() - started
            line = {
                "trace": trace,
                "policy": policy,
                "seed": seed,
                "at_100": None if math.isnan(at_100) else round(at_100, 4),
                "seconds": round(seconds, 3),
            }
            with path.open("a") as handle:
                handle.write(json.dumps(line) + "\n")
            print(f"{trace} {policy} seed {seed}: {at_100:.4f} ({seconds:.1f} s)", file=out, flush=True)
    return 0


def _table(args: argparse.Namespace, out: TextIO) -> int:
    runs = read_results(Path(args.results))
    if not runs:
        raise TraceError(f"{args.results}: no runs")
    print(render((r.trace, r.policy, r.seed, r.at_100) for r in runs), file=out)
    return 0


def run(args: argparse.Namespace) -> int:
    actions = {"run": _run, "table": _table}
    try:
        return actions[args.action](args, sys.stdout)
    except (TraceError, ValueError, OSError) as exc:
        print(f"hami published {args.action}: {exc}", file=sys.stderr)
        return 2
