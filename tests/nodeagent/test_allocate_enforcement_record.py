"""Allocate holds the node to the enforcement bind recorded (docs/node-agent.md, Allocate step 2):
the scheduler writes each granted card's kind in ``hami.io/vgpu-enforcement`` from the node's
registration; when the node has lost it since (the MPS daemon restarted without namespaces, the HAMi-core
library removed) the agent refuses the card rather than run the pod under less than it was placed with.
Driven end to end through the device plugin's gRPC surface, with pods as bind leaves them on the
embedded API server."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

import kmock
import pytest

from hami.annotations import POD_BIND_PHASE, POD_DEVICES_TO_ALLOCATE, POD_VGPU_ENFORCEMENT
from nodeagent.allocate_call import Allocator
from nodeagent.config import NodeSettings
from nodeagent.mps.control import MpsControl
from nodeagent.mps.protocol import CardLimit, MpsState
from tests.eventually import eventually
from tests.nodeagent.agent_helpers import (
    EVENTS,
    POD,
    allocate_request,
    annotations_of,
    card,
    create_node,
    g,
    node_lock,
    placed,
    plugin_stub,
    refused,
    sim_inventory,
)

PER_CLIENT = MpsState(running=True, protocol=2, detail="pid 7, per-client limits")
NAMESPACED = MpsState(
    running=True, protocol=3, namespaces=True, restored=True, detail="pid 7, namespaces, pods restored"
)

#: kubelet's Allocate: generous on a busy machine (a bound on the test, not the behaviour under test)
TIMEOUT = 60


class Daemon(MpsControl):
    """The node's MPS control daemon as the Allocator sees it: ``check`` answers ``answer``."""

    def __init__(self, root: Path, answer: MpsState) -> None:
        super().__init__(root=root)
        self.answer = answer
        self.opened: list[str] = []

    async def check(self) -> MpsState:
        return self.answer

    async def open_namespace(self, name: str, limits: Sequence[CardLimit]) -> PurePosixPath:
        self.opened.append(name)
        return self.namespace_dir(name)


@dataclass
class Agent:
    stub: Any
    hook: Path
    daemon: Daemon | None


def install_library(hook: Path) -> None:
    """HAMi-core as the chart's init container leaves it: the library and ld.so.preload naming it."""
    vgpu = hook / "vgpu"
    vgpu.mkdir(parents=True, exist_ok=True)
    (vgpu / "libvgpu.so").write_bytes(b"\x7fELF")
    (vgpu / "ld.so.preload").write_text(f"{vgpu / 'libvgpu.so'}\n")


@pytest.fixture
def mode() -> str:
    return "hami-core"


@pytest.fixture
async def agent(
    apiserver: kmock.KubernetesEmulator, api: Any, sock_dir: Path, tmp_path: Path, mode: str
) -> AsyncIterator[Agent]:
    """Node n1's agent with ``--hook-path`` (nothing installed there yet); in MPS mode its daemon
    answers namespaces until a test changes it, and GPU-a is in EXCLUSIVE_PROCESS compute mode (GPU-b is
    not: a process there can leave MPS, so the node reports it ``mps`` whatever the daemon holds)."""
    await create_node(apiserver, "n1")
    settings = NodeSettings(mode="mps") if mode == "mps" else NodeSettings()
    daemon = Daemon(tmp_path / "mps", NAMESPACED) if mode == "mps" else None
    cards = [card("GPU-a", compute_mode="exclusive-process"), card("GPU-b")]
    inventory = await sim_inventory(tmp_path, cards)
    hook = tmp_path / "hook"
    allocator = Allocator(
        api=api,
        node_name="n1",
        settings=settings,
        hook_path=hook,
        lock_dir=tmp_path / "vgpulock",
        inventory=inventory,
        mps=daemon,
    )
    async with plugin_stub(allocator, inventory, settings, sock_dir) as stub:
        yield Agent(stub=stub, hook=hook, daemon=daemon)


async def place(
    apiserver: kmock.KubernetesEmulator, api: Any, record: str | None, uuid: str = "GPU-a"
) -> None:
    """Pod p, one container granted 3000 MiB of ``uuid``, with ``record`` as its enforcement record."""
    extra = {} if record is None else {POD_VGPU_ENFORCEMENT: record}
    await placed(apiserver, api, "p", ((g(uuid, 3000, 30),),), extra=extra)


async def served(apiserver: kmock.KubernetesEmulator, agent: Agent) -> dict[str, str]:
    """Kubelet's Allocate for p's one card answers; the envs it hands out. The pod is done."""
    response = await agent.stub.Allocate(allocate_request(["GPU-a-0"]), timeout=TIMEOUT)
    (answer,) = response.container_responses
    stored = await annotations_of(apiserver, POD + "p")
    assert stored[POD_BIND_PHASE] == "success" and stored[POD_DEVICES_TO_ALLOCATE] == ";"
    return dict(answer.envs)


async def assert_failed(apiserver: kmock.KubernetesEmulator, message: str, uuid: str = "GPU-a") -> None:
    """Nothing handed out: p is marked failed, its lock released, its owner told why."""
    stored = await annotations_of(apiserver, POD + "p")
    assert stored[POD_BIND_PHASE] == "failed"
    assert stored[POD_DEVICES_TO_ALLOCATE] == f"{uuid},NVIDIA,3000,30:;"  # nothing consumed
    assert await node_lock(apiserver) is None

    def told() -> bool:  # the agent posts its Events in the background: wait for this one (bounded)
        reasons = [(r.data["reason"], r.data["message"]) for r in apiserver["post", EVENTS]]
        return any(reason == "AllocationFailed" and message in text for reason, text in reasons)

    await eventually(told, f"an AllocationFailed Event saying {message!r}", within=60)


# ----------------------------------------------------------------------------------------------- mps
@pytest.mark.parametrize("mode", ["mps"])
async def test_a_daemon_that_lost_its_namespaces_is_refused_for_a_pod_placed_isolated(
    apiserver: kmock.KubernetesEmulator, api: Any, agent: Agent
) -> None:
    assert agent.daemon is not None
    await place(apiserver, api, "GPU-a:mps-namespaced")
    agent.daemon.answer = PER_CLIENT  # restarted since, without namespaces
    message = await refused(agent.stub, "GPU-a-0")
    expected = (
        "pod default/p on node n1: container main gets no card: card GPU-a was placed with enforcement "
        "mps-namespaced (isolated), the node now has mps (cooperative)"
    )
    assert message.startswith(expected), message
    assert agent.daemon.opened == []
    await assert_failed(apiserver, expected)


@pytest.mark.parametrize("mode", ["mps"])
async def test_a_card_out_of_exclusive_process_mode_is_refused_for_a_pod_placed_isolated(
    apiserver: kmock.KubernetesEmulator, api: Any, agent: Agent
) -> None:
    """The daemon holds namespaces, but GPU-b is not in EXCLUSIVE_PROCESS compute mode (an operator
    changed it since bind): the registrar's rule says ``mps`` for it, and so does Allocate."""
    assert agent.daemon is not None
    await place(apiserver, api, "GPU-b:mps-namespaced", uuid="GPU-b")
    message = await refused(agent.stub, "GPU-b-0")
    expected = "card GPU-b was placed with enforcement mps-namespaced (isolated), the node now has mps"
    assert expected in message, message
    await assert_failed(apiserver, expected, uuid="GPU-b")


@pytest.mark.parametrize("mode", ["mps"])
async def test_a_daemon_with_namespaces_serves_a_pod_placed_isolated_or_cooperative(
    apiserver: kmock.KubernetesEmulator, api: Any, agent: Agent
) -> None:
    assert agent.daemon is not None
    await place(apiserver, api, "GPU-a:mps-namespaced")
    envs = await served(apiserver, agent)
    assert envs["NVIDIA_VISIBLE_DEVICES"] == "GPU-a" and agent.daemon.opened == ["uid-p-0"]


@pytest.mark.parametrize("mode", ["mps"])
async def test_a_pod_placed_cooperative_is_served_by_per_client_limits(
    apiserver: kmock.KubernetesEmulator, api: Any, agent: Agent
) -> None:
    assert agent.daemon is not None
    agent.daemon.answer = PER_CLIENT
    await place(apiserver, api, "GPU-a:mps")
    assert (await served(apiserver, agent))["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=3000M"


# ----------------------------------------------------------------------------------------- hami-core
async def test_a_removed_library_is_refused_for_a_pod_placed_with_hami_core(
    apiserver: kmock.KubernetesEmulator, api: Any, agent: Agent
) -> None:
    await place(apiserver, api, "GPU-a:hami-core")  # the hook directory holds no library (any more)
    message = await refused(agent.stub, "GPU-a-0")
    expected = (
        "pod default/p on node n1: container main gets no card: card GPU-a was placed with enforcement "
        "hami-core (cooperative), the node now has none (none)"
    )
    assert message.startswith(expected), message
    assert not (agent.hook / "vgpu" / "containers").exists()  # nothing prepared for it
    await assert_failed(apiserver, expected)


async def test_an_installed_library_serves_a_pod_placed_with_hami_core(
    apiserver: kmock.KubernetesEmulator, api: Any, agent: Agent
) -> None:
    install_library(agent.hook)
    await place(apiserver, api, "GPU-b:none,GPU-a:hami-core")
    assert (await served(apiserver, agent))["CUDA_DEVICE_MEMORY_LIMIT_0"] == "3000m"


async def test_a_pod_placed_without_enforcement_is_served_without_it(
    apiserver: kmock.KubernetesEmulator, api: Any, agent: Agent
) -> None:
    await place(apiserver, api, "GPU-a:none")
    assert (await served(apiserver, agent))["CUDA_DEVICE_MEMORY_LIMIT_0"] == "3000m"


@pytest.mark.parametrize(
    "record", [None, "GPU-a:hami-core,GPU-a:mig", "GPU-a:strong"], ids=["absent", "twice", "unknown"]
)
async def test_no_readable_record_is_served_as_before(
    apiserver: kmock.KubernetesEmulator, api: Any, agent: Agent, record: str | None
) -> None:
    """A pod bound by an older scheduler (or HAMi's) has no record: nothing to hold the node to."""
    await place(apiserver, api, record)
    assert (await served(apiserver, agent))["CUDA_DEVICE_MEMORY_LIMIT_0"] == "3000m"


async def test_a_card_the_record_does_not_name_is_served(
    apiserver: kmock.KubernetesEmulator, api: Any, agent: Agent
) -> None:
    await place(apiserver, api, "GPU-b:hami-core")
    assert (await served(apiserver, agent))["NVIDIA_VISIBLE_DEVICES"] == "GPU-a"
