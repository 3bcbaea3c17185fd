"""``promtool check metrics`` on every component's ``/metrics``: promlint's rules, written as a test.

promtool (a Go binary) is not installable here, so :func:`lint` applies the rules of its linter
(``prometheus/client_golang``'s ``testutil/promlint``, the one ``promtool check metrics`` runs) to the
text each component serves: help text present; no non-base or prefixed units (``milliseconds``,
``kilobytes``, ``minutes``); counters end in ``_total`` and nothing else does; ``_bucket``, ``_count``,
``_sum`` and the ``le``/``quantile`` labels only on histograms/summaries; no metric type in the name;
no ``:``; no camelCase in metric or label names; no abbreviated units (``_ms``, ``_kb``, ``_s``...).

Every name that breaks a rule must be one of HAMi's, kept for HAMi's dashboards and listed in
docs/metrics.md's "Names promtool flags" section; the test holds that list equal to what it finds.
"""

from __future__ import annotations

import asyncio
import datetime
import re
from collections import defaultdict
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest

from hami.annotations import allocation_annotations
from hami.core.model import Device, DeviceState, Grant, NodeState
from hami.scheduler.metrics import Metrics
from nodeagent.backends.simulated import SimBackend
from nodeagent.config import NodeSettings
from nodeagent.exporter import NodeCollector
from nodeagent.grants import PodGrants, read_pod_grants
from nodeagent.inventory import Inventory
from nodeagent.podcache import PodCache, PodCacheCollector
from webhook.metrics import WebhookMetrics

#: The pod cache of the agent text is fed by hand: it never talks to an API server.
NO_API: Any = None
NOW = datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)
DOCS = Path(__file__).resolve().parents[1] / "docs" / "metrics.md"

# promlint's tables (client_golang prometheus/testutil/promlint/validations/units.go)
UNITS = {
    **{u: u for u in ("amperes", "bytes", "celsius", "grams", "joules", "kelvin", "meters", "metres")},
    **{u: u for u in ("seconds", "volts")},
    **{u: "seconds" for u in ("minutes", "hours", "days", "weeks")},
    "kelvins": "kelvin", "fahrenheit": "celsius", "rankine": "celsius",
    "inches": "meters", "yards": "meters", "miles": "meters",
    "bits": "bytes", "calories": "joules", "pounds": "grams", "ounces": "grams",
}  # fmt: skip
PREFIXES = (
    "pico", "nano", "micro", "milli", "centi", "deci", "deca", "hecto", "kilo", "kibi", "mega", "mibi",
    "giga", "gibi", "tera", "tebi", "peta", "pebi",
)  # fmt: skip
ABBREVIATIONS = ("s", "ms", "us", "ns", "sec", "b", "kb", "mb", "gb", "tb", "pb", "m", "h", "d")
TYPES = ("counter", "gauge", "summary", "histogram", "gauge_histogram")
CAMEL = re.compile(r"[a-z][A-Z]")
SAMPLE = re.compile(r"^([A-Za-z_:][A-Za-z0-9_:]*)(?:\{(.*)\})? ")
LABEL = re.compile(r'([A-Za-z_][A-Za-z0-9_]*)="')


def families(text: str) -> dict[str, dict[str, Any]]:
    """Family name -> {type, help, labels} from the text exposition format, as promtool's parser reads it."""
    found: dict[str, dict[str, Any]] = defaultdict(lambda: {"type": "untyped", "help": None, "labels": set()})
    for line in text.splitlines():
        if line.startswith("# HELP "):
            name, _, text_ = line[7:].partition(" ")
            found[name]["help"] = text_
        elif line.startswith("# TYPE "):
            name, _, kind = line[7:].partition(" ")
            found[name]["type"] = kind
        elif line and not line.startswith("#"):
            match = SAMPLE.match(line)
            assert match, line
            name = match.group(1)
            family = name
            for suffix in ("_bucket", "_count", "_sum"):
                base = name.removesuffix(suffix)
                if name.endswith(suffix) and found.get(base, {}).get("type") in ("histogram", "summary"):
                    family = base
            found[family]["labels"].update(LABEL.findall(match.group(2) or ""))
    return dict(found)


def lint(text: str) -> dict[str, list[str]]:
    """promlint's problems per metric family (empty dict: ``promtool check metrics`` passes)."""
    problems: dict[str, list[str]] = defaultdict(list)
    for name, family in families(text).items():
        kind, labels, lower = family["type"], family["labels"], name.lower()
        found = problems[name]
        if family["help"] is None:
            found.append("no help text")
        for part in name.split("_"):
            base = UNITS.get(part) or next(
                (UNITS[part[len(p) :]] for p in PREFIXES if part.startswith(p) and part[len(p) :] in UNITS),
                None,
            )
            if base is not None and base != part:
                found.append(f"use base unit {base!r} instead of {part!r}")
                break
        if kind == "counter" and not name.endswith("_total"):
            found.append('counter metrics should have "_total" suffix')
        if kind not in ("counter", "untyped") and name.endswith("_total"):
            found.append('non-counter metrics should not have "_total" suffix')
        if kind != "untyped":
            if kind != "histogram" and name.endswith("_bucket"):
                found.append('non-histogram metrics should not have "_bucket" suffix')
            for suffix in ("_count", "_sum"):
                if kind not in ("histogram", "summary") and name.endswith(suffix):
                    found.append(f'non-histogram and non-summary metrics should not have "{suffix}" suffix')
            if kind != "histogram" and "le" in labels:
                found.append('non-histogram metrics should not have "le" label')
            if kind != "summary" and "quantile" in labels:
                found.append('non-summary metrics should not have "quantile" label')
        for type_name in TYPES:
            if f"_{type_name}_" in lower or lower.endswith(f"_{type_name}"):
                found.append(f"metric name should not include type '{type_name}'")
        if ":" in name:
            found.append("metric names should not contain ':'")
        if CAMEL.search(name):
            found.append("metric names should be written in 'snake_case' not 'camelCase'")
        if any(CAMEL.search(label) for label in labels):
            found.append("label names should be written in 'snake_case' not 'camelCase'")
        if any(f"_{a}_" in lower or lower.endswith(f"_{a}") for a in ABBREVIATIONS):
            found.append("metric names should not contain abbreviated units")
    return {name: found for name, found in problems.items() if found}


def documented_exceptions() -> set[str]:
    """The names docs/metrics.md lists as HAMi's, kept although promtool flags them."""
    text = DOCS.read_text(encoding="utf-8")
    section = text.split("### Names promtool flags", 1)[1].split("\n#", 1)[0]
    return set(re.findall(r"^\| `([A-Za-z_]+)` \|", section, re.MULTILINE))


# ------------------------------------------------------------------------------ what each one serves
class _Pods:
    def __init__(self, pods: tuple[PodGrants, ...]) -> None:
        self.pods = pods


def node_agent_text(tmp_path: Path, *, legacy: bool) -> str:
    """A node agent's /metrics with a sample in every family: a card with live usage and a process list,
    and a tracked pod with a grant on it."""
    cards = tmp_path / "cards.yaml"
    cards.write_text(
        "cards:\n  - {uuid: GPU-a, model: NVIDIA A10, memory_mib: 23028, used_memory_mib: 100,"
        " utilization: 5, memory_utilization: 3, processes: []}\n",
        encoding="utf-8",
    )
    grant = Grant(uuid="GPU-a", type="NVIDIA", memory_mib=1000, cores=10)
    pod = {
        "metadata": {
            "name": "p",
            "namespace": "default",
            "uid": "u1",
            "annotations": allocation_annotations(node="n1", devices=((grant,),), now=NOW),
            "labels": {"hami.io/vgpu-node": "n1"},
        },
        "spec": {"nodeName": "n1", "containers": [{"name": "c"}]},
        "status": {"phase": "Running"},
    }
    tracked = read_pod_grants(pod)
    assert tracked is not None
    registry = CollectorRegistry()
    inventory = Inventory(SimBackend(cards))
    asyncio.run(inventory.refresh())
    registry.register(
        NodeCollector(
            node_name="n1",
            inventory=inventory,
            settings=NodeSettings(),
            grants=_Pods((tracked,)),
            legacy=legacy,
        )
    )
    pods = PodCache(NO_API, "n1")  # fed by hand, as its watch would
    pods.on_list([pod])
    registry.register(PodCacheCollector(pods, "n1"))
    return generate_latest(registry).decode()


def scheduler_text() -> str:
    metrics = Metrics()
    device = Device(
        uuid="GPU-a", index=0, count=10, memory_mib=1000, cores=100, type="NVIDIA-A10", health=True
    )
    state = NodeState(name="n1", devices=(DeviceState(device=device, used=1, used_mem=10, used_cores=5),))
    metrics.attach(lambda: [("n1", state, None)], lambda: 1)
    metrics.observe("filter", "ok", 0.001)
    metrics.lock_hold.observe(0.2)
    return metrics.render().decode()


def webhook_text() -> str:
    return WebhookMetrics(CollectorRegistry()).render().decode()


# ----------------------------------------------------------------------------------------- the tests
def test_the_linter_finds_what_promtool_finds() -> None:
    text = (
        "# HELP a_total x\n# TYPE a_total gauge\na_total 1\n"
        "# TYPE b counter\nb 1\n"
        "# HELP c_count x\n# TYPE c_count gauge\nc_count 1\n"
        '# HELP dMs x\n# TYPE dMs gauge\ndMs{fooBar="1"} 1\n'
        "# HELP e_milliseconds x\n# TYPE e_milliseconds gauge\ne_milliseconds 1\n"
        "# HELP f_seconds x\n# TYPE f_seconds histogram\n"
        'f_seconds_bucket{le="1"} 1\nf_seconds_count 1\nf_seconds_sum 1\n'
    )
    assert lint(text) == {
        "a_total": ['non-counter metrics should not have "_total" suffix'],
        "b": ["no help text", 'counter metrics should have "_total" suffix'],
        "c_count": ['non-histogram and non-summary metrics should not have "_count" suffix'],
        "dMs": [
            "metric names should be written in 'snake_case' not 'camelCase'",
            "label names should be written in 'snake_case' not 'camelCase'",
        ],
        "e_milliseconds": ["use base unit 'seconds' instead of 'milliseconds'"],
    }


def test_node_agent_metrics_pass(tmp_path: Path) -> None:
    text = node_agent_text(tmp_path, legacy=False)
    assert "hami_node_container_memory_allocated_bytes{" in text and "hami_vgpu_memory_used_bytes{" in text
    assert lint(text) == {}


def test_scheduler_metrics_pass_but_for_hamis_names() -> None:
    text = scheduler_text()
    assert "hami_gpu_memory_limit_bytes{" in text and "hami_scheduler_request_seconds_bucket{" in text
    failing = lint(text)
    assert set(failing) <= documented_exceptions(), failing
    assert set(failing) == {"hami_gpu_shared_count"}  # HAMi's dashboard reads it


def test_webhook_metrics_pass() -> None:
    assert lint(webhook_text()) == {}


def test_the_documented_exceptions_are_exactly_what_promtool_flags(tmp_path: Path) -> None:
    """HAMi's legacy names (``--legacy-metrics``) and hami_gpu_shared_count: listed, and nothing else."""
    flagged = set(lint(node_agent_text(tmp_path, legacy=True))) | set(lint(scheduler_text()))
    assert flagged == documented_exceptions()
