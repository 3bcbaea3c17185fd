"""What each enforcement mode holds against, where a test can show it without a GPU (docs/security.md,
"Enforcement modes"): the Allocate answer kubelet gets over gRPC from the running agent (limits equal
to the grant, what is mounted read-only and what the tenant can write), that answer applied to a
process the way a container runtime applies it (``tests.gpu.runtime``: a private mount namespace, a
stand-in library built here), and the GPU check's own answer held equal to the agent's."""

from __future__ import annotations

import asyncio
import shutil
import subprocess
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

import kmock
import pytest

from nodeagent.allocate_call import Allocator
from nodeagent.allocate_rules import ContainerAnswer, MountSpec
from nodeagent.config import NodeSettings
from nodeagent.mps.control import MpsControl
from nodeagent.mps.protocol import CardLimit, MpsState
from tests.gpu.answer import agent_answer, mps_agent_answer
from tests.gpu.runtime import namespace_available, probe_argv, run_in_container

from .agent_helpers import (
    allocate_request,
    card,
    create_node,
    g,
    placed,
    plugin_stub,
    sim_inventory,
)

PRELOAD = "/etc/ld.so.preload"


@dataclass
class Agent:
    stub: Any
    hook: Path | None
    lock_dir: Path
    mps: Daemon | None = None


class Daemon(MpsControl):
    """The node's MPS control daemon as the agent sees it, answering ``state`` (per-client limits, or
    namespaces); opening a namespace makes its directory (what the real daemon's socket lives in)."""

    def __init__(self, root: Path, state: MpsState) -> None:
        super().__init__(root=root)
        self.answer = state

    async def check(self) -> MpsState:
        return self.answer

    async def open_namespace(self, name: str, limits: Sequence[CardLimit]) -> PurePosixPath:
        await asyncio.to_thread(Path(self.namespace_dir(name)).mkdir, parents=True, exist_ok=True)
        return self.namespace_dir(name)


PER_CLIENT = MpsState(running=True, protocol=2, detail="per-client limits")
NAMESPACED = MpsState(running=True, protocol=3, namespaces=True, detail="namespaces")


async def _agent(
    apiserver: kmock.KubernetesEmulator,
    api: Any,
    sock_dir: Path,
    tmp_path: Path,
    *,
    hook: Path | None,
    mps: MpsState | None = None,
) -> AsyncIterator[Agent]:
    await create_node(apiserver, "n1")
    settings = NodeSettings() if mps is None else NodeSettings(mode="mps")
    daemon = None if mps is None else Daemon(tmp_path / "mps", mps)
    inventory = await sim_inventory(tmp_path, [card("GPU-a"), card("GPU-b")])
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
        yield Agent(stub=stub, hook=hook, lock_dir=tmp_path / "vgpulock", mps=daemon)


@pytest.fixture
async def hami_core(
    apiserver: kmock.KubernetesEmulator, api: Any, sock_dir: Path, tmp_path: Path
) -> AsyncIterator[Agent]:
    """Node n1's agent with ``--hook-path`` (HAMi-core mode)."""
    async for agent in _agent(apiserver, api, sock_dir, tmp_path, hook=tmp_path / "hook"):
        yield agent


@pytest.fixture
async def no_library(
    apiserver: kmock.KubernetesEmulator, api: Any, sock_dir: Path, tmp_path: Path
) -> AsyncIterator[Agent]:
    """Node n1's agent without ``--hook-path`` (enforcement ``none``)."""
    async for agent in _agent(apiserver, api, sock_dir, tmp_path, hook=None):
        yield agent


@pytest.fixture(params=[PER_CLIENT, NAMESPACED], ids=["mps", "mps-namespaced"])
async def mps_node(
    apiserver: kmock.KubernetesEmulator,
    api: Any,
    sock_dir: Path,
    tmp_path: Path,
    request: pytest.FixtureRequest,
) -> AsyncIterator[Agent]:
    """Node n1's agent in MPS mode, its daemon answering per-client limits or namespaces."""
    async for agent in _agent(apiserver, api, sock_dir, tmp_path, hook=tmp_path / "hook", mps=request.param):
        yield agent


async def answer_for(apiserver: kmock.KubernetesEmulator, api: Any, agent: Agent, *grants: Any) -> Any:
    """Kubelet's Allocate for pod ``p`` (one container ``main``) granted ``grants``: its one answer."""
    await placed(apiserver, api, "p", (tuple(grants),))
    response = await agent.stub.Allocate(allocate_request([f"{x.uuid}-0" for x in grants]), timeout=60)
    (answer,) = response.container_responses
    return answer


def mounts_of(answer: Any) -> dict[str, tuple[str, bool]]:
    return {m.container_path: (m.host_path, m.read_only) for m in answer.mounts}


# ------------------------------------------------------------------------------------------ hami-core
async def test_hami_core_limits_equal_the_grant_card_by_card(
    apiserver: kmock.KubernetesEmulator, api: Any, hami_core: Agent
) -> None:
    """Accidental over-use: HAMi-core holds each process to what these variables say; they must say
    exactly the grant (by position in the container's card list), no more."""
    answer = await answer_for(apiserver, api, hami_core, g("GPU-b", 3000, 30), g("GPU-a", 5000, 30))
    envs = dict(answer.envs)
    assert envs["NVIDIA_VISIBLE_DEVICES"] == "GPU-b,GPU-a"
    assert (envs["CUDA_DEVICE_MEMORY_LIMIT_0"], envs["CUDA_DEVICE_MEMORY_LIMIT_1"]) == ("3000m", "5000m")
    assert envs["CUDA_DEVICE_SM_LIMIT"] == "30"
    assert "CUDA_DEVICE_MEMORY_LIMIT_2" not in envs and "CUDA_OVERSUBSCRIBE" not in envs


async def test_hami_core_library_and_preload_are_mounted_read_only(
    apiserver: kmock.KubernetesEmulator, api: Any, hami_core: Agent
) -> None:
    """The library and /etc/ld.so.preload reach the container read-only, from the node's files; the
    container can write only its own directory and the lock directory."""
    assert hami_core.hook is not None
    vgpu = hami_core.hook / "vgpu"
    mounts = mounts_of(await answer_for(apiserver, api, hami_core, g("GPU-a", 3000, 30)))
    assert mounts[PRELOAD] == (f"{vgpu}/ld.so.preload", True)
    assert mounts[f"{vgpu}/libvgpu.so"] == (f"{vgpu}/libvgpu.so", True)
    writable = {path: host for path, (host, read_only) in mounts.items() if not read_only}
    assert writable == {str(vgpu): f"{vgpu}/containers/uid-p_main", "/tmp/vgpulock": str(hami_core.lock_dir)}


async def test_hami_core_limits_live_where_the_tenant_can_change_them(
    apiserver: kmock.KubernetesEmulator, api: Any, hami_core: Agent
) -> None:
    """Why HAMi-core does not hold against a tenant who edits its environment (docs/security.md): the
    limits are plain environment variables of the container, and the shared accounting file they seed
    lies in a directory the container mounts read-write. Should either change, the doc's row changes."""
    assert hami_core.hook is not None
    answer = await answer_for(apiserver, api, hami_core, g("GPU-a", 3000, 30))
    envs, mounts = dict(answer.envs), mounts_of(answer)
    assert envs["CUDA_DEVICE_MEMORY_LIMIT_0"] == "3000m"  # read by HAMi-core from the process's env
    cache = Path(envs["CUDA_DEVICE_MEMORY_SHARED_CACHE"])
    covering = max((Path(p) for p in mounts if cache.is_relative_to(p)), key=lambda p: len(p.parts))
    assert covering == hami_core.hook / "vgpu" and mounts[str(covering)][1] is False


async def test_the_gpu_checks_answer_is_the_agents_answer(
    apiserver: kmock.KubernetesEmulator, api: Any, hami_core: Agent, tmp_path: Path
) -> None:
    """tests/gpu computes the Allocate answer with the agent's rules (the GPU machine has no API
    server): for the same grant it must be the answer the running agent gives kubelet, but for the
    cache file's random name."""
    assert hami_core.hook is not None
    real = await answer_for(apiserver, api, hami_core, g("GPU-a", 3000, 30))
    made = agent_answer("GPU-a", 3000, 30, hook=hami_core.hook, lock_dir=hami_core.lock_dir, uid="uid-p")
    cache = "CUDA_DEVICE_MEMORY_SHARED_CACHE"
    real_envs, made_envs = dict(real.envs), dict(made.envs)
    assert Path(real_envs.pop(cache)).parent == Path(made_envs.pop(cache)).parent == hami_core.hook / "vgpu"
    assert made_envs == real_envs
    assert mounts_of(made) == mounts_of(real)


# ----------------------------------------------------------------------------------------------- mps
async def test_mps_mounts_the_daemon_s_pipe_directory_or_only_the_container_s_namespace(
    apiserver: kmock.KubernetesEmulator, api: Any, mps_node: Agent
) -> None:
    """Per-client limits (``mps``): the container mounts the daemon's whole pipe directory read-write,
    where the control daemon also takes its commands, and carries its limits in its environment
    (not held against a tenant who edits it). Namespaces (``mps-namespaced``): only its own
    namespace's directory and no limit in the environment (the daemon holds them)."""
    assert mps_node.mps is not None
    answer = await answer_for(apiserver, api, mps_node, g("GPU-a", 3000, 30))
    envs, mounts = dict(answer.envs), mounts_of(answer)
    pipe = mps_node.mps.pipe_dir
    if mps_node.mps.answer.namespaces:
        assert mounts["/tmp/nvidia-mps"] == (f"{pipe}/hami/uid-p-0", False)
        assert {k for k in envs if k.startswith("CUDA_MPS_")} == {"CUDA_MPS_PIPE_DIRECTORY"}
    else:
        assert mounts["/tmp/nvidia-mps"] == (str(pipe), False)
        assert envs["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=3000M"
        assert envs["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "30"


async def test_every_mps_container_on_a_node_shares_one_dev_shm(
    apiserver: kmock.KubernetesEmulator, api: Any, mps_node: Agent
) -> None:
    """Both MPS modes: ``/dev/shm`` of every container is the daemon's one shared-memory directory,
    read-write (the MPS server and its clients meet there): a tenant can see and write what another
    tenant's processes keep in ``/dev/shm`` (docs/security.md, "Enforcement modes")."""
    assert mps_node.mps is not None
    await placed(apiserver, api, "p", ((g("GPU-a", 3000, 30),),))
    first = (await mps_node.stub.Allocate(allocate_request(["GPU-a-0"]), timeout=60)).container_responses[0]
    await placed(apiserver, api, "q", ((g("GPU-a", 2000, 30),),))  # admitted after p
    second = (await mps_node.stub.Allocate(allocate_request(["GPU-a-1"]), timeout=60)).container_responses[0]
    assert dict(first.envs)["CUDA_MPS_PIPE_DIRECTORY"] == dict(second.envs)["CUDA_MPS_PIPE_DIRECTORY"]
    shm = (str(mps_node.mps.shm_dir), False)
    assert mounts_of(first)["/dev/shm"] == mounts_of(second)["/dev/shm"] == shm


async def test_the_gpu_checks_mps_answer_is_the_agents_answer(
    apiserver: kmock.KubernetesEmulator, api: Any, mps_node: Agent
) -> None:
    """tests/gpu/mps_check.py answers its two containers with the agent's MPS rules: for the same
    grant and daemon it is the answer the running agent gives kubelet."""
    assert mps_node.mps is not None
    real = await answer_for(apiserver, api, mps_node, g("GPU-a", 3000, 30))
    made = await mps_agent_answer(mps_node.mps, mps_node.mps.answer, "GPU-a", 3000, 30, uid="uid-p")
    assert dict(made.envs) == dict(real.envs)
    assert mounts_of(made) == mounts_of(real)


# ---------------------------------------------------------------------------------------------- none
async def test_without_a_library_nothing_is_mounted_and_the_limits_bind_nobody(
    apiserver: kmock.KubernetesEmulator, api: Any, no_library: Agent
) -> None:
    """Enforcement ``none``: the limits are still written (HAMi's answer), but nothing is preloaded to
    read them; the agent reports such cards as ``none`` (tests/nodeagent/test_agent_enforcement.py)."""
    answer = await answer_for(apiserver, api, no_library, g("GPU-a", 3000, 30))
    assert dict(answer.envs)["CUDA_DEVICE_MEMORY_LIMIT_0"] == "3000m"
    assert list(answer.mounts) == []


# ------------------------------------------------------------------- the answer applied to a process
def _stand_in_library(tmp_path: Path) -> Path:
    """A shared object built here that does nothing: what matters is whether the loader maps it."""
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        pytest.skip("no C compiler to build a stand-in library")
    source = tmp_path / "standin.c"
    source.write_text("int hami_stand_in(void) { return 1; }\n")
    library = tmp_path / "standin.so"
    subprocess.run([compiler, "-shared", "-fPIC", "-o", str(library), str(source)], check=True, timeout=120)
    return library


def _installed(tmp_path: Path, library: Path) -> Path:
    """``<hook>/vgpu`` as the chart's init container leaves it: the library and ld.so.preload naming it."""
    hook = tmp_path / "hook"
    (hook / "vgpu").mkdir(parents=True)
    installed = hook / "vgpu" / "libvgpu.so"
    shutil.copyfile(library, installed)
    installed.chmod(0o755)
    (hook / "vgpu" / "ld.so.preload").write_text(f"{installed}\n")
    return hook


@pytest.fixture
def container_answer(tmp_path: Path) -> ContainerAnswer:
    if not namespace_available():
        pytest.skip("needs root and a private mount namespace (unshare) to apply mounts as a runtime does")
    hook = _installed(tmp_path, _stand_in_library(tmp_path))
    return agent_answer("GPU-a", 3000, 30, hook=hook, lock_dir=tmp_path / "vgpulock")


def _library_mount(answer: ContainerAnswer) -> MountSpec:
    return next(m for m in answer.mounts if m.container_path.endswith("/libvgpu.so"))


@pytest.mark.parametrize("tenant_env", [{}, {"LD_PRELOAD": ""}, {"LD_PRELOAD": "/nonexistent.so"}])
def test_the_preload_loads_the_library_into_every_process_and_root_cannot_edit_it(
    container_answer: ContainerAnswer, tmp_path: Path, tenant_env: dict[str, str]
) -> None:
    """The answer applied as a runtime applies it: the loader maps the library into a dynamically
    linked process through /etc/ld.so.preload, whatever the process's own LD_PRELOAD says, and the
    file cannot be opened for writing even by root (a read-only mount)."""
    outcome = run_in_container(
        container_answer, probe_argv(), stage=tmp_path / "stage", env_changes=tenant_env, cwd=Path.cwd()
    )
    assert outcome.mechanism == "mount-namespace" and outcome.returncode == 0, outcome
    assert outcome.result["mapped"] == [_library_mount(container_answer).container_path], outcome
    assert outcome.result["preload_writable"] is False, outcome


def test_a_statically_linked_program_is_never_preloaded(
    container_answer: ContainerAnswer, tmp_path: Path
) -> None:
    """Why no library mode holds against a program that brings its own way to the driver: the loader
    that reads /etc/ld.so.preload never runs for a statically linked program."""
    compiler = shutil.which("cc") or shutil.which("gcc")
    assert compiler is not None  # the fixture built the stand-in with it
    source = tmp_path / "maps.c"
    source.write_text(
        "#include <stdio.h>\n"
        'int main(void) { FILE *f = fopen("/proc/self/maps", "r"); char l[4096]; int n = 0;\n'
        '  while (f && fgets(l, sizeof l, f)) n += strstr(l, "libvgpu") != 0;\n'
        '  printf("{\\"mapped_count\\": %d}\\n", n); return 0; }\n'
    )
    program = tmp_path / "maps"
    built = subprocess.run(
        [compiler, "-static", "-include", "string.h", "-o", str(program), str(source)],
        capture_output=True,
        timeout=120,
        check=False,
    )
    if built.returncode != 0:
        pytest.skip(f"no static C library here: {built.stderr.decode(errors='replace')[-200:]}")
    dynamic = run_in_container(container_answer, probe_argv(), stage=tmp_path / "stage", cwd=Path.cwd())
    static = run_in_container(container_answer, [str(program)], stage=tmp_path / "stage2")
    assert dynamic.result["mapped"], dynamic  # the same container preloads a dynamic program
    assert static.returncode == 0 and static.result == {"mapped_count": 0}, static


def test_the_bare_scenario_inherits_no_preload(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The GPU check's ``bare`` scenario (no answer): the caller's own ``LD_PRELOAD`` and ``CUDA_*`` are
    not passed on, so nothing is mapped and a refusal under the answer is the library's doing."""
    library = _stand_in_library(tmp_path)
    monkeypatch.setenv("LD_PRELOAD", str(library))
    monkeypatch.setenv("CUDA_DEVICE_MEMORY_LIMIT_0", "1m")
    outcome = run_in_container(None, probe_argv(), stage=tmp_path, namespace=False, cwd=Path.cwd())
    assert outcome.mechanism == "none" and outcome.returncode == 0, outcome
    assert outcome.result["mapped"] == [], outcome
