"""Run every ``benchmarks/bench_*.py`` (or those named on the command line) and print their tables."""

from __future__ import annotations

import importlib
import pkgutil
import sys
from pathlib import Path


def main(argv: list[str]) -> int:
    here = Path(__file__).parent
    names = sorted(m.name for m in pkgutil.iter_modules([str(here)]) if m.name.startswith("bench_"))
    wanted = [n for n in names if not argv or any(a in n for a in argv)]
    for name in wanted:
        module = importlib.import_module(f"benchmarks.{name}")
        for table in module.run():
            print(table.render(), end="\n\n", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
