"""Prometheus metrics of the admission webhook and the HTTP server that exposes them.

Owns the metric families (in a ``CollectorRegistry`` built by the entry point and passed in: no
global registry), how one admission response is classified (``mutated``, ``unchanged``, ``refused``,
``error``), and ``GET /metrics`` on ``--metrics-listen`` (the shared listener of
:mod:`hami.process.http`). The metrics have their own port because Kopf's liveness server is a closed
aiohttp app with one route (``kopf/_core/engines/probing.py``). A metrics port that cannot be bound is
logged and retried: metrics must never stop admission. Must not import kopf or the Kubernetes client.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

from hami.process.flags import Address
from hami.process.http import metrics_app, serve_retrying
from webhook.mutation import REFUSAL_REASONS

logger = logging.getLogger("hami.webhook.metrics")

MUTATED = "mutated"
UNCHANGED = "unchanged"
REFUSED = "refused"
ERROR = "error"
RESULTS = (MUTATED, UNCHANGED, REFUSED, ERROR)
#: The API server gives up after the webhook's timeoutSeconds (10): buckets from 0.5 ms to 10 s.
BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


class WebhookMetrics:
    """The webhook's metric families, registered in ``registry``."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        self.duration = Histogram(
            "hami_webhook_admission_duration_seconds",
            "time to decide one AdmissionReview (Kopf's handling and the mutation; not TLS or HTTP)",
            buckets=BUCKETS,
            registry=registry,
        )
        self.admissions = Counter(
            "hami_webhook_admissions",
            "AdmissionReviews answered, by result (mutated, unchanged, refused, error)",
            ["result"],
            registry=registry,
        )
        self.refusals = Counter(
            "hami_webhook_refusals",
            "pods refused, by the reason code of the first problem",
            ["reason"],
            registry=registry,
        )
        # Every series exists from the start (at 0), so rate() and alerts work before the first event.
        for result in RESULTS:
            self.admissions.labels(result)
        for reason in REFUSAL_REASONS:
            self.refusals.labels(reason)

    def refused(self, reason: str) -> None:
        self.refusals.labels(reason).inc()

    def answered(self, response: Mapping[str, Any] | None, seconds: float) -> None:
        """Record one admission: its duration and the result read from the AdmissionReview response."""
        self.duration.observe(seconds)
        self.admissions.labels(classify(response)).inc()

    def render(self) -> bytes:
        """The registry in Prometheus' text format (what ``/metrics`` serves by default)."""
        return generate_latest(self.registry)


def classify(response: Mapping[str, Any] | None) -> str:
    """The result of an AdmissionReview response (None: no review came back, e.g. a malformed request).

    Kopf answers a handler's ``AdmissionError`` with its code (our refusals: 400, 403, 422) and any
    other exception with 500; a patch means the pod was changed.
    """
    if response is None:
        return ERROR
    payload: Mapping[str, Any] = response.get("response") or {}
    if payload.get("allowed"):
        return MUTATED if payload.get("patch") else UNCHANGED
    code = (payload.get("status") or {}).get("code") or 500
    return REFUSED if int(code) < 500 else ERROR


async def serve_metrics(metrics: WebhookMetrics, listen: Address, *, retry: float = 5.0) -> None:
    """Serve ``GET /metrics`` until cancelled; a taken port is logged and retried."""
    await serve_retrying(lambda: metrics_app(metrics.registry), listen, retry=retry, logger=logger)
