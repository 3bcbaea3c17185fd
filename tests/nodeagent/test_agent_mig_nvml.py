"""Dynamic MIG on the NVML backend, driven by a fake pynvml that keeps GPU and compute instances the way
the driver does (out-parameter arrays filled through ctypes, pynvml's own error classes), plus the
reuse / left-over rules of ``nodeagent.mig.ensure_instance`` on top of it."""

from __future__ import annotations

import ctypes
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pynvml
import pytest

from hami.core.model import MigAllocation, MigPlacement
from nodeagent.allocate_rules import AllocationError
from nodeagent.backends.base import BackendError, MigBackend
from nodeagent.backends.nvml import NvmlBackend
from nodeagent.mig import Claims, ensure_instance

#: GPU-instance profile id -> (name, slices, legal starts, placement size), as an A100-40GB reports them.
GI_PROFILES = {
    0: ("MIG 1g.5gb", 1, tuple(range(7)), 1),
    1: ("MIG 2g.10gb", 2, (0, 2, 4), 2),
    2: ("MIG 3g.20gb", 3, (0, 4), 4),
    4: ("MIG 7g.40gb", 7, (0,), 8),
}
#: Compute-instance profile id -> slices.
CI_PROFILES = {0: 1, 1: 2, 2: 3, 4: 7}
_BASE = 0x1000  # fake GPU-instance handles are pointers whose address encodes the id


def gi_handle(gi_id: int) -> Any:
    return ctypes.cast(ctypes.c_void_p(_BASE + gi_id), pynvml.c_nvmlGpuInstance_t)


def gi_id_of(handle: Any) -> int:
    return int(ctypes.cast(handle, ctypes.c_void_p).value or 0) - _BASE


@dataclass
class GpuInstance:
    profile: int
    start: int
    size: int
    computes: dict[int, str] = field(default_factory=dict)  # compute instance id -> MIG UUID


@dataclass
class FakeMigNvml:
    """One A100 (``GPU-m``) in MIG mode: the slice of pynvml the backend's MIG code calls."""

    instances: dict[int, GpuInstance] = field(default_factory=dict)
    fail_compute: bool = False
    made: int = 0
    NVML_GPU_INSTANCE_PROFILE_COUNT = pynvml.NVML_GPU_INSTANCE_PROFILE_COUNT
    NVML_COMPUTE_INSTANCE_PROFILE_COUNT = pynvml.NVML_COMPUTE_INSTANCE_PROFILE_COUNT

    # --- what NvmlBackend.__init__ touches
    def nvmlInit(self) -> None: ...
    def nvmlShutdown(self) -> None: ...
    def nvmlEventSetCreate(self) -> str:
        return "events"

    def nvmlDeviceGetCount(self) -> int:
        return 1

    def nvmlDeviceGetHandleByIndex(self, i: int) -> str:
        return "dev-m"

    def nvmlDeviceRegisterEvents(self, handle: str, kinds: int, events: str) -> None: ...

    # --- MIG
    def nvmlDeviceGetHandleByUUID(self, uuid: str) -> str:
        if uuid != "GPU-m":
            raise pynvml.NVMLError_NotFound(pynvml.NVML_ERROR_NOT_FOUND)
        return "dev-m"

    def nvmlDeviceGetGpuInstanceProfileInfo(self, handle: str, profile: int) -> Any:
        if profile not in GI_PROFILES:
            raise pynvml.NVMLError_NotSupported(pynvml.NVML_ERROR_NOT_SUPPORTED)
        name, slices, starts, _ = GI_PROFILES[profile]
        return SimpleNamespace(
            id=profile, name=name.encode(), sliceCount=slices, instanceCount=len(starts), memorySizeMB=4864
        )

    def nvmlDeviceGetGpuInstances(self, handle: str, profile: int, array: Any, count: Any) -> int:
        mine = sorted(k for k, gi in self.instances.items() if gi.profile == profile)
        assert len(mine) <= len(array)  # the caller sized the array from instanceCount
        for k, gi_id in enumerate(mine):
            array[k] = gi_handle(gi_id)
        count.contents.value = len(mine)
        return 0  # NVML_SUCCESS

    def nvmlGpuInstanceGetInfo(self, handle: Any) -> Any:
        gi_id = gi_id_of(handle)
        gi = self.instances[gi_id]
        placement = SimpleNamespace(start=gi.start, size=gi.size)
        return SimpleNamespace(id=gi_id, profileId=gi.profile, placement=placement)

    def nvmlDeviceCreateGpuInstanceWithPlacement(self, handle: str, profile: int, placement: Any) -> Any:
        start, size = placement.contents.start, placement.contents.size
        _, _, starts, legal_size = GI_PROFILES[profile]
        if start not in starts or size != legal_size:
            raise pynvml.NVMLError_InvalidArgument(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        if any(gi.start < start + size and start < gi.start + gi.size for gi in self.instances.values()):
            raise pynvml.NVMLError_InsufficientResources(pynvml.NVML_ERROR_INSUFFICIENT_RESOURCES)
        gi_id = next(n for n in range(1, 16) if n not in self.instances)
        self.instances[gi_id] = GpuInstance(profile=profile, start=start, size=size)
        return gi_handle(gi_id)

    def nvmlGpuInstanceGetComputeInstanceProfileInfo(self, handle: Any, profile: int, engines: int) -> Any:
        gi = self.instances[gi_id_of(handle)]
        if profile not in CI_PROFILES or CI_PROFILES[profile] > GI_PROFILES[gi.profile][1]:
            raise pynvml.NVMLError_NotSupported(pynvml.NVML_ERROR_NOT_SUPPORTED)
        assert engines == pynvml.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED
        return SimpleNamespace(id=profile, sliceCount=CI_PROFILES[profile])

    def nvmlGpuInstanceCreateComputeInstance(self, handle: Any, profile: int) -> Any:
        gi_id = gi_id_of(handle)
        gi = self.instances[gi_id]
        if self.fail_compute or CI_PROFILES[profile] != GI_PROFILES[gi.profile][1]:
            raise pynvml.NVMLError_InsufficientResources(pynvml.NVML_ERROR_INSUFFICIENT_RESOURCES)
        self.made += 1
        gi.computes[0] = f"MIG-{self.made:08x}-0000-4000-8000-00000000000{gi_id:x}"
        return ("ci", gi_id, 0)

    def nvmlComputeInstanceGetInfo(self, compute: Any) -> Any:
        return SimpleNamespace(id=compute[2])

    def nvmlGpuInstanceGetComputeInstanceById(self, handle: Any, ci_id: int) -> Any:
        return ("ci", gi_id_of(handle), ci_id)

    def nvmlComputeInstanceDestroy(self, compute: Any) -> None:
        del self.instances[compute[1]].computes[compute[2]]

    def nvmlDeviceGetGpuInstanceById(self, handle: str, gi_id: int) -> Any:
        if gi_id not in self.instances:
            raise pynvml.NVMLError_NotFound(pynvml.NVML_ERROR_NOT_FOUND)
        return gi_handle(gi_id)

    def nvmlGpuInstanceDestroy(self, handle: Any) -> None:
        gi_id = gi_id_of(handle)
        if self.instances[gi_id].computes:
            raise pynvml.NVMLError_InUse(pynvml.NVML_ERROR_IN_USE)
        del self.instances[gi_id]

    def _mig_devices(self) -> list[tuple[int, int, str]]:
        return [(g, c, u) for g, gi in sorted(self.instances.items()) for c, u in gi.computes.items()]

    def nvmlDeviceGetMaxMigDeviceCount(self, handle: str) -> int:
        return 7

    def nvmlDeviceGetMigDeviceHandleByIndex(self, handle: str, index: int) -> Any:
        devices = self._mig_devices()
        if index >= len(devices):
            raise pynvml.NVMLError_NotFound(pynvml.NVML_ERROR_NOT_FOUND)
        return ("mig", *devices[index])

    def nvmlDeviceGetGpuInstanceId(self, mig: Any) -> int:
        return int(mig[1])

    def nvmlDeviceGetComputeInstanceId(self, mig: Any) -> int:
        return int(mig[2])

    def nvmlDeviceGetUUID(self, mig: Any) -> str:
        return str(mig[3])


def booking(profile: str, start: int, size: int) -> MigAllocation:
    return MigAllocation(
        container_index=0,
        device_index=0,
        gpu_uuid="GPU-m",
        profile=profile,
        placement=MigPlacement(start=start, size=size),
    )


def test_create_list_and_destroy_an_instance_at_an_exact_placement() -> None:
    fake = FakeMigNvml()
    backend = NvmlBackend(nvml=fake)
    assert isinstance(backend, MigBackend)
    made = backend.create_mig_instance("GPU-m", "3g.20gb", 4, 4)
    assert (made.profile, made.start, made.size, made.compute_instance_id) == ("3g.20gb", 4, 4, 0)
    assert made.mig_uuid == fake.instances[made.gpu_instance_id].computes[0]  # read from the MIG device
    other = backend.create_mig_instance("GPU-m", "1g.5gb", 0, 1)
    assert backend.mig_instances("GPU-m") == tuple(sorted((made, other), key=lambda i: i.gpu_instance_id))
    backend.destroy_mig_instance("GPU-m", made.gpu_instance_id)  # compute instance first, then the GPU one
    assert backend.mig_instances("GPU-m") == (other,)
    assert set(fake.instances) == {other.gpu_instance_id}


def test_a_failed_compute_instance_leaves_nothing_behind() -> None:
    fake = FakeMigNvml(fail_compute=True)
    backend = NvmlBackend(nvml=fake)
    with pytest.raises(BackendError, match=r"card GPU-m: MIG profile '2g.10gb' at slices \[2, 4\).*compute"):
        backend.create_mig_instance("GPU-m", "2g.10gb", 2, 2)
    assert fake.instances == {}


def test_driver_refusals_are_backend_errors_naming_card_profile_and_placement() -> None:
    backend = NvmlBackend(nvml=FakeMigNvml())
    backend.create_mig_instance("GPU-m", "3g.20gb", 0, 4)
    with pytest.raises(BackendError, match=r"'2g.10gb' at slices \[2, 4\): creating the GPU instance failed"):
        backend.create_mig_instance("GPU-m", "2g.10gb", 2, 2)  # overlaps [0, 4)
    with pytest.raises(BackendError, match="offers no such GPU-instance profile"):
        backend.create_mig_instance("GPU-m", "4g.20gb", 0, 4)
    with pytest.raises(BackendError, match="card GPU-x: listing MIG instances failed"):
        backend.mig_instances("GPU-x")
    with pytest.raises(BackendError, match="destroying MIG GPU instance 9 failed"):
        backend.destroy_mig_instance("GPU-m", 9)


def test_ensure_reuses_a_spare_match_and_replaces_a_half_made_one() -> None:
    fake = FakeMigNvml()
    backend = NvmlBackend(nvml=fake)
    nobody = Claims(owners={})
    mine = ("default/p", 0, 0)
    spare = backend.create_mig_instance("GPU-m", "2g.10gb", 0, 2)
    assert ensure_instance(backend, booking("2g.10gb", 0, 2), owner=mine, claims=nobody) == spare
    # a GPU instance whose compute instance was never made (an interrupted Allocate): destroyed, redone
    fake.nvmlDeviceCreateGpuInstanceWithPlacement(
        "dev-m", 2, ctypes.pointer(pynvml.c_nvmlGpuInstancePlacement_t(4, 4))
    )
    (half,) = [i for i in backend.mig_instances("GPU-m") if i.start == 4]
    assert half.mig_uuid is None and half.compute_instance_id is None
    made = ensure_instance(backend, booking("3g.20gb", 4, 4), owner=mine, claims=nobody)
    assert made.mig_uuid is not None and [
        i.mig_uuid for i in backend.mig_instances("GPU-m") if i.start == 4
    ] == [made.mig_uuid]


def test_ensure_refuses_an_instance_a_live_pod_records_or_that_might_be_recorded() -> None:
    backend = NvmlBackend(nvml=FakeMigNvml())
    theirs = backend.create_mig_instance("GPU-m", "2g.10gb", 0, 2)
    assert theirs.mig_uuid is not None
    claims = Claims(owners={theirs.mig_uuid: ("ns/other", 1, 0)})
    with pytest.raises(AllocationError, match=r"which pod ns/other \(container 1, device 0\) still uses"):
        ensure_instance(backend, booking("2g.10gb", 0, 2), owner=("default/p", 0, 0), claims=claims)
    unknown = Claims(owners={}, unreadable=("ns/odd: bad JSON",))
    with pytest.raises(AllocationError, match=r"which may be in use: cannot read .* ns/odd: bad JSON"):
        ensure_instance(backend, booking("1g.5gb", 1, 1), owner=("default/p", 0, 0), claims=unknown)
    assert backend.mig_instances("GPU-m") == (theirs,)
    # the same entry asking again (a retried Allocate) gets its own recorded instance back
    again = ensure_instance(backend, booking("2g.10gb", 0, 2), owner=("ns/other", 1, 0), claims=claims)
    assert again == theirs
