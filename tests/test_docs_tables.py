"""The docs' flag and metric tables say what the code declares (issue 23, findings 3 and 7).

Each service's flags table (docs/scheduler.md, docs/webhook.md, docs/node-agent.md: the table whose header
starts ``| flag |``) is checked against the service's settings schema (``FLAGS`` of
``hami.scheduler.config``, ``webhook.config`` and ``nodeagent.config``, :class:`hami.process.flags.Flag`):
it names every option of the schema and no other, each row's default column shows the schema's defaults
(rows whose flags are unset by default say in words what unset means, and are not compared), and a flag's
other env variables (``HAMI_NODELOCK_EXPIRE``, ``NODE_NAME``) are named in its row. Each service's argparse
parser takes exactly its schema's options. Each section of docs/metrics.md lists, in its tables, only
metric families the service registers, and names every one it registers (the scheduler's HAMi per-card
gauges are named in the prose under its table). The node agent's metrics are checked both ways in
tests/nodeagent/test_exporter_parts.py.
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from hami.process.flags import Flag, Flags
from hami.scheduler import config as scheduler_config
from hami.scheduler import main as scheduler_main
from hami.scheduler.metrics import Metrics
from nodeagent import config as agent_config
from webhook import config as webhook_config
from webhook.metrics import WebhookMetrics

DOCS = Path(__file__).resolve().parents[1] / "docs"
_FLAG = re.compile(r"--[a-z][a-z0-9-]*")
_METRIC = re.compile(r"`([A-Za-z_][A-Za-z0-9_]*)`")
_CELL = re.compile(r"(?<!\\)\|")  # a column border: a pipe not escaped as \|


def _scheduler_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser()
    scheduler_main.add_arguments(parser)
    return parser


def _webhook_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser()
    webhook_config.add_arguments(parser, {})
    return parser


SERVICES: list[tuple[str, Flags, Callable[[], argparse.ArgumentParser]]] = [
    ("scheduler.md", scheduler_config.FLAGS, _scheduler_parser),
    ("webhook.md", webhook_config.FLAGS, _webhook_parser),
    ("node-agent.md", agent_config.FLAGS, lambda: agent_config.build_parser({})),
]
DOCS_OF = [pytest.param(doc, flags, id=doc) for doc, flags, _ in SERVICES]


def parser_flags(parser: argparse.ArgumentParser) -> set[str]:
    return {o for action in parser._actions for o in action.option_strings if o.startswith("--")} - {"--help"}


def schema_options(flags: Flags) -> dict[str, Flag[Any]]:
    """Every option string of the schema -> its flag (a switch has two)."""
    return {option: flag for flag in flags for option in flag.options}


def table_rows(text: str) -> list[list[str]]:
    """The cells of every row of every ``| flag | ...`` table of ``text``."""
    rows: list[list[str]] = []
    inside = False
    for line in text.splitlines():
        if re.match(r"\|\s*flag\s*\|", line):
            inside = True
            continue
        if not line.startswith("|"):
            inside = False
        elif inside and not line.startswith("|---"):
            rows.append([cell.strip() for cell in _CELL.split(line)[1:-1]])
    return rows


def table_flags(text: str) -> set[str]:
    """The long options named in the first column of every ``| flag | ...`` table of ``text``."""
    return {option for row in table_rows(text) for option in _FLAG.findall(row[0])}


def test_table_flags_reads_the_first_column_of_flag_tables_only() -> None:
    text = "| flag | meaning |\n|---|---|\n| `--a B` / `--no-a` | see `--c` |\n\n| `--d` | x |\n"
    assert table_flags(text) == {"--a", "--no-a"}


def test_table_rows_keep_an_escaped_pipe_inside_its_cell() -> None:
    text = "| flag | default | meaning |\n|---|---|---|\n| `--p Fail\\|Ignore` | `Fail` | x |\n"
    assert table_rows(text) == [["`--p Fail\\|Ignore`", "`Fail`", "x"]]


@pytest.mark.parametrize(("doc", "parser"), [pytest.param(d, p, id=d) for d, _, p in SERVICES])
def test_each_services_parser_takes_exactly_its_schemas_options(
    doc: str, parser: Callable[[], argparse.ArgumentParser]
) -> None:
    flags = next(f for d, f, _ in SERVICES if d == doc)
    assert parser_flags(parser()) == set(schema_options(flags))


@pytest.mark.parametrize(("doc", "flags"), DOCS_OF)
def test_each_flags_table_names_exactly_the_schemas_flags(doc: str, flags: Flags) -> None:
    declared = set(schema_options(flags))
    documented = table_flags((DOCS / doc).read_text())
    assert declared, doc
    assert sorted(declared - documented) == [], f"flags missing from docs/{doc}'s flags table"
    assert sorted(documented - declared) == [], f"docs/{doc} documents flags the service does not take"


@pytest.mark.parametrize(("doc", "flags"), DOCS_OF)
def test_each_flags_table_shows_the_schemas_defaults(doc: str, flags: Flags) -> None:
    options = schema_options(flags)
    compared = 0
    for row in table_rows((DOCS / doc).read_text()):
        named = list(dict.fromkeys(options[o] for o in _FLAG.findall(row[0]) if o in options))
        if not named or not all(flag.default for flag in named):
            continue  # unset by default: the cell says what that means
        shown = [part.strip() for part in row[1].replace("`", "").split(", ")]
        assert shown == [flag.default for flag in named], f"docs/{doc}: {row[0]}"
        compared += 1
    assert compared >= len(flags) // 2, doc  # most flags have a default: the rows were read


@pytest.mark.parametrize(("doc", "flags"), DOCS_OF)
def test_a_flags_other_env_variables_are_named_in_its_row(doc: str, flags: Flags) -> None:
    rows = {o: " | ".join(row) for row in table_rows((DOCS / doc).read_text()) for o in _FLAG.findall(row[0])}
    for flag in flags:
        for variable in flag.also_env:
            assert variable in rows[flag.option], f"docs/{doc}: {flag.option} reads {variable}"


def metrics_section(title: str) -> str:
    """The ``## <title>...`` section of docs/metrics.md, up to the next ``## `` heading."""
    text = (DOCS / "metrics.md").read_text()
    start = text.index(f"\n## {title}")
    end = text.find("\n## ", start + 1)
    return text[start : end if end >= 0 else len(text)]


def table_metrics(section: str) -> set[str]:
    """The metric names in the first column of the ``| metric | ...`` tables of ``section``."""
    found: set[str] = set()
    inside = False
    for line in section.splitlines():
        if re.match(r"\|\s*metric\s*\|", line):
            inside = True
            continue
        if not line.startswith("|"):
            inside = False
        elif inside and not line.startswith("|---"):
            found |= set(_METRIC.findall(line.split("|")[1]))
    return found


def registered(registry: CollectorRegistry) -> set[str]:
    """Family names as scraped: a counter's samples carry ``_total``."""
    return {f"{m.name}_total" if m.type == "counter" else m.name for m in registry.collect()}


def test_the_scheduler_metrics_table_matches_its_registry() -> None:
    metrics = Metrics()
    metrics.attach(lambda: [], lambda: 0)
    families = registered(metrics.registry)
    section = metrics_section("Scheduler")
    assert table_metrics(section) <= families
    assert sorted(families - set(_METRIC.findall(section))) == []


def test_the_webhook_metrics_table_matches_its_registry() -> None:
    registry = CollectorRegistry()
    WebhookMetrics(registry)
    families = registered(registry)
    assert table_metrics(metrics_section("Webhook")) == families
