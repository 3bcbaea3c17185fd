"""The scheduler's writes about node registration (docs/protocol.md, "Handshake"), made in the background.

Owns :class:`Registration`. The snapshot decides, from every node event; this module writes, through
the service's :class:`~hami.process.tasks.TaskSet` (an extender answer never waits for it):

- the handshake: on a node whose ``hami.io/node-handshake`` does not say ``Requesting``,
  ``Requesting_<local time YYYY-MM-DD HH:MM:SS>``, at most one write per node in flight;
- ``InvalidNodeRegistration``: a Warning Event on a Node whose registration cannot be read, or of a
  shape no API server stores (the snapshot reports each distinct problem once);
- ``InvalidNodeEnforcement``: a Warning Event on a Node whose ``hami.io/node-enforcement`` cannot be
  read (its cards then count as enforcement ``none``; the node stays schedulable);
- the resync pass: every ``--resync-seconds``, the handshake again on each node that still lacks it
  (a write that failed: an API error, a missing right, a Node not yet stored).

Must not import the Kubernetes client (only ``hami.kube``) or aiohttp.
"""

from __future__ import annotations

import asyncio
import datetime
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from hami import objects
from hami.annotations import NODE_HANDSHAKE, HandshakeKind, encode_handshake
from hami.kube.events import record_event
from hami.kube.nodes import patch_node_annotations
from hami.kube.protocol import KubeApi
from hami.process.tasks import TaskSet
from hami.scheduler.snapshot import local_time

#: The Event reason on a Node whose registration annotation cannot be read.
MALFORMED_REGISTRATION = "InvalidNodeRegistration"
#: The Event reason on a Node whose enforcement annotation cannot be read.
MALFORMED_ENFORCEMENT = "InvalidNodeEnforcement"


class Unanswered(Protocol):
    """Where the resync pass learns which nodes lack the handshake (the snapshot)."""

    def needs_handshake(self) -> list[str]: ...


class Registration:
    """Writes the handshake requests and the registration Warnings; runs the resync pass."""

    def __init__(
        self,
        *,
        api: KubeApi,
        component: str,
        background: TaskSet,
        clock: Callable[[], datetime.datetime],
        resync_seconds: float = 15.0,
    ) -> None:
        self._api = api
        self._component = component
        self._background = background
        self._clock = clock
        self._resync_seconds = resync_seconds
        self._in_flight: set[str] = set()

    def request_handshake(self, name: str) -> None:
        """Write ``Requesting_<now>`` on node ``name`` in the background (the snapshot's ``on_handshake``)."""
        self._request(name)

    def _request(self, name: str) -> bool:
        """True when a write was started: none was in flight for ``name`` and the task set had room."""
        if name in self._in_flight:
            return False
        self._in_flight.add(name)
        if not self._background.spawn(self._write_handshake(name), f"write the handshake on node {name}"):
            self._in_flight.discard(name)  # dropped: the next pass asks again
            return False
        return True

    async def _write_handshake(self, name: str) -> None:
        try:
            value = encode_handshake(HandshakeKind.REQUESTING, local_time(self._clock()))
            await patch_node_annotations(self._api, name, {NODE_HANDSHAKE: value})
        finally:
            self._in_flight.discard(name)

    def report_malformed(self, node: Mapping[str, Any], message: str) -> None:
        """An ``InvalidNodeRegistration`` Warning Event on ``node``, in the background."""
        self._warn(node, MALFORMED_REGISTRATION, f"node excluded from GPU scheduling: {message}")

    def report_enforcement(self, node: Mapping[str, Any], message: str) -> None:
        """An ``InvalidNodeEnforcement`` Warning Event on ``node``, in the background."""
        self._warn(node, MALFORMED_ENFORCEMENT, f"its cards count as enforcement none: {message}")

    def _warn(self, node: Mapping[str, Any], reason: str, message: str) -> None:
        event = record_event(
            self._api,
            involved=node,
            reason=reason,
            message=message,
            type="Warning",
            component=self._component,
        )
        self._background.spawn(event, f"record the {reason} event on node {objects.name(node)}")

    def resync_once(self, nodes: Unanswered) -> list[str]:
        """Ask again for the handshake on every node still without one; the nodes asked."""
        return [name for name in nodes.needs_handshake() if self._request(name)]

    async def resync(self, nodes: Unanswered) -> None:
        """Every ``resync_seconds``, one :meth:`resync_once`, until cancelled."""
        while True:
            await asyncio.sleep(self._resync_seconds)
            self.resync_once(nodes)
