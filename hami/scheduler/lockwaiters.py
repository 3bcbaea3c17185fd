"""The binds waiting for a node's lock annotation to change.

Owns :class:`LockWaiters`: per node, the futures of the binds that wait for the next change of the
node's ``hami.io/mutex.lock`` as the watch shows it (:mod:`hami.scheduler.bindlock` registers one
before each try, so no change is missed); the node cache reports each change (or the node going) and
every future of that node is resolved. Runs on the event loop; asyncio futures only: no I/O, must not
import the Kubernetes client or aiohttp.
"""

from __future__ import annotations

import asyncio


class LockWaiters:
    """Futures per node, resolved at the next change of its lock annotation."""

    def __init__(self) -> None:
        self._waiters: dict[str, list[asyncio.Future[None]]] = {}

    def change(self, name: str) -> asyncio.Future[None]:
        """A future resolved the next time the node's lock annotation changes (or the node goes)."""
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.setdefault(name, []).append(future)
        return future

    def changed(self, name: str) -> None:
        """The node's lock annotation changed (or the node went): wake its waiters."""
        for future in self._waiters.pop(name, ()):
            if not future.done():
                future.set_result(None)
