"""Which pods kube-scheduler nominated to which node, and the cards each nomination holds there.

Owns :class:`Nominations` (the settings: our scheduler's name, the device config a nominee's request
is read with, the cluster's default policy its cards are placed under), :func:`pod_nomination` (a pod
object -> the node it is nominated to and its :class:`~hami.core.reservations.Nominee`, or None) and
:class:`NominationBook` (the nominees per node, fed by the snapshot from its pod watch, and each
node's reservations from :func:`hami.core.reservations.reserve`, cached until the snapshot says
that node changed).

A nomination (``status.nominatedNodeName``) counts while kube-scheduler could still place the pod
there: pending and unbound, naming our scheduler, not being deleted, asking for cards, nominated to
a node name (a string of at most 253 characters). It stops when the nomination is cleared or
changed, the pod is bound (anywhere: kube-scheduler may leave the nomination in its status),
finishes or is deleted; while a bind of ours for it is counted (booked, or its grant written before
the Binding shows), its grant holds its cards and the nomination adds nothing. There is no time
bound, as kube-scheduler has none: it keeps a nominated pod's CPU and memory on the node for as long
as the status says so. What bounds a nomination is the node itself: one that could land there only by
evicting pods at least as important as the nominee holds nothing (``reserve``). Who may write the
status, and what a bogus nomination can hold: docs/security.md.

Pure apart from logging: no clock, no I/O; must not import the Kubernetes client or aiohttp.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from hami import objects
from hami.annotations import AnnotationError, read_pod_request
from hami.core.allocate import Policy
from hami.core.model import NodeState
from hami.core.reservations import Nominee, Occupant, Reservation, reserve
from hami.scheduler.podrecords import PodKey
from hami.settings import DeviceConfig

logger = logging.getLogger(__name__)

#: The longest node name (a DNS-1123 subdomain); a longer nomination names no node.
MAX_NODE_NAME = 253
#: What the API server writes when ``spec.schedulerName`` is unset.
DEFAULT_SCHEDULER = "default-scheduler"


@dataclass(frozen=True, slots=True, kw_only=True)
class Nominations:
    """Which nominations hold cards (ours), and how a nominee is read and placed."""

    scheduler_name: str = "hami-scheduler"
    device_config: DeviceConfig = field(default_factory=DeviceConfig)
    policy: Policy = field(default_factory=Policy)


def pod_nomination(key: PodKey, pod: Mapping[str, Any], rule: Nominations) -> tuple[str, Nominee] | None:
    """The node ``pod`` is nominated to and what it asks, when that nomination can hold cards."""
    node = objects.status(pod).get("nominatedNodeName")
    if not isinstance(node, str) or not node or len(node) > MAX_NODE_NAME:
        return None
    if objects.node_name(pod) or objects.finished(pod):
        return None
    if (objects.scheduler_name(pod) or DEFAULT_SCHEDULER) != rule.scheduler_name:
        return None
    if objects.meta(pod).get("deletionTimestamp"):
        return None
    try:
        request = read_pod_request(pod, rule.device_config)
    except AnnotationError as exc:
        logger.info("pod %s/%s: its nomination to %s holds nothing: %s", *key, node, exc)
        return None
    if not request.has_devices:
        return None
    return node, Nominee(key=key, priority=objects.priority(pod), request=request)


class NominationBook:
    """The nominees per node and each node's reservations (cached); single-threaded, like the snapshot."""

    def __init__(self, rule: Nominations | None = None) -> None:
        self.rule = rule if rule is not None else Nominations()
        self._nominees: dict[PodKey, tuple[str, Nominee]] = {}
        self._by_node: dict[str, set[PodKey]] = {}
        self._reserved: dict[str, tuple[Reservation, ...]] = {}

    def __len__(self) -> int:
        return len(self._nominees)

    def on(self, node: str) -> bool:
        """Whether any pod is nominated to ``node`` (the cheap question asked first)."""
        return node in self._by_node

    def node_of(self, key: PodKey) -> str | None:
        found = self._nominees.get(key)
        return found[0] if found is not None else None

    def pod_event(self, key: PodKey, pod: Mapping[str, Any]) -> None:
        """A pod was added or changed: (re)read its nomination."""
        found = pod_nomination(key, pod, self.rule)
        if found == self._nominees.get(key):
            return
        self.forget(key)
        if found is not None:
            self._nominees[key] = found
            self._by_node.setdefault(found[0], set()).add(key)
            self.touch(found[0])

    def forget(self, key: PodKey) -> None:
        """The pod is gone (or no longer nominated)."""
        old = self._nominees.pop(key, None)
        if old is not None:
            keys = self._by_node[old[0]]
            keys.discard(key)
            if not keys:
                del self._by_node[old[0]]
            self.touch(old[0])

    def touch(self, node: str | None) -> None:
        """Something the node's reservations depend on changed (its usage, its pods, its cards)."""
        if node is not None:
            self._reserved.pop(node, None)

    def reservations(
        self,
        node: str,
        state: NodeState | None,
        counted: Callable[[PodKey], bool],
        occupants: Callable[[], Iterable[Occupant]],
    ) -> tuple[Reservation, ...]:
        """The node's reservations on ``state`` (every counted pod in it): its nominees, except those
        ``counted`` already (a bind of theirs), placed by :func:`~hami.core.reservations.reserve`.
        ``occupants`` is asked only when the node has nominees."""
        keys = self._by_node.get(node)
        if not keys or state is None:
            return ()
        found = self._reserved.get(node)
        if found is None:
            nominees = [self._nominees[k][1] for k in keys if not counted(k)]
            found = reserve(state, nominees, list(occupants()), self.rule.policy) if nominees else ()
            self._reserved[node] = found
        return found
