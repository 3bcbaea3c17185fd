"""The agent's current view of its cards, shared by the registrar and the device plugin.

Owns polling the backend (off the event loop: backends block) and telling waiters when the card list
or a card's health changed, so ``ListAndWatch`` can resend the kubelet device list at once. Must not
import grpc, pynvml or the Kubernetes client.
"""

from __future__ import annotations

import asyncio
import logging

from nodeagent.backends.base import Backend, BackendError, Card, Link

log = logging.getLogger(__name__)


class Inventory:
    """Latest cards from one backend plus a change counter (``version``) to wait on."""

    def __init__(self, backend: Backend) -> None:
        self._backend = backend
        self._cards: tuple[Card, ...] = ()
        self._version = 0
        self._changed = asyncio.Event()

    @property
    def backend(self) -> Backend:
        return self._backend

    @property
    def cards(self) -> tuple[Card, ...]:
        return self._cards

    @property
    def version(self) -> int:
        return self._version

    async def refresh(self) -> tuple[Card, ...]:
        """Read the backend now; wake waiters when anything changed. Raises :class:`BackendError`."""
        cards = await asyncio.to_thread(self._backend.cards)
        if cards != self._cards:
            self._cards = cards
            self._version += 1
            changed, self._changed = self._changed, asyncio.Event()
            changed.set()
        return cards

    async def links(self) -> tuple[Link, ...]:
        return await asyncio.to_thread(self._backend.links)

    async def wait_changed(self, version: int) -> int:
        """Return once ``version`` is out of date; the new version."""
        while self._version == version:
            await self._changed.wait()
        return self._version

    async def poll(self, interval: float) -> None:
        """Refresh every ``interval`` seconds forever (the health watch); errors are logged and retried."""
        while True:
            try:
                await self.refresh()
            except BackendError as exc:
                log.error("reading cards from the %s backend failed: %s", self._backend.name, exc)
            await asyncio.sleep(interval)
