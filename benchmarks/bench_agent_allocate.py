"""The node agent's ``Allocate``: what kubelet waits for when it admits one GPU pod.

Set-up: the embedded API server (``hami_testkit.apiserver``, kmock) in a child process, holding one Node
and N running pods bound to it (other pods of the node: the agent lists them to pair kubelet's call).
In this process: the agent's parts as ``nodeagent.__main__`` wires them (8 simulated A100-80GB cards
read into the inventory, the pod cache started on the node, the Allocator, the device plugin's
service), and this benchmark playing kubelet: it calls the service's ``Allocate`` handler with
kubelet's request message, as the gRPC server would (the unix socket and gRPC's own framing are left
out: grpc is imported only by the device plugin, docs/architecture.md, "Import contracts", 7).

Per call: a pod is created as the scheduler's bind leaves it (one container, one card, 1000 MiB and
10 % of a card; the allocation and bind annotations written by the codec) and takes the node lock
through ``hami.kube`` (not timed); then timed: kubelet's ``Allocate`` for its one card, through the
agent's whole hand-off (a fresh list of the node's pods, the pairing and hand-out checks, the envs and
mounts, the pod's annotations patched, ``bind-phase=success``, the node lock released). Not timed
after each call: the pod is deleted, so every call sees the same N other pods.

Baseline, in the same run after each call: one LIST of the node's pods through the same client (the
list Allocate makes itself); the ratio is the median call over the median list.
"""

from __future__ import annotations

import asyncio
import datetime
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
import yaml

from benchmarks.childserver import apiserver_process
from benchmarks.table import Table, ms, percentile
from hami.annotations import BindPhase, allocation_annotations, bind_annotations
from hami.core.model import Grant
from hami.kube.client import load_api_client
from hami.kube.nodelock import acquire_node_lock
from hami.kube.pods import list_pods
from hami.kubeletapi import api_pb2
from hami_testkit.apiserver import write_kubeconfig
from hami_testkit.kubeapi import SimApi, nodes_path, pods_path
from nodeagent.allocate_call import Allocator
from nodeagent.backends.simulated import SimBackend
from nodeagent.config import NodeSettings
from nodeagent.deviceplugin.server import DevicePluginService
from nodeagent.inventory import Inventory
from nodeagent.podcache import PodCache

#: (other pods on the node, Allocate calls)
SIZES = ((10, 100), (80, 100))
WARM_UP = 5
NODE = "gpu-0"
NAMESPACE = "default"
CARDS = 8
SERVER = """
import asyncio, sys
from hami_testkit.apiserver import embedded_apiserver

async def main():
    async with embedded_apiserver(request_log=64) as k:
        print(str(k.url).rstrip("/"), flush=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)  # until stdin closes

asyncio.run(main())
"""


def _uuid(index: int) -> str:
    return f"GPU-00000000-0000-0000-0000-{index:012d}"


def _pod(name: str, card: int, *, running: bool) -> dict[str, Any]:
    """A pod as bind leaves it on :data:`NODE` (1 card), or as it runs after its Allocate."""
    bound_at = datetime.datetime.now(datetime.UTC)
    grant = ((Grant(uuid=_uuid(card), memory_mib=1000, cores=10),),)
    annotations = allocation_annotations(node=NODE, devices=grant, now=bound_at)
    phase = BindPhase.SUCCESS if running else BindPhase.ALLOCATING
    annotations.update(bind_annotations(phase, now=bound_at))
    limits = {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "1000"}
    pod: dict[str, Any] = {
        "metadata": {"name": name, "namespace": NAMESPACE, "annotations": annotations},
        "spec": {
            "nodeName": NODE,
            "schedulerName": "hami-scheduler",
            "containers": [{"name": "main", "image": "cuda:12", "resources": {"limits": limits}}],
        },
    }
    if running:
        pod["status"] = {"phase": "Running"}
    return pod


class _Call:
    """The gRPC call context the device plugin's handler is given: a refusal ends the benchmark."""

    async def abort(self, code: object, details: str) -> None:
        raise RuntimeError(f"Allocate refused ({code}): {details}")


async def _calls(others: int, calls: int) -> tuple[list[float], list[float]]:
    """Seconds per Allocate and per baseline LIST."""
    allocations: list[float] = []
    lists: list[float] = []
    with tempfile.TemporaryDirectory(prefix="hb-", dir="/tmp") as tmp, apiserver_process(SERVER) as url:
        root = Path(tmp)
        kubeconfig = write_kubeconfig(root / "kubeconfig", url)
        cards = [
            {
                "uuid": _uuid(i),
                "model": "NVIDIA A100-SXM4-80GB",
                "memory_mib": 81920,
                "numa": i // 4,
                "healthy": True,
            }
            for i in range(CARDS)
        ]
        (root / "cards.yaml").write_text(yaml.safe_dump({"cards": cards}), encoding="utf-8")
        async with aiohttp.ClientSession() as session:
            seeder = SimApi(session, url)
            await seeder.create(nodes_path(), {"metadata": {"name": NODE}})
            for index in range(others):
                await seeder.create(
                    pods_path(NAMESPACE), _pod(f"running-{index:03d}", index % CARDS, running=True)
                )
            api = load_api_client(str(kubeconfig), component="bench")
            settings = NodeSettings()
            backend = SimBackend(root / "cards.yaml")
            inventory = Inventory(backend)
            await inventory.refresh()
            pods = PodCache(api, NODE)
            pods.start()
            allocator = Allocator(
                api=api,
                node_name=NODE,
                settings=settings,
                hook_path=root / "hook",
                lock_dir=root / "vgpulock",
                backend=backend,
                inventory=inventory,
                pods=pods,
            )
            service = DevicePluginService(inventory=inventory, settings=settings, allocator=allocator)
            try:
                await pods.wait_synced()
                for index in range(calls + WARM_UP):
                    name = f"admitted-{index:04d}"
                    card = index % CARDS
                    await seeder.create(pods_path(NAMESPACE), _pod(name, card, running=False))
                    now = datetime.datetime.now(datetime.UTC)
                    await acquire_node_lock(api, NODE, NAMESPACE, name, now=now)
                    request = api_pb2.AllocateRequest(
                        container_requests=[
                            api_pb2.ContainerAllocateRequest(devices_ids=[f"{_uuid(card)}-0"])
                        ]
                    )
                    started = time.perf_counter()
                    answer = await service.Allocate(request, _Call())
                    elapsed = time.perf_counter() - started
                    assert len(answer.container_responses) == 1
                    started = time.perf_counter()
                    listed = await list_pods(api, node_name=NODE)
                    listed_in = time.perf_counter() - started
                    assert len(listed) == others + 1
                    await seeder.delete(pods_path(NAMESPACE, name))
                    if index >= WARM_UP:
                        allocations.append(elapsed)
                        lists.append(listed_in)
            finally:
                await allocator.events.drain()
                await pods.stop()
                backend.close()
                api.close()
    return allocations, lists


def run() -> list[Table]:
    table = Table(
        title="node agent: kubelet's Allocate for one pod (1 card), the device plugin's handler, N other "
        "pods on the node (API server: kmock in another process); baseline: one LIST of the node's pods",
        columns=("other pods", "calls", "median ms", "p99 ms", "max ms", "LIST ms", "x LIST"),
    )
    for others, calls in SIZES:
        allocations, lists = asyncio.run(_calls(others, calls))
        median, base = statistics.median(allocations), statistics.median(lists)
        table.rows.append(
            (
                str(others),
                str(len(allocations)),
                ms(median),
                ms(percentile(allocations, 99)),
                ms(max(allocations)),
                ms(base),
                f"{median / base:.1f}",
            )
        )
    return [table]
