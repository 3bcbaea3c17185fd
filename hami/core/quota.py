"""Namespace device quota inside Fit (spec-scheduler §14, check 10 of §8).

Owns :class:`QuotaGate`: the pod's grants chosen so far for earlier containers, the current
container's position, and the namespace's :class:`~hami.core.model.NamespaceQuota`. Fit asks it
whether "earlier containers + this container's picks + this card" still fits, collapsed for init
containers like §6 and summed over cards.

Worked example: quota 10000 MiB with 4000 used; an init container took 5000 MiB on card A; the app
container asks 3000 MiB on card A -> collapsed A = max(5000, 3000) = 5000 -> 4000 + 5000 <= 10000
passes; asking 7000 MiB instead -> max(5000, 7000) = 7000 -> 11000 > 10000 fails.

Pure: stdlib only; must not import a Kubernetes client, aiohttp, kopf, grpc, pynvml, ``logging``,
``os`` or ``time``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from hami.core.model import NamespaceQuota
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
