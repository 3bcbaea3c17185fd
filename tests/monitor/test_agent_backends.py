"""Card backends: the simulated file (format, re-read on change, errors naming the field) and the NVML
backend driven by a fake module that raises pynvml's own error classes."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pynvml
import pytest
from agent_helpers import card, write_cards

from monitor.backends import open_backend
from monitor.backends.base import BackendError, BackendUnavailable
from monitor.backends.nvml import NvmlBackend
from monitor.backends.sim import SimBackend, parse_sim_devices


# ------------------------------------------------------------------------------------------------- sim
def test_sim_reads_cards_links_and_mig_profiles(tmp_path: Path) -> None:
    mig = [
        {
            "name": "1g.5gb",
            "memory_mib": 4864,
            "cores": 15,
            "slice_count": 1,
            "placements": [{"start": 0, "size": 1}],
        }
    ]
    path = write_cards(
        tmp_path / "c.yaml",
        [card("GPU-a", mig=mig), card("GPU-b", numa=1, healthy=False, index=5)],
        links=[{"a": "GPU-a", "b": "GPU-b", "score": 100}],
    )
    backend = SimBackend(path)
    a, b = backend.cards()
    assert (a.uuid, a.index, a.model, a.memory_mib, a.healthy) == (
        "GPU-a",
        0,
        "Tesla V100-PCIE-32GB",
        32768,
        True,
    )
    assert (b.index, b.numa, b.healthy) == (5, 1, False)
    assert a.mig_profiles[0].instance_count == 1 and a.mig_profiles[0].placements == ((0, 1),)
    assert [(x.a, x.b, x.score) for x in backend.links()] == [("GPU-a", "GPU-b", 100)]


def test_sim_rereads_the_file_when_it_changes(tmp_path: Path) -> None:
    path = write_cards(tmp_path / "c.yaml", [card("GPU-a"), card("GPU-b")])
    backend = SimBackend(path)
    assert [c.healthy for c in backend.cards()] == [True, True]
    write_cards(path, [card("GPU-a"), card("GPU-b", healthy=False), card("GPU-c")])
    assert [(c.uuid, c.healthy) for c in backend.cards()] == [
        ("GPU-a", True),
        ("GPU-b", False),
        ("GPU-c", True),
    ]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("cards: [{model: x}]", "cards[0].uuid: required"),
        (
            "cards: [{uuid: GPU-a, memory_mib: lots}]",
            "cards[0].memory_mib: must be a non-negative integer, got 'lots'",
        ),
        ("cards: [{uuid: GPU-a, healthy: maybe}]", "cards[0].healthy: must be true or false, got 'maybe'"),
        ("cards: [{uuid: GPU-a}, {uuid: GPU-a}]", "duplicate card uuid 'GPU-a'"),
        (
            "cards: [{uuid: GPU-a}]\nlinks: [{a: GPU-a, b: GPU-z, score: 1}]",
            "links[0].b: unknown card uuid 'GPU-z'",
        ),
        ("cards: {uuid: GPU-a}", "'cards' must be a list"),
        ("cards: [", "not valid YAML"),
    ],
)
def test_sim_errors_name_the_file_entry_and_field(text: str, message: str) -> None:
    with pytest.raises(BackendError) as caught:
        parse_sim_devices(text, source="cards.yaml")
    assert message in str(caught.value) and "'cards.yaml'" in str(caught.value)


def test_open_backend_sim_needs_a_file(tmp_path: Path) -> None:
    with pytest.raises(BackendUnavailable, match="--sim-devices"):
        open_backend("sim")
    with pytest.raises(BackendUnavailable, match="does not exist"):
        open_backend("sim", sim_devices=tmp_path / "missing.yaml")


# ------------------------------------------------------------------------------------------------ nvml
@dataclass
class FakeGpu:
    uuid: str
    name: str
    memory: int | None  # bytes; None = NOT_SUPPORTED
    bus: str


@dataclass
class Event:
    device: Any
    eventData: int


@dataclass
class FakeNvml:
    """The slice of pynvml the backend calls; errors are pynvml's real classes."""

    gpus: list[FakeGpu]
    events: list[Any] = field(default_factory=list)
    init_error: Exception | None = None
    lost: bool = False  # the GPU fell off the bus: every count query fails
    shutdowns: int = 0
    nvmlEventTypeXidCriticalError = pynvml.nvmlEventTypeXidCriticalError
    NVML_GPU_INSTANCE_PROFILE_COUNT = 0

    def nvmlInit(self) -> None:
        if self.init_error:
            raise self.init_error

    def nvmlShutdown(self) -> None:
        self.shutdowns += 1

    def nvmlDeviceGetCount(self) -> int:
        if self.lost:
            raise pynvml.NVMLError_GpuIsLost(pynvml.NVML_ERROR_GPU_IS_LOST)
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, i: int) -> Any:
        return i

    def nvmlDeviceGetUUID(self, h: int) -> str:
        return self.gpus[h].uuid

    def nvmlDeviceGetName(self, h: int) -> bytes:
        return self.gpus[h].name.encode()

    def nvmlDeviceGetIndex(self, h: int) -> int:
        return h

    def nvmlDeviceGetMinorNumber(self, h: int) -> int:
        return h

    def nvmlDeviceGetMemoryInfo(self, h: int) -> Any:
        if self.gpus[h].memory is None:
            raise pynvml.NVMLError_NotSupported(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return type("Memory", (), {"total": self.gpus[h].memory})()

    def nvmlDeviceGetPciInfo(self, h: int) -> Any:
        return type("Pci", (), {"busId": self.gpus[h].bus.encode()})()

    def nvmlEventSetCreate(self) -> str:
        return "events"

    def nvmlDeviceRegisterEvents(self, h: int, kinds: int, events: str) -> None:
        if h == 1:
            raise pynvml.NVMLError_NotSupported(pynvml.NVML_ERROR_NOT_SUPPORTED)

    def nvmlEventSetWait(self, events: str, timeout: int) -> Any:
        if not self.events:
            raise pynvml.NVMLError_Timeout(pynvml.NVML_ERROR_TIMEOUT)
        item = self.events.pop(0)
        if isinstance(item, Exception):
            raise item
        return item


def _fake() -> FakeNvml:
    return FakeNvml(
        gpus=[
            FakeGpu("GPU-a", "Tesla V100-PCIE-32GB", 32 * 1024**3, "00000000:3B:00.0"),
            FakeGpu("GPU-b", "NVIDIA GB10", None, "00000000:AF:00.0"),
        ]
    )


def test_nvml_library_missing_is_a_clear_unavailable_error() -> None:
    fake = _fake()
    fake.init_error = pynvml.NVMLError_LibraryNotFound(pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)
    with pytest.raises(BackendUnavailable, match=r"NVML library not found.*--backend sim"):
        NvmlBackend(nvml=fake)
    fake.init_error = pynvml.NVMLError_DriverNotLoaded(pynvml.NVML_ERROR_DRIVER_NOT_LOADED)
    with pytest.raises(BackendUnavailable, match="NVML initialisation failed"):
        NvmlBackend(nvml=fake)


def test_nvml_without_a_driver_here_fails_cleanly() -> None:
    """This machine has no libnvidia-ml: the real module raises LibraryNotFound, mapped to a clear error."""
    with pytest.raises(BackendUnavailable, match="NVML library not found"):
        open_backend("auto")


def test_nvml_discovery_memory_numa_from_sysfs(tmp_path: Path) -> None:
    (tmp_path / "bus/pci/devices/0000:3b:00.0").mkdir(parents=True)
    (tmp_path / "bus/pci/devices/0000:3b:00.0/numa_node").write_text("1\n")
    (tmp_path / "bus/pci/devices/0000:af:00.0").mkdir(parents=True)
    (tmp_path / "bus/pci/devices/0000:af:00.0/numa_node").write_text("-1\n")
    fake = _fake()
    backend = NvmlBackend(nvml=fake, sysfs=tmp_path)
    a, b = backend.cards()
    assert (a.uuid, a.model, a.memory_mib, a.numa, a.device_paths) == (
        "GPU-a",
        "Tesla V100-PCIE-32GB",
        32768,
        1,
        ("/dev/nvidia0",),
    )
    assert (b.memory_mib, b.numa) == (None, 0)  # NOT_SUPPORTED memory; NUMA -1 means none
    backend.close()
    backend.close()
    assert fake.shutdowns == 1


def test_nvml_xid_events_make_cards_unhealthy_for_good(tmp_path: Path) -> None:
    fake = _fake()
    backend = NvmlBackend(nvml=fake, sysfs=tmp_path)
    fake.events = [Event(device=0, eventData=13), Event(device=0, eventData=79)]  # 13 = application error
    assert [c.healthy for c in backend.cards()] == [False, True]
    assert [c.healthy for c in backend.cards()] == [False, True]  # sticky: no path back
    fake.events = [pynvml.NVMLError_Unknown(pynvml.NVML_ERROR_UNKNOWN)]  # a failed wait: all unhealthy
    assert [c.healthy for c in backend.cards()] == [False, False]


def test_nvml_query_failure_is_a_backend_error(tmp_path: Path) -> None:
    fake = _fake()
    backend = NvmlBackend(nvml=fake, sysfs=tmp_path)
    fake.lost = True
    with pytest.raises(BackendError, match="NVML device query failed"):
        backend.cards()


@pytest.mark.parametrize("xid", [13, 31, 43, 45, 68, 109])
def test_nvml_application_xids_leave_the_card_healthy(tmp_path: Path, xid: int) -> None:
    fake = _fake()
    backend = NvmlBackend(nvml=fake, sysfs=tmp_path)
    fake.events = [Event(device=1, eventData=xid), Event(device=0, eventData=48)]  # 48: double-bit ECC
    cards = backend.cards()
    assert [c.healthy for c in cards] == [False, True]
    assert [c.numa for c in cards] == [0, 0]  # no sysfs entry: NUMA unknown counts as 0
    backend.close()
