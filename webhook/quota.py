"""The admission-time ResourceQuota pre-check (docs/protocol.md, "Quotas", HAMi's ``fitResourceQuota``).

Owns :class:`QuotaCheck`: the GPU limits of every ResourceQuota, kept by a list + watch
(:func:`watch_quotas`, ``hami.kube.watch``), and the judgement of a GPU pod that
:func:`webhook.mutation.plan` admits with a ``quota_ask``: refused (403, reason ``exceeding_quota``)
when its ask alone exceeds a quota's hard GPU limit, every such quota and key named:
``exceeding resource quota: the pod asks for 10000 of limits.nvidia.com/gpumem, more than
resourcequota team/gpu allows in all (8000)``. Which keys count, how a limit is read and what a pod
asks are the core's rules (:mod:`hami.core.quota`), shared with the scheduler's quota book. Admission
itself makes no API call.

Against the hard limit only: HAMi's webhook runs inside its scheduler and adds the usage the scheduler
tracks; ours is a separate process, and knowing usage would mean watching every pod of the cluster.
The scheduler counts usage at filter and bind, so a pod that fits alone but not beside the
namespace's other pods waits (Pending, ``ResourceQuotaNotFit``) instead of being refused
(docs/compatibility.md). Fails open: until the first list succeeds the pre-check is off (a warning
says so), since filter still enforces the quota. An unreadable limit is logged once and left out, as
the scheduler does. Must not import ``kubernetes`` (the client is reached through ``hami.kube``).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable, Mapping
from typing import Any

from hami.core.quota import LimitsBook, QuotaAsk, QuotaError, QuotaKeys, over_quota
from hami.kube.protocol import KubeApi
from hami.kube.watch import ListWatcher
from hami.settings import DeviceConfig
from webhook.mutation import CODE_FORBIDDEN, EXCEEDING_QUOTA, Refuse

logger = logging.getLogger("hami.webhook.quota")

#: HAMi's refusal text, which every message starts with.
EXCEEDING = "exceeding resource quota"
#: Distinct unreadable-limit messages remembered so each is logged once (bounded: quotas are few).
_REPORTED_MAX = 1024


class QuotaCheck:
    """The cluster's ResourceQuota GPU limits (fed on the event loop) and the pre-check against them."""

    def __init__(self, device: DeviceConfig) -> None:
        res = device.resources
        self.book = LimitsBook(QuotaKeys.of(res.memory, res.cores, device.effective_memory_factor))
        self._reported: set[str] = set()
        self._warned = False

    def listed(self, items: Iterable[Mapping[str, Any]]) -> None:
        """The list is complete (each item came through :meth:`event`): the pre-check is on."""
        self.book.listed(items)
        self._warned = False

    def event(self, kind: str, obj: Mapping[str, Any]) -> None:
        self._report(self.book.event(kind, obj))

    def refusal(self, namespace: str, ask: QuotaAsk) -> Refuse | None:
        """The refusal of a pod of ``namespace`` asking ``ask``, or None (within every quota, no quota,
        or the quotas are not listed yet)."""
        if not self.book.synced:
            if not self._warned:
                self._warned = True
                logger.warning(
                    "the ResourceQuotas are not listed yet; GPU pods are admitted without the quota "
                    "pre-check until they are (the scheduler enforces the quota)"
                )
            return None
        problems = over_quota(ask, self.book.of(namespace), self.book.keys)
        if not problems:
            return None
        message = f"{EXCEEDING}: " + "; ".join(problems)
        return Refuse(message=message, code=CODE_FORBIDDEN, reason=EXCEEDING_QUOTA)

    def _report(self, errors: Iterable[QuotaError]) -> None:
        for exc in errors:
            if str(exc) in self._reported:
                continue
            if len(self._reported) >= _REPORTED_MAX:
                self._reported.clear()
            self._reported.add(str(exc))
            logger.warning("%s; the value is ignored", exc)


def watch_quotas(api: KubeApi, check: QuotaCheck, loop: asyncio.AbstractEventLoop) -> ListWatcher:
    """A started list + watch of every ResourceQuota feeding ``check`` on ``loop`` (stop it when done)."""
    watcher = ListWatcher(api, "resourcequotas", loop=loop, on_list=check.listed, on_event=check.event)
    watcher.start()
    return watcher
