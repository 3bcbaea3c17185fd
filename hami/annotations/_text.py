"""Small parsing helpers shared by the codec modules: Go-compatible integers and booleans, comma
lists, and reading JSON objects the way Go's ``encoding/json`` does (case-insensitive keys).

Private to ``hami.annotations``. Pure: stdlib only.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from hami.core.gocompat import fold_keys
from hami.core.gocompat import go_bool as go_bool  # Go strconv.ParseBool, re-exported: the core's rule

INT32_MIN = -(2**31)
INT32_MAX = 2**31 - 1
INT64_MIN = -(2**63)
INT64_MAX = 2**63 - 1

# Go strconv.ParseInt(s, 10, n): optional sign, ASCII digits only (no spaces, no underscores).
_GO_INT = re.compile(r"[+-]?[0-9]+")
#: More significant digits than any 64-bit integer has.
_MAX_INT_DIGITS = 20


def go_int(text: str, *, bits: int = 64) -> int | None:
    """``strconv.ParseInt(text, 10, bits)``: the integer, or None when Go would return an error.

    Significant digits are counted before converting: Go accepts any number of leading zeros, and a
    number with more digits than the widest integer (``2**63`` has 19) is out of range whatever it says,
    so a hostile digit string never reaches ``int()`` (which refuses more than 4,300 digits).
    """
    if len(text) <= _MAX_INT_DIGITS and text.isascii() and text.isdigit():
        value = int(text)  # the common case (an unsigned decimal, no regex); the same value below
        return value if value < 2 ** (bits - 1) else None
    if _GO_INT.fullmatch(text) is None:
        return None
    significant = text.lstrip("+-").lstrip("0")
    if len(significant) > _MAX_INT_DIGITS:
        return None
    value = int(significant or "0")
    if text.startswith("-"):
        value = -value
    bound = 2 ** (bits - 1)
    return value if -bound <= value < bound else None


def split_list(text: str | None) -> tuple[str, ...]:
    """A comma list: entries trimmed, empty entries dropped; blank or missing -> no entries."""
    if text is None:
        return ()
    return tuple(entry for entry in (part.strip() for part in text.split(",")) if entry)


def json_kind(value: Any) -> str:
    """The JSON type name of a decoded value, for messages."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    return "object"


class FieldProblem(ValueError):
    """A JSON field of the wrong type or range; the caller wraps it into an AnnotationError."""


def get_int(
    obj: Mapping[str, Any], name: str, *, default: int | None = 0, minimum: int | None = None, bits: int = 64
) -> int:
    """Field ``name`` (already folded to lower case) as an integer; absent or null -> ``default``.

    ``default=None`` makes the field required. JSON booleans and fractions are refused like Go does.
    """
    value = obj.get(name.lower())
    if value is None:
        if default is None:
            raise FieldProblem(f"{name!r} is missing")
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        raise FieldProblem(f"{name!r} must be an integer, got {json_kind(value)} {value!r}")
    bound = 2 ** (bits - 1)
    if not -bound <= value < bound:
        raise FieldProblem(f"{name!r} {value} does not fit in {bits} bits")
    if minimum is not None and value < minimum:
        raise FieldProblem(f"{name!r} must be at least {minimum}, got {value}")
    return int(value)


def get_str(obj: Mapping[str, Any], name: str, *, required: bool = False) -> str:
    """Field ``name`` as a string; absent or null -> ``""`` unless required (then non-empty)."""
    value = obj.get(name.lower())
    if value is None:
        value = ""
    if not isinstance(value, str):
        raise FieldProblem(f"{name!r} must be a string, got {json_kind(value)} {value!r}")
    if required and not value:
        raise FieldProblem(f"{name!r} is missing or empty")
    return value


def get_bool(obj: Mapping[str, Any], name: str) -> bool:
    """Field ``name`` as a boolean; absent or null -> False."""
    value = obj.get(name.lower())
    if value is None:
        return False
    if not isinstance(value, bool):
        raise FieldProblem(f"{name!r} must be true or false, got {json_kind(value)} {value!r}")
    return value


def get_object(value: Any, what: str) -> dict[str, Any]:
    """``value`` as a JSON object with folded keys."""
    if not isinstance(value, dict):
        raise FieldProblem(f"{what} must be an object, got {json_kind(value)}")
    return fold_keys(value)


def get_list(value: Any, what: str) -> list[Any]:
    """``value`` as a JSON array; null -> empty (Go decodes null into a nil slice)."""
    if value is None:
        return []
    if not isinstance(value, list):
        raise FieldProblem(f"{what} must be an array, got {json_kind(value)}")
    return value
