"""Go's value rules that HAMi's behaviour depends on, one of each: float32 arithmetic and encoding/json's
case-insensitive keys.

Owns :func:`f32` (HAMi computes card and node scores in float32, so a tie, which decides the card,
falls the same way only with the same rounding) and :func:`fold_keys` (Go's ``encoding/json`` matches a
JSON key to a struct field exactly, else case-insensitively, and assigns in document order: of two keys
naming one field the later one wins, whatever their case). The codec reads registration JSON through
:func:`fold_keys`, the extender reads kube-scheduler's bodies through it.

Pure: stdlib only; must not import a Kubernetes client, aiohttp, kopf, grpc, pynvml, ``logging``,
``os`` or ``time``.
"""

from __future__ import annotations

from collections.abc import Mapping
from struct import pack, unpack
from typing import Any


def f32(value: float) -> float:
    """``value`` rounded to the nearest IEEE float32, as Go's ``float32(...)`` does."""
    return float(unpack("f", pack("f", value))[0])


def fold_keys(obj: Mapping[str, Any]) -> dict[str, Any]:
    """``obj`` with lower-cased keys, read as Go reads a JSON object into a struct: the later key wins."""
    return {key.lower(): value for key, value in obj.items()}
