"""Kubernetes resource quantities (``"1"``, ``"500m"``, ``"16Gi"``, ``"1e3"``): a small strict parser.

Owns the suffix table, the exact value of a quantity (a :class:`~fractions.Fraction`, never a float)
and the "plain integer" test HAMi applies to device resources (Go's ``Quantity.AsInt64``).
Pure: stdlib only; must not import a Kubernetes client, ``logging``, ``os`` or ``time``.

Grammar (``k8s.io/apimachinery/pkg/api/resource``)::

    quantity = sign? digits ("." digits?)? suffix | sign? "." digits suffix
    suffix   = "" | "n" | "u" | "m" | "k" | "M" | "G" | "T" | "P" | "E"   (decimal SI)
             | "Ki" | "Mi" | "Gi" | "Ti" | "Pi" | "Ei"                   (binary SI)
             | ("e" | "E") sign? digits                                  (decimal exponent)

"Plain integer" (Go ``AsInt64`` succeeding) is stricter than "the value is whole": Go keeps the
digits as written, so ``"1.0"``, ``"1000m"`` and ``"16.0Gi"`` are *not* plain integers although their
values are whole, while ``"1.5k"`` (= 1500) is. The API server canonicalises quantities (``"1.0"`` is
stored as ``"1"``), so this only matters for text that did not go through it (tests, dry runs).

Bounds, checked before any arithmetic (``"1e10000000"`` is valid syntax whose exact value has ten
million digits; a digit string beyond 4,300 digits makes ``int()`` raise a plain ValueError): the text
is at most :data:`MAX_QUANTITY_LENGTH` characters, the exponent fits in 32 bits (Go's ``Scale``), and
a value other than 0 lies between :data:`MIN_MAGNITUDE` (1n) and :data:`INT64_MAX` in absolute value,
judged from the digit count and exponent first. Kubernetes keeps a decimal value of any size (as a
scaled decimal: ``1e10000000`` costs it nothing), caps binary-suffix values at ``2**63 - 1`` and rounds
values below 1n up to 1n; we refuse all of these with :class:`QuantityError` (none is a device count, a
MiB amount or a quota limit anyone means).
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from fractions import Fraction
from typing import Final

#: suffix -> (base, exponent): the multiplier is base ** exponent.
SUFFIXES: Final[dict[str, tuple[int, int]]] = {
    "": (10, 0),
    "n": (10, -9),
    "u": (10, -6),
    "m": (10, -3),
    "k": (10, 3),
    "M": (10, 6),
    "G": (10, 9),
    "T": (10, 12),
    "P": (10, 15),
    "E": (10, 18),
    "Ki": (2, 10),
    "Mi": (2, 20),
    "Gi": (2, 30),
    "Ti": (2, 40),
    "Pi": (2, 50),
    "Ei": (2, 60),
}

INT64_MIN: Final = -(2**63)
INT64_MAX: Final = 2**63 - 1
INT32_MIN: Final = -(2**31)
INT32_MAX: Final = 2**31 - 1

# Go's fast path keeps at most 18 decimal digits in an int64 (``maxInt64Factors``).
_MAX_INT64_DIGITS: Final = 18

#: Longest quantity text read; canonical quantities are at most about 20 characters.
MAX_QUANTITY_LENGTH: Final = 64
#: Smallest magnitude of a value other than 0: 1n, Kubernetes' smallest unit.
MIN_MAGNITUDE: Final = Fraction(1, 10**9)
# 10 ** _MIN_ORDER is 1n, 10 ** _MAX_ORDER exceeds INT64_MAX (19 digits).
_MIN_ORDER: Final = -9
_MAX_ORDER: Final = 19

_QUANTITY = re.compile(
    r"(?P<sign>[+-]?)(?:(?P<num>[0-9]+)(?:\.(?P<frac>[0-9]*))?|\.(?P<frac_only>[0-9]+))"
    r"(?P<suffix>[a-zA-Z]*(?:[+-]?[0-9]+)?)"
)
_EXPONENT = re.compile(r"[eE](?P<exp>[+-]?[0-9]+)")


class QuantityError(ValueError):
    """Text that is not a Kubernetes quantity; ``.text`` holds it and the message quotes it."""

    def __init__(self, text: str, why: str) -> None:
        super().__init__(f"{text!r} is not a quantity: {why}")
        self.text = text


@dataclass(frozen=True, slots=True)
class Quantity:
    """A parsed quantity: the text as written, its exact value, and the Go-compatible int view."""

    text: str
    value: Fraction
    plain_int: int | None  # Go's AsInt64(): the integer, or None when Go would say "not ok"

    @property
    def is_whole(self) -> bool:
        return self.value.denominator == 1


def parse_quantity(text: str) -> Quantity:
    """Parse a Kubernetes quantity strictly: no spaces, known suffixes only, within the bounds above."""
    if len(text) <= _MAX_INT64_DIGITS and text.isascii() and text.isdigit():
        return _plain_digits(text)
    if len(text) > MAX_QUANTITY_LENGTH:
        raise QuantityError(text, f"longer than {MAX_QUANTITY_LENGTH} characters")
    match = _QUANTITY.fullmatch(text)
    if match is None:
        raise QuantityError(text, "expected a number with an optional suffix such as m, k, Mi or Gi")
    num = match["num"] if match["num"] is not None else ""
    frac = match["frac"] if match["frac"] is not None else (match["frac_only"] or "")
    base, exponent = _suffix(text, match["suffix"])
    significant = (num + frac).lstrip("0")
    if not significant:
        magnitude = Fraction(0)
    else:
        if base == 10:  # the value lies in [10 ** (order - 1), 10 ** order): judge it before computing
            order = len(significant) + exponent - len(frac)
            if order > _MAX_ORDER:
                raise QuantityError(text, f"out of range: larger than {INT64_MAX}")
            if order <= _MIN_ORDER:
                raise QuantityError(text, "out of range: smaller than 1n")
        # at most 64 digits times 2 ** 60 or 10 ** 83: cheap
        magnitude = Fraction(int(significant), 10 ** len(frac)) * Fraction(base) ** exponent
        if magnitude > INT64_MAX:
            raise QuantityError(text, f"out of range: larger than {INT64_MAX}")
        if magnitude < MIN_MAGNITUDE:
            raise QuantityError(text, "out of range: smaller than 1n")
    negative = match["sign"] == "-"
    value = -magnitude if negative else magnitude
    return Quantity(text=text, value=value, plain_int=_go_as_int64(num, frac, base, exponent, value))


@functools.lru_cache(maxsize=4096)
def _plain_digits(text: str) -> Quantity:
    """The common case (a card count, MiB, cores: ``"1"``, ``"4000"``): at most 18 ASCII digits, no sign,
    no suffix, is its own integer, Go's fast path included (the grammar gives the same answer). The few
    such texts a cluster writes are read once each (a quantity is immutable)."""
    number = int(text)
    return Quantity(text=text, value=Fraction(number), plain_int=number)


def plain_int(text: str) -> int | None:
    """The integer a quantity stands for when Go's ``AsInt64`` would accept it, else None.

    Raises :class:`QuantityError` when the text is not a quantity at all.
    """
    return parse_quantity(text).plain_int


def _suffix(text: str, suffix: str) -> tuple[int, int]:
    if suffix in SUFFIXES:
        return SUFFIXES[suffix]
    exp = _EXPONENT.fullmatch(suffix)
    if exp is None:
        raise QuantityError(text, f"unknown suffix {suffix!r}")
    exponent = int(exp["exp"])  # at most MAX_QUANTITY_LENGTH digits
    if not INT32_MIN <= exponent <= INT32_MAX:
        raise QuantityError(text, f"exponent {exponent} does not fit in 32 bits")
    return 10, exponent


def _go_as_int64(num: str, frac: str, base: int, exponent: int, value: Fraction) -> int | None:
    """Mirror Go: only the int64 fast path with a non-negative scale yields an int64."""
    significant = num.lstrip("0") or "0"
    if base == 10:
        # scale = exponent - fractional digits; a negative scale (``1.0``, ``1000m``) is "not ok".
        if len(significant) + len(frac) > _MAX_INT64_DIGITS or exponent - len(frac) < 0:
            return None
    else:
        # binary suffixes with a fraction, or too many digits for the suffix, leave the fast path.
        precision = 15 - len(significant) - int(exponent * 3 / 10) - 1
        if frac or precision < 0:
            return None
    if value.denominator != 1 or not INT64_MIN <= value.numerator <= INT64_MAX:
        return None
    return value.numerator
