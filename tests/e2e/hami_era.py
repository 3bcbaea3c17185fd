"""A cluster as HAMi left it: the objects the migration test (test_hami_migration.py) starts from.

Owns the HAMi-era fixtures: two GPU nodes and the pods HAMi placed on them, and the text of every
annotation exactly as HAMi v2.x writes it. The text is formatted here from plain data, the way HAMi's
Go code formats it, and never through ``hami.annotations``: a mistake in our codec must show up as a
wrong count, not cancel out. What HAMi writes (HAMi v2.10, ``Project-HAMi/HAMi``):

* registration ``hami.io/node-nvidia-register``: ``json.Marshal`` of ``[]DeviceInfo`` (fields in struct
  order ``id, index, count, devmem, devcore, type, numa, mode, migProfiles, health``, each omitted when
  zero, compact, no spaces) since v2.8; up to v2.7 the colon form ``id,count,devmem,devcore,type,numa,
  health,index,mode:`` per card (``EncodeNodeDevices``);
* handshake ``hami.io/node-handshake``: ``Requesting_`` + the scheduler's local time as
  ``2006-01-02 15:04:05``;
* node lock ``hami.io/mutex.lock``: ``time.Now().Format(time.RFC3339)`` (local time with its offset)
  ``,<namespace>,<pod>``;
* Filter: ``hami.io/vgpu-node`` (annotation and label), ``hami.io/vgpu-time`` (Unix seconds),
  ``hami.io/vgpu-devices-to-allocate`` = ``hami.io/vgpu-devices-allocated`` = one segment per
  container, init containers first, each card ``uuid,NVIDIA,MiB,cores:`` and ``;`` after each container;
* Bind: ``hami.io/bind-phase=allocating``, ``hami.io/bind-time`` (Unix seconds), then the Binding;
* the device plugin's Allocate: re-encodes ``to-allocate`` with the served containers blanked. Go splits
  the value on ``;``, which yields one empty entry after the last ``;``, so a finished pod of n
  containers carries n + 1 ``;``; then ``hami.io/bind-phase=success`` and the lock removed.

Must not import ``hami.annotations`` (see above); test-only.
"""

from __future__ import annotations

import datetime
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

#: HAMi's hostname-less local time zone of the fixtures: a scheduler running at UTC+8 writes this offset.
HAMI_ZONE = datetime.timezone(datetime.timedelta(hours=8))
MODEL = "NVIDIA A10"
CARD_MIB = 24576
SLOTS = 10


@dataclass(frozen=True, slots=True)
class Card:
    uuid: str
    index: int
    memory: int = CARD_MIB
    cores: int = 100
    slots: int = SLOTS


@dataclass(frozen=True, slots=True)
class Grant:
    """One card of one container's grant."""

    uuid: str
    memory: int
    cores: int


@dataclass(frozen=True, slots=True, kw_only=True)
class HamiPod:
    """A pod HAMi's scheduler placed; ``grants`` per container, init containers first."""

    namespace: str
    name: str
    node: str
    grants: tuple[tuple[Grant, ...], ...]
    init: int = 0  # how many of ``grants`` belong to init containers
    phase: str = "Running"
    allocating: bool = False  # bound, Allocate not yet done: bind-phase=allocating, to-allocate full

    def holding(self) -> list[tuple[Grant, ...]]:
        """The containers whose cards the pod counts by HAMi's rule (docs/scheduler.md): none once
        finished; with init containers (Running pods only, here) the app containers, as every init
        container exited 0."""
        if self.phase in ("Succeeded", "Failed"):
            return []
        assert self.init == 0 or self.phase == "Running", "fixture: init containers only on Running pods"
        return list(self.grants[self.init :])


@dataclass(frozen=True, slots=True, kw_only=True)
class HamiNode:
    name: str
    cards: tuple[Card, ...]
    legacy: bool = False  # registered in the colon form (HAMi <= v2.7)
    extra: Mapping[str, str] = field(default_factory=dict)


def _uuid(node: int, card: int) -> str:
    return f"GPU-7a1c0{node}d2-5e3b-4f1a-9c2d-0000000000{card}{node}"


GPU_A = HamiNode(name="gpu-a", cards=(Card(_uuid(0, 0), 0), Card(_uuid(0, 1), 1)))
GPU_B = HamiNode(name="gpu-b", cards=(Card(_uuid(1, 0), 0), Card(_uuid(1, 1), 1)), legacy=True)
NODES = (GPU_A, GPU_B)
A0, A1 = (c.uuid for c in GPU_A.cards)
B0, B1 = (c.uuid for c in GPU_B.cards)

#: The pods HAMi placed and that keep running through the cut-over.
RUNNING = (
    # one container on two cards
    HamiPod(
        namespace="ml", name="train-0", node="gpu-a", grants=((Grant(A0, 20000, 50), Grant(A1, 20000, 50)),)
    ),
    # a GPU-less sidecar first, then the GPU container
    HamiPod(namespace="ml", name="infer-0", node="gpu-a", grants=((), (Grant(A0, 4000, 30),))),
    # a GPU-less init container, then the GPU container (Go keeps the empty entry: index alignment)
    HamiPod(namespace="ml", name="etl-0", node="gpu-a", grants=((), (Grant(A1, 500, 10),)), init=1),
    # an init container on the same card as the app container; init finished (Running)
    HamiPod(
        namespace="ml",
        name="prep-0",
        node="gpu-b",
        grants=((Grant(B0, 8000, 0),), (Grant(B0, 6000, 40),)),
        init=1,
    ),
    HamiPod(namespace="default", name="notebook-0", node="gpu-b", grants=((Grant(B1, 10000, 60),),)),
    # finished: holds nothing, although its annotations name 20000 MiB of B1
    HamiPod(
        namespace="default",
        name="batch-0",
        node="gpu-b",
        grants=((Grant(B1, 20000, 40),),),
        phase="Succeeded",
    ),
)
#: Bound by HAMi's scheduler a moment before it was uninstalled; kubelet has not admitted it yet.
IN_FLIGHT = HamiPod(
    namespace="default", name="inflight-0", node="gpu-b", grants=((Grant(B0, 4000, 20),),), phase="Pending",
    allocating=True,
)  # fmt: skip
#: A HAMi bind that crashed: its lock stays on gpu-a, its pod gone (recent: only "holder gone" frees it).
DANGLING_HOLDER = ("ml", "train-1")


def hami_now(offset: datetime.timedelta = datetime.timedelta(0)) -> datetime.datetime:
    return datetime.datetime.now(HAMI_ZONE) + offset


def rfc3339(when: datetime.datetime) -> str:
    """Go's ``time.RFC3339``: whole seconds, ``Z`` for UTC, else ``+hh:mm``."""
    text = when.isoformat(timespec="seconds")
    return text[:-6] + "Z" if text.endswith("+00:00") else text


def register_json(node: HamiNode) -> str:
    """``MarshalNodeDevices``: Go's struct field order, zero values omitted, compact."""
    cards = []
    for card in node.cards:
        entry: dict[str, Any] = {"id": card.uuid}
        if card.index:
            entry["index"] = card.index
        entry |= {"count": card.slots, "devmem": card.memory, "devcore": card.cores, "type": MODEL}
        entry |= {"mode": "hami-core", "health": True}  # numa 0 omitted
        cards.append(entry)
    return json.dumps(cards, separators=(",", ":"))


def register_colon(node: HamiNode) -> str:
    """``EncodeNodeDevices`` (9 fields, each card terminated by ``:``)."""
    return "".join(
        f"{c.uuid},{c.slots},{c.memory},{c.cores},{MODEL},0,true,{c.index},hami-core:" for c in node.cards
    )


def handshake(when: datetime.datetime) -> str:
    return "Requesting_" + when.strftime("%Y-%m-%d %H:%M:%S")


def node_lock(when: datetime.datetime, namespace: str, name: str) -> str:
    return f"{rfc3339(when)},{namespace},{name}"


def node_annotations(node: HamiNode) -> dict[str, str]:
    register = register_colon(node) if node.legacy else register_json(node)
    last_handshake = datetime.datetime.now() - datetime.timedelta(hours=1)  # the scheduler's local clock
    return {"hami.io/node-nvidia-register": register, "hami.io/node-handshake": handshake(last_handshake)}


def device_list(grants: tuple[tuple[Grant, ...], ...]) -> str:
    """``EncodePodSingleDevice``."""
    return "".join("".join(f"{g.uuid},NVIDIA,{g.memory},{g.cores}:" for g in c) + ";" for c in grants)


def pod_annotations(pod: HamiPod, now: datetime.datetime) -> dict[str, str]:
    allocated = device_list(pod.grants)
    filtered = str(int(now.timestamp()) - 6)
    bound = str(int(now.timestamp()) - 5)
    return {
        "hami.io/vgpu-node": pod.node,
        "hami.io/vgpu-time": filtered,
        "hami.io/vgpu-devices-allocated": allocated,
        # the device plugin re-encodes Go's split, which has one more (empty) entry than containers
        "hami.io/vgpu-devices-to-allocate": allocated if pod.allocating else ";" * (len(pod.grants) + 1),
        "hami.io/bind-phase": "allocating" if pod.allocating else "success",
        "hami.io/bind-time": bound,
    }


def _container(name: str, grants: tuple[Grant, ...]) -> dict[str, Any]:
    container: dict[str, Any] = {"name": name, "image": "nvcr.io/nvidia/cuda:12.4.1-base-ubuntu22.04"}
    if grants:
        limits = {
            "nvidia.com/gpu": str(len(grants)),
            "nvidia.com/gpumem": str(grants[0].memory),
            "nvidia.com/gpucores": str(grants[0].cores),
        }
        container["resources"] = {"limits": limits}
    return container


def pod_object(pod: HamiPod, now: datetime.datetime) -> dict[str, Any]:
    """The pod as the API server holds it after HAMi's webhook, scheduler, kubelet (and device plugin)."""
    init = [_container(f"init-{i}", g) for i, g in enumerate(pod.grants[: pod.init])]
    app = [_container(f"c{i}", g) for i, g in enumerate(pod.grants[pod.init :])]
    spec: dict[str, Any] = {"schedulerName": "hami-scheduler", "nodeName": pod.node, "containers": app}
    if init:
        spec["initContainers"] = init
    status: dict[str, Any] = {"phase": pod.phase}
    if pod.phase == "Running" and init:
        done = {"terminated": {"exitCode": 0, "reason": "Completed"}}
        status["initContainerStatuses"] = [{"name": c["name"], "state": done} for c in init]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": pod.name,
            "namespace": pod.namespace,
            "labels": {"hami.io/vgpu-node": pod.node},
            "annotations": pod_annotations(pod, now),
        },
        "spec": spec,
        "status": status,
    }


def cluster_yaml() -> str:
    """The embedded cluster's file: the same nodes and cards, so our node agents register what HAMi's did."""
    lines = ["nodes:"]
    for node in NODES:
        cards = ", ".join(f"{{uuid: {c.uuid}, model: {MODEL}, memory_mib: {c.memory}}}" for c in node.cards)
        lines.append(f'  - {{name: {node.name}, labels: {{gpu: "on"}}, cards: [{cards}]}}')
    return "\n".join(lines) + "\n"
