"""The ResourceQuota pre-check fails open: while the webhook cannot list ResourceQuotas (here the API
server refuses the list with 403, as without the chart's RBAC rule), GPU pods are admitted and a
warning says the pre-check is off; once a list succeeds the pre-check is on. The scheduler enforces
the quota at filter either way.
"""

from __future__ import annotations

import logging
from typing import Any

import kmock
import pytest

from tests.eventually import eventually

from .webhook_cases import GPU, MEM, ctr, make_pod
from .webhook_harness import Cluster, Operator, Webhook, api_post

QUOTAS = kmock.resource("v1/resourcequotas")
#: While True the API server answers every ResourceQuota list with 403.
REFUSING = [True]


@pytest.fixture(scope="module")
def operator_overrides(cluster: Cluster) -> dict[str, Any]:
    """Before the operator starts: refuse its ResourceQuota lists while ``REFUSING`` holds."""
    (cluster.emulator**10)[kmock.action.LIST, QUOTAS][lambda _: REFUSING[0]] << 403
    return {}


async def test_gpu_pods_are_admitted_until_the_quotas_can_be_listed(
    operator: Operator, webhook: Webhook, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="hami.webhook")
    quota = {
        "apiVersion": "v1",
        "kind": "ResourceQuota",
        "metadata": {"name": "tiny", "namespace": "team"},
        "spec": {"hard": {f"limits.{MEM}": "1"}},
    }
    await api_post(operator.cluster, "/api/v1/namespaces/team/resourcequotas", quota)
    pod = make_pod(ctr("t", limits={GPU: "1", MEM: "5000"}))
    pod["metadata"]["namespace"] = "team"
    assert (await webhook.admit(pod, namespace="team"))["allowed"] is True
    assert any("ResourceQuotas are not listed yet" in r.getMessage() for r in caplog.records)

    REFUSING[0] = False  # the list succeeds on the watcher's next try

    async def refused() -> bool:
        return not (await webhook.admit(pod, namespace="team"))["allowed"]

    await eventually(refused, "the pre-check to be on once the quotas are listed")
