"""The admission-time ResourceQuota pre-check (HAMi's ``fitResourceQuota``), end to end.

ResourceQuotas live in the embedded API server (the webhook keeps them by a list + watch);
AdmissionReviews go to the running webhook over HTTPS. After creating a quota a test waits, bounded,
until a probe pod over it is refused: the watch has delivered it.

HAMi refuses a GPU pod at creation with ``exceeding resource quota`` when its ask would exceed its
namespace's ``limits.<gpumem>`` / ``limits.<gpucores>``; the webhook does the same against each quota's
hard limit (docs/webhook.md; docs/compatibility.md: what the namespace already uses is the
scheduler's to count, at filter).
"""

from __future__ import annotations

import logging
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.eventually import eventually

from .webhook_cases import CORES, GPU, MEM, PCT, ctr, make_pod
from .webhook_harness import Operator, Webhook, api_get, api_post

MEM_KEY, CORES_KEY = f"limits.{MEM}", f"limits.{CORES}"
#: What a 403 refusal's status carries besides code and message (kubectl: "Error from server (Forbidden)").
FORBIDDEN = {"reason": "Forbidden", "status": "Failure"}


def in_namespace(pod: dict[str, Any], namespace: str) -> dict[str, Any]:
    pod["metadata"]["namespace"] = namespace
    return pod


async def add_quota(
    operator: Operator,
    webhook: Webhook,
    name: str,
    namespace: str,
    hard: dict[str, Any],
    *,
    probe: dict[str, str],
) -> None:
    """Create the quota, then wait until the webhook refuses a pod asking ``probe`` (over the quota)."""
    body = {
        "apiVersion": "v1",
        "kind": "ResourceQuota",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"hard": hard},
    }
    await api_post(operator.cluster, f"/api/v1/namespaces/{namespace}/resourcequotas", body)
    pod = in_namespace(make_pod(ctr("probe", limits=probe)), namespace)

    async def refused() -> bool:
        return not (await webhook.admit(pod, namespace=namespace))["allowed"]

    await eventually(refused, f"the webhook to see resourcequota {namespace}/{name}")


async def refusals_over_quota(operator: Operator, webhook: Webhook) -> float:
    async with webhook.session.get(f"http://{operator.settings.metrics_listen}/metrics") as response:
        text = await response.text()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "hami_webhook_refusals_total" and sample.labels == {
                "reason": "exceeding_quota"
            }:
                return float(sample.value)
    raise AssertionError("no hami_webhook_refusals_total{reason=exceeding_quota} series")


async def test_a_pod_over_its_namespace_gpu_quota_is_refused_at_admission(
    operator: Operator, webhook: Webhook
) -> None:
    hard = {MEM_KEY: "8000", CORES_KEY: "150", "pods": "10"}
    await add_quota(operator, webhook, "gpu", "quota-team", hard, probe={GPU: "1", MEM: "9000"})
    before = await refusals_over_quota(operator, webhook)
    # 2 cards x 5000 MiB = 10000 MiB, more than the 8000 the quota allows in all
    pod = in_namespace(make_pod(ctr("train", limits={GPU: "2", MEM: "5000", CORES: "30"})), "quota-team")
    response = await webhook.admit(pod, namespace="quota-team")
    assert response["allowed"] is False
    assert response["status"] == {
        "message": "exceeding resource quota: the pod asks for 10000 of limits.nvidia.com/gpumem, more than "
        "resourcequota quota-team/gpu allows in all (8000)",
        "code": 403,
        **FORBIDDEN,
    }
    assert await refusals_over_quota(operator, webhook) == before + 1

    # the same pod where no quota limits GPUs: admitted
    elsewhere = in_namespace(make_pod(ctr("train", limits={GPU: "2", MEM: "5000", CORES: "30"})), "free")
    assert (await webhook.admit(elsewhere, namespace="free"))["allowed"] is True


@pytest.fixture
async def cores_quota(operator: Operator, webhook: Webhook) -> str:
    """Namespace ``quota-cores`` with one quota: 8000 MiB and 150 % of a card in all."""
    namespace = "quota-cores"
    hard = {MEM_KEY: "8000", CORES_KEY: "150"}
    if await _absent(operator, namespace):
        await add_quota(operator, webhook, "gpu", namespace, hard, probe={GPU: "1", MEM: "8001"})
    return namespace


async def _absent(operator: Operator, namespace: str) -> bool:
    return await api_get(operator.cluster, f"/api/v1/namespaces/{namespace}/resourcequotas/gpu") is None


@pytest.mark.parametrize(
    ("limits", "init", "message"),
    [
        # within both limits (equality passes)
        ({GPU: "2", MEM: "4000", CORES: "75"}, None, None),
        # a bare card is exclusive (gpucores 100 by the webhook's default): 2 x 100 > 150
        (
            {GPU: "2"},
            None,
            "the pod asks for 200 of limits.nvidia.com/gpucores, more than resourcequota quota-cores/gpu "
            "allows in all (150)",
        ),
        # a percentage counts no MiB at admission (as in HAMi; Fit resolves it per card)
        ({GPU: "1", PCT: "50", CORES: "50"}, None, None),
        # an init container counts at its peak, not added to the app containers
        ({GPU: "1", MEM: "3000", CORES: "10"}, {GPU: "1", MEM: "8000", CORES: "10"}, None),
        (
            {GPU: "1", MEM: "3000", CORES: "10"},
            {GPU: "1", MEM: "8001", CORES: "10"},
            "the pod asks for 8001 of limits.nvidia.com/gpumem, more than resourcequota quota-cores/gpu "
            "allows in all (8000)",
        ),
    ],
    ids=["within", "exclusive-default-counts", "percentage", "init-peak-fits", "init-peak-over"],
)
async def test_what_the_pod_asks_is_hamis_sum(
    webhook: Webhook,
    cores_quota: str,
    limits: dict[str, str],
    init: dict[str, str] | None,
    message: str | None,
) -> None:
    inits = (ctr("warm", limits=init),) if init is not None else ()
    pod = in_namespace(make_pod(ctr("train", limits=limits), init=inits), cores_quota)
    response = await webhook.admit(pod, namespace=cores_quota)
    if message is None:
        assert response["allowed"] is True, response
    else:
        assert response["allowed"] is False
        assert response["status"] == {
            "message": f"exceeding resource quota: {message}",
            "code": 403,
            **FORBIDDEN,
        }


async def test_every_quota_over_its_limit_is_named(operator: Operator, webhook: Webhook) -> None:
    await add_quota(
        operator, webhook, "memory", "quota-two", {MEM_KEY: "1000"}, probe={GPU: "1", MEM: "1001"}
    )
    # 0 blocks any ask of cores
    await add_quota(operator, webhook, "cores", "quota-two", {CORES_KEY: "0"}, probe={GPU: "1", CORES: "1"})
    pod = in_namespace(make_pod(ctr("t", limits={GPU: "1", MEM: "2000", CORES: "1"})), "quota-two")
    response = await webhook.admit(pod, namespace="quota-two")
    assert response["allowed"] is False
    assert response["status"]["message"] == (
        "exceeding resource quota: "
        "the pod asks for 1 of limits.nvidia.com/gpucores, more than resourcequota quota-two/cores allows "
        "in all (0); "
        "the pod asks for 2000 of limits.nvidia.com/gpumem, more than resourcequota quota-two/memory allows "
        "in all (1000)"
    )
    # a deleted quota no longer counts (the watch delivers the deletion)
    path = "/api/v1/namespaces/quota-two/resourcequotas/cores"
    async with webhook.session.delete(operator.cluster.url + path) as deleted:
        assert deleted.status == 200
    cores_only = in_namespace(make_pod(ctr("t", limits={GPU: "1", MEM: "10", CORES: "1"})), "quota-two")

    async def admitted() -> bool:
        return bool((await webhook.admit(cores_only, namespace="quota-two"))["allowed"])

    await eventually(admitted, "the deleted quota to stop counting")


async def test_other_refusals_come_first_and_unrouted_pods_are_not_checked(
    operator: Operator, webhook: Webhook
) -> None:
    over = {GPU: "1", MEM: "5000"}
    await add_quota(operator, webhook, "tiny", "quota-order", {MEM_KEY: "1"}, probe=over)
    privileged = make_pod(ctr("t", limits=over, securityContext={"privileged": True}))
    response = await webhook.admit(in_namespace(privileged, "quota-order"), namespace="quota-order")
    assert response["status"] == {"message": "container t is privileged", "code": 403, **FORBIDDEN}
    # a pod naming another scheduler is not ours to route (HAMi lets it through unchecked, too)
    foreign = in_namespace(make_pod(ctr("t", limits=over), schedulerName="volcano"), "quota-order")
    assert (await webhook.admit(foreign, namespace="quota-order"))["allowed"] is True
    # nor is a pod that asks for no card
    cpu = in_namespace(make_pod(ctr("t", limits={"cpu": "1"})), "quota-order")
    assert (await webhook.admit(cpu, namespace="quota-order"))["allowed"] is True


async def test_an_unreadable_limit_is_ignored_and_the_other_still_counts(
    operator: Operator, webhook: Webhook, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="hami.webhook")
    hard = {MEM_KEY: "lots", CORES_KEY: "20"}
    await add_quota(operator, webhook, "half", "quota-bad", hard, probe={GPU: "1", CORES: "21"})
    memory_only = in_namespace(make_pod(ctr("t", limits={GPU: "1", MEM: "99999", CORES: "20"})), "quota-bad")
    assert (await webhook.admit(memory_only, namespace="quota-bad"))["allowed"] is True
    messages = [r.getMessage() for r in caplog.records]
    assert any("resourcequota quota-bad/half: spec.hard[limits.nvidia.com/gpumem]" in m for m in messages)
