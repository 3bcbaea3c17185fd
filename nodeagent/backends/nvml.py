"""Real cards through NVML (``nvidia-ml-py``, import name ``pynvml``): the project's ONLY pynvml import.

Owns discovery (uuid, index, model, memory, NUMA node from sysfs, MIG profiles, compute mode), health from XID
critical-error events (HAMi's ignore list) with recovery after a quiet period and a successful probe of
the card (the state machine is ``nodeagent.backends.health``), NVLink/PCIe pair scores, and the
exporter's live usage (memory used, utilisation, compute processes with their memory and SM share).
Tests pass a fake module with the same function names that raises pynvml's own ``NVMLError``
subclasses. Dynamic MIG: list, create (GPU instance at an exact placement + one compute instance
spanning it, undone on failure) and destroy GPU instances, MIG UUIDs read from the MIG device handles.
Must not import grpc, the Kubernetes client or the codec.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import math
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pynvml

from nodeagent.backends.base import (
    EXCLUSIVE_PROCESS,
    BackendError,
    BackendUnavailable,
    Card,
    Link,
    LiveUsage,
    MigInstance,
    MigProfileInfo,
    ProcessUsage,
)
from nodeagent.backends.health import HealthBook

log = logging.getLogger(__name__)

#: XIDs caused by applications, not by the card (HAMi and NVIDIA's plugin ignore them).
IGNORED_XIDS = frozenset({13, 31, 43, 45, 68, 109})
_MIB = 1024 * 1024
#: PCIe common-ancestor level -> pair score (docs/protocol.md, "Topology"); each active NVLink adds 100.
LEVEL_SCORES: tuple[tuple[str, int], ...] = (
    ("NVML_TOPOLOGY_SYSTEM", 10),  # across CPU sockets
    ("NVML_TOPOLOGY_NODE", 20),  # same CPU
    ("NVML_TOPOLOGY_HOSTBRIDGE", 30),
    ("NVML_TOPOLOGY_MULTIPLE", 40),  # several PCIe switches
    ("NVML_TOPOLOGY_SINGLE", 50),  # one PCIe switch
    ("NVML_TOPOLOGY_INTERNAL", 60),  # same board
)


#: NVML's compute modes (``nvmlDeviceGetComputeMode``) -> the card's ``compute_mode``.
COMPUTE_MODE_NAMES: tuple[tuple[str, str], ...] = (
    ("NVML_COMPUTEMODE_DEFAULT", "default"),
    ("NVML_COMPUTEMODE_EXCLUSIVE_THREAD", "exclusive-thread"),
    ("NVML_COMPUTEMODE_PROHIBITED", "prohibited"),
    ("NVML_COMPUTEMODE_EXCLUSIVE_PROCESS", EXCLUSIVE_PROCESS),
)


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _profile_name(info: Any) -> str:
    """NVML names GPU-instance profiles "MIG 1g.5gb"; the registration uses "1g.5gb"."""
    return _text(getattr(info, "name", "")).removeprefix("MIG ") or f"profile-{info.id}"


class NvmlBackend:
    """Cards from the NVIDIA driver. ``nvml`` defaults to the real module; ``sysfs`` to ``/sys``.

    ``health_recovery``: seconds without a critical XID before an unhealthy card is probed and may come
    back (0 = never); ``clock`` measures them (tests pass a fake one).
    """

    def __init__(
        self,
        *,
        nvml: Any = None,
        sysfs: Path = Path("/sys"),
        topology: bool = False,
        health_recovery: float = 300.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._nvml: Any = nvml if nvml is not None else pynvml
        self._sysfs = sysfs
        self._topology = topology
        self._health = HealthBook(recovery=health_recovery, clock=clock)
        self._mig_cache: dict[str, tuple[MigProfileInfo, ...]] = {}
        self._lock = threading.Lock()  # health state is shared by the registrar and the health poll
        self._mig_lock = threading.Lock()  # one MIG reconfiguration at a time
        try:
            self._nvml.nvmlInit()
        except pynvml.NVMLError_LibraryNotFound as exc:
            raise BackendUnavailable(
                "NVML library not found (libnvidia-ml.so.1): the NVIDIA driver is not installed on this node "
                "or not mounted into the container; use --backend sim to run without cards"
            ) from exc
        except pynvml.NVMLError as exc:
            raise BackendUnavailable(f"NVML initialisation failed: {exc}") from exc
        self._open = True
        self._events: Any = self._create_event_set()

    @property
    def name(self) -> str:
        return "nvml"

    def close(self) -> None:
        if self._open:
            self._open = False
            try:
                self._nvml.nvmlShutdown()
            except pynvml.NVMLError as exc:  # shutting down anyway; nothing to recover
                log.warning("NVML shutdown failed: %s", exc)

    # ------------------------------------------------------------------------------------- discovery
    def cards(self) -> tuple[Card, ...]:
        with self._lock:  # the whole health pass: events, then one verdict per card
            try:
                self._drain_events()
                count = self._nvml.nvmlDeviceGetCount()
                cards = tuple(self._card(self._nvml.nvmlDeviceGetHandleByIndex(i)) for i in range(count))
            except pynvml.NVMLError as exc:
                raise BackendError(f"NVML device query failed: {exc}") from exc
            self._health.settled()  # a node-wide event has now reached every card
            return cards

    def _card(self, handle: Any) -> Card:
        nvml = self._nvml
        uuid = _text(nvml.nvmlDeviceGetUUID(handle))
        try:
            memory: int | None = int(nvml.nvmlDeviceGetMemoryInfo(handle).total) // _MIB
        except pynvml.NVMLError_NotSupported:
            memory = None  # unified-memory parts (GB10): preConfiguredDeviceMemory applies
        index = int(nvml.nvmlDeviceGetIndex(handle))
        healthy, reason = self._health.check(uuid, lambda: self._probe(uuid))
        return Card(
            uuid=uuid,
            index=index,
            model=_text(nvml.nvmlDeviceGetName(handle)),
            memory_mib=memory,
            numa=self._numa(handle, uuid),
            healthy=healthy,
            health_reason=reason,
            mig_profiles=self._mig_profiles(handle, uuid),
            device_paths=(f"/dev/nvidia{self._minor(handle, index)}",),
            compute_mode=self._compute_mode(handle, uuid),
        )

    def _compute_mode(self, handle: Any, uuid: str) -> str:
        """The card's compute mode read now (an operator may change it at any time); ``unknown`` when
        the driver will not say, which no rule reads as exclusive."""
        try:
            mode = int(self._nvml.nvmlDeviceGetComputeMode(handle))
        except pynvml.NVMLError as exc:
            log.info("card %s: compute mode unknown (%s)", uuid, exc)
            return "unknown"
        for constant, name in COMPUTE_MODE_NAMES:
            if mode == getattr(pynvml, constant):
                return name
        return "unknown"

    def _minor(self, handle: Any, index: int) -> int:
        try:
            return int(self._nvml.nvmlDeviceGetMinorNumber(handle))
        except pynvml.NVMLError:
            return index

    def _bus_id(self, handle: Any) -> str:
        # NVML spells the PCI domain with 8 digits, sysfs with 4: "00000000:3B:00.0" -> "0000:3b:00.0"
        bus_id = _text(self._nvml.nvmlDeviceGetPciInfo(handle).busId).lower()
        return bus_id[4:] if len(bus_id.split(":", 1)[0]) == 8 else bus_id

    def _numa(self, handle: Any, uuid: str) -> int:
        path = self._sysfs / "bus" / "pci" / "devices" / self._bus_id(handle) / "numa_node"
        try:
            node = int(path.read_text().strip())
        except (OSError, ValueError) as exc:
            log.info("card %s: NUMA node unknown (%s), using 0", uuid, exc)
            return 0
        return max(node, 0)  # -1 = the platform has no NUMA information

    def _mig_profiles(self, handle: Any, uuid: str) -> tuple[MigProfileInfo, ...]:
        """The card's GPU-instance profiles; hardware facts, so read once per card."""
        if uuid in self._mig_cache:
            return self._mig_cache[uuid]
        nvml, infos = self._nvml, []
        for profile in range(int(getattr(nvml, "NVML_GPU_INSTANCE_PROFILE_COUNT", 0))):
            try:
                info = nvml.nvmlDeviceGetGpuInstanceProfileInfo(handle, profile)
                places = self._placements(handle, int(info.id))
            except pynvml.NVMLError:
                continue  # profile not offered by this card, or the card has no MIG at all
            infos.append((info, places))
        total_sm = max((int(i.multiprocessorCount) for i, _ in infos), default=0)
        profiles = tuple(
            MigProfileInfo(
                name=_profile_name(info),
                memory_mib=int(info.memorySizeMB),
                cores=math.ceil(100 * int(info.multiprocessorCount) / total_sm) if total_sm else 0,
                slice_count=int(info.sliceCount),
                instance_count=int(info.instanceCount),
                placements=places,
            )
            for info, places in infos
        )
        self._mig_cache[uuid] = profiles
        return profiles

    def _placements(self, handle: Any, profile_id: int) -> tuple[tuple[int, int], ...]:
        """Where a GPU instance of the profile may start, as ``(start, size)`` slices. NVML's call takes
        C out-parameters: asked first with no array for the count (a profile may have more placements
        than instances, e.g. ``1g.10gb+me``), then with an array of that size."""
        count = ctypes.c_uint(0)
        self._nvml.nvmlDeviceGetGpuInstancePossiblePlacements(handle, profile_id, None, ctypes.byref(count))
        if count.value == 0:
            return ()
        places = (pynvml.c_nvmlGpuInstancePlacement_t * count.value)()
        self._nvml.nvmlDeviceGetGpuInstancePossiblePlacements(handle, profile_id, places, ctypes.byref(count))
        return tuple((int(places[k].start), int(places[k].size)) for k in range(count.value))

    # ---------------------------------------------------------------------------------------- health
    def _create_event_set(self) -> Any:
        nvml = self._nvml
        try:
            events = nvml.nvmlEventSetCreate()
        except pynvml.NVMLError as exc:
            log.warning("NVML events unavailable, health checks off: %s", exc)
            return None
        try:
            count = nvml.nvmlDeviceGetCount()
        except pynvml.NVMLError as exc:
            raise BackendUnavailable(f"NVML device count failed: {exc}") from exc
        for i in range(count):
            handle = nvml.nvmlDeviceGetHandleByIndex(i)
            try:
                nvml.nvmlDeviceRegisterEvents(handle, pynvml.nvmlEventTypeXidCriticalError, events)
            except pynvml.NVMLError_NotSupported:
                log.info("card %d is too old for XID events; its health is not watched", i)
        return events

    def _probe(self, uuid: str) -> str | None:
        """A cheap sign of life from a card whose quiet period is over: the driver still finds it by its
        UUID and answers a memory query. ``None`` = fine, else what failed."""
        nvml = self._nvml
        try:
            handle = nvml.nvmlDeviceGetHandleByUUID(uuid)
            # unified-memory parts never report memory; NOT_SUPPORTED still means the card answered
            with contextlib.suppress(pynvml.NVMLError_NotSupported):
                nvml.nvmlDeviceGetMemoryInfo(handle)
            found = _text(nvml.nvmlDeviceGetUUID(handle))
        except pynvml.NVMLError as exc:
            return f"NVML query failed: {exc}"
        return None if found == uuid else f"the card now reads UUID {found}"

    def _drain_events(self) -> None:
        """Read every pending XID event without waiting; each critical one (re)starts its card's sickness."""
        if self._events is None:
            return
        while True:
            try:
                data = self._nvml.nvmlEventSetWait(self._events, 0)
            except pynvml.NVMLError_Timeout:
                return
            except pynvml.NVMLError as exc:
                self._health.critical_all(f"NVML event wait failed ({exc})")
                return
            xid = int(data.eventData)
            if xid in IGNORED_XIDS:
                continue
            try:
                uuid = _text(self._nvml.nvmlDeviceGetUUID(data.device))
            except pynvml.NVMLError:
                self._health.critical_all(f"XID {xid} on a card whose UUID cannot be read")
                continue
            self._health.critical(uuid, f"XID {xid}")

    # ----------------------------------------------------------------------------------- live usage
    def usage(self) -> tuple[LiveUsage, ...]:
        """Memory used, utilisation and compute processes per card. A figure the card does not support
        is ``None`` rather than an error, so one old card does not blank the whole node."""
        nvml = self._nvml
        try:
            handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(nvml.nvmlDeviceGetCount())]
            return tuple(self._usage(handle) for handle in handles)
        except pynvml.NVMLError as exc:
            raise BackendError(f"NVML usage query failed: {exc}") from exc

    def _usage(self, handle: Any) -> LiveUsage:
        nvml = self._nvml
        uuid = _text(nvml.nvmlDeviceGetUUID(handle))
        try:
            used: int | None = int(nvml.nvmlDeviceGetMemoryInfo(handle).used)
        except pynvml.NVMLError_NotSupported:
            used = None
        gpu: int | None = None
        memory: int | None = None
        try:
            rates = nvml.nvmlDeviceGetUtilizationRates(handle)
            gpu, memory = int(rates.gpu), int(rates.memory)
        except pynvml.NVMLError_NotSupported:
            pass  # both stay unknown
        return LiveUsage(
            uuid=uuid,
            memory_used_bytes=used,
            utilization=gpu,
            memory_utilization=memory,
            processes=self._processes(handle),
        )

    def _processes(self, handle: Any) -> tuple[ProcessUsage, ...] | None:
        nvml = self._nvml
        try:
            running = nvml.nvmlDeviceGetComputeRunningProcesses(handle)
        except pynvml.NVMLError_NotSupported:
            return None
        shares: dict[int, int] = {}
        try:
            # Samples since the driver's buffer start (timestamp 0); the newest one per process wins.
            for sample in sorted(nvml.nvmlDeviceGetProcessUtilization(handle, 0), key=lambda s: s.timeStamp):
                shares[int(sample.pid)] = int(sample.smUtil)
        except pynvml.NVMLError:
            pass  # NOT_FOUND = no samples yet; NOT_SUPPORTED = old card: memory is still worth reporting
        return tuple(
            ProcessUsage(
                pid=int(p.pid),
                # usedGpuMemory is None when the driver withholds it (e.g. no permission, MIG)
                memory_bytes=int(p.usedGpuMemory or 0),
                utilization=shares.get(int(p.pid)),
            )
            for p in running
        )

    # ------------------------------------------------------------------------------------ dynamic MIG
    def mig_instances(self, gpu_uuid: str) -> tuple[MigInstance, ...]:
        with self._mig_lock:
            try:
                handle = self._nvml.nvmlDeviceGetHandleByUUID(gpu_uuid)
                return self._instances(handle, gpu_uuid)
            except pynvml.NVMLError as exc:
                raise BackendError(f"card {gpu_uuid}: listing MIG instances failed: {exc}") from exc

    def create_mig_instance(self, gpu_uuid: str, profile: str, start: int, size: int) -> MigInstance:
        nvml = self._nvml
        where = f"card {gpu_uuid}: MIG profile {profile!r} at slices [{start}, {start + size})"
        with self._mig_lock:
            try:
                handle = nvml.nvmlDeviceGetHandleByUUID(gpu_uuid)
                info = next((i for i, name in self._gi_profiles(handle) if name == profile), None)
                if info is None:
                    raise BackendError(f"{where}: the card offers no such GPU-instance profile")
                placement = pynvml.c_nvmlGpuInstancePlacement_t(start, size)
                gpu_instance = nvml.nvmlDeviceCreateGpuInstanceWithPlacement(
                    handle, info.id, ctypes.pointer(placement)
                )
            except pynvml.NVMLError as exc:
                raise BackendError(f"{where}: creating the GPU instance failed: {exc}") from exc
            compute: Any = None
            try:
                gi_id = int(nvml.nvmlGpuInstanceGetInfo(gpu_instance).id)
                ci_profile = self._full_ci(gpu_instance)
                compute = nvml.nvmlGpuInstanceCreateComputeInstance(gpu_instance, ci_profile.id)
                ci_id = int(nvml.nvmlComputeInstanceGetInfo(compute).id)
                mig_uuid = self._mig_devices(handle).get((gi_id, ci_id))
                if mig_uuid is None:
                    raise BackendError(f"no MIG device shows GPU instance {gi_id} / compute instance {ci_id}")
            except (pynvml.NVMLError, BackendError) as exc:
                self._undo(gpu_instance, compute, where)  # a half-made instance would block the slices
                raise BackendError(f"{where}: creating the compute instance failed: {exc}") from exc
        log.info("card %s: created MIG instance %s (%s, GPU instance %d)", gpu_uuid, mig_uuid, profile, gi_id)
        return MigInstance(
            gpu_uuid=gpu_uuid,
            profile=profile,
            start=start,
            size=size,
            gpu_instance_id=gi_id,
            compute_instance_id=ci_id,
            mig_uuid=mig_uuid,
        )

    def destroy_mig_instance(self, gpu_uuid: str, gpu_instance_id: int) -> None:
        nvml = self._nvml
        with self._mig_lock:
            try:
                handle = nvml.nvmlDeviceGetHandleByUUID(gpu_uuid)
                gpu_instance = nvml.nvmlDeviceGetGpuInstanceById(handle, gpu_instance_id)
                for gi_id, ci_id in self._mig_devices(handle):
                    if gi_id == gpu_instance_id:
                        nvml.nvmlComputeInstanceDestroy(
                            nvml.nvmlGpuInstanceGetComputeInstanceById(gpu_instance, ci_id)
                        )
                nvml.nvmlGpuInstanceDestroy(gpu_instance)
            except pynvml.NVMLError as exc:
                raise BackendError(
                    f"card {gpu_uuid}: destroying MIG GPU instance {gpu_instance_id} failed: {exc}"
                ) from exc
        log.info("card %s: destroyed MIG GPU instance %d", gpu_uuid, gpu_instance_id)

    def _gi_profiles(self, handle: Any) -> list[tuple[Any, str]]:
        """(NVML profile info, profile name) for every GPU-instance profile the card offers."""
        found = []
        for profile in range(int(getattr(self._nvml, "NVML_GPU_INSTANCE_PROFILE_COUNT", 0))):
            try:
                info = self._nvml.nvmlDeviceGetGpuInstanceProfileInfo(handle, profile)
            except pynvml.NVMLError:
                continue  # not offered by this card
            found.append((info, _profile_name(info)))
        return found

    def _instances(self, handle: Any, gpu_uuid: str) -> tuple[MigInstance, ...]:
        devices = self._mig_devices(handle)
        found = []
        for info, name in self._gi_profiles(handle):
            count = int(info.instanceCount)
            if count <= 0:
                continue
            # nvmlDeviceGetGpuInstances fills a caller-owned array and count (C out-parameters)
            handles = (pynvml.c_nvmlGpuInstance_t * count)()
            filled = ctypes.c_uint(0)
            self._nvml.nvmlDeviceGetGpuInstances(handle, info.id, handles, ctypes.pointer(filled))
            for k in range(filled.value):
                gi = self._nvml.nvmlGpuInstanceGetInfo(handles[k])
                gi_id = int(gi.id)
                computes = sorted(c for g, c in devices if g == gi_id)
                ci = computes[0] if computes else None
                found.append(
                    MigInstance(
                        gpu_uuid=gpu_uuid,
                        profile=name,
                        start=int(gi.placement.start),
                        size=int(gi.placement.size),
                        gpu_instance_id=gi_id,
                        compute_instance_id=ci,
                        mig_uuid=None if ci is None else devices[(gi_id, ci)],
                    )
                )
        return tuple(sorted(found, key=lambda i: i.gpu_instance_id))

    def _mig_devices(self, handle: Any) -> dict[tuple[int, int], str]:
        """(GPU instance id, compute instance id) -> MIG UUID of every MIG device on the card."""
        nvml, found = self._nvml, {}
        for index in range(int(nvml.nvmlDeviceGetMaxMigDeviceCount(handle))):
            try:
                mig = nvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, index)
            except pynvml.NVMLError_NotFound:
                continue  # the index range is a maximum; unused indexes are empty
            key = (int(nvml.nvmlDeviceGetGpuInstanceId(mig)), int(nvml.nvmlDeviceGetComputeInstanceId(mig)))
            found[key] = _text(nvml.nvmlDeviceGetUUID(mig))
        return found

    def _full_ci(self, gpu_instance: Any) -> Any:
        """The compute-instance profile spanning the whole GPU instance (the most slices it offers)."""
        best: Any = None
        for profile in range(int(getattr(self._nvml, "NVML_COMPUTE_INSTANCE_PROFILE_COUNT", 0))):
            try:
                info = self._nvml.nvmlGpuInstanceGetComputeInstanceProfileInfo(
                    gpu_instance, profile, pynvml.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED
                )
            except pynvml.NVMLError:
                continue  # larger than this GPU instance
            if best is None or int(info.sliceCount) > int(best.sliceCount):
                best = info
        if best is None:
            raise BackendError("the GPU instance offers no compute-instance profile")
        return best

    def _undo(self, gpu_instance: Any, compute: Any, where: str) -> None:
        try:
            if compute is not None:
                self._nvml.nvmlComputeInstanceDestroy(compute)
            self._nvml.nvmlGpuInstanceDestroy(gpu_instance)
        except pynvml.NVMLError as exc:  # reported; the next Allocate destroys it as unclaimed
            log.error("%s: could not remove the half-made instance: %s", where, exc)

    # -------------------------------------------------------------------------------------- topology
    def links(self) -> tuple[Link, ...]:
        if not self._topology:
            return ()
        nvml = self._nvml
        try:
            handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(nvml.nvmlDeviceGetCount())]
            uuids = [_text(nvml.nvmlDeviceGetUUID(h)) for h in handles]
            buses = [self._bus_id(h) for h in handles]
            levels = {getattr(nvml, k): v for k, v in LEVEL_SCORES if hasattr(nvml, k)}
            result = []
            for i in range(len(handles)):
                for j in range(i + 1, len(handles)):
                    there = self._nvlinks(handles[i], buses[j])
                    back = self._nvlinks(handles[j], buses[i])
                    if there != back:
                        log.warning(
                            "asymmetric NVLink count between %s and %s; pair scores 0", uuids[i], uuids[j]
                        )
                        score = 0
                    else:
                        level = nvml.nvmlDeviceGetTopologyCommonAncestor(handles[i], handles[j])
                        score = levels.get(level, 0) + 100 * there
                    result.append(Link(a=uuids[i], b=uuids[j], score=score))
            return tuple(result)
        except pynvml.NVMLError as exc:
            raise BackendError(f"NVML topology query failed: {exc}") from exc

    def _nvlinks(self, handle: Any, peer_bus: str) -> int:
        count = 0
        for link in range(int(getattr(self._nvml, "NVML_NVLINK_MAX_LINKS", 0))):
            try:
                if not self._nvml.nvmlDeviceGetNvLinkState(handle, link):
                    continue
                remote = _text(self._nvml.nvmlDeviceGetNvLinkRemotePciInfo(handle, link).busId).lower()
            except pynvml.NVMLError:
                continue  # link not present on this card
            if remote.endswith(peer_bus):
                count += 1
        return count
