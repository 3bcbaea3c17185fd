"""Go's ``strconv.ParseBool``, and the ``CUDA_DISABLE_CONTROL`` rule HAMi builds on it.

Owns :func:`go_bool` (the one reading of a boolean text that HAMi's Go code makes: exactly
``1 t T TRUE true True`` and ``0 f F FALSE false False``, nothing trimmed or case-folded) and
:func:`disabling_value`: whether a container's env turns HAMi-core off. With ``CUDA_DISABLE_CONTROL``
true the node agent does not mount ``/etc/ld.so.preload`` (spec-node-chart §A.9), so the container's
memory and core limits are not enforced. The node agent (``monitor.allocate_rules``) decides the mount
with it and the webhook (``webhook.isolation``) refuses such a container on a shared card with it, so
the two can never disagree; the codec reads ``nvidia.com/numa-bind`` and a card's health field with
:func:`go_bool`.

Pure: stdlib only; must not import a Kubernetes client, aiohttp, kopf, grpc, pynvml, ``logging``,
``os`` or ``time``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

ENV_DISABLE_CONTROL = "CUDA_DISABLE_CONTROL"

_GO_BOOLS = {
    "1": True, "t": True, "T": True, "TRUE": True, "true": True, "True": True,
    "0": False, "f": False, "F": False, "FALSE": False, "false": False, "False": False,
}  # fmt: skip


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
