"""The Grafana dashboard shipped with the chart queries only metrics the code exports.

Exported names are collected from the source: every prometheus-client metric constructor
(``Counter``, ``Gauge``, ``Histogram``, ``Summary``, ``Info``, ``Enum`` and the ``*MetricFamily``
classes of custom collectors) called with a literal name anywhere in ``hami/``, ``webhook/`` and
``nodeagent/``, expanded to the sample names Prometheus stores (``_total``, ``_bucket``, ...). The node
exporter's own registry cross-checks the scan, so a metric built some other way cannot slip by.
"""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from hami.settings import DeviceConfig
from nodeagent.backends.base import Card, Link
from nodeagent.config import NodeSettings
from nodeagent.exporter import NodeCollector
from nodeagent.grants import GrantBook
from nodeagent.inventory import Inventory
from tests.builders import NO_API

ROOT = Path(__file__).resolve().parent.parent
DASHBOARD = ROOT / "charts" / "hami" / "dashboards" / "hami.json"
SOURCES = ("hami", "webhook", "nodeagent")

#: constructor -> suffixes of the samples it exposes ("" = the name itself)
SUFFIXES: dict[str, tuple[str, ...]] = {
    "Counter": ("_total", "_created"),
    "Gauge": ("",),
    "Histogram": ("_bucket", "_sum", "_count", "_created"),
    "Summary": ("_sum", "_count", "_created"),
    "Info": ("_info",),
    "Enum": ("",),
    "GaugeMetricFamily": ("",),
    "CounterMetricFamily": ("_total", "_created"),
    "HistogramMetricFamily": ("_bucket", "_sum", "_count", "_created"),
    "GaugeHistogramMetricFamily": ("_bucket", "_gsum", "_gcount"),
    "SummaryMetricFamily": ("_sum", "_count", "_created"),
    "InfoMetricFamily": ("_info",),
    "StateSetMetricFamily": ("",),
    "UnknownMetricFamily": ("",),
}
PROMQL_KEYWORDS = frozenset(
    {"and", "or", "unless", "bool", "offset", "by", "without", "on", "ignoring", "group_left", "group_right"}
    | {"inf", "nan", "Inf", "NaN"}
)


# ------------------------------------------------------------------------------------ exported names
def _literal(node: ast.expr | None) -> str | None:
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


def _constructed(tree: ast.AST) -> Iterator[tuple[str, str]]:
    """(constructor, full metric name) for every metric constructor called with a literal name."""
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        kind = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""
        if kind not in SUFFIXES:
            continue
        keywords = {k.arg: k.value for k in node.keywords if k.arg}
        name = _literal(node.args[0] if node.args else keywords.get("name"))
        if name is None:
            continue
        parts = [_literal(keywords.get("namespace")), _literal(keywords.get("subsystem")), name]
        full = "_".join(p for p in parts if p)
        if kind in ("Counter", "CounterMetricFamily"):
            full = full.removesuffix("_total")  # prometheus-client strips it, then exposes name_total
        yield kind, full


def exported_names() -> set[str]:
    names: set[str] = set()
    for package in SOURCES:
        for path in sorted((ROOT / package).rglob("*.py")):
            if path.name.endswith("_pb2.py") or path.name.endswith("_pb2_grpc.py"):
                continue
            for kind, full in _constructed(ast.parse(path.read_text(), filename=str(path))):
                names.update(full + suffix for suffix in SUFFIXES[kind])
    return names


# ----------------------------------------------------------------------------------- queried names
def promql_metric_names(expr: str) -> set[str]:
    """Metric names a PromQL expression selects (functions, keywords, labels and Grafana variables
    are not names)."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)  # label values may hold anything
    text = re.sub(r"\{[^}]*\}", " ", text)  # label matchers
    text = re.sub(r"\[[^\]]*\]", " ", text)  # ranges and subqueries
    text = re.sub(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", text)
    names = set()
    for match in re.finditer(r"(?<![\w$:.])([A-Za-z_:][\w:]*)(\s*\()?", text):
        word, call = match.group(1), match.group(2)
        if not call and word not in PROMQL_KEYWORDS:
            names.add(word)
    return names


def _queries(dashboard: dict[str, Any]) -> Iterator[tuple[str, str]]:
    """(where, PromQL) for every panel target and every templating query."""

    def panels(items: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
        for panel in items:
            yield panel
            yield from panels(panel.get("panels") or [])

    for panel in panels(dashboard.get("panels") or []):
        for target in panel.get("targets") or []:
            yield f"panel {panel.get('title')!r} target {target.get('refId')}", str(target.get("expr") or "")
    for variable in (dashboard.get("templating") or {}).get("list") or []:
        if variable.get("type") != "query":
            continue
        query = variable.get("query")
        text = str(query.get("query") if isinstance(query, dict) else query or "")
        found = re.fullmatch(r"\s*label_values\((.*),\s*\w+\s*\)\s*", text)
        yield f"variable ${variable.get('name')}", found.group(1) if found else text


@pytest.fixture(scope="module")
def dashboard() -> dict[str, Any]:
    document: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return document


# ---------------------------------------------------------------------------------------------- tests
@pytest.mark.parametrize(
    ("expr", "names"),
    [
        ('hami_node_card_healthy{node=~"$node"} == 0', {"hami_node_card_healthy"}),
        ("a_bytes / on (device_uuid) group_left(pod) b_bytes", {"a_bytes", "b_bytes"}),
        (
            'histogram_quantile(0.99, sum by (verb, le) (rate(lat_seconds_bucket{x="}"}[5m])))',
            {"lat_seconds_bucket"},
        ),
        ("sum without (pod) (x) > bool 1e3 and y offset 5m unless on(n) z", {"x", "y", "z"}),
        ('count(label_replace(up, "a", "$1", "b", "(.*)"))', {"up"}),
    ],
)
def test_promql_metric_names(expr: str, names: set[str]) -> None:
    assert promql_metric_names(expr) == names


def test_the_scan_finds_every_name_the_node_exporter_registers() -> None:
    class NoCards:
        name = "none"

        def cards(self) -> tuple[Card, ...]:
            return ()

        def links(self) -> tuple[Link, ...]:
            return ()

        def close(self) -> None: ...

    collector = NodeCollector(
        node_name="n",
        inventory=Inventory(NoCards()),
        settings=NodeSettings(device=DeviceConfig()),
        grants=GrantBook(api=NO_API, node_name="n"),
        legacy=True,
    )
    registered = {family.name for family in collector.describe()}
    assert "hami_node_card_healthy" in registered and "HostGPUMemoryUsage" in registered
    assert registered <= exported_names()


def test_every_dashboard_query_uses_exported_metrics(dashboard: dict[str, Any]) -> None:
    exported = exported_names()
    queries = list(_queries(dashboard))
    assert len(queries) >= 20
    missing = {
        f"{where}: {name}"
        for where, expr in queries
        for name in promql_metric_names(expr)
        if name not in exported
    }
    assert not missing, f"the dashboard queries metrics no code exports: {sorted(missing)}"
    used = set().union(*(promql_metric_names(expr) for _, expr in queries))
    # the dashboard is built on the node exporter's card, live and per-container metrics, the
    # scheduler's latency, rejections, binds, lock holds and live view, and the webhook's admissions
    for name in (
        "hami_node_card_healthy",
        "hami_node_card_memory_allocated_bytes",
        "hami_host_gpu_utilization_ratio",
        "hami_vgpu_memory_used_bytes",
        "hami_node_container_memory_allocated_bytes",
        "hami_scheduler_request_seconds_bucket",
        "hami_scheduler_node_rejections_total",
        "hami_scheduler_binds_total",
        "hami_scheduler_node_lock_hold_seconds_bucket",
        "hami_scheduler_snapshot_nodes",
        "hami_scheduler_snapshot_cards",
        "hami_scheduler_snapshot_pods_tracked",
        "hami_scheduler_watch_restarts_total",
        "hami_webhook_admission_duration_seconds_bucket",
        "hami_webhook_refusals_total",
    ):
        assert name in used


def test_a_wrong_name_would_be_caught(dashboard: dict[str, Any]) -> None:
    """The check above is not vacuous: a misspelt metric in a query is reported."""
    broken = json.loads(json.dumps(dashboard))
    broken["panels"][1]["targets"][0]["expr"] = "sum(hami_node_card_helthy)"
    exported = exported_names()
    names = {name for _, expr in _queries(broken) for name in promql_metric_names(expr)}
    assert names - exported == {"hami_node_card_helthy"}


def test_dashboard_structure(dashboard: dict[str, Any]) -> None:
    assert dashboard["uid"] == "hami-vgpu" and dashboard["title"]
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert (
        variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    )
    assert {"node", "namespace"} <= variables.keys()
    ids = [panel["id"] for panel in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    for panel in dashboard["panels"]:
        grid = panel["gridPos"]
        assert grid["x"] + grid["w"] <= 24, panel["title"]
        if panel["type"] == "row":
            continue
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, panel["title"]
        refs = [target["refId"] for target in panel["targets"]]
        assert refs and len(refs) == len(set(refs)) and all(t["expr"] for t in panel["targets"]), panel[
            "title"
        ]
