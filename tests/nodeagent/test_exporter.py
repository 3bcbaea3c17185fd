"""The node exporter end to end: a real /metrics endpoint on an OS-chosen port, the embedded API server
holding pods with codec-built allocations, simulated cards from a file, and a fake /proc for cgroups.
Every assertion is on a scraped VALUE, derived in a comment from the pods and the cards file."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import kmock
from prometheus_client import CollectorRegistry

from hami.annotations import POD_DEVICES_ALLOCATED, POD_VGPU_NODE
from hami.process.flags import Address
from hami.process.http import alive, listening, metrics_app
from nodeagent.backends.simulated import SimBackend
from nodeagent.cgroups import ProcessOwners
from nodeagent.config import NodeSettings
from nodeagent.exporter import NodeCollector
from nodeagent.grants import GrantBook
from nodeagent.inventory import Inventory
from tests.eventually import eventually

from .agent_helpers import card, write_cards
from .exporter_helpers import (
    MIB,
    NODE,
    Samples,
    container_id,
    create_gpu_pod,
    grant,
    pod_uid,
    scrape,
    value,
    values,
    write_cgroup,
)

POD = "/api/v1/namespaces/default/pods/"


@dataclass
class Exporter:
    url: str
    inventory: Inventory
    grants: GrantBook
    cards_file: Path

    async def scrape(self) -> Samples:
        return await scrape(self.url + "/metrics")


@asynccontextmanager
async def running_exporter(
    api: Any,
    tmp_path: Path,
    cards: list[dict[str, Any]],
    *,
    settings: NodeSettings | None = None,
    legacy: bool = False,
) -> AsyncIterator[Exporter]:
    """The exporter as the agent wires it, on 127.0.0.1:0; stopped (server closed) on exit."""
    cards_file = write_cards(tmp_path / "cards.yaml", cards)
    backend = SimBackend(cards_file)
    inventory = Inventory(backend)
    await inventory.refresh()
    grants = GrantBook(api=api, node_name=NODE)
    registry = CollectorRegistry()
    registry.register(
        NodeCollector(
            node_name=NODE,
            inventory=inventory,
            settings=settings or NodeSettings(),
            grants=grants,
            owners=ProcessOwners(tmp_path / "proc"),
            legacy=legacy,
        )
    )
    app = metrics_app(registry, blocking=True, routes={"/healthz": alive})  # as the agent serves it
    async with listening(app, Address(host="127.0.0.1", port=0)) as bound:
        assert bound.port != 0
        yield Exporter(url=f"http://{bound}", inventory=inventory, grants=grants, cards_file=cards_file)
    backend.close()


TWO_CARDS = [card("GPU-0000", memory=32768), card("GPU-0001", memory=16384, numa=1)]


async def test_card_allocation_is_the_sum_of_the_grants(
    apiserver: kmock.KubernetesEmulator, api: Any, tmp_path: Path
) -> None:
    await create_gpu_pod(apiserver, "p1", [[grant("GPU-0000", 4000, 20)]], containers=["main"])
    await create_gpu_pod(
        apiserver,
        "p2",
        [[grant("GPU-0000", 2000, 10), grant("GPU-0001", 1000, 30)], [grant("GPU-0000", 3000, 25)]],
        containers=["c1", "c2"],
        namespace="team-a",
    )
    # Not counted: another node's pod, a finished pod, a pod whose annotation cannot be read.
    await create_gpu_pod(apiserver, "elsewhere", [[grant("GPU-0000", 9000, 50)]], containers=["m"], node="n2")
    await create_gpu_pod(
        apiserver, "done", [[grant("GPU-0000", 7000, 40)]], containers=["m"], phase="Succeeded"
    )
    await create_gpu_pod(
        apiserver,
        "broken",
        [[grant("GPU-0000", 5000, 5)]],
        containers=["m"],
        annotations={POD_DEVICES_ALLOCATED: "GPU-0000,NVIDIA,lots,5:;"},
    )
    settings = NodeSettings(split_count=4, memory_scaling=1.5, core_scaling=2.0)
    async with running_exporter(api, tmp_path, TWO_CARDS, settings=settings) as exporter:
        tracked = await exporter.grants.refresh()
        assert sorted(p.name for p in tracked) == ["p1", "p2"]
        samples = await exporter.scrape()

    a, b = {"device_uuid": "GPU-0000", "node": NODE}, {"device_uuid": "GPU-0001", "node": NODE}
    # GPU-0000: p1/main 4000 + p2/c1 2000 + p2/c2 3000 = 9000 MiB; cores 20 + 10 + 25; three grants.
    assert value(samples, "hami_node_card_memory_allocated_bytes", **a) == 9000 * MIB
    assert value(samples, "hami_node_card_cores_allocated", **a) == 55
    assert value(samples, "hami_node_card_slots_used", **a) == 3
    # GPU-0001: p2/c1 1000 MiB, 30 cores, one grant.
    assert value(samples, "hami_node_card_memory_allocated_bytes", **b) == 1000 * MIB
    assert value(samples, "hami_node_card_cores_allocated", **b) == 30
    assert value(samples, "hami_node_card_slots_used", **b) == 1
    # Totals are the registration: 32768 MiB x 1.5 = 49152; 16384 x 1.5 = 24576; cores 100 x 2; split 4.
    assert value(samples, "hami_node_card_memory_total_bytes", **a) == 49152 * MIB
    assert value(samples, "hami_node_card_memory_total_bytes", **b) == 24576 * MIB
    assert value(samples, "hami_node_card_cores_capacity", **a) == 200
    assert value(samples, "hami_node_card_slots_capacity", **b) == 4
    assert value(samples, "hami_node_card_healthy", **a) == 1
    labels = next(
        got for n, got, _ in samples if n == "hami_node_card_healthy" and got["device_uuid"] == "GPU-0001"
    )
    assert labels == {**b, "device_index": "1", "device_type": "NVIDIA-Tesla V100-PCIE-32GB", "zone": "vGPU"}

    # One series per container grant, with its position inside the container.
    c1_second = {"namespace": "team-a", "pod": "p2", "container": "c1", "vdevice_index": "1"}
    assert value(samples, "hami_node_container_memory_allocated_bytes", **c1_second) == 1000 * MIB
    assert value(samples, "hami_node_container_cores_allocated", **c1_second, device_uuid="GPU-0001") == 30
    assert value(samples, "hami_vgpu_memory_limit_bytes", pod="p2", container="c2") == 3000 * MIB
    assert value(samples, "hami_vgpu_memory_limit_bytes", pod="p1", node=NODE, zone="vGPU") == 4000 * MIB
    granted = values(samples, "hami_node_container_memory_allocated_bytes")
    assert sorted(granted) == sorted(m * MIB for m in (4000, 2000, 1000, 3000))
    for name in ("elsewhere", "done", "broken"):
        assert not values(samples, "hami_vgpu_memory_limit_bytes", pod=name)


async def test_init_container_grants_collapse_like_the_scheduler(
    apiserver: kmock.KubernetesEmulator, api: Any, tmp_path: Path
) -> None:
    devices = [[grant("GPU-0000", 5000, 20)], [grant("GPU-0000", 4000, 20)]]
    await create_gpu_pod(apiserver, "staged", devices, containers=["app"], init_containers=["setup"])
    async with running_exporter(api, tmp_path, TWO_CARDS) as exporter:
        await exporter.grants.refresh()
        before = await exporter.scrape()
        # The init container finished with exit code 0: its grant is released.
        finished = [{"name": "setup", "state": {"terminated": {"exitCode": 0}}}]
        await apiserver.patch(POD + "staged", json={"status": {"initContainerStatuses": finished}})
        await exporter.grants.refresh()
        after = await exporter.scrape()
    a = {"device_uuid": "GPU-0000"}
    # While init runs: max(init 5000, app 4000) = 5000 MiB, max(20, 20) cores, one slot (the collapse of
    # docs/protocol.md, "Usage").
    assert value(before, "hami_node_card_memory_allocated_bytes", **a) == 5000 * MIB
    assert value(before, "hami_node_card_slots_used", **a) == 1
    assert value(before, "hami_vgpu_memory_limit_bytes", container="setup") == 5000 * MIB
    # After: the app container only.
    assert value(after, "hami_node_card_memory_allocated_bytes", **a) == 4000 * MIB
    assert not values(after, "hami_vgpu_memory_limit_bytes", container="setup")
    assert value(after, "hami_vgpu_memory_limit_bytes", container="app") == 4000 * MIB


async def test_released_init_grants_stay_released_like_the_scheduler(
    apiserver: kmock.KubernetesEmulator, api: Any, tmp_path: Path
) -> None:
    """The scheduler never re-inflates a pod whose init containers once all exited 0
    (docs/protocol.md, "Usage", sticky); a restarted pod whose init statuses go back to running must not
    re-inflate here."""
    devices = [[grant("GPU-0000", 5000, 20)], [grant("GPU-0000", 4000, 20)]]
    finished = [{"name": "setup", "state": {"terminated": {"exitCode": 0}}}]
    await create_gpu_pod(
        apiserver, "staged", devices, containers=["app"], init_containers=["setup"], init_statuses=finished
    )
    async with running_exporter(api, tmp_path, TWO_CARDS) as exporter:
        await exporter.grants.refresh()
        done = await exporter.scrape()
        rerun = [{"name": "setup", "state": {"running": {"startedAt": "2026-01-01T00:05:00Z"}}}]
        await apiserver.patch(POD + "staged", json={"status": {"initContainerStatuses": rerun}})
        await exporter.grants.refresh()
        restarted = await exporter.scrape()
    a = {"device_uuid": "GPU-0000"}
    # The app container only (4000 MiB), before and after the init statuses reset.
    assert value(done, "hami_node_card_memory_allocated_bytes", **a) == 4000 * MIB
    assert value(restarted, "hami_node_card_memory_allocated_bytes", **a) == 4000 * MIB
    assert not values(restarted, "hami_vgpu_memory_limit_bytes", container="setup")


async def test_only_the_grant_annotation_says_where_a_pod_holds_cards(
    apiserver: kmock.KubernetesEmulator, api: Any, tmp_path: Path
) -> None:
    """A pod bound here whose ``hami.io/vgpu-node`` annotation names another node holds no card here
    for the scheduler (docs/scheduler.md); the exporter must agree, whatever the label says."""
    await create_gpu_pod(apiserver, "ours", [[grant("GPU-0000", 1000, 10)]], containers=["m"])
    await create_gpu_pod(
        apiserver,
        "rewritten",  # label and nodeName say this node, the grant names n2
        [[grant("GPU-0000", 6000, 30)]],
        containers=["m"],
        annotations={POD_VGPU_NODE: "n2"},
    )
    async with running_exporter(api, tmp_path, TWO_CARDS) as exporter:
        tracked = await exporter.grants.refresh()
        samples = await exporter.scrape()
    assert [p.name for p in tracked] == ["ours"]
    assert value(samples, "hami_node_card_memory_allocated_bytes", device_uuid="GPU-0000") == 1000 * MIB
    assert not values(samples, "hami_vgpu_memory_limit_bytes", pod="rewritten")


async def test_health_flips_when_the_cards_file_marks_a_card_unhealthy(api: Any, tmp_path: Path) -> None:
    async with running_exporter(api, tmp_path, TWO_CARDS) as exporter:
        assert value(await exporter.scrape(), "hami_node_card_healthy", device_uuid="GPU-0001") == 1
        write_cards(exporter.cards_file, [TWO_CARDS[0], {**TWO_CARDS[1], "healthy": False}])
        await exporter.inventory.refresh()  # what the agent's health poll does every --health-interval
        samples = await exporter.scrape()
        assert value(samples, "hami_node_card_healthy", device_uuid="GPU-0001") == 0
        assert value(samples, "hami_node_card_healthy", device_uuid="GPU-0000") == 1
        write_cards(exporter.cards_file, TWO_CARDS)
        await exporter.inventory.refresh()
        assert value(await exporter.scrape(), "hami_node_card_healthy", device_uuid="GPU-0001") == 1


async def test_container_series_appear_and_disappear_with_the_pod(
    apiserver: kmock.KubernetesEmulator, api: Any, tmp_path: Path
) -> None:
    async with running_exporter(api, tmp_path, TWO_CARDS) as exporter:
        refresher = asyncio.create_task(exporter.grants.run(0.05))  # the agent's periodic pod list
        try:
            assert not values(await exporter.scrape(), "hami_vgpu_memory_limit_bytes")
            await create_gpu_pod(apiserver, "short", [[grant("GPU-0001", 2500, 15)]], containers=["main"])

            async def listed() -> Samples | None:
                samples = await exporter.scrape()
                return samples if values(samples, "hami_vgpu_memory_limit_bytes", pod="short") else None

            samples = await eventually(listed, "the new pod's series")
            assert value(samples, "hami_vgpu_memory_limit_bytes", pod="short") == 2500 * MIB
            assert (
                value(samples, "hami_node_card_memory_allocated_bytes", device_uuid="GPU-0001") == 2500 * MIB
            )
            await apiserver.delete(POD + "short")

            async def dropped() -> Samples | None:
                samples = await exporter.scrape()
                return None if values(samples, "hami_vgpu_memory_limit_bytes", pod="short") else samples

            samples = await eventually(dropped, "the deleted pod's series to go")
            assert not values(samples, "hami_node_container_cores_allocated", pod="short")
            assert value(samples, "hami_node_card_memory_allocated_bytes", device_uuid="GPU-0001") == 0
        finally:
            refresher.cancel()
            await asyncio.gather(refresher, return_exceptions=True)


async def test_live_usage_and_processes_mapped_to_containers_through_cgroups(
    apiserver: kmock.KubernetesEmulator, api: Any, tmp_path: Path
) -> None:
    await create_gpu_pod(apiserver, "train", [[grant("GPU-0000", 8000, 50)]], containers=["main", "sidecar"])
    await create_gpu_pod(
        apiserver,
        "infer",
        [[grant("GPU-0000", 2000, 10)], [grant("GPU-0000", 1000, 10)]],
        containers=["a", "b"],
    )
    proc = tmp_path / "proc"
    train, infer = pod_uid("train"), pod_uid("infer")
    # systemd driver, cgroup v2 (UID with underscores), and cgroupfs driver, cgroup v1
    write_cgroup(
        proc,
        101,
        "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod"
        f"{train.replace('-', '_')}.slice/cri-containerd-{container_id('train', 'main')}.scope\n",
    )
    write_cgroup(proc, 102, f"0::/kubepods/burstable/pod{train}/{container_id('train', 'main')}\n")
    write_cgroup(proc, 201, f"12:memory:/kubepods/pod{infer}/docker-{container_id('infer', 'a')}.scope\n")
    write_cgroup(proc, 301, "0::/system.slice/sshd.service\n")  # a host process
    cards = [
        {
            **TWO_CARDS[0],
            "used_memory_mib": 9000,
            "utilization": 63,
            "memory_utilization": 41,
            "processes": [
                {"pid": 101, "used_memory_mib": 3000, "utilization": 30},
                {"pid": 102, "used_memory_mib": 1500, "utilization": 12},
                {"pid": 201, "used_memory_mib": 700, "utilization": 9},
                {"pid": 301, "used_memory_mib": 100, "utilization": 1},
                {"pid": 999, "used_memory_mib": 50},  # exited: no /proc entry
            ],
        },
        TWO_CARDS[1],  # no usage fields: the backend cannot tell
    ]
    async with running_exporter(api, tmp_path, cards, legacy=True) as exporter:
        await exporter.grants.refresh()
        samples = await exporter.scrape()

    a = {"device_uuid": "GPU-0000", "node": NODE}
    assert value(samples, "hami_host_gpu_memory_used_bytes", **a, device_index="0") == 9000 * MIB
    assert value(samples, "hami_host_gpu_utilization_ratio", **a) == 63
    assert value(samples, "hami_host_gpu_memory_controller_utilization_ratio", **a) == 41
    assert not values(samples, "hami_host_gpu_memory_used_bytes", device_uuid="GPU-0001")
    # train/main owns pids 101 + 102: 3000 + 1500 MiB, 30 + 12 % SM.
    main = {"pod": "train", "container": "main", "device_uuid": "GPU-0000"}
    assert value(samples, "hami_vgpu_memory_used_bytes", **main) == 4500 * MIB
    assert value(samples, "hami_container_device_memory_bytes", **main) == 4500 * MIB
    assert value(samples, "hami_container_device_utilization_ratio", **main) == 42
    # infer/a owns pid 201; infer/b has no process on the card: a measured 0, not a missing series.
    assert value(samples, "hami_vgpu_memory_used_bytes", pod="infer", container="a") == 700 * MIB
    assert value(samples, "hami_vgpu_memory_used_bytes", pod="infer", container="b") == 0
    assert value(samples, "hami_container_device_utilization_ratio", pod="infer", container="b") == 0
    # Legacy names carry HAMi's legacy labels.
    assert (
        value(samples, "HostGPUMemoryUsage", nodeid=NODE, deviceidx="0", deviceuuid="GPU-0000") == 9000 * MIB
    )
    assert value(samples, "HostCoreUtilization", deviceuuid="GPU-0000") == 63
    legacy_main = {"podnamespace": "default", "podname": "train", "ctrname": "main", "vdeviceid": "0"}
    assert value(samples, "vGPU_device_memory_usage_in_bytes", **legacy_main) == 4500 * MIB
    assert value(samples, "vGPU_device_memory_limit_in_bytes", **legacy_main) == 8000 * MIB
    assert value(samples, "Device_memory_desc_of_container", **legacy_main) == 4500 * MIB
    assert value(samples, "Device_utilization_desc_of_container", **legacy_main) == 42


async def test_unknown_process_shares_and_unlisted_cards_give_no_usage_series(
    apiserver: kmock.KubernetesEmulator, api: Any, tmp_path: Path
) -> None:
    await create_gpu_pod(
        apiserver, "p", [[grant("GPU-0000", 1000, 10), grant("GPU-0001", 1000, 10)]], containers=["main"]
    )
    write_cgroup(tmp_path / "proc", 7, f"0::/kubepods/pod{pod_uid('p')}/{container_id('p', 'main')}\n")
    cards = [{**TWO_CARDS[0], "processes": [{"pid": 7, "used_memory_mib": 600}]}, TWO_CARDS[1]]
    async with running_exporter(api, tmp_path, cards) as exporter:
        await exporter.grants.refresh()
        samples = await exporter.scrape()
    assert value(samples, "hami_vgpu_memory_used_bytes", device_uuid="GPU-0000") == 600 * MIB
    # The driver gave no SM share for pid 7: no utilisation series rather than a made-up 0.
    assert not values(samples, "hami_container_device_utilization_ratio")
    # GPU-0001's processes are not listed at all: usage unknown, only the grant is exported.
    assert not values(samples, "hami_vgpu_memory_used_bytes", device_uuid="GPU-0001")
    assert value(samples, "hami_vgpu_memory_limit_bytes", device_uuid="GPU-0001") == 1000 * MIB
    # Legacy names only with --legacy-metrics.
    assert not values(samples, "HostGPUMemoryUsage") and not values(
        samples, "vGPU_device_memory_limit_in_bytes"
    )


async def test_healthz_openmetrics_and_unknown_paths(api: Any, tmp_path: Path) -> None:
    async with running_exporter(api, tmp_path, TWO_CARDS) as exporter, aiohttp.ClientSession() as session:
        async with session.get(exporter.url + "/healthz") as response:
            assert (response.status, await response.text()) == (200, "ok\n")
        async with session.get(exporter.url + "/metrics") as response:
            assert response.headers["Content-Type"].startswith("text/plain; version=0.0.4")
        accept = "application/openmetrics-text; version=1.0.0"
        async with session.get(exporter.url + "/metrics", headers={"Accept": accept}) as response:
            body = await response.text()
            assert response.headers["Content-Type"].startswith("application/openmetrics-text")
            assert body.rstrip().endswith("# EOF")
            assert 'hami_node_card_slots_capacity{device_index="0",device_type=' in body
        async with session.get(exporter.url + "/other") as response:
            assert response.status == 404
