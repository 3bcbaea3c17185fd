"""The agent's MPS passes over the node's pods: namespaces whose pod is gone are closed, and those of
the pods running here are rebuilt on a new daemon.

Owns :func:`close_gone` (one pass), :func:`sweep` (the loop, every ``interval`` seconds) and
:func:`restore`. A namespace is named after its container's pod (``nodeagent.mps.rules.namespace_pod``
reads the pod UID back); it is closed when no pod with that UID is on the node any more, or the pod
finished (``Succeeded``/``Failed``). Only namespaces open before the pods were read are judged, so
one opened meanwhile by Allocate is never closed by a stale read. The pods come from the agent's pod
cache (``nodeagent.podcache``) while it is synced; a namespace or directory is only closed or removed
once one fresh list confirms its pod is gone (the cache may not show a pod bound moments ago yet), so a
pass where every pod is still there makes no API request. A name that names no pod is left
alone. The same pass removes the directories under ``<pipe>/hami`` a previous daemon left for pods
gone (:meth:`MpsControl.remove_leftover_dirs`: never one the daemon still has).

:func:`restore`: a daemon that is new to the agent (the agent's container restarted and its daemon
died with it, or the daemon was restarted) holds none of the namespaces of the pods running on the
node, whose containers then find no socket in their pipe directory. For every pod on the node that has
not finished and carries ``hami.io/vgpu-devices-allocated``, each container with grants gets its
namespace ``<uid>-<index>`` opened again with the limits Allocate computes
(``nodeagent.mps.rules.card_limits``); the daemon is then marked restored, and only then does the node
report ``mps-namespaced`` again. The agent runs it after :meth:`MpsControl.start` (before the device
plugin serves) and from :meth:`MpsControl.watch` after each new daemon. The daemon's own health and
restarts are :meth:`MpsControl.watch`. Must not import ``hami_testkit``, grpc or pynvml.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from hami import objects
from hami.annotations import AnnotationError, read_pod_devices
from hami.kube.client import KubeError
from hami.kube.protocol import KubeApi
from nodeagent.allocate_rules import AllocationError
from nodeagent.mps.control import MpsControl
from nodeagent.mps.protocol import MpsError, MpsNameError
from nodeagent.mps.rules import card_limits, namespace_name, namespace_pod
from nodeagent.podcache import ListedPods, NodePods

log = logging.getLogger(__name__)


def _live(pods: Sequence[Mapping[str, Any]]) -> set[str]:
    return {objects.uid(pod) for pod in pods if not objects.finished(pod)}


def _gone(names: Iterable[str], live: set[str]) -> list[str]:
    return [name for name in names if (uid := namespace_pod(name)) is not None and uid not in live]


async def close_gone(
    control: MpsControl, *, api: KubeApi, node_name: str, pods: NodePods | None = None
) -> list[str]:
    """Close the namespaces of pods no longer running on the node, and remove the directories left for
    such pods; returns the namespaces closed. Raises :class:`KubeError` when the pods cannot be listed
    (nothing is closed or removed then)."""
    source = pods if pods is not None else ListedPods(api, node_name)
    before = control.namespaces
    leftovers = await control.leftover_dirs()
    if not before and not leftovers:
        return []
    view = await source.view()
    live = _live(view.pods)
    if not view.fresh and (_gone(before, live) or _gone(leftovers, live)):
        live = _live((await source.listed()).pods)  # confirmed on the API server before anything goes
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
    gone = _gone(leftovers, live)
    if gone:
        try:
            await control.remove_leftover_dirs(gone)
        except MpsError as exc:
            log.warning("MPS: the directories of namespaces gone stay for now: %s", exc)
    return closed


async def restore(
    control: MpsControl,
    *,
    api: KubeApi,
    node_name: str,
    core_limit: bool = True,
    pods: NodePods | None = None,
) -> bool:
    """Open the namespaces of the pods running on the node on the daemon that answers now (module
    docstring); True when done and the daemon is marked restored. False (logged; the caller tries
    again later) when the daemon is down, the pods cannot be listed, or the daemon refused a namespace
    for a reason that is not the pod's own. A pod whose annotation, UID or grant cannot make a namespace
    is logged and skipped (Allocate refused or would refuse it too). ``core_limit``: the device config's
    ``disableCoreLimit`` off, as Allocate reads it. Never raises."""
    state = await control.check()
    pid = control.daemon_pid
    if not state.running or pid is None:
        return False
    if not state.namespaces:  # per-client limits: nothing is held on the daemon's side
        return control.mark_restored(pid)
    source = pods if pods is not None else ListedPods(api, node_name)
    try:
        # one fresh list: a pod Allocate served moments ago gets its namespace back too
        running = (await source.listed()).pods
    except KubeError as exc:
        log.warning("MPS: cannot list node %s's pods to restore their namespaces: %s", node_name, exc)
        return False
    opened: list[str] = []
    for pod in running:
        if objects.finished(pod):
            continue
        where = f"pod {objects.namespace(pod)}/{objects.name(pod)}"
        try:
            devices = read_pod_devices(pod)
        except AnnotationError as exc:
            log.warning("MPS: %s: its namespaces are not restored: %s", where, exc)
            continue
        for index, grants in enumerate(devices or ()):
            if not grants:
                continue
            try:
                name = namespace_name(objects.uid(pod) or "", index)
                await control.open_namespace(name, card_limits(grants, core_limit=core_limit))
            except (AllocationError, MpsNameError) as exc:
                log.warning("MPS: %s: container %d's namespace is not restored: %s", where, index, exc)
                continue
            except MpsError as exc:
                log.warning("MPS: restoring the namespaces of node %s's pods stopped: %s", node_name, exc)
                return False
            opened.append(name)
    if not control.mark_restored(pid):
        return False
    log.info(
        "MPS: namespaces of the pods running here restored on daemon pid %d: %s",
        pid,
        ", ".join(opened) or "none",
    )
    return True


async def sweep(
    control: MpsControl, *, api: KubeApi, node_name: str, interval: float, pods: NodePods | None = None
) -> None:
    """:func:`close_gone` every ``interval`` seconds; never returns (cancel it to stop)."""
    while True:
        try:
            closed = await close_gone(control, api=api, node_name=node_name, pods=pods)
        except KubeError as exc:
            log.warning("MPS: cannot list node %s's pods, namespaces stay for now: %s", node_name, exc)
        else:
            if closed:
                log.info("MPS: closed the namespaces of pods gone: %s", ", ".join(closed))
        await asyncio.sleep(interval)
