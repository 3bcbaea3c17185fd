"""The node exporter's collector: what ``/metrics`` on ``--metrics-listen`` reports.

Owns :class:`NodeCollector`, a prometheus-client collector that computes every value at scrape time
from what the agent already holds: the cards (``Inventory``, refreshed by the health poll), the node's
registration rules (``build_registration``: scaled memory, cores, slots, health), the tracked pods'
grants (``GrantBook``, decoded with the shared codec) and the backend's live usage, with processes
attributed to pod containers through their cgroup. Metric names follow HAMi's monitor where HAMi has
one (docs/metrics.md, "Node agent"; its legacy camel-case names too with ``--legacy-metrics``), ours are
``hami_node_*``; all but the legacy ones pass ``promtool check metrics`` (``tests/test_promlint.py``).
Every series carries HAMi's constant ``zone="vGPU"`` label, and ``node`` + ``device_uuid``. The full
list is ``docs/metrics.md``. The registry is built by the entry point and passed in: no global registry;
the entry point serves it (text or OpenMetrics, with ``/healthz``) through the shared listener of
:mod:`hami.process.http`, reading it in a worker thread. Must not import grpc, pynvml or the
Kubernetes client.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass

from prometheus_client.metrics_core import GaugeMetricFamily, Metric

from nodeagent.backends.base import BackendError, Card, LiveUsage, live_usage
from nodeagent.cgroups import ProcessOwners
from nodeagent.config import NodeSettings
from nodeagent.grants import PodGrants, TrackedPods, card_totals
from nodeagent.inventory import Inventory
from nodeagent.mps.control import MpsControl
from nodeagent.mps.metrics import mps_families
from nodeagent.registrar import build_registration, card_type

log = logging.getLogger(__name__)

MIB = 1024 * 1024
ZONE = "vGPU"  # HAMi's constant label on every monitor metric
CARD = ["node", "device_uuid", "device_index", "device_type", "zone"]
CONTAINER = ["node", "namespace", "pod", "container", "vdevice_index", "device_uuid", "zone"]
LEGACY_HOST = ["nodeid", "deviceidx", "deviceuuid", "devicetype", "zone"]
LEGACY_CONTAINER = ["podnamespace", "podname", "ctrname", "vdeviceid", "deviceuuid", "zone"]


@dataclass(frozen=True, slots=True, kw_only=True)
class _Live:
    """A container's live figures on one card, summed over its processes there."""

    memory_bytes: int
    utilization: int | None  # None when the driver did not give every process's share


class NodeCollector:
    """Computes the node's metrics on each scrape (called from a worker thread: it may block)."""

    def __init__(
        self,
        *,
        node_name: str,
        inventory: Inventory,
        settings: NodeSettings,
        grants: TrackedPods,
        owners: ProcessOwners | None = None,
        legacy: bool = False,
        mps: MpsControl | None = None,
    ) -> None:
        self._node, self._inventory, self._settings, self._grants = node_name, inventory, settings, grants
        self._owners = owners if owners is not None else ProcessOwners()
        self._legacy = legacy
        self._mps = mps  # MPS mode: the control daemon's families (nodeagent.mps.metrics)

    def describe(self) -> Iterable[Metric]:
        """The families without samples (lets the registry reject a duplicate name at register time)."""
        families = [family for family in self._families().values() if family is not None]
        return families + (mps_families(self._node, ZONE, None) if self._mps is not None else [])

    def collect(self) -> Iterable[Metric]:
        cards = self._inventory.cards
        pods = self._grants.pods
        try:
            live = live_usage(self._inventory.backend)
        except BackendError as exc:  # allocation metrics are still worth serving
            log.warning("live card usage unavailable for this scrape: %s", exc)
            live = ()
        families = self._families()
        self._card_metrics(families, cards, pods)
        self._host_metrics(families, cards, live)
        self._container_metrics(families, pods, live)
        daemon = mps_families(self._node, ZONE, self._mps) if self._mps is not None else []
        return [f for f in families.values() if f is not None] + daemon

    # ----------------------------------------------------------------------------------- families
    def _families(self) -> dict[str, GaugeMetricFamily | None]:
        legacy = self._legacy
        return {
            # allocation view of each registered card (ours: HAMi keeps these in the scheduler only)
            "mem_total": GaugeMetricFamily(
                "hami_node_card_memory_total_bytes",
                "Registered card memory (after deviceMemoryScaling), the budget grants draw on.",
                labels=CARD,
            ),
            "mem_alloc": GaugeMetricFamily(
                "hami_node_card_memory_allocated_bytes",
                "Card memory granted to tracked pods (init containers collapsed as the scheduler does).",
                labels=CARD,
            ),
            "cores_capacity": GaugeMetricFamily(
                "hami_node_card_cores_capacity",
                "Registered card cores in percent of the card (100 x deviceCoreScaling).",
                labels=CARD,
            ),
            "cores_alloc": GaugeMetricFamily(
                "hami_node_card_cores_allocated", "Card cores (percent) granted to tracked pods.", labels=CARD
            ),
            "slots_capacity": GaugeMetricFamily(
                "hami_node_card_slots_capacity",
                "Containers that may share the card (deviceSplitCount).",
                labels=CARD,
            ),
            "slots_used": GaugeMetricFamily(
                "hami_node_card_slots_used", "Container grants on the card (slots in use).", labels=CARD
            ),
            "healthy": GaugeMetricFamily(
                "hami_node_card_healthy", "1 when the card is healthy, 0 when not.", labels=CARD
            ),
            # live card usage (HAMi's monitor names)
            "host_mem": GaugeMetricFamily(
                "hami_host_gpu_memory_used_bytes", "Card memory in use, from the driver.", labels=CARD
            ),
            "host_util": GaugeMetricFamily(
                "hami_host_gpu_utilization_ratio",
                "Card GPU utilisation, 0-100, from the driver.",
                labels=CARD,
            ),
            "host_mc_util": GaugeMetricFamily(
                "hami_host_gpu_memory_controller_utilization_ratio",
                "Card memory-controller utilisation, 0-100, from the driver.",
                labels=CARD,
            ),
            # per container grant
            "ctr_mem_alloc": GaugeMetricFamily(
                "hami_node_container_memory_allocated_bytes",
                "Card memory granted to the container (hami.io/vgpu-devices-allocated).",
                labels=CONTAINER,
            ),
            "ctr_cores_alloc": GaugeMetricFamily(
                "hami_node_container_cores_allocated",
                "Card cores (percent) granted to the container.",
                labels=CONTAINER,
            ),
            "vgpu_limit": GaugeMetricFamily(
                "hami_vgpu_memory_limit_bytes",
                "The container's memory limit on the card (its grant; HAMi-core enforces it).",
                labels=CONTAINER,
            ),
            # per container live usage (processes attributed through their cgroup)
            "vgpu_used": GaugeMetricFamily(
                "hami_vgpu_memory_used_bytes",
                "Card memory used by the container's processes.",
                labels=CONTAINER,
            ),
            "ctr_mem": GaugeMetricFamily(
                "hami_container_device_memory_bytes",
                "Card memory used by the container's processes (same value as hami_vgpu_memory_used_bytes).",
                labels=CONTAINER,
            ),
            "ctr_util": GaugeMetricFamily(
                "hami_container_device_utilization_ratio",
                "SM utilisation of the container's processes on the card, 0-100.",
                labels=CONTAINER,
            ),
            # HAMi's legacy names (--legacy-metrics)
            "legacy_host_mem": GaugeMetricFamily(
                "HostGPUMemoryUsage", "Card memory in use (legacy name).", labels=LEGACY_HOST
            )
            if legacy
            else None,
            "legacy_host_util": GaugeMetricFamily(
                "HostCoreUtilization", "Card GPU utilisation 0-100 (legacy name).", labels=LEGACY_HOST
            )
            if legacy
            else None,
            "legacy_used": GaugeMetricFamily(
                "vGPU_device_memory_usage_in_bytes",
                "Container memory used (legacy name).",
                labels=LEGACY_CONTAINER,
            )
            if legacy
            else None,
            "legacy_limit": GaugeMetricFamily(
                "vGPU_device_memory_limit_in_bytes",
                "Container memory limit (legacy name).",
                labels=LEGACY_CONTAINER,
            )
            if legacy
            else None,
            "legacy_mem_desc": GaugeMetricFamily(
                "Device_memory_desc_of_container",
                "Container memory used (legacy name; no context/module/data breakdown from the driver).",
                labels=LEGACY_CONTAINER,
            )
            if legacy
            else None,
            "legacy_util_desc": GaugeMetricFamily(
                "Device_utilization_desc_of_container",
                "Container SM utilisation 0-100 (legacy name).",
                labels=LEGACY_CONTAINER,
            )
            if legacy
            else None,
        }

    # ------------------------------------------------------------------------------------- values
    def _card_metrics(
        self, f: dict[str, GaugeMetricFamily | None], cards: tuple[Card, ...], pods: tuple[PodGrants, ...]
    ) -> None:
        registration = build_registration(cards, (), self._settings)
        for state in card_totals(self._node, registration.devices, pods).devices:
            device = state.device
            labels = [self._node, device.uuid, str(device.index), device.type, ZONE]
            for key, value in (
                ("mem_total", device.memory_mib * MIB),
                ("mem_alloc", state.used_mem * MIB),
                ("cores_capacity", device.cores),
                ("cores_alloc", state.used_cores),
                ("slots_capacity", device.count),
                ("slots_used", state.used),
                ("healthy", int(device.health)),
            ):
                _add(f, key, labels, value)

    def _host_metrics(
        self, f: dict[str, GaugeMetricFamily | None], cards: tuple[Card, ...], live: tuple[LiveUsage, ...]
    ) -> None:
        by_uuid = {card.uuid: card for card in cards}
        for usage in live:
            card = by_uuid.get(usage.uuid)
            index, kind = (str(card.index), card_type(card.model)) if card else ("", "")
            labels = [self._node, usage.uuid, index, kind, ZONE]
            legacy = [self._node, index, usage.uuid, kind, ZONE]
            if usage.memory_used_bytes is not None:
                _add(f, "host_mem", labels, usage.memory_used_bytes)
                _add(f, "legacy_host_mem", legacy, usage.memory_used_bytes)
            if usage.utilization is not None:
                _add(f, "host_util", labels, usage.utilization)
                _add(f, "legacy_host_util", legacy, usage.utilization)
            if usage.memory_utilization is not None:
                _add(f, "host_mc_util", labels, usage.memory_utilization)

    def _container_metrics(
        self, f: dict[str, GaugeMetricFamily | None], pods: tuple[PodGrants, ...], live: tuple[LiveUsage, ...]
    ) -> None:
        measured = self._attribute(pods, live)
        listed = {usage.uuid for usage in live if usage.processes is not None}
        for pod in pods:
            for grant in pod.grants:
                labels = [
                    self._node,
                    pod.namespace,
                    pod.name,
                    grant.container,
                    str(grant.vdevice_index),
                    grant.uuid,
                    ZONE,
                ]
                legacy = labels[1:]  # HAMi's legacy container labels: the same, without node
                _add(f, "ctr_mem_alloc", labels, grant.memory_mib * MIB)
                _add(f, "ctr_cores_alloc", labels, grant.cores)
                _add(f, "vgpu_limit", labels, grant.memory_mib * MIB)
                _add(f, "legacy_limit", legacy, grant.memory_mib * MIB)
                if grant.uuid not in listed:
                    continue  # the backend cannot list this card's processes: usage unknown, not 0
                idle = _Live(memory_bytes=0, utilization=0)  # no process of the container on the card
                figures = measured.get((pod.uid, grant.container, grant.uuid), idle)
                for key in ("vgpu_used", "ctr_mem"):
                    _add(f, key, labels, figures.memory_bytes)
                for key in ("legacy_used", "legacy_mem_desc"):
                    _add(f, key, legacy, figures.memory_bytes)
                if figures.utilization is not None:
                    _add(f, "ctr_util", labels, figures.utilization)
                    _add(f, "legacy_util_desc", legacy, figures.utilization)

    def _attribute(
        self, pods: tuple[PodGrants, ...], live: tuple[LiveUsage, ...]
    ) -> dict[tuple[str, str, str], _Live]:
        """(pod UID, container name, card) → the summed figures of that container's processes there."""
        by_uid = {pod.uid: pod for pod in pods if pod.uid}
        out: dict[tuple[str, str, str], _Live] = {}
        for usage in live:
            for process in usage.processes or ():
                owner = self._owners.owner(process.pid)
                pod = by_uid.get(owner[0]) if owner else None
                if owner is None or pod is None or owner[1] not in pod.container_ids:
                    continue  # not a tracked pod's container (a host process, another device plugin's pod)
                key = (pod.uid, pod.container_ids[owner[1]], usage.uuid)
                before = out.get(key, _Live(memory_bytes=0, utilization=0))
                share = (
                    None
                    if before.utilization is None or process.utilization is None
                    else (before.utilization + process.utilization)
                )
                out[key] = _Live(memory_bytes=before.memory_bytes + process.memory_bytes, utilization=share)
        return out


def _add(f: dict[str, GaugeMetricFamily | None], key: str, labels: list[str], value: float) -> None:
    family = f[key]
    if family is not None:
        family.add_metric(labels, value)
