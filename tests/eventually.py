"""The tests' one bounded wait: :func:`eventually` polls a condition until it holds.

Its bound follows progress instead of a fixed wall clock, so a busy machine (two ``make test`` side by
side on 2 cores) slows a test down without failing it, while a test that is stuck still fails quickly
and says what it waited for:

- the bound is the time allowed *without progress*: each change of ``progress()`` (a count of pods
  bound, the length of a log) starts it again;
- it stretches with the machine's load: ``within`` is multiplied by the 1-minute load average per core
  (at least 1, at most :data:`MAX_SCALE`), re-read at every poll, and by ``HAMI_TEST_TIME_SCALE``
  (default 1) for a machine known to be slow;
- ``alive()`` is called before every poll and should raise when something the test waits on has died
  (a child process), so a crash is reported at once instead of as a timeout.

pytest-timeout (``timeout`` in pyproject.toml, or a test's own marker) stays the last guard against a
condition that progresses forever.
"""

from __future__ import annotations

import asyncio
import inspect
import os
import time
from collections.abc import Awaitable, Callable, Hashable
from typing import TypeVar, overload

T = TypeVar("T")

SCALE_ENV = "HAMI_TEST_TIME_SCALE"
#: the most the load average stretches a bound
MAX_SCALE = 8.0
_UNSET = object()


def time_scale() -> float:
    """How much longer than on an idle machine a wait may take now (see the module docstring)."""
    try:
        load = os.getloadavg()[0] / (os.cpu_count() or 1)
    except OSError:  # not available on this platform
        load = 1.0
    return min(max(1.0, load), MAX_SCALE) * float(os.environ.get(SCALE_ENV) or 1.0)


@overload
async def eventually(
    condition: Callable[[], Awaitable[T | None]],
    what: str,
    *,
    within: float = ...,
    progress: Callable[[], Hashable] | None = ...,
    alive: Callable[[], None] | None = ...,
    interval: float = ...,
) -> T: ...


@overload
async def eventually(
    condition: Callable[[], T | None],
    what: str,
    *,
    within: float = ...,
    progress: Callable[[], Hashable] | None = ...,
    alive: Callable[[], None] | None = ...,
    interval: float = ...,
) -> T: ...


async def eventually(
    condition: Callable[[], object],
    what: str,
    *,
    within: float = 10.0,
    progress: Callable[[], Hashable] | None = None,
    alive: Callable[[], None] | None = None,
    interval: float = 0.01,
) -> object:
    """Call ``condition`` (plain or async) until it returns something truthy, and return that (a
    condition whose answer may be falsy, such as 0, wraps it); ``what`` names what is awaited in the
    failure. Fails with AssertionError once ``within`` seconds (scaled by :func:`time_scale`) pass
    without ``progress()`` changing; an exception from ``condition`` or ``alive`` goes through at once."""
    started = last_move = time.monotonic()
    moved: Hashable = progress() if progress is not None else _UNSET
    result: object = None
    while True:
        if alive is not None:
            alive()
        result = condition()
        if inspect.isawaitable(result):
            result = await result
        if result:
            return result
        now = time.monotonic()
        if progress is not None and (current := progress()) != moved:
            moved, last_move = current, now
        scale = time_scale()
        if now - last_move > within * scale:
            shown = "" if progress is None else f", progress {moved!r}"
            raise AssertionError(
                f"timed out waiting for {what}: {now - started:.1f}s, {now - last_move:.1f}s of them without"
                f" progress (bound {within:g}s x{scale:.1f} for load); last result {result!r}{shown}"
            )
        await asyncio.sleep(interval)
