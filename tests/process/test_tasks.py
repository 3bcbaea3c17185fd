"""The one background-task set: kept until done, bounded, failures logged, drained on shutdown."""

from __future__ import annotations

import asyncio
import inspect
import logging
from typing import Any

import pytest

from hami.kube.client import KubeError
from hami.process.tasks import TaskSet


async def test_failures_are_logged_never_left_unretrieved(caplog: pytest.LogCaptureFixture) -> None:
    unhandled: list[dict[str, Any]] = []
    asyncio.get_running_loop().set_exception_handler(lambda _loop, context: unhandled.append(context))
    tasks = TaskSet(expected=(KubeError,))

    async def api_down() -> None:
        raise KubeError(503, "ServiceUnavailable", "try later")

    async def bug() -> None:
        raise RuntimeError("a bug")

    with caplog.at_level(logging.WARNING, logger="hami.process.tasks"):
        assert tasks.spawn(api_down(), "write the handshake on node n1")
        assert tasks.spawn(bug(), "record the event")
        await tasks.drain()
    lines = [(r.levelname, r.getMessage(), r.exc_info is not None) for r in caplog.records]
    assert lines == [
        ("WARNING", "could not write the handshake on node n1: 503 ServiceUnavailable: try later", False),
        ("ERROR", "could not record the event", True),  # an unexpected error keeps its traceback
    ]
    assert len(tasks) == 0 and unhandled == []


async def test_a_full_set_drops_new_work(caplog: pytest.LogCaptureFixture) -> None:
    tasks = TaskSet(concurrency=1, limit=2)
    gate = asyncio.Event()
    done: list[int] = []

    async def work(n: int) -> None:
        await gate.wait()
        done.append(n)

    assert tasks.spawn(work(1), "one") and tasks.spawn(work(2), "two")
    extra = work(3)
    with caplog.at_level(logging.WARNING, logger="hami.process.tasks"):
        assert not tasks.spawn(extra, "record the third event")
    assert inspect.getcoroutinestate(extra) == inspect.CORO_CLOSED  # never "coroutine was never awaited"
    assert "dropped: record the third event (2 background tasks in flight)" in caplog.text
    gate.set()
    await tasks.drain()
    assert done == [1, 2] and len(tasks) == 0


async def test_at_most_concurrency_run_at_once() -> None:
    tasks = TaskSet(concurrency=2)
    running, peak = 0, 0
    release = asyncio.Event()

    async def work() -> None:
        nonlocal running, peak
        running += 1
        peak = max(peak, running)
        await release.wait()
        running -= 1

    for n in range(5):
        tasks.spawn(work(), f"work {n}")
    for _ in range(10):  # let every task reach its turn or the semaphore
        await asyncio.sleep(0)
    assert (peak, len(tasks)) == (2, 5)
    release.set()
    await tasks.drain()
    assert peak == 2 and len(tasks) == 0


async def test_drain_cancels_what_outlasts_it() -> None:
    tasks = TaskSet(concurrency=1)
    waiting = asyncio.Event()
    started = asyncio.Event()

    async def hangs() -> None:
        started.set()
        await waiting.wait()

    never_started = hangs()
    tasks.spawn(hangs(), "hang")
    tasks.spawn(never_started, "wait its turn")
    await started.wait()
    await tasks.drain(seconds=0.01)
    assert len(tasks) == 0
    assert inspect.getcoroutinestate(never_started) == inspect.CORO_CLOSED
