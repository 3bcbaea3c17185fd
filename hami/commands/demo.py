"""``hami demo``: the subcommand's flags, and :func:`run`, which loads the demo only when it runs.

The demo is the embedded cluster (:mod:`hami_testkit.demo_session`, :mod:`hami_testkit`): it needs the
``demo`` extra (kmock, a CEL engine, Kubernetes' OpenAPI schemas), which the product image does not
install. ``hami demo --help`` works without it; running the demo without it is one line naming the extra
(``hami.cli``). Must not import ``hami_testkit`` at module level.
"""

from __future__ import annotations

import argparse
from pathlib import Path


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--nodes", type=Path, default=None, help="cluster file (default: the packaged 4-node one)"
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


def run(args: argparse.Namespace) -> int:
    from hami.commands import demo_session  # the demo extra, only now

    return demo_session.run(args)
