"""The chart ships what the exporter needs: host PIDs, the legacy-names switch, the Grafana dashboard."""

from __future__ import annotations

import json
from pathlib import Path

from nodeagent.config import parse_agent_config

from .rendering import CHART, argv, container, pod_spec, render


def test_node_agent_sees_host_pids_and_passes_the_legacy_switch() -> None:
    for values, legacy in (({}, False), ({"nodeAgent": {"legacyMetrics": True}}, True)):
        daemonset = render(values).component("DaemonSet", "node-agent")
        assert pod_spec(daemonset)["hostPID"] is True
        settings = parse_agent_config(argv(container(daemonset, "node-agent"))[1:], {"NODE_NAME": "n1"})
        assert settings.legacy_metrics is legacy


def test_dashboard_config_map_carries_the_shipped_dashboard() -> None:
    assert not any("hami.json" in (cm.get("data") or {}) for cm in render().of_kind("ConfigMap"))
    rendered = render({"metrics": {"dashboard": {"enabled": True}}})
    (config_map,) = [cm for cm in rendered.of_kind("ConfigMap") if "hami.json" in (cm.get("data") or {})]
    assert config_map["metadata"]["labels"]["grafana_dashboard"] == "1"
    shipped = json.loads(Path(CHART, "dashboards", "hami.json").read_text())
    assert json.loads(config_map["data"]["hami.json"]) == shipped
