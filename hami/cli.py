"""ENTRY POINT ``hami``: one console script, one subcommand per job.

Each subcommand lives in its own module exposing ``add_arguments(parser)`` and ``run(args) -> int``;
this file only wires them. Imports are lazy: ``hami --help`` imports no subcommand, ``hami CMD ...``
only CMD's module, so each command needs only what its own work does. A command whose optional extra
is not installed (``sim``: numpy; ``demo``: kmock, CEL, ...) says so in one line naming the extra and
exits 2 (:data:`EXTRAS`), never with a traceback.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

#: subcommand -> (module, one-line help)
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "scheduler": ("hami.scheduler.main", "run the scheduler extender kube-scheduler calls"),
    "explain": ("hami.commands.explain", "say why a pod is pending, per node, and the nearest fit"),
    "cordon": ("hami.commands.cordon", "keep new pods off some of a node's cards (hami.io/device-cordon)"),
    "uncordon": ("hami.commands.cordon", "let new pods onto a node's cordoned cards again"),
    "doctor": ("hami.commands.doctor", "check an installation: webhook, nodes, locks, GPU pods, card usage"),
    "simulate": ("hami.commands.simulate", "replay a pod trace per placement policy: GPU left unallocated"),
    "heldout": ("hami.commands.heldout", "compare two placement policies on generated trace families"),
    "published": ("hami.commands.published", "replay the published openb variants: docs/policies.md's table"),
    "demo": ("hami.commands.demo", "run the whole system on an embedded cluster and place the example pods"),
}

#: top-level module of each optional dependency -> the extra of pyproject.toml that installs it
EXTRAS: dict[str, str] = {
    "numpy": "sim",
    "matplotlib": "sim",
    "hami_testkit": "demo",
    "kmock": "demo",
    "cel": "demo",
    "kubernetes_validate": "demo",
}


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The parser; with ``only``, just that subcommand's module is imported (the others stay unloaded),
    without, none (the top-level help and a mistyped command need no subcommand's arguments)."""
    parser = argparse.ArgumentParser(prog="hami", description="GPU sharing for Kubernetes (HAMi-compatible).")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, (module_name, help_text) in SUBCOMMANDS.items():
        command = sub.add_parser(name, help=help_text, description=help_text)
        command.set_defaults(module=module_name)
        if name == only:
            importlib.import_module(module_name).add_arguments(command)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    chosen = next((a for a in argv if not a.startswith("-")), None)
    try:
        return _run(argv, chosen if chosen in SUBCOMMANDS else None)
    except ModuleNotFoundError as exc:
        extra = EXTRAS.get((exc.name or "").partition(".")[0])
        if extra is None:
            raise
        print(f"hami {chosen}: needs the '{extra}' extra: pip install 'hami-py[{extra}]'", file=sys.stderr)
        return 2


def _run(argv: list[str], chosen: str | None) -> int:
    args = build_parser(chosen).parse_args(argv)
    module = importlib.import_module(args.module)
    try:
        result: int = module.run(args)
    except Exception as exc:
        # A cluster a subcommand could not use (no or bad kubeconfig, a server that refuses): one line,
        # exit 2, whatever the subcommand. Imported here: only a subcommand that loaded it can raise it.
        from hami.kube.client import KubeError

        if not isinstance(exc, KubeError):
            raise
        print(f"hami {args.command}: {exc}", file=sys.stderr)
        return 2
    return result


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
