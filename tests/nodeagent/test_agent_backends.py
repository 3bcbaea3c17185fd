"""Card backends: the simulated file (format, re-read on change, errors naming the field) and the NVML
backend driven by a fake module that raises pynvml's own error classes, with a fake clock for health
recovery (quiet period, probe, restarts; never with recovery 0)."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pynvml
import pytest

from nodeagent.backends import open_backend
from nodeagent.backends.base import BackendError, BackendUnavailable
from nodeagent.backends.nvml import NvmlBackend
from nodeagent.backends.simulated import SimBackend, parse_sim_devices
from nodeagent.inventory import Inventory

from .agent_helpers import card, write_cards


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


def test_sim_cards_carry_a_compute_mode(tmp_path: Path) -> None:
    path = write_cards(tmp_path / "c.yaml", [card("GPU-a"), card("GPU-b", compute_mode="exclusive-process")])
    assert [c.compute_mode for c in SimBackend(path).cards()] == ["default", "exclusive-process"]
    write_cards(path, [card("GPU-a", compute_mode="exclusive")])
    with pytest.raises(BackendError, match=r"cards\[0\]\.compute_mode: must be one of default, "):
        SimBackend(path).cards()


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
    compute_mode: int | Exception = pynvml.NVML_COMPUTEMODE_DEFAULT


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
    unreachable: set[str] = field(default_factory=set)  # UUIDs the driver no longer finds (probe fails)
    probes: list[str] = field(default_factory=list)  # every lookup by UUID (what the health probe does)
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

    def nvmlDeviceGetHandleByUUID(self, uuid: str) -> int:
        self.probes.append(uuid)
        if uuid in self.unreachable:
            raise pynvml.NVMLError_GpuIsLost(pynvml.NVML_ERROR_GPU_IS_LOST)
        return next(i for i, gpu in enumerate(self.gpus) if gpu.uuid == uuid)

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

    def nvmlDeviceGetComputeMode(self, h: int) -> int:
        mode = self.gpus[h].compute_mode
        if isinstance(mode, Exception):
            raise mode
        return mode

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


@pytest.mark.no_gpu
def test_nvml_without_a_driver_here_fails_cleanly() -> None:
    """A host without libnvidia-ml: the real module raises LibraryNotFound, mapped to a clear error."""
    with pytest.raises(BackendUnavailable, match="NVML library not found"):
        open_backend("auto")


@pytest.mark.gpu
def test_nvml_on_a_gpu_host_lists_its_cards_through_the_real_driver() -> None:
    """A host with the NVIDIA driver: the real NVML answers with every card, each named by its UUID."""
    backend = open_backend("auto")
    try:
        assert backend.name == "nvml"
        cards = backend.cards()
        assert cards, "the driver loads but lists no card"
        assert [c.index for c in cards] == list(range(len(cards)))
        for found in cards:
            assert found.uuid.startswith("GPU-") and found.model, found
            assert found.memory_mib is None or found.memory_mib > 0, found
            assert found.healthy, found
    finally:
        backend.close()


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


def test_nvml_reads_each_cards_compute_mode(tmp_path: Path) -> None:
    """The MPS level depends on it: only under EXCLUSIVE_PROCESS can no process leave MPS."""
    fake = _fake()
    fake.gpus[0].compute_mode = pynvml.NVML_COMPUTEMODE_EXCLUSIVE_PROCESS
    backend = NvmlBackend(nvml=fake, sysfs=tmp_path)
    assert [c.compute_mode for c in backend.cards()] == ["exclusive-process", "default"]
    fake.gpus[0].compute_mode = pynvml.NVML_COMPUTEMODE_PROHIBITED  # an operator changed it: read anew
    fake.gpus[1].compute_mode = pynvml.NVMLError_NotSupported(pynvml.NVML_ERROR_NOT_SUPPORTED)
    assert [c.compute_mode for c in backend.cards()] == ["prohibited", "unknown"]
    backend.close()


def test_nvml_xid_events_make_cards_unhealthy_for_good_with_recovery_0(tmp_path: Path) -> None:
    """HAMi's behaviour: no path back, however long the card stays quiet; it is never even probed."""
    fake, clock = _fake(), FakeClock()
    backend = NvmlBackend(nvml=fake, sysfs=tmp_path, health_recovery=0, clock=clock)
    fake.events = [Event(device=0, eventData=13), Event(device=0, eventData=79)]  # 13 = application error
    assert [c.healthy for c in backend.cards()] == [False, True]
    clock.now += 10**9
    assert [(c.healthy, c.health_reason) for c in backend.cards()] == [(False, "XID 79"), (True, "")]
    fake.events = [pynvml.NVMLError_Unknown(pynvml.NVML_ERROR_UNKNOWN)]  # a failed wait: all unhealthy
    assert [c.healthy for c in backend.cards()] == [False, False]
    clock.now += 10**9
    assert [c.healthy for c in backend.cards()] == [False, False]
    assert fake.probes == []


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


# --------------------------------------------------------------------------------- health recovery
@dataclass
class FakeClock:
    now: float = 1000.0

    def __call__(self) -> float:
        return self.now


def _recovering(tmp_path: Path, recovery: float = 300) -> tuple[FakeNvml, FakeClock, NvmlBackend]:
    fake, clock = _fake(), FakeClock()
    return fake, clock, NvmlBackend(nvml=fake, sysfs=tmp_path, health_recovery=recovery, clock=clock)


def _health(backend: NvmlBackend) -> list[tuple[bool, str]]:
    return [(c.healthy, c.health_reason) for c in backend.cards()]


def test_nvml_card_recovers_after_the_quiet_period_and_a_good_probe(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    fake, clock, backend = _recovering(tmp_path)
    caplog.set_level(logging.INFO, logger="nodeagent.backends.health")
    fake.events = [Event(device=0, eventData=79)]
    assert _health(backend) == [(False, "XID 79"), (True, "")]
    clock.now += 299.9  # quiet period not over: still unhealthy, and the card is not probed yet
    assert _health(backend) == [(False, "XID 79"), (True, "")]
    assert fake.probes == []
    clock.now += 0.1
    assert _health(backend) == [(True, ""), (True, "")]
    assert fake.probes == ["GPU-a"]  # one probe, of the sick card only
    assert _health(backend) == [(True, ""), (True, "")]
    assert fake.probes == ["GPU-a"]  # healthy cards are not probed
    lines = [r.getMessage() for r in caplog.records]
    assert [line for line in lines if "GPU-a" in line] == [
        "card GPU-a unhealthy: XID 79; until 300s pass without another critical event and a probe succeeds",
        "card GPU-a healthy again: no critical event for 300s since XID 79 and the probe answered",
    ]


def test_nvml_failed_probe_keeps_the_card_unhealthy_until_a_later_probe_succeeds(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    fake, clock, backend = _recovering(tmp_path, recovery=60)
    fake.events = [Event(device=0, eventData=79)]
    backend.cards()
    fake.unreachable = {"GPU-a"}
    clock.now += 60
    ((healthy, reason), _) = _health(backend)
    assert not healthy and reason.startswith("XID 79; probe failed: NVML query failed: ")
    clock.now += 5  # the next health interval probes again
    assert _health(backend)[0][0] is False
    assert fake.probes == ["GPU-a", "GPU-a"]
    assert sum("probe failed" in r.getMessage() for r in caplog.records) == 1  # logged once, not per poll
    fake.unreachable = set()
    clock.now += 5
    assert _health(backend) == [(True, ""), (True, "")]


def test_nvml_probe_notices_a_card_answering_with_another_uuid(tmp_path: Path) -> None:
    fake, clock, backend = _recovering(tmp_path, recovery=60)
    fake.events = [Event(device=1, eventData=48)]
    backend.cards()
    fake.nvmlDeviceGetHandleByUUID = lambda uuid: 0  # type: ignore[method-assign]  # lookup finds GPU-a
    clock.now += 60
    assert _health(backend)[1] == (False, "XID 48; probe failed: the card now reads UUID GPU-a")


def test_nvml_xid_during_the_quiet_period_restarts_it(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    fake, clock, backend = _recovering(tmp_path)
    fake.events = [Event(device=0, eventData=79)]
    backend.cards()
    clock.now += 200
    fake.events = [Event(device=0, eventData=94), Event(device=0, eventData=31)]  # 31: ignored
    assert _health(backend)[0] == (False, "XID 94")
    clock.now += 100  # 300 s after the first XID, only 100 s after the second
    assert _health(backend)[0] == (False, "XID 94")
    assert fake.probes == []
    assert any(
        r.getMessage() == "card GPU-a: XID 94 while unhealthy; the quiet period restarts"
        for r in caplog.records
    )
    clock.now += 200
    assert _health(backend)[0] == (True, "")


def test_nvml_node_wide_event_failure_hits_every_card_and_each_recovers_on_its_own(tmp_path: Path) -> None:
    fake, clock, backend = _recovering(tmp_path)
    fake.events = [pynvml.NVMLError_Unknown(pynvml.NVML_ERROR_UNKNOWN)]
    reason = "NVML event wait failed (Unknown Error)"
    assert _health(backend) == [(False, reason), (False, reason)]
    clock.now += 300
    fake.unreachable = {"GPU-b"}
    assert _health(backend)[0] == (True, "")
    assert _health(backend)[1][0] is False
    fake.unreachable = set()
    assert _health(backend) == [(True, ""), (True, "")]  # the old node-wide event is not applied again


async def test_inventory_sees_the_recovery_as_a_change(tmp_path: Path) -> None:
    """ListAndWatch resends on an inventory change, so kubelet learns of the recovered card at once."""
    fake, clock, backend = _recovering(tmp_path, recovery=30)
    inventory = Inventory(backend)
    fake.events = [Event(device=0, eventData=79)]
    await inventory.refresh()
    version = inventory.version
    clock.now += 30
    await inventory.refresh()
    assert inventory.version == version + 1 and inventory.cards[0].healthy
