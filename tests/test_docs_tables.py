"""The docs' flag and metric tables say what the code declares (issue 23, finding 7).

Each service's flags table (docs/scheduler.md, docs/webhook.md, docs/node-agent.md: the table whose header
starts ``| flag |``) names every long option its argparse parser takes, and no other; each section of
docs/metrics.md lists, in its tables, only metric families the service registers, and names every one it
registers (the scheduler's HAMi per-card gauges are named in the prose under its table). The node agent's
metrics are checked both ways in tests/nodeagent/test_exporter_parts.py.
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from hami.scheduler import main as scheduler_main
from hami.scheduler.metrics import Metrics
from nodeagent.config import build_parser
from webhook import config as webhook_config
from webhook.metrics import WebhookMetrics

DOCS = Path(__file__).resolve().parents[1] / "docs"
_FLAG = re.compile(r"--[a-z][a-z0-9-]*")
_METRIC = re.compile(r"`([A-Za-z_][A-Za-z0-9_]*)`")


def _scheduler_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser()
    scheduler_main.add_arguments(parser)
    return parser


def _webhook_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser()
    webhook_config.add_arguments(parser, {})
    return parser


def parser_flags(parser: argparse.ArgumentParser) -> set[str]:
    return {o for action in parser._actions for o in action.option_strings if o.startswith("--")} - {"--help"}


def table_flags(text: str) -> set[str]:
    """The long options named in the first column of every ``| flag | ...`` table of ``text``."""
    found: set[str] = set()
    inside = False
    for line in text.splitlines():
        if re.match(r"\|\s*flag\s*\|", line):
            inside = True
            continue
        if not line.startswith("|"):
            inside = False
        elif inside and not line.startswith("|---"):
            found |= set(_FLAG.findall(line.split("|")[1]))
    return found


def test_table_flags_reads_the_first_column_of_flag_tables_only() -> None:
    text = "| flag | meaning |\n|---|---|\n| `--a B` / `--no-a` | see `--c` |\n\n| `--d` | x |\n"
    assert table_flags(text) == {"--a", "--no-a"}


@pytest.mark.parametrize(
    ("doc", "parser"),
    [
        ("scheduler.md", _scheduler_parser),
        ("webhook.md", _webhook_parser),
        ("node-agent.md", lambda: build_parser({})),
    ],
)
def test_each_flags_table_names_exactly_the_parsers_flags(doc: str, parser: object) -> None:
    assert callable(parser)
    declared = parser_flags(parser())
    documented = table_flags((DOCS / doc).read_text())
    assert declared, doc
    assert sorted(declared - documented) == [], f"flags missing from docs/{doc}'s flags table"
    assert sorted(documented - declared) == [], f"docs/{doc} documents flags the service does not take"


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
