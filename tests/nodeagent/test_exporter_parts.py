"""The exporter's parts: cgroup paths → pod and container, listen addresses, the sim file's usage
fields, NVML live usage (through a fake module raising pynvml's own errors), the agent's entry
point serving /metrics next to the other tasks, and docs/metrics.md listing every metric."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any, cast

import kmock
import pynvml
import pytest
import yaml

from hami.process.flags import Address
from hami_testkit.processes import PortReservations
from nodeagent.__main__ import main, run
from nodeagent.backends.base import BackendError, LiveUsage, ProcessUsage, live_usage
from nodeagent.backends.nvml import NvmlBackend
from nodeagent.backends.simulated import SimBackend, parse_sim_usage
from nodeagent.cgroups import ProcessOwners, owner_of_cgroup
from nodeagent.config import AgentConfig, NodeSettings
from nodeagent.exporter import NodeCollector
from nodeagent.grants import GrantBook
from nodeagent.inventory import Inventory
from nodeagent.mps.metrics import mps_families
from nodeagent.podcache import PodCache, PodCacheCollector
from tests.builders import NO_API
from tests.eventually import eventually
from tests.test_docs_tables import metrics_section, table_metrics

from .agent_helpers import card, create_node, write_cards
from .exporter_helpers import MIB, NODE, Samples, create_gpu_pod, grant, scrape, value, values

UID = "8c6f1c3e-0d0a-4c8e-9a55-2b0f4f1e6a71"
CID = "4f" * 32


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        # cgroup v2, cgroupfs driver
        (f"0::/kubepods/burstable/pod{UID}/{CID}\n", (UID, CID)),
        # cgroup v2, systemd driver: the UID is written with underscores
        (
            "0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod"
            f"{UID.replace('-', '_')}.slice/cri-containerd-{CID}.scope\n",
            (UID, CID),
        ),
        # cgroup v1: several hierarchies, docker and cri-o scopes; the first matching line wins
        (f"12:pids:/\n11:memory:/kubepods/pod{UID}/docker-{CID}.scope\n", (UID, CID)),
        (f"0::/kubepods.slice/kubepods-pod{UID.replace('-', '_')}.slice/crio-{CID}.scope", (UID, CID)),
        # a static pod's UID is a 32-hex hash
        (f"0::/kubepods/pod{'ab' * 16}/{CID}\n", ("ab" * 16, CID)),
        # not a pod container
        ("0::/system.slice/containerd.service\n", None),
        ("0::/user.slice/user-1000.slice/session-3.scope\n", None),
        # the pod's own cgroup (no container below it) and a container ID outside a pod
        (f"0::/kubepods/burstable/pod{UID}\n", None),
        (f"0::/system.slice/docker-{CID}.scope\n", None),
        ("", None),
    ],
)
def test_owner_of_cgroup(text: str, expected: tuple[str, str] | None) -> None:
    assert owner_of_cgroup(text) == expected


def test_process_owners_read_proc_and_tolerate_gone_processes(tmp_path: Path) -> None:
    (tmp_path / "42").mkdir()
    (tmp_path / "42" / "cgroup").write_text(f"0::/kubepods/pod{UID}/{CID}\n")
    owners = ProcessOwners(tmp_path)
    assert owners.owner(42) == (UID, CID)
    assert owners.owner(43) is None


def test_sim_usage_fields(tmp_path: Path) -> None:
    path = write_cards(
        tmp_path / "c.yaml",
        [
            card("GPU-a", used_memory_mib=100, utilization=5, processes=[{"pid": 9, "used_memory_mib": 3}]),
            card("GPU-b", processes=[]),
            card("GPU-c"),
        ],
    )
    backend = SimBackend(path)
    assert live_usage(backend) == (
        LiveUsage(
            uuid="GPU-a",
            memory_used_bytes=100 * MIB,
            utilization=5,
            processes=(ProcessUsage(pid=9, memory_bytes=3 * MIB),),
        ),
        LiveUsage(uuid="GPU-b", processes=()),  # can list processes, there are none
    )
    write_cards(path, [card("GPU-a", utilization=101)])
    with pytest.raises(BackendError, match=r"cards\[0\]\.utilization: must be a percentage 0-100, got 101"):
        backend.usage()


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ({"processes": {"pid": 1}}, r"cards\[0\]\.processes: must be a list"),
        ({"processes": [{"used_memory_mib": 1}]}, r"cards\[0\]\.processes\[0\]\.pid: required"),
        ({"processes": [7]}, r"cards\[0\]\.processes\[0\]: must be a mapping, got 7"),
        ({"used_memory_mib": -1}, r"cards\[0\]\.used_memory_mib: must be a non-negative integer, got -1"),
    ],
)
def test_sim_usage_errors_name_the_field(entry: dict[str, Any], message: str) -> None:
    with pytest.raises(BackendError, match=message):
        parse_sim_usage(yaml.safe_dump({"cards": [{"uuid": "GPU-a", **entry}]}), source="f.yaml")


class FakeNvml:
    """The slice of pynvml the usage path calls; errors are pynvml's real classes."""

    NVML_GPU_INSTANCE_PROFILE_COUNT = 0

    def __init__(self) -> None:
        self.fail = False

    def nvmlInit(self) -> None: ...

    def nvmlShutdown(self) -> None: ...

    def nvmlEventSetCreate(self) -> None:
        raise pynvml.NVMLError_NotSupported(pynvml.NVML_ERROR_NOT_SUPPORTED)

    def nvmlDeviceGetCount(self) -> int:
        if self.fail:
            raise pynvml.NVMLError_GpuIsLost(pynvml.NVML_ERROR_GPU_IS_LOST)
        return 2

    def nvmlDeviceGetHandleByIndex(self, i: int) -> int:
        return i

    def nvmlDeviceGetUUID(self, h: int) -> bytes:
        return f"GPU-{h}".encode()

    def nvmlDeviceGetMemoryInfo(self, h: int) -> Any:
        if h == 1:
            raise pynvml.NVMLError_NotSupported(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return type("Memory", (), {"total": 16 * 1024**3, "used": 5 * 1024**3})()

    def nvmlDeviceGetUtilizationRates(self, h: int) -> Any:
        if h == 1:
            raise pynvml.NVMLError_NotSupported(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return type("Rates", (), {"gpu": 77, "memory": 33})()

    def nvmlDeviceGetComputeRunningProcesses(self, h: int) -> list[Any]:
        if h == 1:
            raise pynvml.NVMLError_NotSupported(pynvml.NVML_ERROR_NOT_SUPPORTED)
        proc = type("Proc", (), {})
        a, b = proc(), proc()
        a.pid, a.usedGpuMemory, b.pid, b.usedGpuMemory = 10, 2 * 1024**3, 11, None
        return [a, b]

    def nvmlDeviceGetProcessUtilization(self, h: int, since: int) -> list[Any]:
        sample = type("Sample", (), {})
        old, new = sample(), sample()
        old.pid, old.smUtil, old.timeStamp = 10, 90, 1
        new.pid, new.smUtil, new.timeStamp = 10, 25, 2
        return [new, old]


def test_nvml_live_usage() -> None:
    fake = FakeNvml()
    backend = NvmlBackend(nvml=fake)
    assert backend.usage() == (
        LiveUsage(
            uuid="GPU-0",
            memory_used_bytes=5 * 1024**3,
            utilization=77,
            memory_utilization=33,
            # the newest sample wins; a withheld memory figure reads 0; no sample = unknown share
            processes=(
                ProcessUsage(pid=10, memory_bytes=2 * 1024**3, utilization=25),
                ProcessUsage(pid=11, memory_bytes=0, utilization=None),
            ),
        ),
        LiveUsage(uuid="GPU-1"),  # an old card: nothing supported, nothing made up
    )
    fake.fail = True
    with pytest.raises(BackendError, match="NVML usage query failed"):
        backend.usage()


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--metrics-listen", "9394"], "--metrics-listen must be HOST:PORT, got '9394'"),
        (["--legacy-metrics", "maybe"], "--legacy-metrics must be true or false, got 'maybe'"),
    ],
)
def test_entry_point_refuses_bad_exporter_flags(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["--node-name", "n1", *argv]) == 2
    assert message in capsys.readouterr().err


async def test_the_agent_serves_metrics_next_to_its_other_tasks(
    apiserver: kmock.KubernetesEmulator,
    kubeconfig: Path,
    tmp_path: Path,
    sock_dir: Path,
    ports: PortReservations,
) -> None:
    await create_node(apiserver, NODE)
    await create_gpu_pod(apiserver, "p", [[grant("GPU-a", 3000, 30)]], containers=["main"])
    port = ports.take()  # the agent binds its own --metrics-listen
    config = AgentConfig(
        kubeconfig=str(kubeconfig),
        node_name=NODE,
        backend="sim",
        sim_devices=write_cards(tmp_path / "cards.yaml", [card("GPU-a", used_memory_mib=1200)]),
        kubelet_dir=sock_dir,
        metrics_listen=Address(host="127.0.0.1", port=port),
        legacy_metrics=True,
    )
    agent = asyncio.create_task(run(config))

    def alive() -> None:
        if agent.done():  # a crashed agent fails at once, with its exception
            agent.result()
            raise AssertionError("the agent stopped")

    async def served() -> Samples | None:
        try:
            samples = await scrape(f"http://127.0.0.1:{port}/metrics")
        except OSError:  # not listening yet
            return None
        granted = values(samples, "hami_node_card_memory_allocated_bytes", device_uuid="GPU-a")
        return samples if granted == [3000 * MIB] else None  # the pod list has run

    try:
        samples = await eventually(served, "the agent's /metrics with the pod's grant", alive=alive)
        assert value(samples, "hami_node_card_healthy", device_uuid="GPU-a") == 1
        assert value(samples, "HostGPUMemoryUsage", deviceuuid="GPU-a") == 1200 * MIB
    finally:
        agent.cancel()
        await asyncio.gather(agent, return_exceptions=True)


def test_docs_list_every_exported_metric(tmp_path: Path) -> None:
    collector = NodeCollector(
        node_name=NODE,
        inventory=Inventory(SimBackend(write_cards(tmp_path / "c.yaml", []))),
        settings=NodeSettings(),
        grants=GrantBook(api=NO_API, node_name=NODE),
        legacy=True,
    )
    names = {family.name for family in collector.describe()}
    assert len(names) == 22
    docs = (Path(__file__).resolve().parents[2] / "docs" / "metrics.md").read_text()
    assert {name for name in names if f"| `{name}` |" not in docs} == set()
    # and the other way: every name the agent's tables list is one the agent exports (its card and
    # container families, the MPS daemon's and the pod cache's; a counter is scraped with _total)
    others = [*mps_families(NODE, "vGPU", None), *PodCacheCollector(cast(PodCache, None), NODE).describe()]
    exported = names | {f"{m.name}_total" if m.type == "counter" else m.name for m in others}
    assert sorted(table_metrics(metrics_section("Node agent")) - exported) == []
