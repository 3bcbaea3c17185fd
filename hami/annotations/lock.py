"""Node lock value (``hami.io/mutex.lock``, docs/protocol.md, "Node lock") and handshake
(``hami.io/node-handshake``, docs/protocol.md, "Handshake").

Lock value: ``<RFC3339 time>,<namespace>,<pod name>``; a bare RFC3339 time is the legacy form (no
owner). With commas there must be exactly three parts; anything else, or a bad time, is an error.

Lock expiry: a Go duration (``5m0s``), as HAMi reads ``HAMI_NODELOCK_EXPIRE`` (Go's
``time.ParseDuration``: :func:`parse_go_duration`) and prints the expiry in its contention error
(``Duration.String``: :func:`go_duration`).

Handshake: ``Requesting_<YYYY-MM-DD HH:MM:SS>`` written by the scheduler (local wall-clock time, no
zone); older agents wrote ``Reported <time>`` and older schedulers ``Deleted_<time>``. HAMi treats an
unreadable handshake as "no stamp" rather than an error, so :func:`decode_handshake` never raises.

Pure: stdlib only; the caller passes ``now``.
"""

from __future__ import annotations

import datetime
import re
from dataclasses import dataclass
from enum import StrEnum

from hami.annotations.errors import AnnotationError
from hami.annotations.keys import NODE_LOCK
from hami.annotations.limits import check_length

_RFC3339 = re.compile(
    r"(?P<date>[0-9]{4}-[0-9]{2}-[0-9]{2})T(?P<clock>[0-9]{2}:[0-9]{2}:[0-9]{2})(?:\.(?P<frac>[0-9]+))?"
    r"(?P<zone>Z|[+-][0-9]{2}:[0-9]{2})"
)
_GO_DURATION_PART = re.compile(r"([0-9]*)(?:\.([0-9]*))?(ns|us|\u00b5s|\u03bcs|ms|s|m|h)")
_GO_UNIT_NS = {
    "ns": 1,
    "us": 1_000,
    "\u00b5s": 1_000,  # micro sign
    "\u03bcs": 1_000,  # Greek mu
    "ms": 1_000_000,
    "s": 1_000_000_000,
    "m": 60_000_000_000,
    "h": 3_600_000_000_000,
}
_GO_MAX_NS = 2**63 - 1
_HANDSHAKE_TIME = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2} [0-9]{2}:[0-9]{2}:[0-9]{2}(?:\.[0-9]+)?")
HANDSHAKE_TIME_FORMAT = "%Y-%m-%d %H:%M:%S"


# ------------------------------------------------------------------------------------------ node lock


@dataclass(frozen=True, slots=True, kw_only=True)
class NodeLockValue:
    """Who holds a node lock since when. ``namespace``/``name`` are None for a legacy (bare time) lock."""

    time: datetime.datetime  # aware
    namespace: str | None = None
    name: str | None = None

    @property
    def legacy(self) -> bool:
        return self.namespace is None

    def owned_by(self, namespace: str, name: str) -> bool:
        """True when this lock names that pod (HAMi checks the ``,<ns>,<name>`` suffix)."""
        return self.namespace == namespace and self.name == name

    def expired(self, now: datetime.datetime, timeout: datetime.timedelta) -> bool:
        """True when the lock is older than ``timeout`` at ``now`` (then anyone may take it over)."""
        return now - self.time > timeout


def format_rfc3339(moment: datetime.datetime) -> str:
    """Go's ``time.RFC3339``: whole seconds, ``Z`` for UTC, else ``+hh:mm``."""
    if moment.tzinfo is None or moment.utcoffset() is None:
        raise ValueError(f"{moment!r} has no time zone; pass an aware datetime")
    offset = moment.utcoffset() or datetime.timedelta()
    stamp = moment.strftime("%Y-%m-%dT%H:%M:%S")
    if not offset:
        return stamp + "Z"
    minutes = int(offset.total_seconds()) // 60
    sign = "+" if minutes >= 0 else "-"
    hours, mins = divmod(abs(minutes), 60)
    return f"{stamp}{sign}{hours:02d}:{mins:02d}"


def parse_rfc3339(text: str) -> datetime.datetime | None:
    """An RFC3339 time (fraction allowed, as Go's parser allows it), or None."""
    match = _RFC3339.fullmatch(text)
    if match is None:
        return None
    frac = (match["frac"] or "")[:6].ljust(6, "0")
    zone = "+00:00" if match["zone"] == "Z" else match["zone"]
    try:
        return datetime.datetime.fromisoformat(f"{match['date']}T{match['clock']}.{frac}{zone}")
    except ValueError:
        return None


def encode_node_lock(value: NodeLockValue) -> str:
    """``<RFC3339>,<ns>,<name>``, or the bare time for a legacy value (tests only: we never write one)."""
    stamp = format_rfc3339(value.time)
    if value.namespace is None and value.name is None:
        return stamp
    if not value.namespace or not value.name or "," in value.namespace + value.name:
        raise ValueError(
            f"lock owner {value.namespace!r}/{value.name!r} must be two non-empty names without ','"
        )
    return f"{stamp},{value.namespace},{value.name}"


def decode_node_lock(text: str) -> NodeLockValue:
    check_length(NODE_LOCK, text)
    parts = text.split(",")
    if len(parts) not in (1, 3):
        raise AnnotationError(
            NODE_LOCK, text, f"malformed lock: expected <time>,<namespace>,<pod>, got {len(parts)} parts"
        )
    moment = parse_rfc3339(parts[0])
    if moment is None:
        raise AnnotationError(NODE_LOCK, text, f"malformed lock: {parts[0]!r} is not an RFC3339 time")
    if len(parts) == 1:
        return NodeLockValue(time=moment)
    return NodeLockValue(time=moment, namespace=parts[1], name=parts[2])


# --------------------------------------------------------------------------------------- lock expiry


def parse_go_duration(text: str) -> datetime.timedelta:
    """Go's ``time.ParseDuration``: ``[+-]`` then one or more ``<number><unit>`` (``1h30m``, ``1.5s``,
    ``300ms``; units ns, us/µs, ms, s, m, h), or ``0``; beyond Go's int64 nanoseconds is an error.
    Nanoseconds below a microsecond are dropped (``timedelta`` resolution). Raises ValueError."""
    refused = ValueError(f"{text!r} is not a Go duration (e.g. 5m, 90s, 1h30m)")
    body = text[1:] if text[:1] in ("+", "-") else text
    if body == "0":
        return datetime.timedelta(0)
    if not body or len(body) > 64:
        raise refused
    total = 0  # nanoseconds, exact: each part's fraction scaled by its unit
    position = 0
    while position < len(body):
        part = _GO_DURATION_PART.match(body, position)
        if part is None or not (part[1] or part[2]):
            raise refused
        whole, fraction, unit = part[1] or "0", part[2] or "", part[3]
        scale = _GO_UNIT_NS[unit]
        total += int(whole) * scale + (int(fraction) * scale // 10 ** len(fraction) if fraction else 0)
        if total > _GO_MAX_NS:
            raise refused
        position = part.end()
    micros = total // 1000
    return datetime.timedelta(microseconds=-micros if text[:1] == "-" else micros)


def go_duration(delta: datetime.timedelta) -> str:
    """Go's ``time.Duration.String`` (to the microsecond): ``5m0s``, ``1h0m5s``, ``1.5s``, ``300ms``."""
    micros = delta // datetime.timedelta(microseconds=1)
    if micros == 0:
        return "0s"
    sign, micros = ("-", -micros) if micros < 0 else ("", micros)
    if micros < 1_000:
        return f"{sign}{micros}\u00b5s"
    if micros < 1_000_000:
        return f"{sign}{_decimal(micros, 1_000)}ms"
    hours, rest = divmod(micros, 3_600_000_000)
    minutes, rest = divmod(rest, 60_000_000)
    seconds = f"{_decimal(rest, 1_000_000)}s"
    if hours:
        return f"{sign}{hours}h{minutes}m{seconds}"
    if minutes:
        return f"{sign}{minutes}m{seconds}"
    return sign + seconds


def _decimal(value: int, unit: int) -> str:
    """``value / unit`` written as Go does: no trailing zeros after the point, no point when whole."""
    whole, part = divmod(value, unit)
    if not part:
        return str(whole)
    digits = str(part).rjust(len(str(unit)) - 1, "0").rstrip("0")
    return f"{whole}.{digits}"


# ------------------------------------------------------------------------------------------ handshake


class HandshakeKind(StrEnum):
    REQUESTING = "Requesting"  # written by the scheduler: "Requesting_<time>"
    REPORTED = "Reported"  # older agents: "Reported <time>"
    DELETED = "Deleted"  # older schedulers after declaring the node gone: "Deleted_<time>"
    OTHER = "other"  # anything else, including an empty value


@dataclass(frozen=True, slots=True, kw_only=True)
class Handshake:
    """A decoded handshake. ``time`` is naive local wall-clock time; None when absent or unreadable."""

    kind: HandshakeKind
    time: datetime.datetime | None = None


def encode_handshake(kind: HandshakeKind, at: datetime.datetime) -> str:
    """``Requesting_2024-05-01 10:00:00`` (``at`` as local wall-clock time; its zone is dropped)."""
    stamp = at.strftime(HANDSHAKE_TIME_FORMAT)
    if kind is HandshakeKind.REPORTED:
        return f"{kind.value} {stamp}"
    if kind is HandshakeKind.OTHER:
        raise ValueError("only Requesting, Reported and Deleted handshakes are written")
    return f"{kind.value}_{stamp}"


def decode_handshake(text: str | None) -> Handshake:
    """Classify a handshake like HAMi: contains ``Requesting`` -> requesting with the time after the
    first ``_`` if it parses; never raises (an unreadable stamp counts as healthy in HAMi)."""
    if text is None:
        return Handshake(kind=HandshakeKind.OTHER)
    if HandshakeKind.REQUESTING.value in text:
        kind = HandshakeKind.REQUESTING
    elif text.startswith(HandshakeKind.REPORTED.value):
        kind = HandshakeKind.REPORTED
    elif text.startswith(HandshakeKind.DELETED.value):
        kind = HandshakeKind.DELETED
    else:
        return Handshake(kind=HandshakeKind.OTHER)
    separator = " " if kind is HandshakeKind.REPORTED else "_"
    _, found, stamp = text.partition(separator)
    return Handshake(kind=kind, time=_handshake_time(stamp) if found else None)


def _handshake_time(stamp: str) -> datetime.datetime | None:
    if _HANDSHAKE_TIME.fullmatch(stamp) is None:
        return None
    try:
        return datetime.datetime.strptime(stamp[:19], HANDSHAKE_TIME_FORMAT)
    except ValueError:
        return None
