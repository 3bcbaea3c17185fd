"""The API server behind the fault proxy (the test kit's embedded apiserver) keeps kube-apiserver's rules,
and each fault mode does what it promises, seen through the project's API client (``hami.kube``) over
HTTP."""

from __future__ import annotations

import asyncio
import datetime
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from hami.kube import paths
from hami.kube.client import KubeError, call_json, load_api_client
from hami.kube.pods import MERGE_PATCH, bind_pod, get_pod, json_patch_pod, list_pods, patch_pod
from hami_testkit.apiserver import write_kubeconfig
from tests.eventually import eventually

from .apiserver import Objects, running
from .faults import FaultProxy, Mode, Rule, classify

PODS = "/api/v1/namespaces/default/pods"


@pytest.fixture
async def store() -> AsyncIterator[Objects]:
    async with running() as objects:
        for name in ("p1", "p2"):
            body = {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": name, "namespace": "default", "uid": name},
            }
            await objects.create("pods", body)
        yield objects


@pytest.fixture
async def proxy(store: Objects) -> AsyncIterator[FaultProxy]:
    fault_proxy = FaultProxy(store.url)
    await fault_proxy.start()
    yield fault_proxy
    await fault_proxy.stop()


@pytest.fixture
def client(proxy: FaultProxy, tmp_path: Path) -> Any:
    api = load_api_client(str(write_kubeconfig(tmp_path / "kc", proxy.url)), component="integrity-scheduler")
    yield api
    api.close()


def annotation(store: Objects, name: str) -> str | None:
    pod = store.get("pods", "default", name) or {}
    return ((pod.get("metadata") or {}).get("annotations") or {}).get("a")


def arm(proxy: FaultProxy, mode: Mode, *, kind: str = "pod-patch", subject: str = "p1", **kw: Any) -> None:
    proxy.arm(Rule(owner=1, who=kw.pop("who", "scheduler"), kind=kind, subject=subject, mode=mode, **kw))


def test_requests_are_classified_by_what_they_do_and_name() -> None:
    assert classify("POST", f"{PODS}/p1/binding") == ("binding", "p1")
    assert classify("PATCH", f"{PODS}/p1") == ("pod-patch", "p1")
    assert classify("GET", "/api/v1/nodes/n1") == ("node-get", "n1")
    assert classify("GET", "/api/v1/pods") == ("pod-list", None)
    assert classify("POST", "/api/v1/namespaces/default/events") == ("event", None)


async def test_fail_answers_500_and_applies_nothing(store: Objects, proxy: FaultProxy, client: Any) -> None:
    arm(proxy, Mode.FAIL)
    with pytest.raises(KubeError) as caught:
        await patch_pod(client, "default", "p1", annotations={"a": "1"})
    assert caught.value.status == 500 and annotation(store, "p1") is None
    await patch_pod(client, "default", "p1", annotations={"a": "2"})  # one-shot: the next one passes
    assert annotation(store, "p1") == "2"


async def test_lost_applies_then_answers_500(store: Objects, proxy: FaultProxy, client: Any) -> None:
    arm(proxy, Mode.LOST)
    with pytest.raises(KubeError) as caught:
        await patch_pod(client, "default", "p1", annotations={"a": "1"})
    assert caught.value.status == 500 and annotation(store, "p1") == "1"


async def test_late_answers_504_and_applies_only_when_released(
    store: Objects, proxy: FaultProxy, client: Any
) -> None:
    arm(proxy, Mode.LATE)
    with pytest.raises(KubeError) as caught:
        await patch_pod(client, "default", "p1", annotations={"a": "late"})
    assert caught.value.status == 504 and annotation(store, "p1") is None
    await patch_pod(client, "default", "p1", annotations={"a": "undo"})
    (entry,) = proxy.parked
    assert not entry.waiting and proxy.waiting == 0
    proxy.release(entry)
    await eventually(
        lambda: annotation(store, "p1") == "late", "the late write"
    )  # landed after the newer write


async def test_hold_parks_the_request_until_released(store: Objects, proxy: FaultProxy, client: Any) -> None:
    arm(proxy, Mode.HOLD)
    call = asyncio.create_task(patch_pod(client, "default", "p1", annotations={"a": "1"}))
    await eventually(lambda: bool(proxy.parked), "a parked request")
    assert proxy.waiting == 1 and not call.done() and annotation(store, "p1") is None
    proxy.release(proxy.parked[0])
    await call
    assert annotation(store, "p1") == "1"


async def test_slow_applies_at_once_and_parks_the_answer(
    store: Objects, proxy: FaultProxy, client: Any
) -> None:
    arm(proxy, Mode.SLOW)
    call = asyncio.create_task(patch_pod(client, "default", "p1", annotations={"a": "1"}))
    await eventually(lambda: bool(proxy.parked), "a parked request")
    assert annotation(store, "p1") == "1" and not call.done()
    proxy.release(proxy.parked[0])
    await call


async def test_rules_match_caller_kind_and_subject_and_may_skip(
    store: Objects, proxy: FaultProxy, client: Any, tmp_path: Path
) -> None:
    arm(proxy, Mode.FAIL, skip=1)
    arm(proxy, Mode.FAIL, who="agent", subject="p2")
    await patch_pod(client, "default", "p2", annotations={"a": "other pod"})  # neither rule matches
    await patch_pod(client, "default", "p1", annotations={"a": "skipped"})  # the first match passes
    with pytest.raises(KubeError):
        await patch_pod(client, "default", "p1", annotations={"a": "failed"})
    assert (annotation(store, "p1"), annotation(store, "p2")) == ("skipped", "other pod")
    assert proxy.fired == ["fail PATCH /api/v1/namespaces/default/pods/p1 (scheduler)"]
    proxy.disarm(1)
    agent = load_api_client(str(write_kubeconfig(tmp_path / "agent", proxy.url)), component="integrity-agent")
    try:
        await patch_pod(agent, "default", "p2", annotations={"a": "agent"})  # disarmed
    finally:
        agent.close()
    assert annotation(store, "p2") == "agent"


async def test_reads_and_writes_go_to_the_emulators_store(
    store: Objects, proxy: FaultProxy, client: Any
) -> None:
    await store.patch("pods", "default", "p1", {"metadata": {"annotations": {"a": "x"}}})
    assert (await get_pod(client, "default", "p1"))["metadata"]["annotations"] == {"a": "x"}
    assert [p["metadata"]["name"] for p in await list_pods(client)] == ["p1", "p2"]
    await store.delete("pods", "default", "p2")
    with pytest.raises(KubeError) as caught:
        await get_pod(client, "default", "p2")
    assert caught.value.status == 404


async def test_every_write_gets_a_new_resource_version_and_stale_tests_fail(
    store: Objects, proxy: FaultProxy, client: Any
) -> None:
    read = await patch_pod(client, "default", "p1", annotations={"a": "1"})
    version = read["metadata"]["resourceVersion"]
    assert store.get("pods", "default", "p1")["metadata"]["resourceVersion"] == version  # type: ignore[index]
    test = [{"op": "test", "path": "/metadata/resourceVersion", "value": version}]
    change = [{"op": "add", "path": "/metadata/annotations/a", "value": "2"}]
    assert (await json_patch_pod(client, "default", "p1", test + change))["metadata"]["annotations"][
        "a"
    ] == "2"
    with pytest.raises(KubeError):  # the version moved on with that write: the same test now fails
        await json_patch_pod(
            client, "default", "p1", [*test, {"op": "add", "path": "/metadata/annotations/a", "value": "3"}]
        )
    assert annotation(store, "p1") == "2"
    stale = {"metadata": {"resourceVersion": version, "annotations": {"a": "4"}}}
    with pytest.raises(KubeError) as caught:  # a merge patch naming an old version: 409, as kube-apiserver
        where = {"namespace": "default", "name": "p1"}
        await call_json(client, "PATCH", paths.POD, params=where, body=stale, content_type=MERGE_PATCH)
    assert caught.value.status == 409 and annotation(store, "p1") == "2"


async def test_a_request_parked_past_its_limit_times_out_unapplied(
    store: Objects, proxy: FaultProxy, tmp_path: Path
) -> None:
    now = [datetime.datetime(2026, 5, 1, tzinfo=datetime.UTC)]
    limited = FaultProxy(store.url, clock=lambda: now[0], limit=datetime.timedelta(seconds=30))
    await limited.start()
    api = load_api_client(
        str(write_kubeconfig(tmp_path / "limited", limited.url)), component="integrity-scheduler"
    )
    try:
        for name in ("p1", "p2"):
            limited.arm(Rule(owner=1, who="scheduler", kind="pod-patch", subject=name, mode=Mode.LATE))
            with pytest.raises(KubeError):
                await patch_pod(api, "default", name, annotations={"a": "late"})
        early, late = limited.parked
        now[0] += datetime.timedelta(seconds=30)
        limited.release(early)  # within the limit: lands
        now[0] += datetime.timedelta(seconds=1)
        limited.release(late)  # past it: dropped
        assert (early.expired, late.expired) == (False, True)
    finally:
        api.close()
        await limited.stop()  # waits for the late writes that were let through
    assert (annotation(store, "p1"), annotation(store, "p2")) == ("late", None)


async def test_bindings_follow_kube_apiservers_rules(store: Objects, proxy: FaultProxy, client: Any) -> None:
    with pytest.raises(KubeError) as caught:  # the pod was recreated: its UID is not the one bound
        await bind_pod(client, "default", "p1", "n1", "an-older-uid")
    assert caught.value.status == 409
    await bind_pod(client, "default", "p1", "n1", "p1")
    assert (store.get("pods", "default", "p1") or {})["spec"]["nodeName"] == "n1"
    with pytest.raises(KubeError) as caught:  # already bound, to any node
        await bind_pod(client, "default", "p1", "n2", "p1")
    assert (
        caught.value.status == 409 and (store.get("pods", "default", "p1") or {})["spec"]["nodeName"] == "n1"
    )
    with pytest.raises(KubeError) as caught:
        await bind_pod(client, "default", "gone", "n1")
    assert caught.value.status == 404


async def test_a_failed_json_patch_test_is_422_and_stores_nothing(
    store: Objects, proxy: FaultProxy, client: Any
) -> None:
    before = store.get("pods", "default", "p1")
    operations: list[dict[str, Any]] = [
        {"op": "add", "path": "/metadata/annotations", "value": {"a": "1"}},
        {"op": "test", "path": "/metadata/uid", "value": "not-p1"},
    ]
    with pytest.raises(KubeError) as caught:
        await json_patch_pod(client, "default", "p1", operations)
    assert caught.value.status == 422 and store.get("pods", "default", "p1") == before
