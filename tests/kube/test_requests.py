"""The lean request path (``hami.kube.client.send``: the official client's ``param_serialize`` and
``call_api``, no generated API class) puts on the wire exactly what the generated methods it replaced put
there: method, URL (quoted path, query), headers (Accept, Content-Type, User-Agent, credential), body and
timeout, for every call ``hami.kube`` and the test kit make; and a refused request maps to the same error.
A body is the same object, not always the same bytes: the generated create methods turned a typed body
(an Event, a Secret) into the client's model and back (keys sorted, times written ``+00:00``); ours goes
as built.

Both paths end in the client's connection pool; a recorder stands in for it and answers each request.
The generated API classes are used here only, as the reference."""

from __future__ import annotations

import asyncio
import datetime
import io
import json
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import pytest
import urllib3
from kubernetes import client

from hami.kube import admissionconfig, events, nodes, paths, pods, quotas, secrets, webhookconfigs
from hami.kube.client import (
    HamiApiClient,
    KubeError,
    RefreshAtMost,
    call_json,
    error_from,
    send,
    timeout_of,
)
from hami.kube.protocol import KubeApi
from hami.kube.watch import ListWatcher

TIMEOUT = 7.0
NAME = "p:1@x y"  # characters the path quoting must treat as the client does
NAMESPACE = "ns-1"
POD = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": NAME, "namespace": NAMESPACE, "uid": "u1"}}


class Body(io.BytesIO):
    """A response body that closes at its end, as a socket's does (urllib3's stream reads until then)."""

    def read(self, size: int | None = -1, /) -> bytes:
        data = super().read(size)
        if not data:
            self.close()
        return data


class Recorder:
    """The connection pool: records each request and answers ``status`` with ``body``."""

    def __init__(self) -> None:
        self.requests: list[dict[str, Any]] = []
        self.status = 200
        # read as a list (no items), an object, and a watch's one event (a bookmark)
        self.body = json.dumps(
            {
                "metadata": {"resourceVersion": "7"},
                "items": [],
                "type": "BOOKMARK",
                "object": {"metadata": {"resourceVersion": "8"}},
            }
        ).encode()

    def request(self, method: str, url: str, **kwargs: Any) -> urllib3.HTTPResponse:
        timeout = kwargs.pop("timeout", None)
        self.requests.append({"method": method, "url": url, "timeout": repr(timeout), **kwargs})
        return urllib3.HTTPResponse(
            body=Body(self.body),
            headers={"Content-Type": "application/json"},
            status=self.status,
            reason="Reason",
            preload_content=False,
        )

    def clear(self) -> None:
        """The pool's own ``clear`` (``ApiClient.close`` calls it): nothing is held."""


@dataclass
class Apis:
    core: Any
    policy: Any
    admission: Any


def _api() -> tuple[Any, Recorder]:
    configuration = client.Configuration()
    configuration.host = "https://apiserver.test:6443"
    configuration.api_key = {"authorization": "secret-token"}
    configuration.api_key_prefix = {"authorization": "Bearer"}
    api: Any = HamiApiClient(configuration, request_timeout=TIMEOUT)
    api.user_agent = "hami-test/1"
    recorder = Recorder()
    api.rest_client.pool_manager = recorder
    return api, recorder


def _generated(api: Any) -> Apis:
    return Apis(client.CoreV1Api(api), client.PolicyV1Api(api), client.AdmissionregistrationV1Api(api))


RAW = {"_preload_content": False, "_request_timeout": TIMEOUT}
OPS = [{"op": "test", "path": "/metadata/uid", "value": "u1"}, {"op": "remove", "path": "/metadata/labels/x"}]
Ours = Callable[[KubeApi], Awaitable[Any]]
Theirs = Callable[[Apis, Any], Any]  # the generated call; also given the body ours sent


async def _watch_request(api: KubeApi, kind: Any, version: str, selector: str | None) -> None:
    watcher = ListWatcher(
        api,
        kind,
        loop=asyncio.get_running_loop(),
        on_list=lambda items: None,
        on_event=lambda kind, obj: None,
        watch_seconds=300,
        field_selector=selector,
    )
    await asyncio.to_thread(watcher._watch, version)  # one watch request, read to its end


async def _list_request(api: KubeApi, kind: Any, selector: str | None) -> None:
    watcher = ListWatcher(
        api,
        kind,
        loop=asyncio.get_running_loop(),
        on_list=lambda items: None,
        on_event=lambda kind, obj: None,
        field_selector=selector,
    )
    await asyncio.to_thread(watcher._list)


CASES: dict[str, tuple[Ours, Theirs]] = {
    "get pod": (
        lambda api: pods.get_pod(api, NAMESPACE, NAME),
        lambda g, _: g.core.read_namespaced_pod(NAME, NAMESPACE, **RAW),
    ),
    "get pod, limited": (
        lambda api: pods.get_pod(api, NAMESPACE, NAME, limit=2.5),
        lambda g, _: g.core.read_namespaced_pod(
            NAME, NAMESPACE, _preload_content=False, _request_timeout=2.5
        ),
    ),
    "list pods on a node": (
        lambda api: pods.list_pods(api, node_name="n1"),
        lambda g, _: g.core.list_pod_for_all_namespaces(field_selector="spec.nodeName=n1", **RAW),
    ),
    "list every pod": (
        lambda api: pods.list_pods(api),
        lambda g, _: g.core.list_pod_for_all_namespaces(**RAW),
    ),
    "merge-patch a pod": (
        lambda api: pods.patch_pod(
            api, NAMESPACE, NAME, annotations={"a": "1", "b": None}, labels={"l": "v"}
        ),
        lambda g, body: g.core.patch_namespaced_pod(
            NAME, NAMESPACE, body, _content_type=paths.MERGE_PATCH, **RAW
        ),
    ),
    "JSON-patch a pod": (
        lambda api: pods.json_patch_pod(api, NAMESPACE, NAME, OPS),
        lambda g, _: g.core.patch_namespaced_pod(NAME, NAMESPACE, OPS, _content_type=paths.JSON_PATCH, **RAW),
    ),
    "bind a pod": (
        lambda api: pods.bind_pod(api, NAMESPACE, NAME, "node-1", "u1", limit=3.0),
        lambda g, body: g.core.create_namespaced_pod_binding(
            NAME, NAMESPACE, body, _preload_content=False, _request_timeout=3.0
        ),
    ),
    "merge-patch a pod's status": (
        lambda api: call_json(
            api,
            "PATCH",
            paths.POD_STATUS,
            params={"namespace": NAMESPACE, "name": NAME},
            body={"status": {"phase": "Running"}},
            content_type=paths.MERGE_PATCH,
        ),
        lambda g, body: g.core.patch_namespaced_pod_status(
            NAME, NAMESPACE, body, _content_type=paths.MERGE_PATCH, **RAW
        ),
    ),
    "get node": (
        lambda api: nodes.get_node(api, "node-1"),
        lambda g, _: g.core.read_node("node-1", **RAW),
    ),
    "list nodes": (lambda api: nodes.list_nodes(api), lambda g, _: g.core.list_node(**RAW)),
    "merge-patch a node": (
        lambda api: nodes.patch_node_annotations(api, "node-1", {"a": "1", "b": None}),
        lambda g, body: g.core.patch_node("node-1", body, _content_type=paths.MERGE_PATCH, **RAW),
    ),
    "JSON-patch a node": (
        lambda api: nodes.json_patch_node(api, "node-1", OPS),
        lambda g, _: g.core.patch_node("node-1", OPS, _content_type=paths.JSON_PATCH, **RAW),
    ),
    "merge-patch a node's status": (
        lambda api: call_json(
            api,
            "PATCH",
            paths.NODE_STATUS,
            params={"name": "node-1"},
            body={"status": {"capacity": {"nvidia.com/gpu": "2"}}},
            content_type=paths.MERGE_PATCH,
        ),
        lambda g, body: g.core.patch_node_status("node-1", body, _content_type=paths.MERGE_PATCH, **RAW),
    ),
    "create an event": (
        lambda api: events.record_event(api, involved=POD, reason="R", message="m", component="hami-test"),
        lambda g, body: g.core.create_namespaced_event(NAMESPACE, body, **RAW),
    ),
    "merge-patch an event": (
        lambda api: call_json(
            api,
            "PATCH",
            paths.EVENT,
            params={"namespace": NAMESPACE, "name": "e.1"},
            body={"count": 2},
            content_type=paths.MERGE_PATCH,
        ),
        lambda g, body: g.core.patch_namespaced_event(
            "e.1", NAMESPACE, body, _content_type=paths.MERGE_PATCH, **RAW
        ),
    ),
    "list quotas of a namespace": (
        lambda api: quotas.list_resource_quotas(api, NAMESPACE),
        lambda g, _: g.core.list_namespaced_resource_quota(NAMESPACE, **RAW),
    ),
    "list every quota": (
        lambda api: quotas.list_resource_quotas(api),
        lambda g, _: g.core.list_resource_quota_for_all_namespaces(**RAW),
    ),
    "get secret": (
        lambda api: secrets.get_secret(api, NAMESPACE, "s"),
        lambda g, _: g.core.read_namespaced_secret("s", NAMESPACE, **RAW),
    ),
    "create secret": (
        lambda api: secrets.create_secret(api, NAMESPACE, {"metadata": {"name": "s"}, "data": {"k": "dg=="}}),
        lambda g, body: g.core.create_namespaced_secret(NAMESPACE, body, **RAW),
    ),
    "merge-patch secret": (
        lambda api: secrets.patch_secret(api, NAMESPACE, "s", data={"k": None}, labels={"l": "v"}),
        lambda g, body: g.core.patch_namespaced_secret(
            "s", NAMESPACE, body, _content_type=paths.MERGE_PATCH, **RAW
        ),
    ),
    "get webhook configuration": (
        lambda api: admissionconfig.get_mutating_webhook_configuration(api, "hami"),
        lambda g, _: g.admission.read_mutating_webhook_configuration("hami", **RAW),
    ),
    "JSON-patch webhook configuration": (
        lambda api: admissionconfig.json_patch_mutating_webhook_configuration(api, "hami", OPS),
        lambda g, _: g.admission.patch_mutating_webhook_configuration(
            "hami", OPS, _content_type=paths.JSON_PATCH, **RAW
        ),
    ),
    "list webhook configurations": (
        lambda api: webhookconfigs.list_mutating_webhook_configurations(api),
        lambda g, _: g.admission.list_mutating_webhook_configuration(**RAW),
    ),
    "list pods (watcher)": (
        lambda api: _list_request(api, "pods", "spec.nodeName=n1"),
        lambda g, _: g.core.list_pod_for_all_namespaces(field_selector="spec.nodeName=n1", **RAW),
    ),
    "watch pods (watcher)": (
        lambda api: _watch_request(api, "pods", "41", "spec.nodeName=n1"),
        lambda g, _: g.core.list_pod_for_all_namespaces(
            watch=True,
            resource_version="41",
            allow_watch_bookmarks=True,
            timeout_seconds=300,
            field_selector="spec.nodeName=n1",
            _preload_content=False,
            _request_timeout=(TIMEOUT, 330),
        ),
    ),
    "watch nodes from nothing (watcher)": (
        lambda api: _watch_request(api, "nodes", "", None),
        lambda g, _: g.core.list_node(
            watch=True,
            allow_watch_bookmarks=True,
            timeout_seconds=300,
            _preload_content=False,
            _request_timeout=(TIMEOUT, 330),
        ),
    ),
    "list quotas (watcher)": (
        lambda api: _list_request(api, "resourcequotas", None),
        lambda g, _: g.core.list_resource_quota_for_all_namespaces(**RAW),
    ),
    "list PDBs (watcher)": (
        lambda api: _list_request(api, "poddisruptionbudgets", None),
        lambda g, _: g.policy.list_pod_disruption_budget_for_all_namespaces(**RAW),
    ),
    "watch PDBs (watcher)": (
        lambda api: _watch_request(api, "poddisruptionbudgets", "9", None),
        lambda g, _: g.policy.list_pod_disruption_budget_for_all_namespaces(
            watch=True,
            resource_version="9",
            allow_watch_bookmarks=True,
            timeout_seconds=300,
            _preload_content=False,
            _request_timeout=(TIMEOUT, 330),
        ),
    ),
}


STAMP = re.compile(r"^\d{4}-\d\d-\d\dT[\d:.]+(Z|[+-]\d\d:\d\d)$")


def _canonical(value: Any) -> Any:
    """A decoded JSON body with its timestamps as instants (``Z`` and ``+00:00`` are one time)."""
    if isinstance(value, dict):
        return {key: _canonical(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_canonical(item) for item in value]
    if isinstance(value, str) and STAMP.match(value):
        return datetime.datetime.fromisoformat(value)
    return value


def _without_body(request: dict[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in request.items() if key != "body"}


@pytest.mark.parametrize("case", sorted(CASES))
async def test_each_request_is_the_one_the_generated_method_sent(case: str) -> None:
    ours, theirs = CASES[case]
    api, recorder = _api()
    try:
        await ours(api)
        [sent] = recorder.requests
        body = json.loads(sent["body"]) if sent.get("body") else None
        response = theirs(_generated(api), body)
        response.read()  # to its end, as call_json does
        [reference] = recorder.requests[1:]
        assert _without_body(sent) == _without_body(reference)
        assert ("body" in sent) == ("body" in reference)
        if "body" in sent:
            assert _canonical(json.loads(sent["body"])) == _canonical(json.loads(reference["body"]))
        assert sent["headers"]["User-Agent"] == "hami-test/1"
        assert sent["headers"]["authorization"] == "Bearer secret-token"
        assert sent["url"].startswith("https://apiserver.test:6443/")
    finally:
        api.close()


def test_the_path_and_query_are_quoted_as_the_client_quotes_them() -> None:
    """Spelled out once, so a change of the client's own quoting shows here too."""
    api, recorder = _api()
    try:
        send(
            api,
            "GET",
            paths.POD,
            params={"namespace": NAMESPACE, "name": NAME},
            query={"labelSelector": "a in (x,y)", "watch": True, "timeoutSeconds": 5, "absent": None},
            timeout=1.0,
        ).read()
        [sent] = recorder.requests
        assert sent["url"] == (
            "https://apiserver.test:6443/api/v1/namespaces/ns-1/pods/p%3A1%40x%20y"
            "?labelSelector=a%20in%20%28x%2Cy%29&watch=true&timeoutSeconds=5"
        )
        assert sent["headers"]["Accept"] == "application/json"
        assert "Content-Type" not in sent["headers"]
    finally:
        api.close()


def test_a_patch_must_name_its_content_type() -> None:
    api, recorder = _api()
    try:
        with pytest.raises(ValueError, match="content type"):
            send(api, "PATCH", paths.NODE, params={"name": "n"}, body={}, timeout=1.0)
        assert recorder.requests == []
    finally:
        api.close()


def _status(code: int, reason: str) -> bytes:
    return json.dumps(
        {"kind": "Status", "status": "Failure", "code": code, "reason": reason, "message": f"it is {reason}"}
    ).encode()


@pytest.mark.parametrize(
    ("code", "reason"),
    [(404, "NotFound"), (409, "AlreadyExists"), (410, "Expired"), (422, "Invalid"), (500, "InternalError")],
)
async def test_a_refusal_maps_to_the_error_the_generated_path_mapped(code: int, reason: str) -> None:
    api, recorder = _api()
    recorder.status, recorder.body = code, _status(code, reason)
    try:
        with pytest.raises(KubeError) as ours:
            await pods.json_patch_pod(api, NAMESPACE, NAME, OPS)
        with pytest.raises(client.ApiException) as theirs:
            _generated(api).core.patch_namespaced_pod(
                NAME, NAMESPACE, OPS, _content_type=paths.JSON_PATCH, **RAW
            )
        expected = error_from(theirs.value)
        assert type(ours.value) is type(expected)
        assert (ours.value.status, ours.value.reason, ours.value.message) == (code, reason, f"it is {reason}")
        assert (expected.status, expected.reason, expected.message) == (code, reason, f"it is {reason}")
        with pytest.raises(client.ApiException) as raw:  # the raw path raises the client's own exception
            send(api, "GET", paths.NODES, timeout=1.0)
        assert type(raw.value) is type(theirs.value)
    finally:
        api.close()


async def test_each_request_runs_the_refresh_hook_at_most_once_a_second() -> None:
    """The credential goes through the configuration's hook (param_serialize asks for it), wrapped by
    RefreshAtMost: a new token is sent once its second is up, not before."""
    api, recorder = _api()
    runs: list[int] = []
    now = [100.0]

    def hook(configuration: Any) -> None:
        runs.append(1)
        configuration.api_key["authorization"] = f"token-{len(runs)}"

    api.configuration.refresh_api_key_hook = hook
    RefreshAtMost.install(api.configuration, every=1.0, clock=lambda: now[0])
    try:
        for _ in range(5):
            await nodes.get_node(api, "node-1")
        now[0] += 1.0
        await nodes.list_nodes(api)
        sent = [r["headers"]["authorization"] for r in recorder.requests]
        assert sent == ["Bearer token-1"] * 5 + ["Bearer token-2"]
        assert len(runs) == 2
        assert timeout_of(api) == TIMEOUT
    finally:
        api.close()
