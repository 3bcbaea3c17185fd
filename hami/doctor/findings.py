"""What ``hami doctor`` reports: :class:`Finding` (severity, check, subject, message, what to do), the
settings the rules read, the exit code, and small readers of raw objects shared by the rules.

Pure: stdlib, ``hami.settings``, ``hami.objects``; no I/O, no clock.
"""

from __future__ import annotations

import datetime
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from hami import objects
from hami.settings import DeviceConfig

#: The subject of a finding about the whole cluster rather than one object.
CLUSTER = "cluster"


class Severity(StrEnum):
    OK = "OK"
    WARN = "WARN"
    FAIL = "FAIL"


@dataclass(frozen=True, slots=True, kw_only=True)
class Finding:
    """One line of the report: what was checked about which object, and what to do about it."""

    severity: Severity
    check: str  # webhook | node | enforce | lock | pod | usage
    subject: str  # e.g. "node gpu-a", "pod default/train", "cluster"
    message: str
    action: str = ""

    def line(self) -> str:
        """``FAIL  node     node gpu-a: <message> -> <action>``."""
        text = f"{self.severity.value:<4}  {self.check:<7}  {self.subject}: {self.message}"
        return f"{text} -> {self.action}" if self.action else text


def finding(severity: Severity, check: str, subject: str, message: str, action: str = "") -> Finding:
    return Finding(severity=severity, check=check, subject=subject, message=message, action=action)


@dataclass(frozen=True, slots=True, kw_only=True)
class DoctorSettings:
    scheduler_name: str = "hami-scheduler"  # what the webhook sets on GPU pods
    lock_timeout: datetime.timedelta = datetime.timedelta(seconds=300)  # the scheduler's --node-lock-timeout
    handshake_window: datetime.timedelta = datetime.timedelta(seconds=60)  # docs/protocol.md, "Handshake"
    config: DeviceConfig = field(default_factory=DeviceConfig)


def exit_code(findings: Iterable[Finding]) -> int:
    """0 when nothing failed, 1 otherwise (2, for errors, is the command's)."""
    return 1 if any(f.severity is Severity.FAIL for f in findings) else 0


def name_of(obj: Mapping[str, Any]) -> str:
    return objects.name(obj)


def pod_key(pod: Mapping[str, Any]) -> str:
    """``namespace/name``."""
    return "/".join(objects.pod_key(pod))


def seconds(delta: datetime.timedelta) -> str:
    return f"{int(delta.total_seconds())} s"


def plural(count: int, noun: str) -> str:
    """``1 card``, ``2 cards``."""
    return f"{count} {noun}{'' if count == 1 else 's'}"
