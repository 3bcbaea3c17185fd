"""The admission-time ResourceQuota pre-check (spec-scheduler §4 step 7, HAMi's ``fitResourceQuota``).

Owns :class:`QuotaCheck`: for a GPU pod :func:`webhook.mutation.plan` admits with a
``quota_ask``, it lists the ResourceQuotas of the pod's namespace (``hami.kube.quotas``, one request)
and refuses the pod (403, reason ``exceeding_quota``) when its ask alone exceeds a quota's hard GPU
limit, every such quota and key named: ``exceeding resource quota: the pod asks for 10000 of
limits.nvidia.com/gpumem, more than resourcequota team/gpu allows in all (8000)``. Which keys count,
how a limit is read and what a pod asks are the core's rules (:mod:`hami.core.quota`), shared with the
scheduler's quota book.

Against the hard limit only: HAMi's webhook runs inside its scheduler and subtracts the usage the
scheduler tracks; ours is a separate process, and knowing usage would mean reading every pod of the
namespace on each admission. The scheduler counts usage at filter and bind, so a pod that fits alone
but not beside the namespace's other pods waits (Pending, ``ResourceQuotaNotFit``) instead of being
refused (docs/compatibility.md). Fails open: when the quotas cannot be read the pod is admitted and
a warning logged, since filter still enforces the quota. An unreadable limit is logged once and left
out, as the scheduler does. Must not import ``kubernetes`` (the client is reached through ``hami.kube``).
"""

from __future__ import annotations

import logging
from typing import Any

from hami.core.quota import QuotaAsk, QuotaKeys, QuotaLimits, over_quota, read_limits
from hami.kube.client import KubeError
from hami.kube.quotas import list_resource_quotas
from hami.settings import DeviceConfig
from webhook.mutation import CODE_FORBIDDEN, EXCEEDING_QUOTA, Refuse

logger = logging.getLogger("hami.webhook.quota")

#: HAMi's refusal text, which every message starts with.
EXCEEDING = "exceeding resource quota"
#: Distinct unreadable-limit messages remembered so each is logged once (bounded: quotas are few).
_REPORTED_MAX = 1024


class QuotaCheck:
    """Reads a namespace's ResourceQuotas on demand and judges a pod's ask against them."""

    def __init__(self, api: Any, device: DeviceConfig) -> None:
        res = device.resources
        self._api = api
        self.keys = QuotaKeys.of(res.memory, res.cores, device.effective_memory_factor)
        self._reported: set[str] = set()

    async def refusal(self, namespace: str, ask: QuotaAsk) -> Refuse | None:
        """The refusal of a pod of ``namespace`` asking ``ask``, or None (within every quota, no quota,
        or the quotas could not be read)."""
        if not namespace:
            return None  # kube-apiserver always fills it in; a hand-made review may not
        try:
            items = await list_resource_quotas(self._api, namespace)
        except KubeError as exc:
            logger.warning(
                "cannot read the ResourceQuotas of namespace %s (%s); admitting the pod without the "
                "quota pre-check: the scheduler enforces the quota",
                namespace,
                exc,
            )
            return None
        problems = over_quota(ask, self._limits(items), self.keys)
        if not problems:
            return None
        return Refuse(
            message=f"{EXCEEDING}: " + "; ".join(problems), code=CODE_FORBIDDEN, reason=EXCEEDING_QUOTA
        )

    def _limits(self, items: list[dict[str, Any]]) -> list[tuple[str, QuotaLimits]]:
        found: list[tuple[str, QuotaLimits]] = []
        for item in items:
            metadata = item.get("metadata") or {}
            namespace, name = str(metadata.get("namespace") or ""), str(metadata.get("name") or "")
            hard = (item.get("spec") or {}).get("hard") or {}
            if not isinstance(hard, dict):
                continue
            limits, errors = read_limits(namespace, name, hard, self.keys)
            for exc in errors:
                self._report(str(exc))
            found.append((f"{namespace}/{name}", limits))
        return found

    def _report(self, message: str) -> None:
        if message in self._reported:
            return
        if len(self._reported) >= _REPORTED_MAX:
            self._reported.clear()
        self._reported.add(message)
        logger.warning("%s; the value is ignored", message)
