"""Namespace device quotas (docs/protocol.md, "Quotas"): a ResourceQuota's GPU limits, the admission pre-check
(docs/protocol.md, "Admission", HAMi's ``fitResourceQuota``) and the check inside Fit (docs/protocol.md, "Fit"
check 10).

Owns :func:`read_limits` (``spec.hard`` keys ``limits.<memory resource>`` / ``limits.<cores resource>``
-> :class:`QuotaLimits`: whole numbers rounded up like Go's ``Value()``, memory times ``memoryFactor``,
an unreadable value left out with a :class:`QuotaError` saying why) and :class:`LimitsBook` (those
limits for every ResourceQuota that sets one, kept by a list + watch), used by the scheduler's quota
book and by the webhook alike; :func:`admission_ask` and :func:`over_quota`, the webhook's pre-check;
and :class:`QuotaGate`: the pod's grants chosen so far for earlier containers, the current
container's position, and the namespace's :class:`~hami.core.model.NamespaceQuota`. Fit asks it
whether "earlier containers + this container's picks + this card" still fits, collapsed for init
containers (docs/protocol.md, "Usage") and summed over cards.

Admission (HAMi): the pod asks ``memory x cards`` and ``cores x cards`` summed over its app
containers, or the largest init container's if more (init containers run one after another); a
``gpumem-percentage`` counts 0 MiB there (Fit resolves it per card). ``used + ask > limit`` fails,
equality passes, a limit of 0 blocks any ask of that dimension. What Fit books for the pod is never
less than this ask, so a pod over a quota's hard limit on its own could never be placed.

Worked example: quota 10000 MiB with 4000 used; an init container took 5000 MiB on card A; the app
container asks 3000 MiB on card A -> collapsed A = max(5000, 3000) = 5000 -> 4000 + 5000 <= 10000
passes; asking 7000 MiB instead -> max(5000, 7000) = 7000 -> 11000 > 10000 fails.

Pure: stdlib and :mod:`hami.objects` only; must not import a Kubernetes client, aiohttp, kopf, grpc,
pynvml, ``logging``, ``os`` or ``time``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from hami import objects
from hami.core.model import ContainerRequest, NamespaceQuota
from hami.core.quantity import QuantityError, parse_quantity
from hami.core.usage import collapse

#: One container's entries as ``(uuid, memory, cores)``.
Entries = tuple[tuple[str, int, int], ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class QuotaGate:
    quota: NamespaceQuota
    earlier: tuple[Entries, ...]  # containers before the current one, in pod order
    position: int  # the current container's index in init+app order
    init_count: int

    def allows(self, picks: Sequence[tuple[str, int, int]]) -> bool:
        """Would the pod, with ``picks`` for the current container, stay within the quota?"""
        containers: list[Sequence[tuple[str, int, int]]] = list(self.earlier)
        # Pad so the current container keeps its init/app role in the collapse.
        containers += [()] * (self.position - len(containers))
        containers.append(picks)
        folded = collapse(containers, self.init_count)
        memory = sum(m for _, m, _ in folded.values())
        cores = sum(c for _, _, c in folded.values())
        return self.quota.allows(memory, cores)


# ------------------------------------------------------------------------- ResourceQuota limits


@dataclass(frozen=True, slots=True, kw_only=True)
class QuotaKeys:
    """The ``spec.hard`` keys of one device's GPU limits, and its effective ``memoryFactor`` (>= 1)."""

    memory: str  # e.g. "limits.nvidia.com/gpumem"; "" when the device has no memory resource
    cores: str
    memory_factor: int = 1

    @classmethod
    def of(cls, memory_resource: str, cores_resource: str, memory_factor: int = 1) -> QuotaKeys:
        return cls(
            memory=f"limits.{memory_resource}" if memory_resource else "",
            cores=f"limits.{cores_resource}" if cores_resource else "",
            memory_factor=max(memory_factor, 1),
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class QuotaLimits:
    """The two limits one ResourceQuota sets (``None`` = that quota does not set it)."""

    memory: int | None = None  # MiB as booked: already multiplied by memoryFactor
    cores: int | None = None


class QuotaError(ValueError):
    """One ``spec.hard`` value that cannot be a limit; the message names the quota, key and text."""


def parse_limit(namespace: str, name: str, key: str, text: Any) -> int:
    """One ``spec.hard`` value -> a whole non-negative number (rounded up), or :class:`QuotaError`."""
    where = f"resourcequota {namespace}/{name}: spec.hard[{key}]"
    if not isinstance(text, str):
        raise QuotaError(f"{where} = {text!r} is not a quantity string")
    try:
        value = parse_quantity(text).value
    except QuantityError as exc:
        raise QuotaError(f"{where}: {exc}") from None
    if value < 0:
        raise QuotaError(f"{where} = {text!r} is negative")
    return math.ceil(value)


def read_limits(
    namespace: str, name: str, hard: Mapping[str, Any], keys: QuotaKeys
) -> tuple[QuotaLimits, tuple[QuotaError, ...]]:
    """The GPU limits of one ResourceQuota's ``spec.hard``; an unreadable value is left out (the other
    limit still counts) and returned as an error for the caller to report."""
    found: dict[str, int | None] = {"memory": None, "cores": None}
    errors: list[QuotaError] = []
    for field, key, factor in (("memory", keys.memory, keys.memory_factor), ("cores", keys.cores, 1)):
        if not key or key not in hard:
            continue
        try:
            found[field] = parse_limit(namespace, name, key, hard[key]) * factor
        except QuotaError as exc:
            errors.append(exc)
    return QuotaLimits(memory=found["memory"], cores=found["cores"]), tuple(errors)


QuotaKey = tuple[str, str]  # (namespace, name) of one ResourceQuota


def quota_key(obj: Mapping[str, Any]) -> QuotaKey:
    return objects.namespace(obj), objects.name(obj)


class LimitsBook:
    """The GPU limits of every ResourceQuota that sets one, by namespace, fed with raw ResourceQuota
    objects by a list + watch (``replace``/``listed``/``event``, like the scheduler's other books).

    No I/O and no logging: the feeding methods return the unreadable values they met (:class:`QuotaError`)
    for the caller to report; such a value is left out and the quota's other limit still counts.
    """

    def __init__(self, keys: QuotaKeys) -> None:
        self.keys = keys
        self._limits: dict[QuotaKey, QuotaLimits] = {}
        self._by_namespace: dict[str, set[QuotaKey]] = {}
        self.synced = False

    def replace(self, items: Iterable[Mapping[str, Any]]) -> list[QuotaError]:
        """A full ResourceQuota list: upsert each, forget the ones that are gone."""
        listed = list(items)
        errors = [e for obj in listed for e in self.event("ADDED", obj)]
        self.listed(listed)
        return errors

    def listed(self, items: Iterable[Mapping[str, Any]]) -> None:
        """A list is complete and each of ``items`` already came through :meth:`event`: forget the rest."""
        seen = {quota_key(obj) for obj in items}
        for key in [k for k in self._limits if k not in seen]:
            self._drop(key)
        self.synced = True

    def event(self, kind: str, obj: Mapping[str, Any]) -> tuple[QuotaError, ...]:
        key = quota_key(obj)
        if kind == "DELETED":
            self._drop(key)
            return ()
        limits, errors = self.limits_of(obj)
        if limits.memory is None and limits.cores is None:
            self._drop(key)  # no GPU limit (left): this quota does not concern us
        else:
            self._limits[key] = limits
            self._by_namespace.setdefault(key[0], set()).add(key)
        return errors

    def limits_of(self, obj: Mapping[str, Any]) -> tuple[QuotaLimits, tuple[QuotaError, ...]]:
        """The GPU limits of one ResourceQuota object (:func:`read_limits` on its ``spec.hard``)."""
        hard = objects.spec(obj).get("hard") or {}
        if not isinstance(hard, Mapping):
            return QuotaLimits(), ()
        return read_limits(*quota_key(obj), hard, self.keys)

    def _drop(self, key: QuotaKey) -> None:
        if self._limits.pop(key, None) is not None:
            keys = self._by_namespace[key[0]]
            keys.discard(key)
            if not keys:
                del self._by_namespace[key[0]]

    def of(self, namespace: str) -> list[tuple[str, QuotaLimits]]:
        """``("namespace/name", limits)`` of each quota in ``namespace`` that limits GPUs, by name."""
        keys = sorted(self._by_namespace.get(namespace, ()))
        return [(f"{ns}/{name}", self._limits[(ns, name)]) for ns, name in keys]

    def __len__(self) -> int:
        return len(self._limits)


# ---------------------------------------------------------------------- the admission pre-check


@dataclass(frozen=True, slots=True)
class QuotaAsk:
    """What a new pod asks of its namespace's GPU quota (MiB as booked, cores in percent of a card)."""

    memory: int
    cores: int


def admission_ask(containers: Iterable[ContainerRequest | None], init_count: int) -> QuotaAsk:
    """HAMi's ``fitResourceQuota`` sum: app containers add up, init containers count at their peak."""
    app = [0, 0]
    init = [0, 0]
    for position, request in enumerate(containers):
        if request is None or request.nums <= 0:
            continue
        memory, cores = request.memory_mib * request.nums, request.cores * request.nums
        if position < init_count:
            init = [max(init[0], memory), max(init[1], cores)]
        else:
            app = [app[0] + memory, app[1] + cores]
    return QuotaAsk(memory=max(app[0], init[0]), cores=max(app[1], init[1]))


def over_quota(ask: QuotaAsk, quotas: Iterable[tuple[str, QuotaLimits]], keys: QuotaKeys) -> list[str]:
    """One message per (quota, limit) that ``ask`` alone exceeds, naming the quota (``namespace/name``)
    and the ``spec.hard`` key, amounts in the units the pod and the quota are written in."""
    factor = keys.memory_factor
    found: list[str] = []
    for name, limits in quotas:
        for key, asked, limit, scale in (
            (keys.memory, ask.memory, limits.memory, factor),
            (keys.cores, ask.cores, limits.cores, 1),
        ):
            if limit is not None and asked > limit:
                found.append(
                    f"the pod asks for {asked // scale} of {key}, more than resourcequota {name} allows "
                    f"in all ({limit // scale})"
                )
    return found
