"""Go's value rules that HAMi's behaviour depends on, one of each: float32 arithmetic, encoding/json's
case-insensitive keys, ``strconv.ParseBool``, and the ``CUDA_DISABLE_CONTROL`` rule built on it.

Owns :func:`f32` (HAMi computes card and node scores in float32, so a tie, which decides the card,
falls the same way only with the same rounding); :func:`fold_keys` (Go's ``encoding/json`` matches a
JSON key to a struct field exactly, else case-insensitively, and assigns in document order: of two keys
naming one field the later one wins, whatever their case; the codec reads registration JSON through it,
the extender reads kube-scheduler's bodies through it); :func:`go_bool` (the one reading of a boolean
text that HAMi's Go code makes: exactly ``1 t T TRUE true True`` and ``0 f F FALSE false False``,
nothing trimmed or case-folded; the codec reads ``nvidia.com/numa-bind`` and a card's health field with
it) and :func:`disabling_value`: whether a container's env turns HAMi-core off. With
``CUDA_DISABLE_CONTROL`` true the node agent does not mount ``/etc/ld.so.preload``
(docs/protocol.md, "Allocate"), so the container's memory and core limits are not enforced. The node
agent (``nodeagent.allocate_rules``) decides the mount with it and the webhook (``webhook.isolation``)
refuses such a container on a shared card with it, so the two can never disagree.

Pure: stdlib only; must not import a Kubernetes client, aiohttp, kopf, grpc, pynvml, ``logging``,
``os`` or ``time``.
"""

from __future__ import annotations

from collections.abc import Mapping
from struct import pack, unpack
from typing import Any

ENV_DISABLE_CONTROL = "CUDA_DISABLE_CONTROL"

_GO_BOOLS = {
    "1": True, "t": True, "T": True, "TRUE": True, "true": True, "True": True,
    "0": False, "f": False, "F": False, "FALSE": False, "false": False, "False": False,
}  # fmt: skip


def f32(value: float) -> float:
    """``value`` rounded to the nearest IEEE float32, as Go's ``float32(...)`` does."""
    return float(unpack("f", pack("f", value))[0])


def fold_keys(obj: Mapping[str, Any]) -> dict[str, Any]:
    """``obj`` with lower-cased keys, read as Go reads a JSON object into a struct: the later key wins."""
    return {key.lower(): value for key, value in obj.items()}


def go_bool(text: str) -> bool | None:
    """``strconv.ParseBool(text)``: the boolean, or None where Go returns an error."""
    return _GO_BOOLS.get(text)


def disabling_value(container: Mapping[str, Any]) -> str | None:
    """The first literal ``CUDA_DISABLE_CONTROL`` value of ``container``'s env that Go reads as true.

    Any entry of that exact name counts (HAMi skips a false or unreadable entry and keeps looking, so
    a false entry before a true one does not help). Only a literal ``value`` text is judged: a
    ``valueFrom`` or ``envFrom`` value cannot be known here, and the node agent does not read it either.
    """
    for entry in container.get("env") or ():
        value = entry.get("name") == ENV_DISABLE_CONTROL and entry.get("value")
        if isinstance(value, str) and go_bool(value) is True:
            return value
    return None
