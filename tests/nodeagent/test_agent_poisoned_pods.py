"""The node agent's pod list never ends the agent: a pod with a hostile annotation (a number of
thousands of digits, JSON nested thousands deep) is skipped with its reason, a field of a shape nothing
expects reads as absent, the other pods are tracked, and the refresh loop keeps running (issue 11,
finding 4: the same annotation used to make ``hami-node-agent`` exit)."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import kmock
import pytest

from hami.annotations import POD_DEVICES_ALLOCATED, POD_MIG_ALLOCATIONS
from nodeagent.grants import GrantBook
from tests.eventually import eventually

from .exporter_helpers import NODE, create_gpu_pod, grant

HUGE = "9" * 5000
DEEP = "[" * 50_000 + "]" * 50_000


async def test_poisoned_pods_are_skipped_and_the_loop_goes_on(
    apiserver: kmock.KubernetesEmulator, api: Any, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="nodeagent.grants")
    await create_gpu_pod(apiserver, "good", [[grant("GPU-0000", 1000, 10)]], containers=["m"])
    await create_gpu_pod(
        apiserver,
        "huge",
        [[grant("GPU-0000", 1000, 10)]],
        containers=["m"],
        annotations={POD_DEVICES_ALLOCATED: f"GPU-0000,NVIDIA,{HUGE},10:;"},
    )
    await create_gpu_pod(
        apiserver,
        "deep",
        [[grant("GPU-0000", 1000, 10)]],
        containers=["m"],
        annotations={POD_MIG_ALLOCATIONS: DEEP},
    )
    await create_gpu_pod(
        apiserver,
        "odd",
        [[grant("GPU-0000", 1000, 10)]],
        containers=["m"],
        init_containers=["i"],
        init_statuses="not a list",  # type: ignore[arg-type]  # the API server stand-in validates nothing
    )
    await apiserver.patch(  # and container statuses that are not objects
        "/api/v1/namespaces/default/pods/odd", json={"status": {"containerStatuses": ["m", 7]}}
    )
    book = GrantBook(api=api, node_name=NODE)
    loop = asyncio.create_task(book.run(0.01))

    def running() -> None:
        assert not loop.done(), loop  # the loop must survive every pod

    try:
        await eventually(lambda: book.pods or None, "the first pod list", alive=running)
        # odd's statuses read as absent: its init containers have not finished, no container ID is known
        assert [pod.name for pod in book.pods] == ["good", "odd"]
        odd = book.pods[1]
        assert not odd.init_done and odd.container_ids == {}
        await create_gpu_pod(apiserver, "later", [[grant("GPU-0000", 2000, 20)]], containers=["m"])
        await eventually(lambda: len(book.pods) == 3, "the later pod listed", alive=running)
        assert sorted(pod.name for pod in book.pods) == ["good", "later", "odd"]
    finally:
        loop.cancel()
        with pytest.raises(asyncio.CancelledError):
            await loop
    skipped = " ".join(r.getMessage() for r in caplog.records)
    for name in ("default/huge", "default/deep"):
        assert name in skipped, skipped
    assert "default/odd" not in skipped
