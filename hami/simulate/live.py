"""``hami simulate --kubeconfig``: a live cluster as the replay's node list. Read-only.

Owns :func:`load_cluster` and :func:`cluster_from_objects`. The cards and their current usage are the
scheduler's own view (:class:`~hami.scheduler.snapshot.Snapshot` fed with the Nodes and Pods, as
``hami doctor`` does): registered cards, cordons, every tracked pod's grants. CPU and memory are the
Node's ``status.allocatable`` less the requests of the pods bound to it that have not finished
(``hami.annotations.holding`` without a grant required; kube-scheduler's view: per pod the larger of
the app containers' sum and any init container).
Nodes without a readable registration are left out. The only module of ``hami.simulate`` that
reaches a cluster.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping
from typing import Any

from hami import objects
from hami.annotations.holding import holding
from hami.kube import nodes as kube_nodes
from hami.kube import pods as kube_pods
from hami.kube.client import load_api_client
from hami.kube.protocol import KubeApi
from hami.objects import RawNode, RawPod
from hami.scheduler.snapshot import Snapshot
from hami.simulate.cluster import Cluster, NodeCapacity
from hami.simulate.manifests import MIB, amount, pod_requests


def cluster_from_objects(nodes: Iterable[Mapping[str, Any]], pods: Iterable[Mapping[str, Any]]) -> Cluster:
    """The replay cluster of these Node and Pod objects (raw JSON dicts)."""
    nodes = list(nodes)
    pods = list(pods)
    snapshot = Snapshot()
    snapshot.replace_nodes(nodes)
    snapshot.replace_pods(pods)
    used: dict[str, list[int]] = {}
    for pod in pods:
        node_name = holding(pod, grant_required=False).node  # bound there and not finished
        if node_name is not None:
            cpu, memory = pod_requests(pod)
            total = used.setdefault(node_name, [0, 0])
            total[0] += cpu
            total[1] += memory
    allocatable = {objects.name(n): objects.allocatable(n) for n in nodes}
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
                cpu_milli=amount(offered.get("cpu", "0"), 1000),
                memory_mib=amount(offered.get("memory", "0"), 1, MIB),
                cpu_used=cpu_used,
                memory_used=memory_used,
            )
        )
    if not states:
        raise ValueError("the cluster has no node with a readable hami.io/node-nvidia-register")
    return Cluster(states=states, capacity=capacity, exact_card_mib=None)


async def _read(api: KubeApi) -> tuple[list[RawNode], list[RawPod]]:
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
