"""The webhook end to end with default settings: the Kopf operator runs in a thread against the
embedded API server; AdmissionReview v1 requests go over HTTPS to the URL it published in its
MutatingWebhookConfiguration, verified against the caBundle published there; the returned JSONPatch
is applied with ``jsonpatch``. Golden patches for every mutation, golden messages for every refusal.
"""

from __future__ import annotations

import base64
import json
import ssl
from typing import Any

import aiohttp
import cel
import jsonpatch
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization

from hami.annotations import INTERNAL_POD_ANNOTATIONS
from webhook import tlsbundle

from .webhook_cases import CORES, GPU, MEM, PCT, PRIO, REFUSALS, ctr, make_pod
from .webhook_harness import Operator, Webhook, api_get, scoped_mwc, served_certificate


def ops_of(response: dict[str, Any]) -> list[dict[str, Any]]:
    assert response["allowed"] is True, response
    if "patch" not in response:
        return []
    assert response["patchType"] == "JSONPatch"
    ops: list[dict[str, Any]] = json.loads(base64.b64decode(response["patch"]))
    return ops


SCHED = {"op": "add", "path": "/spec/schedulerName", "value": "hami-scheduler"}
LIMITS = "/spec/containers/0/resources/limits/"
INIT_LIMITS = "/spec/initContainers/0/resources/limits/"
PRIORITY_ENV = {"name": "CUDA_TASK_PRIORITY", "value": "2"}
IGNORE = {"hami.io/webhook": "ignore"}

MUTATIONS: list[tuple[str, dict[str, Any], list[dict[str, Any]]]] = [
    (
        "bare card -> exclusive cores",
        make_pod(ctr(limits={GPU: "1"})),
        [SCHED, {"op": "add", "path": LIMITS + "nvidia.com~1gpucores", "value": "100"}],
    ),
    (
        "memory only -> one card",
        make_pod(ctr(limits={MEM: "3000"})),
        [SCHED, {"op": "add", "path": LIMITS + "nvidia.com~1gpu", "value": "1"}],
    ),
    (
        "whole-card percentage -> one exclusive card",
        make_pod(ctr(limits={PCT: "100"})),
        [
            SCHED,
            {"op": "add", "path": LIMITS + "nvidia.com~1gpu", "value": "1"},
            {"op": "add", "path": LIMITS + "nvidia.com~1gpucores", "value": "100"},
        ],
    ),
    (
        "shared card, scheduler only",
        make_pod(ctr(limits={GPU: "2", MEM: "4000", CORES: "30"})),
        [SCHED],
    ),
    (
        "priority -> env",
        make_pod(ctr(limits={GPU: "1", MEM: "1000", PRIO: "2"})),
        [
            SCHED,
            {
                "op": "add",
                "path": "/spec/containers/0/env",
                "value": [{"name": "CUDA_TASK_PRIORITY", "value": "2"}],
            },
        ],
    ),
    (
        "init container",
        make_pod(ctr("app"), init=(ctr("warm", limits={GPU: "1"}),)),
        [
            SCHED,
            {
                "op": "add",
                "path": "/spec/initContainers/0/resources/limits/nvidia.com~1gpucores",
                "value": "100",
            },
        ],
    ),
    (
        "default-scheduler taken over",
        make_pod(ctr(limits={GPU: "1", MEM: "1"}), schedulerName="default-scheduler"),
        [{"op": "replace", "path": "/spec/schedulerName", "value": "hami-scheduler"}],
    ),
    ("no GPU: untouched", make_pod(ctr(limits={"cpu": "1"})), []),
    ("foreign scheduler: untouched", make_pod(ctr(limits={GPU: "1"}), schedulerName="volcano"), []),
    ("ignored pod: untouched", make_pod(ctr(limits={GPU: "1"}), labels={"hami.io/webhook": "ignore"}), []),
    (
        "already ours: nothing to do",
        make_pod(ctr(limits={GPU: "1", MEM: "1"}), schedulerName="hami-scheduler"),
        [],
    ),
]


@pytest.mark.parametrize(("pod", "golden"), [m[1:] for m in MUTATIONS], ids=[m[0] for m in MUTATIONS])
async def test_mutation_golden_patch(
    webhook: Webhook, pod: dict[str, Any], golden: list[dict[str, Any]]
) -> None:
    ops = ops_of(await webhook.admit(pod))
    assert ops == golden
    mutated = jsonpatch.apply_patch(pod, ops)
    if golden:
        assert mutated["spec"]["schedulerName"] == "hami-scheduler"
    else:
        assert mutated == pod


@pytest.mark.parametrize(("pod", "message", "code"), [r[1:4] for r in REFUSALS], ids=[r[0] for r in REFUSALS])
async def test_refusal(webhook: Webhook, pod: dict[str, Any], message: str, code: int) -> None:
    response = await webhook.admit(pod)
    assert response["allowed"] is False
    # the code, and the reason kube-apiserver passes on (kubectl: "Error from server (Invalid): ...")
    reason = {400: "BadRequest", 403: "Forbidden", 422: "Invalid"}[code]
    assert response["status"] == {"message": message, "code": code, "reason": reason, "status": "Failure"}
    assert "patch" not in response


@pytest.mark.parametrize("key", INTERNAL_POD_ANNOTATIONS)
async def test_forged_internal_annotation_refused(webhook: Webhook, key: str) -> None:
    # even on a pod that asks for no card and opted out of the webhook
    pod = make_pod(ctr(limits={"cpu": "1"}), labels=IGNORE, annotations={key: "x"})
    response = await webhook.admit(pod)
    assert response["allowed"] is False
    assert response["status"] == {
        "message": f"annotation {key} is written by HAMi only; a new pod may not carry it",
        "code": 403,
        "reason": "Forbidden",
        "status": "Failure",
    }


async def test_managed_configuration_is_scoped(operator: Operator) -> None:
    mwc = await scoped_mwc(operator)
    assert not any("kopf" in key for key in (mwc["metadata"].get("annotations") or {}))
    (hook,) = mwc["webhooks"]
    config = hook.pop("clientConfig")
    assert config["url"].startswith("https://127.0.0.1:") and config["url"].endswith("/webhook")
    assert base64.b64decode(config["caBundle"]) == (operator.settings.tls_dir / "ca.crt").read_bytes()
    expression = hook["matchConditions"][0]["expression"]
    assert hook == {
        "name": "vgpu.hami.io",
        "admissionReviewVersions": ["v1"],
        "rules": [
            {
                "apiGroups": [""],
                "apiVersions": ["v1"],
                "resources": ["pods"],
                "operations": ["CREATE"],
                "scope": "Namespaced",
            }
        ],
        "failurePolicy": "Fail",
        "matchPolicy": "Equivalent",
        "sideEffects": "None",
        "timeoutSeconds": 10,
        "reinvocationPolicy": "Never",
        "namespaceSelector": {
            "matchExpressions": [{"key": "hami.io/webhook", "operator": "NotIn", "values": ["ignore"]}]
        },
        "matchConditions": [{"name": "hami-gpu-pods", "expression": expression}],
    }
    # the published condition sends GPU pods and forged pods, and nothing else
    assert cel.evaluate(expression, {"object": make_pod(ctr(limits={GPU: "1"}))}) is True
    assert cel.evaluate(expression, {"object": make_pod(ctr(limits={"cpu": "1"}))}) is False


async def test_serving_certificate_covers_the_service_names(operator: Operator, webhook: Webhook) -> None:
    for name in ("hami-webhook.hami-system.svc", "localhost", "hami-webhook"):
        der = await served_certificate(webhook.url, webhook.ca, server_hostname=name)
        pem = x509.load_der_x509_certificate(der).public_bytes(serialization.Encoding.PEM)
        assert tlsbundle.sans(pem) == operator.settings.hostnames
    earlier = tlsbundle.expiry(pem) - tlsbundle.SERVING_VALIDITY
    other_ca = tlsbundle.generate(["localhost"], now=earlier).ca_cert
    with pytest.raises(ssl.SSLCertVerificationError):
        await served_certificate(webhook.url, other_ca)


async def test_healthz(operator: Operator) -> None:
    health = operator.settings.health_listen
    url = f"http://{health.host}:{health.port}/healthz"
    async with aiohttp.ClientSession() as session, session.get(url) as response:
        assert response.status == 200
        body = await response.json()
    tls = (operator.settings.tls_dir / "tls.crt").read_bytes()
    assert body == {"certificate": tlsbundle.expiry(tls).isoformat()}


async def test_no_kubernetes_events_are_posted(operator: Operator, webhook: Webhook) -> None:
    await webhook.admit(REFUSALS[0][1])
    events = await api_get(operator.cluster, "/api/v1/namespaces/default/events")
    assert events is not None and events["items"] == []
