"""ResourceQuota reads as raw JSON dicts (the scheduler's namespace GPU quotas, docs/protocol.md, "Quotas").

Owns listing ResourceQuotas, in one namespace or in all of them (the extender keeps them live with
:class:`~hami.kube.watch.ListWatcher` kind ``resourcequotas``; ``hami explain`` reads them once). Interpreting
``spec.hard`` belongs to ``hami.scheduler.quotas``. Imports ``hami.kube.client``, ``hami.kube.paths``,
``hami.kube.protocol`` and ``hami.objects``; must not import ``hami.scheduler`` or services.
"""

from __future__ import annotations

from typing import Any

from hami import objects
from hami.kube import paths
from hami.kube.client import call_json
from hami.kube.protocol import KubeApi


async def list_resource_quotas(api: KubeApi, namespace: str | None = None) -> list[dict[str, Any]]:
    """The ResourceQuotas of ``namespace`` (every namespace when ``None``); items that are not objects
    are left out."""
    if namespace is None:
        body = await call_json(api, "GET", paths.RESOURCE_QUOTAS)
    else:
        body = await call_json(api, "GET", paths.NAMESPACE_RESOURCE_QUOTAS, params={"namespace": namespace})
    items = objects.items(body)
    if namespace is not None:  # not every API server filters by the path's namespace the same way
        items = [q for q in items if objects.namespace(q) == namespace]
    return items
