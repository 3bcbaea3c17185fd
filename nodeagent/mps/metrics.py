"""The MPS control daemon's Prometheus families, built at scrape time from :class:`MpsControl`.

``hami_node_mps_daemon_up`` (1 when the daemon answered the last check), ``hami_node_mps_protocol_version``
(the protocol it speaks; no sample while unknown), ``hami_node_mps_daemon_restarts_total`` (daemons
the agent started again after one died) and ``hami_node_mps_namespaces_open`` (per-container namespaces
on the daemon). Labels ``node`` and HAMi's constant ``zone``. Reads only the last known state (no
command at scrape time). Must not import ``hami_testkit``, grpc, pynvml or the Kubernetes client.
"""

from __future__ import annotations

from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric

from nodeagent.mps.control import MpsControl

LABELS = ["node", "zone"]


def mps_families(node: str, zone: str, control: MpsControl | None) -> list[Metric]:
    """The four families; empty ones (no samples) when ``control`` is None (describe-time)."""
    up = GaugeMetricFamily(
        "hami_node_mps_daemon_up",
        "1 when the node's MPS control daemon answered the last check.",
        labels=LABELS,
    )
    protocol = GaugeMetricFamily(
        "hami_node_mps_protocol_version",
        "MPS protocol the control daemon speaks (3: per-pod namespaces with daemon-side limits).",
        labels=LABELS,
    )
    restarts = CounterMetricFamily(
        "hami_node_mps_daemon_restarts",
        "MPS control daemons the agent started again after one died.",
        labels=LABELS,
    )
    namespaces = GaugeMetricFamily(
        "hami_node_mps_namespaces_open", "MPS namespaces open on the control daemon.", labels=LABELS
    )
    if control is not None:
        state, labels = control.state, [node, zone]
        up.add_metric(labels, 1 if state.running else 0)
        if state.running and state.protocol is not None:
            protocol.add_metric(labels, state.protocol)
        restarts.add_metric(labels, control.restarts)
        namespaces.add_metric(labels, len(control.namespaces))
    return [up, protocol, restarts, namespaces]
