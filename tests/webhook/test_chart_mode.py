"""The operator as the Helm chart runs it (``--no-manage-config``): its Prometheus metrics, scraped
over HTTP after real AdmissionReviews, and the API requests it makes (only the ResourceQuota list + watch
behind the admission pre-check need RBAC).

The webhook is reached at the address it listens on, verified against the ``ca.crt`` it made in its
tls dir (the chart's configuration points the API server at the Service instead).
"""

from __future__ import annotations

import re
import ssl
import time
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.eventually import eventually
from webhook.mutation import REFUSAL_REASONS

from .webhook_cases import GPU, MEM, ctr, make_pod
from .webhook_harness import Operator, Webhook, listening, review


@pytest.fixture(scope="module")
def operator_overrides() -> dict[str, Any]:
    return {"manage_config": False, "config_name": "hami-webhook-chart-mode"}


@pytest.fixture
async def direct(operator: Operator) -> AsyncIterator[Webhook]:
    settings = operator.settings
    # Kopf reports ready before its webhook server listens (--manage-config tests wait for the
    # published configuration instead)
    await eventually(lambda: listening(settings.listen.host, settings.listen.port), "the webhook's port")
    ca = (settings.tls_dir / "ca.crt").read_bytes()
    context = ssl.create_default_context(cadata=ca.decode())
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=context)) as session:
        yield Webhook(url=f"https://{settings.listen}/webhook", ca=ca, session=session)


Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


async def scrape(operator: Operator) -> tuple[Samples, str]:
    url = f"http://{operator.settings.metrics_listen}/metrics"
    async with aiohttp.ClientSession() as session, session.get(url) as response:
        assert response.status == 200
        assert response.headers["Content-Type"].startswith("text/plain")
        text = await response.text()
    samples: Samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples[sample.name, tuple(sorted(sample.labels.items()))] = sample.value
    return samples, text


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def delta(before: Samples, after: Samples, name: str, **labels: str) -> float:
    return value(after, name, **labels) - value(before, name, **labels)


async def test_metrics_count_every_admission_by_result_and_reason(
    operator: Operator, direct: Webhook
) -> None:
    before, text = await scrape(operator)
    # every series exists from the start
    for reason in REFUSAL_REASONS:
        assert f'hami_webhook_refusals_total{{reason="{reason}"}}' in text
    for result in ("mutated", "unchanged", "refused", "error"):
        assert f'hami_webhook_admissions_total{{result="{result}"}}' in text

    pods = [
        make_pod(ctr(limits={GPU: "1"})),  # mutated
        make_pod(ctr(limits={MEM: "2000"})),  # mutated
        make_pod(ctr(limits={"cpu": "1"})),  # unchanged
        make_pod(ctr("t", limits={GPU: "1"}, securityContext={"privileged": True})),
        make_pod(ctr(limits={"cpu": "1"}), annotations={"hami.io/vgpu-node": "n1"}),
        make_pod(ctr("t", limits={GPU: "1", MEM: "16Gi"})),
        make_pod(ctr("t", limits={GPU: "1", MEM: "lots"}), ctr("u", limits={"nvidia.com/gpucores": "300"})),
        make_pod(ctr(limits={GPU: "1"}), annotations={"nvidia.com/numa-bind": "yes"}),
    ]
    started = time.perf_counter()
    results = [await direct.admit(pod) for pod in pods]
    # a review for a resource the webhook has no handler for: Kopf answers 404, no AdmissionReview
    bad = review(make_pod(ctr()))
    bad["request"]["resource"] = {"group": "", "version": "v1", "resource": "nodes"}
    async with direct.session.post(direct.url, json=bad) as response:
        assert response.status == 404
    elapsed = time.perf_counter() - started
    assert [r["allowed"] for r in results] == [True, True, True, False, False, False, False, False]

    after, _ = await scrape(operator)
    admissions = "hami_webhook_admissions_total"
    assert delta(before, after, admissions, result="mutated") == 2
    assert delta(before, after, admissions, result="unchanged") == 1
    assert delta(before, after, admissions, result="refused") == 5
    assert delta(before, after, admissions, result="error") == 1
    refusals = {
        reason: delta(before, after, "hami_webhook_refusals_total", reason=reason)
        for reason in REFUSAL_REASONS
    }
    # the last pod has two problems: counted once, under the first one's reason
    assert {r: n for r, n in refusals.items() if n} == {
        "privileged": 1,
        "forged_annotation": 1,
        "bad_gpumem": 2,
        "bad_annotation": 1,
    }

    duration = "hami_webhook_admission_duration_seconds"
    count = delta(before, after, f"{duration}_count")
    assert count == 9
    assert delta(before, after, f"{duration}_bucket", le="+Inf") == count
    # the server-side time of sequential requests fits inside the client's wall-clock time
    assert 0 < delta(before, after, f"{duration}_sum") < elapsed
    assert delta(before, after, f"{duration}_bucket", le="10.0") == count


QUOTAS = "/api/v1/resourcequotas"  # every namespace's: the pre-check's list + watch


def needs_permission(path: str) -> bool:
    """Whether a request path names a resource (RBAC applies) rather than API discovery."""
    parts = [p for p in path.split("?")[0].strip("/").split("/") if p]
    if parts[:1] == ["api"]:
        return len(parts) > 2
    if parts[:1] == ["apis"]:
        return len(parts) > 3
    return not re.fullmatch(r"version|healthz|readyz|livez", "/".join(parts))


async def test_the_chart_mode_webhook_reads_only_resource_quotas(operator: Operator, direct: Webhook) -> None:
    """The chart grants the webhook's ServiceAccount one rule, ``list`` and ``watch`` on
    ``resourcequotas`` (kept for the admission pre-check); otherwise Kopf may only read API discovery,
    and admitting a pod makes no API call at all."""
    emulator = operator.cluster.emulator

    async def quotas_watched() -> bool:
        return any(r.url.path == QUOTAS and r.params.get("watch") in ("true", "1") for r in list(emulator))

    await eventually(quotas_watched, "the webhook's ResourceQuota list + watch")
    before = len(list(emulator))
    response = await direct.admit(make_pod(ctr(limits={GPU: "1"})))
    assert response["allowed"] is True
    requests = list(emulator)
    assert {(str(r.method.value), r.url.path) for r in requests if needs_permission(r.url.path)} == {
        ("GET", QUOTAS)
    }
    assert [r.url.path for r in requests[before:] if needs_permission(r.url.path)] == []  # admission: none
