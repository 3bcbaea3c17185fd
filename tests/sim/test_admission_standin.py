"""The admission stand-in calls webhooks over HTTPS as kube-apiserver does, and honours their answers.

A small aiohttp HTTPS server plays the webhook (certificate from the project's own cert helper); the
MutatingWebhookConfiguration lives in the embedded apiserver with its url and caBundle.
"""

from __future__ import annotations

import base64
import datetime
import json
import ssl
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import aiohttp
import kmock
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from hami.sim.admission_standin import AdmissionStandIn, Admitted, Refused, apply_defaults, selector_matches
from hami.sim.kubeapi import MWC_PATH, SimApi
from webhook.certs import generate

Answer = Callable[[dict[str, Any]], dict[str, Any]]


def _patch(operations: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "allowed": True,
        "patchType": "JSONPatch",
        "patch": base64.b64encode(json.dumps(operations).encode()).decode(),
    }


class FakeWebhook:
    """An HTTPS admission endpoint answering with ``self.answer(review request)``; keeps the requests."""

    def __init__(self) -> None:
        self.requests: list[dict[str, Any]] = []
        self.answer: Answer = lambda request: {"allowed": True}

    async def handle(self, request: web.Request) -> web.Response:
        review = await request.json()
        self.requests.append(review)
        response = {"uid": review["request"]["uid"], **self.answer(review["request"])}
        return web.json_response(
            {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": response}
        )


@pytest.fixture
async def webhook(tmp_path: Path) -> AsyncIterator[tuple[FakeWebhook, TestServer, bytes]]:
    bundle = generate(["127.0.0.1", "localhost"], now=datetime.datetime.now(datetime.UTC))
    (tmp_path / "tls.crt").write_bytes(bundle.cert)
    (tmp_path / "tls.key").write_bytes(bundle.key)
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(tmp_path / "tls.crt", tmp_path / "tls.key")
    fake = FakeWebhook()
    app = web.Application()
    app.router.add_post("/webhook", fake.handle)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server(ssl=context)
    yield fake, server, bundle.ca_cert
    await server.close()


async def _configure(apiserver: kmock.KubernetesEmulator, url: str, ca: bytes, **hook: Any) -> None:
    webhook = {
        "name": "vgpu.hami.io",
        "clientConfig": {"url": url, "caBundle": base64.b64encode(ca).decode()},
        "rules": [
            {"apiGroups": [""], "apiVersions": ["v1"], "resources": ["pods"], "operations": ["CREATE"]}
        ],
        "failurePolicy": "Fail",
        "sideEffects": "None",
        "admissionReviewVersions": ["v1"],
        **hook,
    }
    body = {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "MutatingWebhookConfiguration",
            "metadata": {"name": "hami-webhook"}, "webhooks": [webhook]}  # fmt: skip
    await apiserver.post(MWC_PATH, json=body)


def _pod(name: str = "p1", **metadata: Any) -> dict[str, Any]:
    container = {
        "name": "c",
        "image": "x",
        "resources": {"limits": {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 3000}},
    }
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, **metadata},
        "spec": {"containers": [container]},
    }


@pytest.fixture
async def standin(apiserver: kmock.KubernetesEmulator) -> AsyncIterator[AdmissionStandIn]:
    async with aiohttp.ClientSession() as session:
        yield AdmissionStandIn(SimApi(session, str(apiserver.url)), session)


async def test_the_patch_is_applied_before_the_pod_is_created(
    apiserver: kmock.KubernetesEmulator,
    webhook: tuple[FakeWebhook, TestServer, bytes],
    standin: AdmissionStandIn,
) -> None:
    fake, server, ca = webhook
    await _configure(apiserver, f"https://127.0.0.1:{server.port}/webhook", ca)
    fake.answer = lambda request: {
        **_patch([{"op": "replace", "path": "/spec/schedulerName", "value": "hami-scheduler"}]),
        "warnings": ["schedulerName set"],
    }
    outcome = await standin.submit(_pod())
    assert isinstance(outcome, Admitted)
    assert outcome.warnings == ("schedulerName set",)
    stored = apiserver.objects[kmock.resource("v1/pods"), "default", "p1"].raw
    assert stored["spec"]["schedulerName"] == "hami-scheduler"
    assert stored["status"]["phase"] == "Pending"
    assert stored["metadata"]["uid"]
    # what the webhook saw: a v1 CREATE review of the defaulted pod (quantities as strings)
    request = fake.requests[0]["request"]
    assert (request["operation"], request["namespace"], request["name"]) == ("CREATE", "default", "p1")
    assert request["object"]["spec"]["schedulerName"] == "default-scheduler"
    resources = request["object"]["spec"]["containers"][0]["resources"]
    assert resources["limits"] == {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "3000"}
    assert resources["requests"] == resources["limits"]


async def test_a_denial_creates_nothing_and_reports_the_message(
    apiserver: kmock.KubernetesEmulator,
    webhook: tuple[FakeWebhook, TestServer, bytes],
    standin: AdmissionStandIn,
) -> None:
    fake, server, ca = webhook
    await _configure(apiserver, f"https://127.0.0.1:{server.port}/webhook", ca)
    fake.answer = lambda request: {
        "allowed": False,
        "status": {"message": "container c is privileged", "code": 400},
    }
    outcome = await standin.submit(_pod())
    assert isinstance(outcome, Refused)
    assert outcome.message == 'admission webhook "vgpu.hami.io" denied the request: container c is privileged'
    assert (kmock.resource("v1/pods"), "default", "p1") not in apiserver.objects


async def test_an_unreachable_webhook_fails_closed_or_is_ignored(
    apiserver: kmock.KubernetesEmulator,
    webhook: tuple[FakeWebhook, TestServer, bytes],
    standin: AdmissionStandIn,
) -> None:
    _, server, ca = webhook
    await _configure(apiserver, f"https://127.0.0.1:{server.port}/elsewhere", ca)  # answers 404
    refused = await standin.submit(_pod("closed"))
    assert isinstance(refused, Refused)
    assert 'failed calling webhook "vgpu.hami.io"' in refused.message
    await apiserver.patch(
        f"{MWC_PATH}/hami-webhook",
        json={"webhooks": [{**(await (await apiserver.get(f"{MWC_PATH}/hami-webhook")).json())["webhooks"][0],
                            "failurePolicy": "Ignore"}]},
    )  # fmt: skip
    admitted = await standin.submit(_pod("open"))
    assert isinstance(admitted, Admitted)
    assert admitted.pod["spec"]["schedulerName"] == "default-scheduler"  # unmutated


async def test_a_certificate_from_another_ca_is_rejected(
    apiserver: kmock.KubernetesEmulator,
    webhook: tuple[FakeWebhook, TestServer, bytes],
    standin: AdmissionStandIn,
) -> None:
    _, server, _ = webhook
    other = generate(["127.0.0.1"], now=datetime.datetime.now(datetime.UTC))
    await _configure(apiserver, f"https://127.0.0.1:{server.port}/webhook", other.ca_cert)
    outcome = await standin.submit(_pod())
    assert isinstance(outcome, Refused)
    assert "CERTIFICATE_VERIFY_FAILED" in outcome.message


async def test_object_selector_skips_opted_out_pods(
    apiserver: kmock.KubernetesEmulator,
    webhook: tuple[FakeWebhook, TestServer, bytes],
    standin: AdmissionStandIn,
) -> None:
    fake, server, ca = webhook
    selector = {"matchExpressions": [{"key": "hami.io/webhook", "operator": "NotIn", "values": ["ignore"]}]}
    await _configure(apiserver, f"https://127.0.0.1:{server.port}/webhook", ca, objectSelector=selector)
    outcome = await standin.submit(_pod(labels={"hami.io/webhook": "ignore"}))
    assert isinstance(outcome, Admitted)
    assert fake.requests == []


def test_selector_operators() -> None:
    labels = {"a": "1", "b": "2"}
    assert selector_matches({"matchLabels": {"a": "1"}}, labels)
    assert not selector_matches({"matchLabels": {"a": "2"}}, labels)
    assert selector_matches(
        {"matchExpressions": [{"key": "a", "operator": "In", "values": ["1", "3"]}]}, labels
    )
    assert not selector_matches({"matchExpressions": [{"key": "c", "operator": "Exists"}]}, labels)
    assert selector_matches({"matchExpressions": [{"key": "c", "operator": "DoesNotExist"}]}, labels)


def test_defaults_need_a_name() -> None:
    with pytest.raises(ValueError, match=r"metadata\.name"):
        apply_defaults({"metadata": {"generateName": "x-"}})
