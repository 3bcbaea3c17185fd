"""ENTRY POINT ``hami``: one console script, one subcommand per job.

Each subcommand lives in its own module exposing ``add_arguments(parser)`` and ``run(args) -> int``;
this file only wires them (imports are lazy so ``hami --help`` stays fast and a subcommand's heavy
dependencies load only when used).
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

#: subcommand -> (module, one-line help)
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "scheduler": ("hami.scheduler.main", "run the scheduler extender kube-scheduler calls"),
    "demo": ("hami.sim.demo", "run the whole system on an embedded cluster and place the example pods"),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="hami", description="GPU sharing for Kubernetes (HAMi-compatible).")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, (module_name, help_text) in SUBCOMMANDS.items():
        command = sub.add_parser(name, help=help_text, description=help_text)
        command.set_defaults(module=module_name)
        module = importlib.import_module(module_name)
        module.add_arguments(command)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    module = importlib.import_module(args.module)
    result: int = module.run(args)
    return result


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
