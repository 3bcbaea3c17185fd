"""``hami simulate --kubeconfig``: a live cluster as the replay's node list. Read-only.

Owns :func:`load_cluster` and :func:`cluster_from_objects`. The cards and their current usage are the
scheduler's own view (:class:`~hami.scheduler.snapshot.Snapshot` fed with the Nodes and Pods, as
``hami doctor`` does): registered cards, cordons, every tracked pod's grants. CPU and memory are the
Node's ``status.allocatable`` less the requests of the pods bound to it that have not finished
(kube-scheduler's view: per pod the larger of the app containers' sum and any init container).
Nodes without a readable registration are left out. The only module of ``hami.simulate`` that
reaches a cluster.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping
from typing import Any

from hami.core.quantity import QuantityError, parse_quantity
from hami.kube import nodes as kube_nodes
from hami.kube import pods as kube_pods
from hami.kube.client import load_api_client
from hami.scheduler.snapshot import Snapshot
from hami.simulate.cluster import Cluster, NodeCapacity

MIB = 2**20


def _amount(text: Any, scale: int, divide: int = 1) -> int:
    """A quantity in the unit ``scale``/``divide`` (CPU: x1000 -> milli; memory: /2**20 -> MiB); 0 if bad."""
    try:
        value = parse_quantity(str(text)).value
    except QuantityError:
        return 0
    return max(0, int(value * scale // divide))


def pod_requests(pod: Mapping[str, Any]) -> tuple[int, int]:
    """(milli-CPU, MiB) the pod holds on its node: app containers summed vs the largest init container."""
    spec = pod.get("spec") or {}

    def one(container: Mapping[str, Any]) -> tuple[int, int]:
        requests = (container.get("resources") or {}).get("requests") or {}
        return _amount(requests.get("cpu", "0"), 1000), _amount(requests.get("memory", "0"), 1, MIB)

    apps = [one(c) for c in spec.get("containers") or []]
    inits = [one(c) for c in spec.get("initContainers") or []]
    cpu = max([sum(a[0] for a in apps), *(i[0] for i in inits)])
    memory = max([sum(a[1] for a in apps), *(i[1] for i in inits)])
    return cpu, memory


def cluster_from_objects(nodes: Iterable[Mapping[str, Any]], pods: Iterable[Mapping[str, Any]]) -> Cluster:
    """The replay cluster of these Node and Pod objects (raw JSON dicts)."""
    nodes = list(nodes)
    pods = list(pods)
    snapshot = Snapshot()
    snapshot.replace_nodes(nodes)
    snapshot.replace_pods(pods)
    used: dict[str, list[int]] = {}
    for pod in pods:
        node_name = (pod.get("spec") or {}).get("nodeName")
        phase = (pod.get("status") or {}).get("phase")
        if node_name and phase not in ("Succeeded", "Failed"):
            cpu, memory = pod_requests(pod)
            total = used.setdefault(str(node_name), [0, 0])
            total[0] += cpu
            total[1] += memory
    allocatable = {
        str((n.get("metadata") or {}).get("name")): (n.get("status") or {}).get("allocatable") or {}
        for n in nodes
    }
    states = []
    capacity = []
    for entry in snapshot.entries():
        if entry.state is None:
            continue
        offered = allocatable.get(entry.name, {})
        cpu_used, memory_used = used.get(entry.name, [0, 0])
        states.append(entry.state)
        capacity.append(
            NodeCapacity(
                cpu_milli=_amount(offered.get("cpu", "0"), 1000),
                memory_mib=_amount(offered.get("memory", "0"), 1, MIB),
                cpu_used=cpu_used,
                memory_used=memory_used,
            )
        )
    if not states:
        raise ValueError("the cluster has no node with a readable hami.io/node-nvidia-register")
    return Cluster(states=states, capacity=capacity, exact_card_mib=None)


async def _read(api: Any) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    nodes, _ = await kube_nodes.list_nodes(api)
    pods = await kube_pods.list_pods(api)
    return nodes, pods


def load_cluster(kubeconfig: str) -> Cluster:
    """Read Nodes and Pods once through ``hami.kube`` and build the cluster (nothing is written)."""
    api = load_api_client(kubeconfig, component="hami-simulate")
    try:
        nodes, pods = asyncio.run(_read(api))
    finally:
        api.close()
    return cluster_from_objects(nodes, pods)
