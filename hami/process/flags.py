"""The settings schema every service declares its flags with, and the parsers their values share.

Owns :class:`Flag` (and :class:`Switch`, a ``--x``/``--no-x`` flag): one setting declared once, with its
type (the parser's result), its default as written on the command line, its env variable and its help.
From that one declaration come the argparse option (:func:`add_flags`), the env fallback, the typed
default the service's frozen settings dataclass holds (:attr:`Flag.default_value`), the ``--help`` line
(:meth:`Flag.help_text`) and what the docs' flag tables are checked against (tests/test_docs_tables.py).
Each service's schema is a tuple of these in its config module (``hami.scheduler.config.FLAGS``,
``webhook.config.FLAGS``, ``nodeagent.config.FLAGS``); bad values raise :class:`hami.settings.ConfigError`,
the one error for bad configuration.

Precedence: the flag, then its env variable ``HAMI_<FLAG>`` (``--node-lock-timeout`` ->
``HAMI_NODE_LOCK_TIMEOUT``; :func:`env_name`), then a flag's other variables in order (HAMi's own names,
such as ``NODE_NAME``; empty counts as unset there), then the default. A value from ``HAMI_<FLAG>`` is
read as the flag's would be and its errors name the flag; a switch's text, which only a variable can give,
and another variable's errors name the variable.

Also owns the value parsers: :class:`Address` and the one ``HOST:PORT`` parser, :func:`parse_address`,
the one switch parser, :func:`parse_bool`, and the one number parser, :func:`parse_number`
(:func:`parse_whole` for whole numbers): a finite number (``nan`` and ``inf`` are refused: a NaN deadline
never passes, every comparison with it being false, and an infinite interval never ends) within the
flag's bounds. A listen address is hostile text from a flag or an env variable: only ASCII digits make a
port (``int`` also reads ``'٨٠'`` and crashes on ``'²'``), an IPv6 host needs its brackets (``::1:80``
could be two different addresses), and a host holds only what a host name or an address can. ``:PORT``
(Go's form, HAMi's defaults such as ``:9395``) means every IPv4 interface. Errors name the flag and the
text. Pure: stdlib and :mod:`hami.settings` only (the environment is passed in; no ``os``).
"""

from __future__ import annotations

import argparse
import math
import string
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Generic, TypeVar

from hami.settings import ConfigError

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


def parse_address(flag: str, text: str, error: type[Exception] = ConfigError) -> Address:
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
    error: type[Exception] = ConfigError,
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
    error: type[Exception] = ConfigError,
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


def parse_bool(label: str, text: str, error: type[Exception] = ConfigError) -> bool:
    """A switch given as text (a flag's value, an env variable): ``1 true yes on`` or ``0 false no off``
    and empty, any case, blanks around ignored; anything else raises ``error`` naming ``label`` (the
    ``--flag`` or the variable) and the text."""
    lowered = text.strip().lower()
    if lowered in _TRUE:
        return True
    if lowered in _FALSE:
        return False
    raise error(f"{label} must be true or false, got {text!r}")


# ------------------------------------------------------------------------------ value parsers of a Flag
# Each takes the flag's name (no dashes) and the text, and names ``--flag`` in its errors.


def plain(flag: str, value: str) -> str:
    """The text as given."""
    return value


def optional_text(flag: str, value: str) -> str | None:
    """The text, or ``None`` when empty (the flag is unset)."""
    return value or None


def path(flag: str, value: str) -> Path:
    """A path, as given."""
    return Path(value)


def optional_path(flag: str, value: str) -> Path | None:
    """A path, or ``None`` when empty (the flag is unset)."""
    return Path(value) if value else None


def address(flag: str, value: str) -> Address:
    """``HOST:PORT`` (:func:`parse_address`)."""
    return parse_address(flag, value)


def boolean(flag: str, value: str) -> bool:
    """``true``/``false`` given as the flag's value (:func:`parse_bool`, naming ``--flag``)."""
    return parse_bool(f"--{flag}", value)


def number(
    *, unit: str = "", positive: bool = False, minimum: float | None = None, maximum: float | None = None
) -> Callable[[str, str], float]:
    """A finite number within these bounds (:func:`parse_number`)."""

    def parse(flag: str, value: str) -> float:
        return parse_number(flag, value, unit=unit, positive=positive, minimum=minimum, maximum=maximum)

    return parse


def whole(
    *, unit: str = "", minimum: int | None = None, maximum: int | None = None
) -> Callable[[str, str], int]:
    """A whole number within these bounds (:func:`parse_whole`)."""

    def parse(flag: str, value: str) -> int:
        return parse_whole(flag, value, unit=unit, minimum=minimum, maximum=maximum)

    return parse


# ------------------------------------------------------------------------------------------ the schema


@dataclass(frozen=True, slots=True)
class EnvText:
    """A flag's text taken from an env variable: the parser's default when the variable is set, so that
    reading it can name where it came from."""

    variable: str
    text: str


@dataclass(frozen=True, slots=True, kw_only=True)
class Flag(Generic[T]):
    """One setting of a service, declared once.

    ``parse`` turns the text into the setting's value (its type is the flag's type) and raises
    :class:`ConfigError` naming ``--name`` and the text; ``default`` is the text used when nothing is
    given, as one would write it on the command line (``""``: unset; the parser says what unset means);
    ``also_env`` are variables read after ``HAMI_<NAME>`` (HAMi's own names), with ``parse_also``
    (given the variable's name) when they are written differently; ``choices`` are checked by argparse
    on the command line (a value from the environment goes through ``parse`` only).
    """

    name: str
    parse: Callable[[str, str], T]
    help: str
    default: str = ""
    metavar: str | None = None
    choices: tuple[str, ...] = ()
    also_env: tuple[str, ...] = ()
    parse_also: Callable[[str, str], T] | None = None

    @property
    def option(self) -> str:
        return f"--{self.name}"

    @property
    def options(self) -> tuple[str, ...]:
        """Every option string the parser takes for this flag."""
        return (self.option,)

    @property
    def dest(self) -> str:
        return self.name.replace("-", "_")

    @property
    def variables(self) -> tuple[str, ...]:
        """The env variables that stand in for the flag, in order."""
        return (env_name(self.name), *self.also_env)

    @property
    def default_value(self) -> T:
        """The default's value: what the service's settings dataclass holds when nothing is given."""
        return self.parse(self.name, self.default)

    def help_text(self) -> str:
        """The ``--help`` line: the help, the default and the env variables."""
        shown = f" (default: {self.default})" if self.default else ""
        return f"{self.help}{shown} [env {', then '.join(self.variables)}]"

    def from_env(self, environ: Mapping[str, str]) -> EnvText | None:
        """The text the environment gives this flag, if any: ``HAMI_<NAME>`` when set (even empty), else
        the first other variable that is set and not empty."""
        given = env_default(self.name, None, environ)
        if given is not None:
            return EnvText(env_name(self.name), given)
        for variable in self.also_env:
            if environ.get(variable):
                return EnvText(variable, environ[variable])
        return None

    def add_to(self, parser: argparse.ArgumentParser, environ: Mapping[str, str]) -> None:
        """Declare the option; its parser default is the environment's text, else the default text."""
        given = self.from_env(environ)
        parser.add_argument(
            self.option,
            default=self.default if given is None else given,
            choices=self.choices or None,
            metavar=self.metavar,
            help=_escaped(self.help_text()),
        )

    def read(self, args: argparse.Namespace) -> T:
        """The flag's value from parsed arguments (flag, environment or default), checked."""
        raw: str | EnvText = getattr(args, self.dest)
        if isinstance(raw, EnvText):
            if raw.variable != env_name(self.name) and self.parse_also is not None:
                return self.parse_also(raw.variable, raw.text)
            return self.parse(self.name, raw.text)
        return self.parse(self.name, raw)


@dataclass(frozen=True, slots=True, kw_only=True)
class Switch(Flag[bool]):
    """A flag that is on or off: ``--name`` / ``--no-name``; its variable holds ``true`` or ``false``
    (:func:`parse_bool`, the error naming the variable)."""

    parse: Callable[[str, str], bool] = field(default=boolean)

    @property
    def options(self) -> tuple[str, ...]:
        return (self.option, f"--no-{self.name}")

    def add_to(self, parser: argparse.ArgumentParser, environ: Mapping[str, str]) -> None:
        given = self.from_env(environ)
        parser.add_argument(
            self.option,
            action=argparse.BooleanOptionalAction,
            default=self.default_value if given is None else given,
            help=_escaped(self.help_text()),
        )

    def read(self, args: argparse.Namespace) -> bool:
        raw: bool | EnvText = getattr(args, self.dest)
        if isinstance(raw, EnvText):
            return parse_bool(raw.variable, raw.text)
        return raw


#: One service's schema: every flag it takes, in ``--help`` order.
Flags = tuple[Flag[Any], ...]


def add_flags(parser: argparse.ArgumentParser, flags: Flags, environ: Mapping[str, str]) -> None:
    """Declare every flag of ``flags`` on ``parser``, each defaulting to its env variable when set."""
    for flag in flags:
        flag.add_to(parser, environ)


def _escaped(help_text: str) -> str:
    """argparse formats help with ``%``: a literal one is written ``%%``."""
    return help_text.replace("%", "%%")


#: The kubeconfig every service reads the same way.
KUBECONFIG = Flag(
    name="kubeconfig",
    metavar="PATH",
    parse=optional_text,
    help="kubeconfig file (default: in-cluster, then ~/.kube/config)",
)


#: The log levels every service takes, in any case.
LOG_LEVELS = ("debug", "info", "warning", "error")


def log_level(flag: str, text: str) -> str:
    """One of :data:`LOG_LEVELS`, in any case (held lower-case); anything else raises ConfigError."""
    level = text.strip().lower()
    if level not in LOG_LEVELS:
        raise ConfigError(f"--{flag} must be one of {', '.join(LOG_LEVELS)} (any case), got {text!r}")
    return level


#: How much every service logs.
LOG_LEVEL = Flag(
    name="log-level",
    metavar="LEVEL",
    parse=log_level,
    default="info",
    help="debug, info, warning or error (any case)",
)
