"""Fire-and-forget work of a service: the one background-task set (Events, handshake writes).

Owns :class:`TaskSet`. Work that must never delay or fail an answer (an Event, an annotation write)
runs as a task the set keeps until it is done (asyncio holds only weak references to tasks: an
unkept one can vanish mid-flight) and awaits on shutdown (:meth:`TaskSet.drain`). Bounded both ways:
at most ``concurrency`` run at once (the others wait their turn), and at most ``limit`` are held;
past it new work is dropped with a log line, so an API server that hangs cannot pile up tasks
without end. A failure is logged and dropped: an ``expected`` error (the API's) as one warning line,
any other with its traceback, and never left to asyncio's "exception was never retrieved".
Must not import the Kubernetes client, aiohttp or a service.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from typing import Any

log = logging.getLogger(__name__)


class TaskSet:
    """Background tasks that are kept until done, bounded, and awaited before shutdown."""

    def __init__(
        self,
        *,
        concurrency: int = 16,
        limit: int = 1024,
        expected: tuple[type[Exception], ...] = (),
        logger: logging.Logger = log,
    ) -> None:
        self._tasks: set[asyncio.Task[None]] = set()
        self._running = asyncio.Semaphore(concurrency)
        self._limit = limit
        self._expected = expected
        self._log = logger

    def spawn(self, coroutine: Coroutine[Any, Any, None], what: str) -> bool:
        """Run ``coroutine`` in the background; ``what`` completes "could not ..." in a failure's log
        line. False when the set is full: the work is dropped (and the coroutine closed)."""
        if len(self._tasks) >= self._limit:
            coroutine.close()
            self._log.warning("dropped: %s (%d background tasks in flight)", what, len(self._tasks))
            return False
        task = asyncio.get_running_loop().create_task(self._run(coroutine, what))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return True

    async def _run(self, coroutine: Coroutine[Any, Any, None], what: str) -> None:
        try:
            async with self._running:
                await coroutine
        except self._expected as exc:
            self._log.warning("could not %s: %s", what, exc)
        except Exception:
            self._log.exception("could not %s", what)
        finally:
            coroutine.close()  # one cancelled before its turn never ran: closed, not left "never awaited"

    async def drain(self, seconds: float = 10.0) -> None:
        """Wait for the tasks in flight (at most ``seconds``), then cancel what is left."""
        if self._tasks:
            _, pending = await asyncio.wait(set(self._tasks), timeout=seconds)
            for task in pending:
                task.cancel()
            if pending:
                await asyncio.wait(pending)

    def __len__(self) -> int:
        return len(self._tasks)
