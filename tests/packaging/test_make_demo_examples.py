"""Every ``make demo ARGS="..."`` the repository shows (Makefile, README.md, docs/) works as written.

Each is parsed by ``hami demo``'s own parser, and the cluster file and example directory it names are
read the way the demo reads them (strictly): an example naming a file that is not there, or a flag
the demo does not have, fails here instead of in a reader's terminal.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from hami.cli import build_parser
from hami_testkit.cluster import load_cluster
from hami_testkit.manifests import read_examples

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = re.compile(r'make demo ARGS="([^"]*)"')


def _examples() -> list[tuple[str, str]]:
    found: list[tuple[str, str]] = []
    for path in [REPO / "Makefile", REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]:
        found.extend((path.name, args) for args in EXAMPLE.findall(path.read_text()))
    return found


EXAMPLES = _examples()


def test_the_repository_shows_make_demo_examples() -> None:
    assert {where for where, _ in EXAMPLES} >= {"Makefile", "README.md"}


@pytest.mark.parametrize(("where", "args"), EXAMPLES, ids=[f"{w}:{a}" for w, a in EXAMPLES])
def test_make_demo_example_works(where: str, args: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(REPO)  # make runs in the repository root
    parsed = build_parser("demo").parse_args(["demo", *shlex.split(args)])
    if parsed.nodes is not None:
        assert load_cluster(parsed.nodes).nodes, f"{where}: {parsed.nodes} has no nodes"
    if parsed.examples is not None:
        assert read_examples(parsed.examples), f"{where}: {parsed.examples} has no examples"
