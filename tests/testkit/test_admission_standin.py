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

from hami_testkit.admission_policy import (
    BINDINGS_PATH,
    POLICIES_PATH,
    Denial,
    annotation_policy,
    review,
    service_account,
)
from hami_testkit.admission_standin import (
    POLICY,
    PRIORITY,
    AdmissionStandIn,
    Admitted,
    Refused,
    apply_defaults,
    resolve_priority,
    selector_matches,
)
from hami_testkit.apiserver import AdmittingEmulator, embedded_apiserver
from hami_testkit.kubeapi import MWC_PATH, SimApi
from tests.testkit.fakeserver import serving
from webhook.tlsbundle import generate

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
    async with serving("/webhook", fake.handle, tls=context) as server:
        yield fake, server, bundle.ca_cert


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
    metadata.setdefault("namespace", "default")
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


@pytest.mark.parametrize(
    ("status", "expected"),
    [
        # kube-apiserver's ToStatusErr: the webhook's own code and reason are what the client sees
        ({"message": "bad field", "code": 422, "reason": "Invalid"}, (422, "Invalid", ": bad field")),
        ({"message": "not allowed", "code": 403, "reason": "Forbidden"}, (403, "Forbidden", ": not allowed")),
        # no code, or one below 400: 400; no message: the reason, else "without explanation"
        ({"reason": "Invalid", "code": 200}, (400, "Invalid", ": Invalid")),
        ({}, (400, "", " without explanation")),
    ],
)
async def test_a_denial_keeps_the_webhooks_code_and_reason(
    apiserver: kmock.KubernetesEmulator,
    webhook: tuple[FakeWebhook, TestServer, bytes],
    standin: AdmissionStandIn,
    status: dict[str, Any],
    expected: tuple[int, str, str],
) -> None:
    fake, server, ca = webhook
    await _configure(apiserver, f"https://127.0.0.1:{server.port}/webhook", ca)
    fake.answer = lambda request: {"allowed": False, "status": status}
    outcome = await standin.submit(_pod())
    assert isinstance(outcome, Refused)
    code, reason, tail = expected
    assert (outcome.code, outcome.reason) == (code, reason)
    assert outcome.message == f'admission webhook "vgpu.hami.io" denied the request{tail}'


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


# --------------------------------------------- ValidatingAdmissionPolicies in the embedded apiserver

SCHEDULER_SA = service_account("hami-system", "hami-scheduler")
TOKENS = {"sched-token": SCHEDULER_SA, "alice-token": "alice"}
ALLOCATED = "GPU-a,NVIDIA,3000,30:;"


@pytest.fixture
async def guarded() -> AsyncIterator[AdmittingEmulator]:
    """An embedded apiserver with two known tokens and the chart's annotation policy stored."""
    async with embedded_apiserver(identities=TOKENS) as emulator:
        policy, binding = annotation_policy([SCHEDULER_SA])
        assert (await emulator.post(POLICIES_PATH, json=policy)).status == 200
        assert (await emulator.post(BINDINGS_PATH, json=binding)).status == 200
        yield emulator


async def _call(
    emulator: AdmittingEmulator, method: str, path: str, body: Any, token: str | None, content_type: str
) -> tuple[int, dict[str, Any]]:
    headers = {"Content-Type": content_type, **({"Authorization": f"Bearer {token}"} if token else {})}
    async with (
        aiohttp.ClientSession() as session,
        session.request(
            method, str(emulator.url).rstrip("/") + path, data=json.dumps(body), headers=headers
        ) as r,
    ):
        return r.status, await r.json()


def _stored(emulator: AdmittingEmulator, name: str = "p1") -> dict[str, Any]:
    raw: dict[str, Any] = emulator.objects[kmock.resource("v1/pods"), "default", name].raw
    return raw


async def _allocated_pod(emulator: AdmittingEmulator) -> str:
    pod = _pod()
    pod["metadata"]["namespace"] = "default"
    status, _ = await _call(
        emulator, "POST", "/api/v1/namespaces/default/pods", pod, "alice-token", "application/json"
    )
    assert status == 200
    bind = {
        "metadata": {
            "annotations": {"hami.io/vgpu-devices-allocated": ALLOCATED},
            "labels": {"hami.io/vgpu-node": "n1"},
        }
    }
    path = "/api/v1/namespaces/default/pods/p1"
    status, _ = await _call(emulator, "PATCH", path, bind, "sched-token", "application/merge-patch+json")
    assert status == 200
    return path


def _denied(user: str, key: str = "hami.io/vgpu-devices-allocated") -> str:
    return (
        "ValidatingAdmissionPolicy 'hami-annotations' with binding 'hami-annotations' denied request: "
        f"annotation {key} is written by HAMi only (its scheduler and node agent); "
        f"{user} may not set, change or remove it"
    )


@pytest.mark.parametrize(
    ("content_type", "body"),
    [
        (
            "application/merge-patch+json",
            {"metadata": {"annotations": {"hami.io/vgpu-devices-allocated": "GPU-a,NVIDIA,1,1:;"}}},
        ),
        (
            "application/strategic-merge-patch+json",
            {"metadata": {"annotations": {"hami.io/vgpu-devices-allocated": None}}},
        ),
        (
            "application/json-patch+json",
            [
                {
                    "op": "replace",
                    "path": "/metadata/annotations/hami.io~1vgpu-devices-allocated",
                    "value": ";",
                }
            ],
        ),
    ],
    ids=["merge", "strategic", "json-patch"],
)
async def test_a_user_patch_of_an_allocation_is_refused(
    guarded: AdmittingEmulator, content_type: str, body: Any
) -> None:
    path = await _allocated_pod(guarded)
    for token, user in (("alice-token", "alice"), (None, "system:anonymous"), ("forged", "system:anonymous")):
        status, answer = await _call(guarded, "PATCH", path, body, token, content_type)
        assert (status, answer["reason"], answer["message"]) == (403, "Forbidden", _denied(user))
        status, answer = await _call(guarded, "PATCH", path + "/status", body, token, content_type)
        assert status == 403
    assert _stored(guarded)["metadata"]["annotations"]["hami.io/vgpu-devices-allocated"] == ALLOCATED
    # the scheduler's own account may
    status, _ = await _call(guarded, "PATCH", path, body, "sched-token", content_type)
    assert status == 200
    assert _stored(guarded)["metadata"]["annotations"].get("hami.io/vgpu-devices-allocated") != ALLOCATED


async def test_other_pod_writes_pass(guarded: AdmittingEmulator) -> None:
    path = await _allocated_pod(guarded)
    ordinary = {
        "metadata": {"annotations": {"team": "a", "nvidia.com/use-gputype": "A100"}, "labels": {"app": "x"}}
    }
    status, _ = await _call(guarded, "PATCH", path, ordinary, "alice-token", "application/merge-patch+json")
    assert status == 200
    status, _ = await _call(
        guarded,
        "PATCH",
        path + "/status",
        {"status": {"phase": "Running"}},
        None,
        "application/merge-patch+json",
    )
    assert status == 200
    stored = _stored(guarded)
    assert stored["metadata"]["annotations"]["team"] == "a" and stored["status"]["phase"] == "Running"
    # binding (kmock reaction, no credentials) only sets spec.nodeName
    status, _ = await _call(
        guarded,
        "POST",
        path + "/binding",
        {"target": {"name": "n1"}, "metadata": {"name": "p1"}},
        None,
        "application/json",
    )
    assert status == 201 and _stored(guarded)["spec"]["nodeName"] == "n1"


async def test_a_policy_denial_at_create_is_reported_by_the_standin(guarded: AdmittingEmulator) -> None:
    async with aiohttp.ClientSession() as session:
        standin = AdmissionStandIn(SimApi(session, str(guarded.url), token="alice-token"), session)
        outcome = await standin.submit(_pod(annotations={"hami.io/vgpu-node": "n1"}))
        assert outcome == Refused(
            namespace="default",
            name="p1",
            webhook=POLICY,
            message="ValidatingAdmissionPolicy 'hami-annotations' with binding 'hami-annotations' "
            "denied request: annotation hami.io/vgpu-node is written by HAMi only "
            "(its scheduler and node agent); a new pod may not carry it",
            code=403,
        )
        assert (kmock.resource("v1/pods"), "default", "p1") not in guarded.objects
        assert isinstance(
            await standin.submit(_pod("p2", annotations={"nvidia.com/use-gputype": "A100"})), Admitted
        )


async def test_without_a_stored_policy_nothing_is_judged() -> None:
    async with embedded_apiserver(identities=TOKENS) as emulator:
        await _allocated_pod(emulator)
        body = {"metadata": {"annotations": {"hami.io/vgpu-devices-allocated": ";"}}}
        status, _ = await _call(
            emulator,
            "PATCH",
            "/api/v1/namespaces/default/pods/p1",
            body,
            None,
            "application/merge-patch+json",
        )
        assert status == 200


# ------------------------------------------------------------------- the policy engine's mechanics


def _policy(name: str = "p", **spec: Any) -> dict[str, Any]:
    rules = [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["UPDATE"], "resources": ["pods"]}]
    return {"metadata": {"name": name}, "spec": {"matchConstraints": {"resourceRules": rules}, **spec}}


def _binding(policy: str = "p", **spec: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": f"{policy}-b"},
        "spec": {"policyName": policy, "validationActions": ["Deny"], **spec},
    }


def _request(operation: str = "UPDATE", sub: str = "", user: str = "u", label: str = "x") -> dict[str, Any]:
    pod = {"metadata": {"name": "p1", "namespace": "ns", "labels": {"l": label}}}
    return {
        "operation": operation,
        "resource": {"group": "", "version": "v1", "resource": "pods"},
        "subResource": sub,
        "name": "p1",
        "namespace": "ns",
        "userInfo": {"username": user},
        "object": pod,
        "oldObject": pod,
    }


NO_X = {"expression": "object.metadata.labels['l'] != 'x'"}


def test_review_matches_rules_and_names_policy_and_binding() -> None:
    policy = _policy(validations=[{**NO_X, "message": "no x", "reason": "Forbidden"}])
    denial = review([policy], [_binding()], _request())
    assert denial == Denial(
        policy="p",
        binding="p-b",
        message="ValidatingAdmissionPolicy 'p' with binding 'p-b' denied request: no x",
        reason="Forbidden",
        code=403,
    )
    assert review([policy], [_binding()], _request(label="y")) is None
    assert review([policy], [_binding()], _request(operation="CREATE")) is None
    assert review([policy], [_binding()], _request(sub="status")) is None  # "pods" is not "pods/status"
    assert review([policy], [_binding(validationActions=["Warn"])], _request()) is None
    assert review([policy], [_binding("other")], _request()) is None
    excluded = _policy(validations=[NO_X])
    excluded["spec"]["matchConstraints"]["excludeResourceRules"] = excluded["spec"]["matchConstraints"][
        "resourceRules"
    ]
    assert review([excluded], [_binding()], _request()) is None
    selective = _policy(validations=[NO_X])
    selective["spec"]["matchConstraints"]["namespaceSelector"] = {"matchLabels": {"a": "b"}}
    assert review([selective], [_binding()], _request()) is None  # unsupported: matches nothing


def test_review_messages_conditions_variables_and_failure_policy() -> None:
    default = review([_policy(validations=[NO_X])], [_binding()], _request())
    assert default is not None and default.code == 422
    assert default.message.endswith("failed expression: object.metadata.labels['l'] != 'x'")
    computed = _policy(
        variables=[
            {"name": "who", "expression": "request.userInfo.username"},
            {"name": "shout", "expression": "[variables.who, 'no'].join(' says ')"},
        ],
        validations=[{**NO_X, "messageExpression": "variables.shout", "message": "fallback"}],
    )
    assert review([computed], [_binding()], _request(user="bob")).message.endswith(": bob says no")  # type: ignore[union-attr]
    broken_message = _policy(
        validations=[{**NO_X, "messageExpression": "object.nope.x", "message": "fallback"}]
    )
    assert review([broken_message], [_binding()], _request()).message.endswith(": fallback")  # type: ignore[union-attr]
    conditioned = _policy(
        matchConditions=[{"name": "c", "expression": "request.userInfo.username == 'bob'"}],
        validations=[NO_X],
    )
    assert review([conditioned], [_binding()], _request(user="alice")) is None
    assert review([conditioned], [_binding()], _request(user="bob")) is not None
    erroring = {"expression": "object.metadata.missing == 'y'"}
    failing = review([_policy(validations=[erroring])], [_binding()], _request())
    assert failing is not None and failing.code == 500 and "resulted in error" in failing.message
    assert review([_policy(validations=[erroring], failurePolicy="Ignore")], [_binding()], _request()) is None


def test_each_expression_sees_exactly_the_variables_evaluated_before_it() -> None:
    """Variables are bound in order (the engine binds them again only when an expression reads one it
    lacks): one that reads ``variables`` whole sees those before it, one that names a later one fails."""
    counting = _policy(
        variables=[
            {"name": "a", "expression": "1"},
            {"name": "b", "expression": "variables.a + 1"},
            {"name": "seen", "expression": "size(variables)"},  # a and b, not itself nor c
            {"name": "c", "expression": "variables.b + variables.seen"},
        ],
        validations=[{**NO_X, "expression": "false", "messageExpression": "string(variables.c)"}],
    )
    assert review([counting], [_binding()], _request()).message.endswith(": 4")  # type: ignore[union-attr]
    early = _policy(
        variables=[
            {"name": "a", "expression": "variables.b"},  # b is not evaluated yet
            {"name": "b", "expression": "1"},
        ],
        validations=[NO_X],
    )
    failing = review([early], [_binding()], _request())
    assert failing is not None and failing.code == 500
    assert "expression 'variables.b' resulted in error" in failing.message
    later = _policy(
        variables=[{"name": "a", "expression": "1"}, {"name": "b", "expression": "variables.a + 1"}],
        validations=[{**NO_X, "expression": "size(variables) == 2 && variables.b == 2"}],
    )
    assert review([later], [_binding()], _request()) is None


# ---------------------------------------------- the embedded apiserver calls the webhooks itself


@pytest.fixture
async def admitting() -> AsyncIterator[AdmittingEmulator]:
    """An embedded apiserver that calls the stored mutating webhooks on pod CREATE (kubectl's too)."""
    async with embedded_apiserver(identities=TOKENS, call_webhooks=True) as emulator:
        yield emulator


async def test_the_apiserver_calls_the_webhook_on_a_plain_pod_create(
    admitting: AdmittingEmulator, webhook: tuple[FakeWebhook, TestServer, bytes]
) -> None:
    fake, server, ca = webhook
    await _configure(admitting, f"https://127.0.0.1:{server.port}/webhook", ca)
    fake.answer = lambda request: _patch([{"op": "replace", "path": "/spec/schedulerName", "value": "hami"}])
    status, body = await _call(
        admitting, "POST", "/api/v1/namespaces/default/pods", _pod(), "alice-token", "application/json"
    )
    assert status in (200, 201), body
    assert _stored(admitting)["spec"]["schedulerName"] == "hami"  # patched before it was stored
    (review_,) = fake.requests
    assert review_["request"]["userInfo"]["username"] == "alice"
    assert review_["request"]["object"]["spec"]["restartPolicy"] == "Always"  # kube-apiserver's defaults


async def test_a_denial_is_answered_as_kube_apiserver_answers_it(
    admitting: AdmittingEmulator, webhook: tuple[FakeWebhook, TestServer, bytes]
) -> None:
    fake, server, ca = webhook
    await _configure(admitting, f"https://127.0.0.1:{server.port}/webhook", ca)
    fake.answer = lambda request: {"allowed": False, "status": {"message": "container c is privileged"}}
    status, body = await _call(
        admitting, "POST", "/api/v1/namespaces/default/pods", _pod(), "alice-token", "application/json"
    )
    assert (status, body["reason"]) == (400, "BadRequest")
    assert body["message"] == 'admission webhook "vgpu.hami.io" denied the request: container c is privileged'
    assert (kmock.resource("v1/pods"), "default", "p1") not in admitting.objects


async def test_a_denial_with_the_webhooks_code_is_answered_with_it(
    admitting: AdmittingEmulator, webhook: tuple[FakeWebhook, TestServer, bytes]
) -> None:
    """What kubectl shows: ``Error from server (Invalid): admission webhook ... denied the request``."""
    fake, server, ca = webhook
    await _configure(admitting, f"https://127.0.0.1:{server.port}/webhook", ca)
    fake.answer = lambda request: {
        "allowed": False,
        "status": {"message": "gpumem must be a number", "code": 422, "reason": "Invalid"},
    }
    status, body = await _call(
        admitting, "POST", "/api/v1/namespaces/default/pods", _pod(), "alice-token", "application/json"
    )
    assert (status, body["code"], body["reason"]) == (422, 422, "Invalid")
    assert body["message"].endswith("denied the request: gpumem must be a number")


async def test_match_conditions_decide_which_pods_are_sent(
    admitting: AdmittingEmulator, webhook: tuple[FakeWebhook, TestServer, bytes]
) -> None:
    """The webhook's own CEL condition (webhook.registration) is evaluated before the call."""
    from hami.settings import ResourceNames
    from webhook.registration import match_expression

    fake, server, ca = webhook
    condition = {"name": "hami-gpu-pods", "expression": match_expression(ResourceNames(), "hami-scheduler")}
    await _configure(admitting, f"https://127.0.0.1:{server.port}/webhook", ca, matchConditions=[condition])
    plain = _pod("plain")
    plain["spec"]["containers"][0]["resources"] = {}
    for pod in (_pod("gpu"), plain):
        status, body = await _call(
            admitting, "POST", "/api/v1/namespaces/default/pods", pod, "alice-token", "application/json"
        )
        assert status in (200, 201), body
    assert [r["request"]["object"]["metadata"]["name"] for r in fake.requests] == ["gpu"]


@pytest.mark.parametrize(("policy", "created"), [("Fail", False), ("Ignore", True)])
async def test_a_broken_match_condition_follows_the_failure_policy(
    admitting: AdmittingEmulator, webhook: tuple[FakeWebhook, TestServer, bytes], policy: str, created: bool
) -> None:
    fake, server, ca = webhook
    broken = {"name": "broken", "expression": "object.spec.nosuchfield == 1"}
    url = f"https://127.0.0.1:{server.port}/webhook"
    await _configure(admitting, url, ca, matchConditions=[broken], failurePolicy=policy)
    status, body = await _call(
        admitting, "POST", "/api/v1/namespaces/default/pods", _pod(), "alice-token", "application/json"
    )
    assert fake.requests == []
    assert (status in (200, 201)) == created, body
    if not created:
        assert status == 500 and "matchCondition 'broken'" in body["message"]


# ------------------------------------------- kube-apiserver's Priority admission plugin (pod CREATE)

PRIORITY_CLASSES = "/apis/scheduling.k8s.io/v1/priorityclasses"


def _class(name: str, value: int, **fields: Any) -> dict[str, Any]:
    return {"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass", "metadata": {"name": name},
            "value": value, **fields}  # fmt: skip


def _with_spec(name: str, **spec: Any) -> dict[str, Any]:
    pod = _pod(name)
    pod["spec"].update(spec)
    return pod


async def test_the_apiserver_resolves_priority_from_the_pod_priority_class(
    admitting: AdmittingEmulator,
) -> None:
    for body in (_class("batch", 100), _class("urgent", 1_000_000, preemptionPolicy="Never")):
        assert (await admitting.post(PRIORITY_CLASSES, json=body)).status == 200
    created = {
        "urgent": _with_spec("urgent", priorityClassName="urgent"),
        "batch": _with_spec("batch", priorityClassName="batch"),
        "plain": _pod("plain"),
        "critical": _with_spec("critical", priorityClassName="system-cluster-critical"),
        "consistent": _with_spec("consistent", priorityClassName="batch", priority=100),
    }
    for pod in created.values():
        status, body = await _call(
            admitting, "POST", "/api/v1/namespaces/default/pods", pod, "alice-token", "application/json"
        )
        assert status in (200, 201), body
    specs = {name: _stored(admitting, name)["spec"] for name in created}
    resolved = {name: (spec.get("priority"), spec.get("preemptionPolicy")) for name, spec in specs.items()}
    assert resolved == {
        "urgent": (1_000_000, "Never"),
        "batch": (100, "PreemptLowerPriority"),
        "plain": (0, "PreemptLowerPriority"),
        "critical": (2_000_000_000, "PreemptLowerPriority"),
        "consistent": (100, "PreemptLowerPriority"),
    }


async def test_the_global_default_class_applies_to_pods_that_name_none(admitting: AdmittingEmulator) -> None:
    for body in (
        _class("low-default", 5, globalDefault=True),
        _class("lower-default", 2, globalDefault=True),
    ):
        assert (await admitting.post(PRIORITY_CLASSES, json=body)).status == 200
    status, body = await _call(
        admitting, "POST", "/api/v1/namespaces/default/pods", _pod(), "alice-token", "application/json"
    )
    assert status in (200, 201), body
    spec = _stored(admitting)["spec"]
    assert (spec["priorityClassName"], spec["priority"]) == ("lower-default", 2)  # the lowest default


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({"priorityClassName": "nope"}, 'pods "p1" is forbidden: no PriorityClass with name nope was found'),
        (
            {"priority": 7},
            'pods "p1" is forbidden: the integer value of priority (7) must not be provided in pod spec; '
            "priority admission controller computed 0 from the given PriorityClass name",
        ),
        (
            {"priorityClassName": "batch", "preemptionPolicy": "Never"},
            'pods "p1" is forbidden: the string value of PreemptionPolicy (Never) must not be provided in '
            "pod spec; priority admission controller computed PreemptLowerPriority from the given "
            "PriorityClass name",
        ),
    ],
    ids=["unknown-class", "own-priority", "own-preemption-policy"],
)
async def test_a_pod_the_priority_plugin_refuses_is_not_created(
    admitting: AdmittingEmulator, spec: dict[str, Any], message: str
) -> None:
    assert (await admitting.post(PRIORITY_CLASSES, json=_class("batch", 100))).status == 200
    status, body = await _call(
        admitting, "POST", "/api/v1/namespaces/default/pods", _with_spec("p1", **spec), "alice-token",
        "application/json",
    )  # fmt: skip
    assert (status, body["reason"], body["message"]) == (403, "Forbidden", message)
    assert (kmock.resource("v1/pods"), "default", "p1") not in admitting.objects


async def test_the_standin_reports_a_priority_refusal_as_the_priority_plugin(
    apiserver: kmock.KubernetesEmulator, standin: AdmissionStandIn
) -> None:
    outcome = await standin.submit(_with_spec("p1", priorityClassName="nope"))
    assert isinstance(outcome, Refused)
    assert (outcome.webhook, outcome.code) == (PRIORITY, 403)
    assert outcome.message == 'pods "p1" is forbidden: no PriorityClass with name nope was found'
    assert (kmock.resource("v1/pods"), "default", "p1") not in apiserver.objects


def test_priority_classes_of_the_wrong_shape_resolve_as_zero() -> None:
    """The embedded apiserver stores a PriorityClass without checking its schema (kube-apiserver would
    refuse these): a value that is no integer counts as 0 instead of failing every pod CREATE."""
    classes = [
        _class("words", "high", globalDefault=True),  # type: ignore[arg-type]
        _class("fine", 7, globalDefault=True),
        _class("flag", True),
    ]
    for named, value in (("words", 0), ("flag", 0), ("", 0)):
        pod = _with_spec("p1", **({"priorityClassName": named} if named else {}))
        resolved = resolve_priority(pod, classes)
        assert isinstance(resolved, dict) and resolved["spec"]["priority"] == value, (named, resolved)
