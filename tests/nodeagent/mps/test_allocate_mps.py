"""Allocate on an MPS-mode node, end to end through the device plugin's gRPC surface: pods annotated as
the scheduler's bind leaves them, a real gRPC client playing kubelet, the embedded API server, and the
node's MPS control daemon (a stand-in answering like :class:`nodeagent.mps.control.MpsControl`, whose
state and namespaces the test sets and reads)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

import kmock
import pytest

from hami.annotations import POD_BIND_PHASE, POD_DEVICES_TO_ALLOCATE
from nodeagent.allocate_call import Allocator
from nodeagent.config import NodeSettings
from nodeagent.mps.control import MpsControl
from nodeagent.mps.protocol import CardLimit, MpsError, MpsState
from tests.nodeagent.agent_helpers import (
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

from .kit import MpsKit, cuda_client

MPS = NodeSettings(mode="mps")
UP = MpsState(running=True, protocol=2, detail="pid 7, per-client limits")
NAMESPACED = MpsState(running=True, protocol=3, namespaces=True, detail="pid 7, namespaces")


class StandInDaemon(MpsControl):
    """The control daemon as the Allocator sees it: ``check`` answers ``answer``; ``open_namespace``
    records each call and returns the namespace's directory, or raises ``refuse``."""

    def __init__(self, root: Path, answer: MpsState) -> None:
        super().__init__(root=root)
        self.answer = answer
        self.opened: list[tuple[str, tuple[CardLimit, ...]]] = []
        self.checks = 0
        self.refuse: MpsError | None = None

    async def check(self) -> MpsState:
        self.checks += 1
        return self.answer

    async def open_namespace(self, name: str, limits: Sequence[CardLimit]) -> PurePosixPath:
        if self.refuse is not None:
            raise self.refuse
        self.opened.append((name, tuple(limits)))
        return self.namespace_dir(name)


@dataclass
class Node:
    stub: Any
    daemon: StandInDaemon
    root: Path
    hook: Path
    settings: NodeSettings = field(default=MPS)


@pytest.fixture
def root(tmp_path: Path) -> Path:
    return tmp_path / "mps"


@pytest.fixture
def daemon(root: Path) -> StandInDaemon:
    return StandInDaemon(root, UP)


@pytest.fixture
async def node(
    apiserver: kmock.KubernetesEmulator, api: Any, sock_dir: Path, tmp_path: Path, daemon: StandInDaemon
) -> AsyncIterator[Node]:
    await create_node(apiserver, "n1")
    inventory = await sim_inventory(tmp_path, [card("GPU-a"), card("GPU-b")])
    allocator = Allocator(
        api=api,
        node_name="n1",
        settings=MPS,
        hook_path=tmp_path / "hook",
        lock_dir=tmp_path / "vgpulock",
        inventory=inventory,
        mps=daemon,
    )
    async with plugin_stub(allocator, inventory, MPS, sock_dir) as stub:
        yield Node(stub=stub, daemon=daemon, root=daemon.pipe_dir.parent, hook=tmp_path / "hook")


def mounts_of(answer: Any) -> dict[str, tuple[str, bool]]:
    return {m.container_path: (m.host_path, m.read_only) for m in answer.mounts}


# ------------------------------------------------------------------------------- per-client limits
async def test_per_client_limits_travel_in_the_environment(
    apiserver: kmock.KubernetesEmulator, api: Any, node: Node
) -> None:
    await placed(apiserver, api, "p", ((g("GPU-a", 3000, 30),),))
    response = await node.stub.Allocate(allocate_request(["GPU-b-7"]), timeout=30)
    (answer,) = response.container_responses
    assert dict(answer.envs) == {
        "NVIDIA_VISIBLE_DEVICES": "GPU-a",
        "CUDA_VISIBLE_DEVICES": "GPU-a",
        "CUDA_MPS_PIPE_DIRECTORY": "/tmp/nvidia-mps",
        "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=3000M",
        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "30",
    }
    assert mounts_of(answer) == {
        "/tmp/nvidia-mps": (str(node.root / "pipe"), False),
        "/dev/shm": (str(node.root / "shm"), False),
    }
    assert not (node.hook / "vgpu" / "containers").exists()  # no HAMi-core directory made for it
    assert node.daemon.checks == 1 and node.daemon.opened == []
    stored = await annotations_of(apiserver, POD + "p")
    assert stored[POD_DEVICES_TO_ALLOCATE] == ";" and stored[POD_BIND_PHASE] == "success"
    assert await node_lock(apiserver) is None


async def test_several_cards_keep_the_grant_order(
    apiserver: kmock.KubernetesEmulator, api: Any, node: Node
) -> None:
    await placed(apiserver, api, "p", ((g("GPU-b", 4000, 25), g("GPU-a", 3000, 25)),))
    response = await node.stub.Allocate(allocate_request(["GPU-a-0", "GPU-a-1"]), timeout=30)
    envs = dict(response.container_responses[0].envs)
    assert envs["NVIDIA_VISIBLE_DEVICES"] == envs["CUDA_VISIBLE_DEVICES"] == "GPU-b,GPU-a"
    assert envs["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=4000M,1=3000M"  # ordinal 0 is GPU-b
    assert envs["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "25"


async def test_cores_zero_sets_no_thread_limit(
    apiserver: kmock.KubernetesEmulator, api: Any, node: Node
) -> None:
    await placed(apiserver, api, "p", ((g("GPU-a", 2000, 0),),))
    response = await node.stub.Allocate(allocate_request(["GPU-a-0"]), timeout=30)
    envs = dict(response.container_responses[0].envs)
    assert "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE" not in envs
    assert envs["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=2000M"


# -------------------------------------------------------------------------------------- namespaces
async def test_namespaced_each_container_gets_its_own_namespace(
    apiserver: kmock.KubernetesEmulator, api: Any, node: Node
) -> None:
    node.daemon.answer = NAMESPACED
    devices = ((g("GPU-a", 1000, 0),), (), (g("GPU-a", 3000, 30), g("GPU-b", 4000, 30)))
    await placed(
        apiserver,
        api,
        "p",
        devices,
        init_containers=[{"name": "init", "image": "x"}],
        containers=[{"name": "side", "image": "x"}, {"name": "main", "image": "x"}],
    )
    first = await node.stub.Allocate(allocate_request(["GPU-a-0"]), timeout=30)
    second = await node.stub.Allocate(allocate_request(["GPU-a-1", "GPU-b-1"]), timeout=30)
    assert node.daemon.opened == [
        ("uid-p-0", (CardLimit(uuid="GPU-a", memory_mib=1000, thread_percentage=100),)),
        (
            "uid-p-2",
            (
                CardLimit(uuid="GPU-a", memory_mib=3000, thread_percentage=30),
                CardLimit(uuid="GPU-b", memory_mib=4000, thread_percentage=30),
            ),
        ),
    ]
    for response, name in ((first, "uid-p-0"), (second, "uid-p-2")):
        (answer,) = response.container_responses
        envs = dict(answer.envs)
        assert (
            "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT" not in envs and "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE" not in envs
        )
        assert envs["CUDA_MPS_PIPE_DIRECTORY"] == "/tmp/nvidia-mps"
        assert mounts_of(answer)["/tmp/nvidia-mps"] == (str(node.root / "pipe" / "hami" / name), False)
        assert mounts_of(answer)["/dev/shm"] == (str(node.root / "shm"), False)
    assert dict(second.container_responses[0].envs)["NVIDIA_VISIBLE_DEVICES"] == "GPU-a,GPU-b"
    assert (await annotations_of(apiserver, POD + "p"))[POD_BIND_PHASE] == "success"


async def test_a_namespace_the_daemon_refuses_hands_out_nothing(
    apiserver: kmock.KubernetesEmulator, api: Any, node: Node
) -> None:
    node.daemon.answer = NAMESPACED
    node.daemon.refuse = MpsError("MPS command 'namespace create ...': Error: no room")
    await placed(apiserver, api, "p", ((g("GPU-a", 3000, 30),),))
    message = await refused(node.stub, "GPU-a-0")
    assert (
        "pod default/p on node n1: container main gets no card: its MPS namespace could not be opened"
        in message
    )
    assert "Error: no room" in message
    assert (await annotations_of(apiserver, POD + "p"))[POD_BIND_PHASE] == "failed"
    assert await node_lock(apiserver) is None


# ------------------------------------------------------------------------------------ daemon down
async def test_daemon_down_refuses_the_allocation(
    apiserver: kmock.KubernetesEmulator, api: Any, node: Node
) -> None:
    node.daemon.answer = MpsState(
        running=False, detail="no control daemon (no pid file in /run/hami/mps/pipe)"
    )
    await placed(apiserver, api, "p", ((g("GPU-a", 3000, 30),),))
    message = await refused(node.stub, "GPU-a-0")
    assert message == (
        "pod default/p on node n1: container main gets no card: the MPS control daemon is down "
        "(no control daemon (no pid file in /run/hami/mps/pipe)), and a slice it cannot enforce is not "
        "handed out"
    )
    stored = await annotations_of(apiserver, POD + "p")
    assert stored[POD_BIND_PHASE] == "failed" and stored[POD_DEVICES_TO_ALLOCATE] == "GPU-a,NVIDIA,3000,30:;"
    assert await node_lock(apiserver) is None and node.daemon.opened == []


async def test_a_real_control_daemon_that_never_started_is_down(
    apiserver: kmock.KubernetesEmulator, api: Any, sock_dir: Path, tmp_path: Path
) -> None:
    """The real MpsControl (no daemon ever started under its root): Allocate checks it and refuses."""
    await create_node(apiserver, "n1")
    inventory = await sim_inventory(tmp_path, [card("GPU-a")])
    control = MpsControl(root=tmp_path / "mps", binary=str(tmp_path / "no-such-binary"))
    allocator = Allocator(api=api, node_name="n1", settings=MPS, inventory=inventory, mps=control)
    await placed(apiserver, api, "p", ((g("GPU-a", 3000, 30),),))
    async with plugin_stub(allocator, inventory, MPS, sock_dir) as stub:
        message = await refused(stub, "GPU-a-0")
    assert "the MPS control daemon is down (no control daemon (no pid file in" in message


async def test_mps_mode_without_a_daemon_refuses(
    apiserver: kmock.KubernetesEmulator, api: Any, sock_dir: Path, tmp_path: Path
) -> None:
    await create_node(apiserver, "n1")
    inventory = await sim_inventory(tmp_path, [card("GPU-a")])
    allocator = Allocator(api=api, node_name="n1", settings=MPS, inventory=inventory)
    await placed(apiserver, api, "p", ((g("GPU-a", 3000, 30),),))
    async with plugin_stub(allocator, inventory, MPS, sock_dir) as stub:
        message = await refused(stub, "GPU-a-0")
    assert message.endswith("the node is in MPS mode but the agent runs no MPS control daemon")


async def test_hami_core_mode_ignores_the_daemon(
    apiserver: kmock.KubernetesEmulator, api: Any, sock_dir: Path, tmp_path: Path, daemon: StandInDaemon
) -> None:
    await create_node(apiserver, "n1")
    inventory = await sim_inventory(tmp_path, [card("GPU-a")])
    settings = NodeSettings()
    allocator = Allocator(api=api, node_name="n1", settings=settings, inventory=inventory, mps=daemon)
    await placed(apiserver, api, "p", ((g("GPU-a", 3000, 30),),))
    async with plugin_stub(allocator, inventory, settings, sock_dir) as stub:
        response = await stub.Allocate(allocate_request(["GPU-a-0"]), timeout=30)
    envs = dict(response.container_responses[0].envs)
    assert envs["CUDA_DEVICE_MEMORY_LIMIT_0"] == "3000m" and "CUDA_MPS_PIPE_DIRECTORY" not in envs
    assert daemon.checks == 0


# --------------------------------------------------------------------- against the simulated daemon
def as_container(answer: Any) -> tuple[str, dict[str, str]]:
    """What the container sees, played on this host: its envs, with the pipe directory read where the
    answer mounts it from (the bind mount kubelet would make)."""
    envs = dict(answer.envs)
    pipe = mounts_of(answer)[envs["CUDA_MPS_PIPE_DIRECTORY"]][0]
    return pipe, {**envs, "CUDA_MPS_PIPE_DIRECTORY": pipe}


@pytest.mark.parametrize("protocol", [2, 3])
async def test_the_answer_is_enforced_by_the_simulated_daemon(
    apiserver: kmock.KubernetesEmulator,
    api: Any,
    sock_dir: Path,
    tmp_path: Path,
    mps_kit: MpsKit,
    protocol: int,
) -> None:
    """Allocate with the real MpsControl over the simulated nvidia-cuda-mps-control: a CUDA client run
    with the answer gets its grant and not a MiB more; with namespaces (protocol 3) even when it lies
    about its limits in its environment."""
    mps_kit.driver_protocol = protocol
    control = mps_kit.control()
    state = await control.start()
    assert state.running and state.namespaces is (protocol == 3), state
    await create_node(apiserver, "n1")
    inventory = await sim_inventory(tmp_path, [card("GPU-a", memory=8192), card("GPU-b", memory=8192)])
    allocator = Allocator(api=api, node_name="n1", settings=MPS, inventory=inventory, mps=control)
    await placed(apiserver, api, "p", ((g("GPU-b", 2048, 25),),))
    async with plugin_stub(allocator, inventory, MPS, sock_dir) as stub:
        response = await stub.Allocate(allocate_request(["GPU-a-0"]), timeout=120)
    pipe, envs = as_container(response.container_responses[0])
    assert envs["NVIDIA_VISIBLE_DEVICES"] == "GPU-b"
    if protocol == 3:
        assert pipe == str(control.pipe_dir / "hami" / "uid-p-0")
        envs |= {"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=100000M", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "100"}
    else:
        assert pipe == str(control.pipe_dir)
    beyond = await cuda_client(mps_kit, pipe, 3000, env=envs)
    assert not beyond.ok and "limit 2048M" in beyond.reply, beyond.reply
    await beyond.release()
    within = await cuda_client(mps_kit, pipe, 2000, env=envs)
    assert within.ok and "threads=25" in within.reply, within.reply
    assert await within.release() == 0
    assert (await annotations_of(apiserver, POD + "p"))[POD_BIND_PHASE] == "success"
