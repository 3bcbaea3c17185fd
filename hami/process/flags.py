"""The flags every service shares the shape of: ``HAMI_<FLAG>`` env fallbacks, ``HOST:PORT`` listeners,
switches and numbers in a range.

Owns the env variable of a flag (``--node-lock-timeout`` -> ``HAMI_NODE_LOCK_TIMEOUT``; precedence: the
flag, then that variable, then the default), :class:`Address` and the one ``HOST:PORT`` parser,
:func:`parse_address`, the one switch parser, :func:`parse_bool`, and the one number parser,
:func:`parse_number` (:func:`parse_whole` for whole numbers): a finite number (``nan`` and ``inf`` are
refused: a NaN deadline never passes, every comparison with it being false, and an infinite interval
never ends) within the flag's bounds. A listen address is hostile text from a flag or an env variable:
only ASCII digits make a port (``int`` also reads ``'٨٠'`` and crashes on ``'²'``), an IPv6 host needs
its brackets (``::1:80`` could be two different addresses), and a host holds only what a host name or an
address can. ``:PORT`` (Go's form, HAMi's defaults such as ``:9395``) means every IPv4 interface. Errors
name the flag and the text, raised as the caller's own error class. Pure: stdlib only (the environment
is passed in; no ``os``).
"""

from __future__ import annotations

import math
import string
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TypeVar

ENV_PREFIX = "HAMI_"
#: What an empty host (``:9395``) listens on.
ALL_INTERFACES = "0.0.0.0"
#: Letters, digits, dots and hyphens (host names; ``_`` as some resolvers allow), colons and ``%zone``
#: (IPv6 inside brackets).
_HOST_CHARACTERS = frozenset(string.ascii_letters + string.digits + ".-_:%")

T = TypeVar("T")


def env_name(flag: str) -> str:
    """The env variable that stands in for ``--flag``: ``HAMI_`` + the flag in upper snake case."""
    return ENV_PREFIX + flag.upper().replace("-", "_")


def env_default(flag: str, default: T, environ: Mapping[str, str]) -> str | T:
    """The default of ``--flag``: its ``HAMI_<FLAG>`` variable when set, else ``default``."""
    return environ.get(env_name(flag), default)


@dataclass(frozen=True, slots=True, kw_only=True)
class Address:
    """A listen address; ``port`` 0 lets the OS choose."""

    host: str
    port: int

    def __str__(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"


def parse_address(flag: str, text: str, error: type[Exception] = ValueError) -> Address:
    """``HOST:PORT`` of ``--flag`` (``[::1]:PORT`` for IPv6, ``:PORT`` for every interface, port 0 for
    an OS-chosen one); anything else raises ``error`` naming the flag and the text."""
    message = f"--{flag} must be HOST:PORT, got {text!r}"
    host, colon, port = text.rpartition(":")
    if not colon or not (port.isascii() and port.isdigit()) or len(port) > 5 or int(port) > 65535:
        raise error(message)
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
        if not host:
            raise error(message)
    elif ":" in host:
        raise error(f"{message}: an IPv6 address goes in brackets, e.g. [::1]:{port}")
    elif not host:
        host = ALL_INTERFACES
    if not set(host) <= _HOST_CHARACTERS:
        raise error(message)
    return Address(host=host, port=int(port))


def parse_number(
    flag: str,
    text: str,
    *,
    unit: str = "",
    positive: bool = False,
    minimum: float | None = None,
    maximum: float | None = None,
    error: type[Exception] = ValueError,
) -> float:
    """The finite number ``--flag`` holds (``unit`` names what it counts in the messages); with
    ``positive`` above 0, else within ``minimum``..``maximum`` (each optional, inclusive). Anything else
    raises ``error`` naming the flag and the text."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value):
        raise error(f"--{flag} must be a number{_of(unit)}, got {text!r}")
    _check_range(flag, text, value, unit, positive, minimum, maximum, error)
    return value


def parse_whole(
    flag: str,
    text: str,
    *,
    unit: str = "",
    minimum: int | None = None,
    maximum: int | None = None,
    error: type[Exception] = ValueError,
) -> int:
    """:func:`parse_number` for a whole number (decimal digits, an optional sign)."""
    try:
        value = int(text)
    except ValueError:
        raise error(f"--{flag} must be a whole number{_of(unit)}, got {text!r}") from None
    _check_range(flag, text, value, unit, False, minimum, maximum, error)
    return value


def _of(unit: str) -> str:
    return f" of {unit}" if unit else ""


def _check_range(
    flag: str,
    text: str,
    value: float,
    unit: str,
    positive: bool,
    minimum: float | None,
    maximum: float | None,
    error: type[Exception],
) -> None:
    unit = f" {unit}" if unit else ""
    if positive and value <= 0:
        raise error(f"--{flag} must be positive, got {text!r}")
    if minimum is not None and maximum is not None and not minimum <= value <= maximum:
        raise error(f"--{flag} must be between {_shown(minimum)} and {_shown(maximum)}{unit}, got {text!r}")
    if minimum is not None and value < minimum:
        raise error(f"--{flag} must be at least {_shown(minimum)}{unit}, got {text!r}")
    if maximum is not None and value > maximum:
        raise error(f"--{flag} must be at most {_shown(maximum)}{unit}, got {text!r}")


def _shown(bound: float) -> str:
    return str(int(bound)) if float(bound).is_integer() else str(bound)


_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"0", "false", "no", "off", ""})


def parse_bool(label: str, text: str, error: type[Exception] = ValueError) -> bool:
    """A switch given as text (a flag's value, an env variable): ``1 true yes on`` or ``0 false no off``
    and empty, any case, blanks around ignored; anything else raises ``error`` naming ``label`` (the
    ``--flag`` or the variable) and the text."""
    lowered = text.strip().lower()
    if lowered in _TRUE:
        return True
    if lowered in _FALSE:
        return False
    raise error(f"{label} must be true or false, got {text!r}")
