"""The in-process coordination of binds: who decides now on a node, who waits for its lock, who is binding.

Owns :class:`BindCoordination`, the one mutable owner of what the binds of this process share:

- per node, the decision queue (:meth:`BindCoordination.queue`: deciding and booking one bind at a
  time; never held while waiting for a node lock);
- per node, the line of binds waiting for a busy node lock (:meth:`BindCoordination.line`: only the
  head of a line polls the API);
- the pods with a bind in progress (:meth:`BindCoordination.claim` / :meth:`BindCoordination.done`: a
  second bind of the same pod in this process is refused), and per node the GPU binds in progress there
  (:meth:`BindCoordination.locking`, from when a bind is known to take the node's lock until it
  answers: ``/prioritize`` ranks such a node below the free ones for every other pod,
  :meth:`BindCoordination.busy_for`, before the node watch can show the lock; docs/scheduler.md, "What
  each step does", Prioritize);
- the time of the last node lock this process wrote for a pod on a node (:meth:`BindCoordination.stamp`,
  bounded, the oldest entries going first), so that a pod's next lock never repeats it.

Runs on the event loop (asyncio locks); no I/O: must not import the Kubernetes client or aiohttp.
"""

from __future__ import annotations

import asyncio
import datetime
from collections.abc import Collection

#: Lock times remembered at most (the oldest go first).
STAMPS = 4096

#: (namespace, name) of a pod.
PodKey = tuple[str, str]


class NodeQueues:
    """One asyncio lock per node (the decision queues, and apart from them the lines of waiters)."""

    def __init__(self) -> None:
        self._locks: dict[str, asyncio.Lock] = {}

    def __call__(self, node: str) -> asyncio.Lock:
        lock = self._locks.get(node)
        if lock is None:
            lock = self._locks[node] = asyncio.Lock()
        return lock


class BindCoordination:
    """What the binds in this process share (see the module docstring)."""

    def __init__(self) -> None:
        self._queues = NodeQueues()
        self._lines = NodeQueues()
        self._binding: set[PodKey] = set()
        self._locking: dict[PodKey, str] = {}  # the GPU binds in progress: pod -> its node
        self._on_node: dict[str, int] = {}  # the same, counted per node (no entry: none)
        self._stamps: dict[tuple[str, str, str], datetime.datetime] = {}

    def queue(self, node: str) -> asyncio.Lock:
        """The node's decision queue: binds to it decide and book one at a time."""
        return self._queues(node)

    def line(self, node: str) -> asyncio.Lock:
        """The node's line of binds waiting for its lock: the holder is the head."""
        return self._lines(node)

    def claim(self, pod: PodKey) -> bool:
        """Start a bind of ``pod``: False when one is already in progress here."""
        if pod in self._binding:
            return False
        self._binding.add(pod)
        return True

    def done(self, pod: PodKey) -> None:
        """The bind of ``pod`` is over (whatever its outcome)."""
        self._binding.discard(pod)
        node = self._locking.pop(pod, None)
        if node is not None:
            left = self._on_node[node] - 1
            if left:
                self._on_node[node] = left
            else:
                del self._on_node[node]

    def locking(self, pod: PodKey, node: str) -> None:
        """The bind of ``pod`` in progress takes the lock of ``node`` (a GPU bind): the node is busy for
        every other pod until :meth:`done`. Counted once per bind; nothing without a bind in progress."""
        if pod not in self._binding or pod in self._locking:
            return
        self._locking[pod] = node
        self._on_node[node] = self._on_node.get(node, 0) + 1

    def busy_for(self, node: str, pod: PodKey) -> bool:
        """Whether a GPU bind of a pod other than ``pod`` to ``node`` is in progress here."""
        count = self._on_node.get(node, 0)
        if count and self._locking.get(pod) == node:
            count -= 1
        return count > 0

    def locking_nodes(self) -> Collection[str]:
        """The nodes with a GPU bind in progress here (a live view: not to be kept across an await)."""
        return self._on_node.keys()

    def binding(self, pod: PodKey) -> bool:
        return pod in self._binding

    def last_lock(self, node: str, pod: PodKey) -> datetime.datetime | None:
        """The time of the last lock this process wrote for ``pod`` on ``node``."""
        return self._stamps.get((node, *pod))

    def stamp(self, node: str, pod: PodKey, when: datetime.datetime) -> None:
        """Remember ``when``, the time of the lock just written for ``pod`` on ``node``."""
        if len(self._stamps) >= STAMPS:  # bounded: the oldest entries go first
            self._stamps.pop(next(iter(self._stamps)))
        self._stamps[(node, *pod)] = when
