"""The agent's MPS pass over the node's pods: namespaces whose pod is gone are closed.

Owns :func:`close_gone` (one pass) and :func:`sweep` (the loop, every ``interval`` seconds). A
namespace is named after its container's pod (``monitor.mps.rules.namespace_pod`` reads the pod UID
back); it is closed when no pod with that UID is on the node any more, or the pod finished
(``Succeeded``/``Failed``). Only namespaces open before the pod list was read are judged, so one
opened meanwhile by Allocate is never closed by a stale list. A name that names no pod is left alone.
The daemon's own health and restarts are :meth:`MpsControl.watch`. Must not import ``hami.sim``,
grpc or pynvml.
"""

from __future__ import annotations

import asyncio
import logging

from hami import objects
from hami.kube.client import KubeError
from hami.kube.pods import list_pods
from hami.kube.protocol import KubeApi
from monitor.mps.control import MpsControl
from monitor.mps.protocol import MpsError
from monitor.mps.rules import namespace_pod

log = logging.getLogger(__name__)

FINISHED = frozenset({"Succeeded", "Failed"})


async def close_gone(control: MpsControl, *, api: KubeApi, node_name: str) -> list[str]:
    """Close the namespaces of pods no longer running on the node; returns the names closed.
    Raises :class:`KubeError` when the pods cannot be listed (nothing is closed then)."""
    before = control.namespaces
    if not before:
        return []
    pods = await list_pods(api, node_name=node_name)
    live = {objects.uid(pod) for pod in pods if objects.pod_phase(pod) not in FINISHED}
    closed: list[str] = []
    for name in before:
        uid = namespace_pod(name)
        if uid is None or uid in live:
            continue
        try:
            await control.close_namespace(name)
        except MpsError as exc:
            log.warning("MPS: namespace %s of a pod gone stays open for now: %s", name, exc)
            continue
        closed.append(name)
    return closed


async def sweep(control: MpsControl, *, api: KubeApi, node_name: str, interval: float) -> None:
    """:func:`close_gone` every ``interval`` seconds; never returns (cancel it to stop)."""
    while True:
        try:
            closed = await close_gone(control, api=api, node_name=node_name)
        except KubeError as exc:
            log.warning("MPS: cannot list node %s's pods, namespaces stay for now: %s", node_name, exc)
        else:
            if closed:
                log.info("MPS: closed the namespaces of pods gone: %s", ", ".join(closed))
        await asyncio.sleep(interval)
