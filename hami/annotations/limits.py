"""The bounds every decoder checks before it does any real work, and the bounded JSON reader.

An annotation value is hostile until read: a number of thousands of digits makes Python's ``int()``
raise a plain ValueError (its int-from-str limit is 4,300 digits), JSON nested thousands deep makes the
json module raise RecursionError, and either would escape a decoder as something other than
:class:`~hami.annotations.errors.AnnotationError`. So, before decoding:

* a value longer than :data:`MAX_VALUE_LENGTH` characters is refused (Kubernetes' own limit on all
  annotations of one object together, so no value the API server stores is refused);
* JSON is scanned for nesting first (brackets inside strings do not count) and refused deeper than
  :data:`MAX_JSON_DEPTH` (our formats nest at most 6 deep; Go's decoder stops at 10,000);
* a JSON integer literal of more than :data:`MAX_JSON_INT_DIGITS` digits is refused while decoding
  (every integer field is 32 or 64 bits: 19 digits at most), as are ``NaN`` and ``Infinity``, which
  Python's json accepts and Go's refuses;
* decimal integers in the colon and comma forms are read by ``_text.go_int``, which counts significant
  digits before converting (Go's ``strconv.ParseInt`` accepts any number of leading zeros).

Every refusal is an AnnotationError naming the key. Pure: stdlib only.
"""

from __future__ import annotations

import json
import re
from typing import Any, Final

from hami.annotations.errors import AnnotationError

#: Longest annotation value any decoder reads: Kubernetes' TotalAnnotationSizeLimitB (256 KiB), the
#: limit on all annotations of one object together.
MAX_VALUE_LENGTH: Final = 256 * 1024
#: Deepest JSON nesting read (arrays and objects together).
MAX_JSON_DEPTH: Final = 32
#: Most digits of one JSON integer literal (sign not counted).
MAX_JSON_INT_DIGITS: Final = 40

# A JSON string (escapes included), matched possessively: linear, no backtracking.
_JSON_STRING = re.compile(r'"(?:[^"\\]++|\\.)*+"', re.DOTALL)
_BRACKETS = re.compile(r"[\[\]{}]")
_LONG_DIGITS = re.compile(f"[0-9]{{{MAX_JSON_INT_DIGITS + 1}}}")


class _Refused(ValueError):
    """Raised inside ``json.loads`` hooks; turned into an AnnotationError by :func:`load_json`."""


def check_length(key: str, text: str) -> None:
    """Refuse a value longer than :data:`MAX_VALUE_LENGTH` characters."""
    if len(text) > MAX_VALUE_LENGTH:
        raise AnnotationError(key, text, f"value is longer than {MAX_VALUE_LENGTH} characters ({len(text)})")


def json_depth(text: str) -> int:
    """How deep arrays and objects nest in ``text`` (strings skipped); stops counting past the bound."""
    depth = deepest = 0
    for bracket in _BRACKETS.finditer(_JSON_STRING.sub("", text)):
        if bracket.group() in "[{":
            depth += 1
            deepest = max(deepest, depth)
            if deepest > MAX_JSON_DEPTH:
                break
        else:
            depth -= 1
    return deepest


def _int(literal: str) -> int:
    digits = len(literal.lstrip("-"))
    if digits > MAX_JSON_INT_DIGITS:
        raise _Refused(f"a number of {digits} digits does not fit in 64 bits")
    return int(literal)


def _constant(name: str) -> Any:
    raise _Refused(f"{name} is not a JSON number")


def load_json(key: str, text: str) -> Any:
    """``json.loads(text)`` within the bounds above; every failure is an AnnotationError for ``key``."""
    check_length(key, text)
    # no deeper than the brackets it opens (those in strings counted too): most texts need no scan
    opened = text.count("[") + text.count("{")
    if opened > MAX_JSON_DEPTH and json_depth(text) > MAX_JSON_DEPTH:
        raise AnnotationError(key, text, f"invalid JSON: nested deeper than {MAX_JSON_DEPTH} levels")
    try:
        if _LONG_DIGITS.search(text) is None:  # no integer literal can be too long: no check per number
            return json.loads(text, parse_constant=_constant)
        return json.loads(text, parse_int=_int, parse_constant=_constant)
    except _Refused as exc:
        raise AnnotationError(key, text, str(exc)) from None
    except (ValueError, RecursionError) as exc:  # RecursionError: only if the scan above were wrong
        raise AnnotationError(key, text, f"invalid JSON: {exc}") from exc
