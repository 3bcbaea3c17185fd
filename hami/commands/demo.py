"""``hami demo``: the subcommand's flags, and :func:`run`, which loads the demo only when it runs.

The demo is the embedded cluster of the test kit (``hami_testkit.demo_session``), a distribution of its
own that the ``demo`` extra installs (with kmock, a CEL engine, Kubernetes' OpenAPI schemas) and the
product image does not. ``hami demo --help`` works without it; running the demo without it is one line
naming the extra (``hami.cli``). The product never imports the kit (an import contract): it is loaded
by name, only to run.
"""

from __future__ import annotations

import argparse
import importlib
from pathlib import Path

from hami.process.flags import parse_whole


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--nodes", type=Path, default=None, help="cluster file (default: the packaged 4-node one)"
    )
    parser.add_argument(
        "--generate",
        type=int,
        default=None,
        metavar="N",
        help="a generated cluster of N simulated nodes instead of a cluster file (its agents run as one fleet"
        " process; the example pods run only with --examples)",
    )
    parser.add_argument(
        "--card-mix",
        default="openb",
        metavar="MIX",
        help="with --generate: openb (the openb node list's mix, the default) or MODEL[xCARDS][:WEIGHT],..."
        " (e.g. T4x4:2,V100M32x8; models P100 T4 V100M16 V100M32 A10 G2 G3 A100)",
    )
    parser.add_argument(
        "--node-list",
        type=Path,
        default=None,
        metavar="CSV",
        help="with --generate: draw the card mix from this node list (openb CSV, as hami simulate reads)",
    )
    parser.add_argument(
        "--seed", type=int, default=0, help="with --generate: the seed of the node order and UUIDs"
    )
    parser.add_argument(
        "--agents",
        choices=("process", "fleet"),
        default=None,
        help="one node-agent process per node, or one fleet process for all (default: fleet with --generate)",
    )
    parser.add_argument(
        "--percentage-of-nodes-to-score",
        type=_percentage,
        default=100,
        metavar="PCT",
        help="the nodes the kube-scheduler stand-in sends the extender, as kube-scheduler's"
        " percentageOfNodesToScore: 100 (the default, what the chart renders) every node its own filters"
        " keep, 0 its adaptive sample (420 of 1,000 nodes)",
    )
    parser.add_argument(
        "--examples",
        type=Path,
        default=None,
        help="directory of pod manifests, *.yaml and *.yml (default: the packaged examples)",
    )
    parser.add_argument("--keep", action="store_true", help="keep the cluster running until Ctrl-C")
    parser.add_argument(
        "--bare",
        action="store_true",
        help="start only the embedded cluster (its nodes and the Job stand-in for the chart's hooks), none of"
        " our components, and keep it running until Ctrl-C: for `helm install` of the chart",
    )
    parser.add_argument(
        "--timeout", type=float, default=120.0, help="seconds to wait for every pod to be decided"
    )
    parser.add_argument("--workdir", type=Path, default=None, help="where kubeconfig, logs and node files go")
    parser.add_argument(
        "--register-interval", type=float, default=1.0, help="node agents' registration period"
    )
    parser.add_argument(
        "--log-level", default="INFO", help="components' log level (their logs are in workdir)"
    )


def _percentage(text: str) -> int:
    return parse_whole(
        "percentage-of-nodes-to-score", text, minimum=0, maximum=100, error=argparse.ArgumentTypeError
    )


#: What the demo runs: the test kit's module, loaded by name when the demo starts.
SESSION_MODULE = "hami_testkit.demo_session"


def run(args: argparse.Namespace) -> int:
    session = importlib.import_module(SESSION_MODULE)  # the demo extra, only now
    result: int = session.run(args)
    return result
