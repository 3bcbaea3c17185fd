"""Card health with hysteresis: the state machine behind the NVML backend's ``Card.healthy``.

A critical event (an XID the card caused, or a node-wide event failure) makes a card unhealthy at once.
It becomes healthy again only when BOTH hold: ``recovery`` seconds have passed without another critical
event on it, and a probe of the card (a callable from the backend) succeeds. Every further event
restarts the quiet period; a failed probe keeps the card unhealthy and the next check probes again.
``recovery`` 0 = never recover (HAMi's behaviour). Time comes from an injected clock, so tests move it
by hand. Every transition is logged in one line naming the card and the reason. Pure: must not import
pynvml, grpc, the Kubernetes client or the codec.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

log = logging.getLogger(__name__)

#: What a probe returns: ``None`` when the card answered, else why it did not.
Probe = Callable[[], str | None]


@dataclass(slots=True, kw_only=True)
class _Sick:
    reason: str  # the last critical event, e.g. "XID 79"
    since: float  # clock time of that event: the quiet period counts from here
    probe_failure: str | None = None  # the last failed probe, logged once per distinct message


class HealthBook:
    """Which cards are unhealthy, why, and since when. Not thread-safe: the backend holds its lock."""

    def __init__(self, *, recovery: float, clock: Callable[[], float] = time.monotonic) -> None:
        if recovery < 0:
            raise ValueError(f"health recovery must be 0 (never) or positive seconds, got {recovery!r}")
        self._recovery = recovery
        self._clock = clock
        self._sick: dict[str, _Sick] = {}
        # A node-wide event names no card: it is folded into each card on that card's next check.
        self._everyone: _Sick | None = None

    @property
    def recovery(self) -> float:
        return self._recovery

    def critical(self, uuid: str, reason: str) -> None:
        """A critical event on one card: unhealthy now, quiet period (re)starts now."""
        self._mark(uuid, reason, self._clock())

    def critical_all(self, reason: str) -> None:
        """A critical event that cannot be pinned to a card: every card checked from now on is hit."""
        log.error("%s: every card is marked unhealthy", reason)
        self._everyone = _Sick(reason=reason, since=self._clock())

    def settled(self) -> None:
        """Every card has been checked since the last node-wide event: it is fully applied."""
        self._everyone = None

    def check(self, uuid: str, probe: Probe) -> tuple[bool, str]:
        """The card's verdict now: ``(healthy, reason)``, reason ``""`` when healthy. Probes the card only
        when its quiet period is over."""
        everyone = self._everyone
        sick = self._sick.get(uuid)
        if everyone is not None and (sick is None or sick.since < everyone.since):
            sick = self._mark(uuid, everyone.reason, everyone.since)
        if sick is None:
            return True, ""
        if self._recovery <= 0 or self._clock() - sick.since < self._recovery:
            return False, sick.reason
        failure = probe()
        if failure is not None:
            if failure != sick.probe_failure:
                log.warning(
                    "card %s stays unhealthy: quiet for %gs after %s, but the probe failed: %s",
                    uuid,
                    self._recovery,
                    sick.reason,
                    failure,
                )
                sick.probe_failure = failure
            return False, f"{sick.reason}; probe failed: {failure}"
        del self._sick[uuid]
        log.warning(
            "card %s healthy again: no critical event for %gs since %s and the probe answered",
            uuid,
            self._recovery,
            sick.reason,
        )
        return True, ""

    def _mark(self, uuid: str, reason: str, since: float) -> _Sick:
        if uuid in self._sick:
            log.error("card %s: %s while unhealthy; the quiet period restarts", uuid, reason)
        else:
            outlook = (
                "until the agent restarts"
                if self._recovery <= 0
                else f"until {self._recovery:g}s pass without another critical event and a probe succeeds"
            )
            log.error("card %s unhealthy: %s; %s", uuid, reason, outlook)
        sick = self._sick[uuid] = _Sick(reason=reason, since=since)
        return sick
