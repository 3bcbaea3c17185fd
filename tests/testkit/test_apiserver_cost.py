"""The embedded API server costs the same per request after thousands of requests as after a hundred,
and keeps bounded logs (kmock 0.8 alone walks its whole request history on every request)."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator

import aiohttp
import kmock
import pytest

from hami_testkit.apiserver import AdmittingEmulator, embedded_apiserver

NODES = kmock.resource("v1/nodes")
TOTAL = 5000


@pytest.fixture
async def server() -> AsyncIterator[tuple[AdmittingEmulator, aiohttp.ClientSession, str]]:
    async with embedded_apiserver(request_log=500) as emulator, aiohttp.ClientSession() as session:
        url = str(emulator.url).rstrip("/")
        async with session.post(f"{url}/api/v1/nodes", json={"metadata": {"name": "n1"}}) as response:
            assert response.status in (200, 201)
        yield emulator, session, url


async def _mixed(session: aiohttp.ClientSession, url: str, count: int) -> float:
    """``count`` requests (discovery, a read, a merge patch in turn); CPU seconds per request, best of 3.

    The client and the emulator share this process and its loop, so the process's CPU time is what the
    requests cost; wall time would also count whatever else the machine runs (a parallel test run)."""
    best = float("inf")
    for _ in range(3):
        start = time.process_time()
        for i in range(count // 3):
            async with session.get(f"{url}/version") as response:
                await response.read()
            async with session.get(f"{url}/api/v1/nodes/n1") as response:
                assert response.status == 200
            patch = {"metadata": {"labels": {"step": str(i)}}}
            headers = {"Content-Type": "application/merge-patch+json"}
            async with session.patch(f"{url}/api/v1/nodes/n1", json=patch, headers=headers) as response:
                assert response.status == 200
        best = min(best, (time.process_time() - start) / (3 * (count // 3)))
    return best


@pytest.mark.timeout(300)
async def test_cost_per_request_is_flat_over_5000_requests(
    server: tuple[AdmittingEmulator, aiohttp.ClientSession, str],
) -> None:
    _, session, url = server
    early = await _mixed(session, url, 60)  # measured after ~180 requests
    sent = 1 + 180
    while sent < TOTAL:
        await _mixed(session, url, 99)
        sent += 3 * 99
    late = await _mixed(session, url, 60)
    print(f"per request: {early * 1000:.2f} ms early, {late * 1000:.2f} ms after {sent} requests")
    # generous: kmock alone is ~30x slower per request at 2,000 requests than at 100, and growing
    assert late < 3 * early, (early, late)


async def test_logs_and_object_histories_stay_bounded(
    server: tuple[AdmittingEmulator, aiohttp.ClientSession, str],
) -> None:
    emulator, session, url = server
    await _mixed(session, url, 1200)  # 3 rounds: 3,600 requests, 2,400 of them node writes
    assert emulator.served > 3600
    assert len(list(emulator)) <= 2 * 500  # the root's log
    assert len(emulator.objects[NODES, None, "n1"].history) <= 2  # the latest version (+ its deletion)
    assert emulator.objects[NODES, None, "n1"]["metadata"]["labels"] == {"step": "399"}
    # the DSL's views still answer about the retained requests
    assert 0 < len(emulator["patch", NODES]) <= 2 * 500


async def test_a_one_shot_fault_still_fires_once(
    server: tuple[AdmittingEmulator, aiohttp.ClientSession, str],
) -> None:
    """Slices are matched by kmock's own walk: ``[:1]`` answers the first matching request only."""
    emulator, session, url = server
    (emulator**10)["get", NODES][:1] << 503
    statuses = []
    for _ in range(3):
        async with session.get(f"{url}/api/v1/nodes/n1") as response:
            statuses.append(response.status)
    assert statuses == [503, 200, 200]


async def test_a_binary_body_is_answered_415_not_500(
    server: tuple[AdmittingEmulator, aiohttp.ClientSession, str],
) -> None:
    """A protobuf body (client-go's default for built-in types) is refused the way kube-apiserver refuses
    a media type it does not serve, so the client retries in JSON."""
    _, session, url = server
    headers = {"Content-Type": "application/vnd.kubernetes.protobuf"}
    body = b"k8s\x00\n\x0c\n\x02v1\x12\x06Secret\xff\xfe"
    async with session.post(f"{url}/api/v1/namespaces/default/secrets", data=body, headers=headers) as r:
        status = await r.json()
        assert r.status == 415
    assert status["kind"] == "Status" and status["reason"] == "UnsupportedMediaType"


async def test_remembered_criteria_still_tell_requests_apart(
    server: tuple[AdmittingEmulator, aiohttp.ClientSession, str],
) -> None:
    """A criterion reading only the method, action, resource or subresource is asked once per value and
    its answer remembered (hami_testkit.lean): each request still gets the reaction that names it."""
    emulator, session, url = server
    (emulator**10)["patch", NODES] << 503
    (emulator**10)[kmock.resource("v1/pods"), kmock.subresource("status")] << 418
    headers = {"Content-Type": "application/merge-patch+json"}
    seen = []
    for _ in range(3):  # the same values again: the remembered answers
        async with session.get(f"{url}/api/v1/nodes/n1") as response:
            seen.append(("get node", response.status))
        async with session.patch(f"{url}/api/v1/nodes/n1", json={}, headers=headers) as response:
            seen.append(("patch node", response.status))
        async with session.get(f"{url}/api/v1/namespaces/default/pods/p/status") as response:
            seen.append(("pod status", response.status))
        async with session.get(f"{url}/api/v1/namespaces/default/pods/p") as response:
            seen.append(("pod", response.status))
    assert seen == [("get node", 200), ("patch node", 503), ("pod status", 418), ("pod", 404)] * 3
