"""Knowing when the system under test has nothing left to do, without sleeping for a fixed time.

Every Kubernetes call of the scheduler and the agent runs in a worker thread (``asyncio.to_thread``
through the loop's default executor). :class:`CountingExecutor` is installed as that executor and
counts the calls in progress; the fault proxy counts the requests parked with a caller waiting. The
system is *settled* when every call in progress is one parked on purpose, no request is being served,
no extender request is on its way, and none of those counters moved across a few loop turns (a call
that just returned resumes its coroutine within a turn or two). A program step runs until settled, so
interleavings follow the program's order, not timing. Test code only.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Hashable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from tests.eventually import time_scale


class CountingExecutor(ThreadPoolExecutor):
    """The loop's default executor, counting submitted and unfinished jobs (enough threads that parked
    requests never starve the others)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, workers: int = 64) -> None:
        super().__init__(max_workers=workers, thread_name_prefix="integrity")
        self._loop = loop
        self.active = 0
        self.submitted = 0

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
        self.active += 1  # called on the loop's thread by run_in_executor
        self.submitted += 1
        future = super().submit(fn, *args, **kwargs)
        future.add_done_callback(lambda _: self._loop.call_soon_threadsafe(self._finished))
        return future

    def _finished(self) -> None:
        self.active -= 1


class NotSettled(AssertionError):
    """The system kept working (or stayed blocked on something not parked) past the bound."""


async def settle(
    quiet: Callable[[], bool],
    marks: Callable[[], Hashable],
    describe: Callable[[], str],
    *,
    limit: float = 20.0,
    rounds: int = 2,
) -> None:
    """Return once ``quiet()`` holds and ``marks()`` is unchanged over ``rounds`` checks, each after a
    few loop turns and a millisecond; raise :class:`NotSettled` after ``limit`` seconds of loop time
    (stretched by the machine's load, as :func:`tests.eventually.eventually` bounds)."""
    loop = asyncio.get_running_loop()
    scale = time_scale()
    limit *= scale  # a loaded machine (another test run beside this one) is slower, not stuck
    # A gRPC call between the kubelet model and the agent is on its way in gRPC's own threads, which
    # no counter sees: on a loaded machine it takes longer to arrive, so quiet must last longer there
    # (rounds and pause grow with the load; on an idle machine, 2 rounds of 1 ms as always).
    rounds += int(2 * (scale - 1))
    pause = 0.001 * scale
    deadline = loop.time() + limit
    stable = 0
    last: Hashable = None
    while stable < rounds:
        if loop.time() > deadline:
            raise NotSettled(f"the system did not settle within {limit:.0f} s: {describe()}")
        for _ in range(4):
            await asyncio.sleep(0)
        await asyncio.sleep(pause)
        if not quiet():
            stable = 0
            continue
        current = marks()
        stable = stable + 1 if current == last else 0
        last = current
