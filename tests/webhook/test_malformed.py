"""Malformed AdmissionReview bodies POSTed to the running webhook over HTTPS (issue 26).

The webhook listens on every interface without client authentication, so any pod can send it any
body. Each malformed one must be answered 400 (413 when too large) with a ``Status``, logged in exactly
one WARNING line without a traceback, and leave the webhook answering valid reviews. Before the fix
Kopf answered most of them 500 with a traceback in the log.

The bodies: the kinds the issue lists (``null``, ``[]``, ``42``, NaN, an envelope without ``request``,
``object`` not a mapping, a missing ``resource``, ``metadata`` as a list, arrays 10,000 deep, a
5,000-digit uid, ...) and, by hypothesis, a valid review with one field replaced by a value of another
JSON type or removed.
"""

from __future__ import annotations

import asyncio
import base64
import copy
import http.client
import json
import logging
import ssl
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from webhook import reviews

from .webhook_cases import GPU, ctr, make_pod
from .webhook_harness import Operator, review, scoped_mwc

VALID = review(make_pod(ctr("train", limits={GPU: "1"})))
DEEP = "[" * 10_000 + "]" * 10_000


def _with(path: tuple[str | int, ...], value: Any) -> bytes:
    """The valid review with the field at ``path`` set to ``value`` (removed when ``value`` is ...)."""
    body = copy.deepcopy(VALID)
    parent: Any = body
    for key in path[:-1]:
        parent = parent[key]
    if value is ...:
        del parent[path[-1]]
    else:
        parent[path[-1]] = value
    return json.dumps(body).encode()


def _raw(path: tuple[str | int, ...], text: str) -> bytes:
    """The valid review with the field at ``path`` replaced by the JSON text ``text`` as written."""
    marker = "__HAMI_RAW__"
    return _with(path, marker).replace(json.dumps(marker).encode(), text.encode())


REQ, OBJ = ("request",), ("request", "object")
CONTAINER = (*OBJ, "spec", "containers", 0)
KINDS: list[tuple[str, bytes]] = [
    ("null", b"null"),
    ("empty list", b"[]"),
    ("a number", b"42"),
    ("a string", b'"AdmissionReview"'),
    ("NaN", b"NaN"),
    ("NaN inside", _raw((*REQ, "dryRun"), "NaN")),
    ("Infinity inside", _raw((*CONTAINER, "resources", "limits", GPU), "-Infinity")),
    ("a float beyond float", _raw((*REQ, "dryRun"), "1e999")),
    ("empty body", b""),
    ("truncated", json.dumps(VALID).encode()[:-20]),
    ("not UTF-8", b'{"apiVersion": "\xff\xfe"}'),
    ("an empty object", b"{}"),
    ("no request", _with(REQ, ...)),
    ("request null", _with(REQ, None)),
    ("request a list", _with(REQ, [])),
    ("object not a mapping", _with(OBJ, ["pod"])),
    ("object a string", _with(OBJ, "pod")),
    ("no object", _with(OBJ, ...)),
    ("no resource", _with((*REQ, "resource"), ...)),
    ("resource a string", _with((*REQ, "resource"), "pods")),
    ("no userInfo", _with((*REQ, "userInfo"), ...)),
    ("metadata a list", _with((*OBJ, "metadata"), ["a"])),
    ("metadata null", _with((*OBJ, "metadata"), None)),
    ("metadata.uid a list", _with((*OBJ, "metadata", "uid"), ["a"])),
    ("metadata.uid an object", _with((*OBJ, "metadata", "uid"), {"a": 1})),
    ("labels null", _with((*OBJ, "metadata", "labels"), None)),
    ("labels a list", _with((*OBJ, "metadata", "labels"), ["a"])),
    ("containers a mapping", _with((*OBJ, "spec", "containers"), {"name": "c"})),
    ("a container a string", _with((*OBJ, "spec", "containers"), ["c"])),
    ("limits a list", _with((*CONTAINER, "resources", "limits"), [GPU])),
    ("a limit a number", _with((*CONTAINER, "resources", "limits", GPU), 1)),
    ("env a mapping", _with((*CONTAINER, "env"), {"name": "X"})),
    ("arrays 10,000 deep", DEEP.encode()),
    ("arrays 10,000 deep in the pod", _raw((*OBJ, "spec", "overhead"), DEEP)),
    ("objects 100 deep in the pod", _raw((*OBJ, "spec", "overhead"), '{"a":' * 100 + "1" + "}" * 100)),
    ("a 5,000-digit uid", _raw((*REQ, "uid"), "9" * 5000)),
    ("a 5,000-character uid", _with((*REQ, "uid"), "u" * 5000)),
    ("no uid", _with((*REQ, "uid"), ...)),
    ("another operation", _with((*REQ, "operation"), "PATCH")),
    ("v1beta1", _with(("apiVersion",), "admission.k8s.io/v1beta1")),
]


@dataclass
class Endpoint:
    host: str
    port: int
    path: str
    context: ssl.SSLContext

    def connect(self) -> http.client.HTTPSConnection:
        return http.client.HTTPSConnection(self.host, self.port, context=self.context, timeout=30)


@pytest.fixture(scope="module")
def endpoint(operator: Operator) -> Endpoint:
    mwc = asyncio.run(scoped_mwc(operator))
    config = mwc["webhooks"][0]["clientConfig"]
    url = urllib.parse.urlsplit(config["url"])
    context = ssl.create_default_context(cadata=base64.b64decode(config["caBundle"]).decode())
    assert url.hostname is not None and url.port is not None
    return Endpoint(url.hostname, url.port, url.path, context)


@pytest.fixture(scope="module")
def connection(endpoint: Endpoint) -> Iterator[http.client.HTTPSConnection]:
    """One keep-alive connection for the module, as kube-apiserver keeps them."""
    conn = endpoint.connect()
    yield conn
    conn.close()


def post(conn: http.client.HTTPSConnection, path: str, body: bytes) -> tuple[int, dict[str, Any]]:
    conn.request("POST", path, body=body, headers={"Content-Type": "application/json"})
    response = conn.getresponse()
    data: dict[str, Any] = json.loads(response.read())
    return response.status, data


def check_malformed(
    conn: http.client.HTTPSConnection, path: str, body: bytes, caplog: pytest.LogCaptureFixture
) -> None:
    """``body`` is answered 400 with a Status, in one WARNING line without a traceback."""
    caplog.clear()
    status, answer = post(conn, path, body)
    assert status == 400, answer
    assert answer["kind"] == "Status" and answer["code"] == 400 and answer["reason"] == "BadRequest"
    assert answer["message"].startswith("malformed AdmissionReview: ")
    assert len(answer["message"]) < 400  # a huge uid or body is never echoed
    lines = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert [(r.name, r.levelno) for r in lines] == [("hami.webhook", logging.WARNING)], lines
    assert "malformed AdmissionReview" in lines[0].getMessage()
    assert len(lines[0].getMessage()) < 400
    assert not any(r.exc_info for r in caplog.records)


def check_still_serving(conn: http.client.HTTPSConnection, path: str) -> None:
    status, answer = post(conn, path, json.dumps(VALID).encode())
    assert status == 200
    assert answer["response"]["uid"] == VALID["request"]["uid"] and answer["response"]["allowed"] is True


@pytest.mark.parametrize("body", [k[1] for k in KINDS], ids=[k[0] for k in KINDS])
def test_a_malformed_body_is_a_400_in_one_log_line(
    endpoint: Endpoint, connection: http.client.HTTPSConnection, body: bytes, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    check_malformed(connection, endpoint.path, body, caplog)
    check_still_serving(connection, endpoint.path)


def _json_values() -> st.SearchStrategy[Any]:
    scalars = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20)

    def nested(inner: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
        return st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3)

    return st.recursive(scalars, nested, max_leaves=6)


#: Fields of the valid review, the JSON type each must have and whether it is required: a value of
#: another type, or removing a required one, is malformed.
FIELDS: list[tuple[tuple[str | int, ...], type, bool]] = [
    # (path, the type it must have, whether it is required)
    ((), dict, True),
    (REQ, dict, True),
    ((*REQ, "uid"), str, True),
    ((*REQ, "resource"), dict, True),
    ((*REQ, "resource", "group"), str, True),
    ((*REQ, "resource", "resource"), str, True),
    ((*REQ, "userInfo"), dict, True),
    ((*REQ, "operation"), str, True),
    ((*REQ, "dryRun"), bool, False),
    (OBJ, dict, True),
    ((*OBJ, "metadata"), dict, False),
    ((*OBJ, "metadata", "name"), str, False),
    ((*OBJ, "metadata", "uid"), str, False),
    ((*OBJ, "metadata", "labels"), dict, False),
    ((*OBJ, "spec"), dict, False),
    ((*OBJ, "spec", "containers"), list, False),
    ((*OBJ, "spec", "schedulerName"), str, False),
    (CONTAINER, dict, True),
    ((*CONTAINER, "name"), str, False),
    ((*CONTAINER, "resources"), dict, False),
    ((*CONTAINER, "resources", "limits"), dict, False),
    ((*CONTAINER, "resources", "limits", GPU), str, False),
]


@st.composite
def malformed_reviews(draw: st.DrawFn) -> bytes:
    path, kind, required = draw(st.sampled_from(FIELDS))
    if required and path and draw(st.booleans()) and not isinstance(path[-1], int):
        return _with(path, ...)
    value = draw(_json_values().filter(lambda v: not isinstance(v, kind)))
    if value is None and not required and path[: len(OBJ)] != OBJ:
        value = 7  # null is "absent" for an optional field of the envelope, which is fine ...
    # ... but not in the pod: kube-apiserver omits an empty field there, and Kopf reads metadata as a map
    return json.dumps(value).encode() if not path else _with(path, value)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(body=malformed_reviews())
def test_fuzzed_malformed_reviews_are_400s(
    endpoint: Endpoint, connection: http.client.HTTPSConnection, body: bytes, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    check_malformed(connection, endpoint.path, body, caplog)


def test_a_body_over_the_limit_is_a_413(endpoint: Endpoint, caplog: pytest.LogCaptureFixture) -> None:
    body = _with((*OBJ, "metadata", "annotations"), {"a": "x" * reviews.MAX_BODY})
    conn = endpoint.connect()
    try:
        status, answer = post(conn, endpoint.path, body)
    finally:
        conn.close()
    assert status == 413 and answer["reason"] == "RequestEntityTooLarge"
    assert [r.levelno for r in caplog.records if r.levelno >= logging.WARNING] == [logging.WARNING]
    conn = endpoint.connect()
    try:
        check_still_serving(conn, endpoint.path)
    finally:
        conn.close()


JSON_BODIES = _json_values().map(lambda v: json.dumps(v).encode())
ANY_BODY = st.binary(max_size=300) | JSON_BODIES | malformed_reviews()


@settings(max_examples=300, deadline=None)
@given(body=ANY_BODY)
def test_reading_any_body_raises_only_malformed(body: bytes) -> None:
    """The reader itself, without the server: any bytes are a review or :class:`reviews.Malformed`."""
    try:
        review = reviews.read_review(body)
    except reviews.Malformed as exc:
        assert len(str(exc)) < 400
    else:
        assert review["request"]["uid"]
