"""What the limits the agent hands out do, shown with simulated CUDA clients under the simulated
daemon: per-client limits (protocol 2, cooperative) stop a client beyond its own limit while its
neighbour's allocation stands, and a client that drops its limit escapes them; a namespace's
daemon-side limits (protocol 3, tenant-proof) hold whatever the client's environment says."""

from __future__ import annotations

from nodeagent.mps.protocol import CLIENT_MEMORY_ENV, CLIENT_THREADS_ENV, CardLimit
from tests.eventually import eventually

from .kit import MpsKit, cuda_client

UID = "0c9f5a4e-6a53-4b1e-9d8e-2f1c3b4a5d6e"
OTHER = "7d1e2c3b-4a5f-4e6d-8c7b-9a0f1e2d3c4b"


def _envs(uuid: str, mib: int, pct: int = 50) -> dict[str, str]:
    """What a container gets in per-client mode: its card and its limits (ordinal 0 = its card)."""
    return {"NVIDIA_VISIBLE_DEVICES": uuid, CLIENT_MEMORY_ENV: f"0={mib}M", CLIENT_THREADS_ENV: str(pct)}


async def test_per_client_limits_stop_a_client_beyond_them_and_the_neighbour_stands(mps_kit: MpsKit) -> None:
    mps_kit.driver_protocol = 2
    control = mps_kit.control()
    assert (await control.start()).running
    neighbour = await cuda_client(mps_kit, control.pipe_dir, 1500, env=_envs("GPU-a", 2048))
    assert neighbour.ok, neighbour.reply
    greedy = await cuda_client(mps_kit, control.pipe_dir, 3000, env=_envs("GPU-a", 2048))
    assert not greedy.ok and "client limit 2048M" in greedy.reply, greedy.reply
    assert await greedy.release() == 1
    _, ps = await mps_kit.client(stdin="ps\n")  # the protocol 2 shell: commands on stdin
    assert "memory=GPU-a=1500M threads=50" in ps, ps  # the neighbour's allocation is untouched
    within = await cuda_client(mps_kit, control.pipe_dir, 2000, env=_envs("GPU-a", 2048))
    assert within.ok, within.reply
    for client in (neighbour, within):
        assert await client.release() == 0


async def test_per_client_limits_are_cooperative_a_client_that_drops_them_escapes(mps_kit: MpsKit) -> None:
    mps_kit.driver_protocol = 2
    control = mps_kit.control()
    await control.start()
    edited = {"NVIDIA_VISIBLE_DEVICES": "GPU-a"}  # the limit variables removed by the container
    escaped = await cuda_client(mps_kit, control.pipe_dir, 6000, env=edited)
    assert escaped.ok, escaped.reply  # why per-client mode registers as `mps`, not `mps-namespaced`
    await escaped.release()


async def test_a_namespace_holds_its_limits_whatever_the_client_says(mps_kit: MpsKit) -> None:
    control = mps_kit.control()
    assert (await control.start()).namespaces
    pipe = await control.open_namespace(UID, [CardLimit("GPU-a", 2048, 25)])
    await eventually(
        lambda: (control.pipe_dir / "hami" / UID / "control").is_socket(), "the socket", within=60
    )
    lying = {"NVIDIA_VISIBLE_DEVICES": "GPU-a", CLIENT_MEMORY_ENV: "0=100000M", CLIENT_THREADS_ENV: "100"}
    greedy = await cuda_client(mps_kit, pipe, 3000, env=lying)
    assert not greedy.ok and f"namespace {UID} limit 2048M" in greedy.reply, greedy.reply
    await greedy.release()
    first = await cuda_client(mps_kit, pipe, 1500, env=lying)
    assert first.ok and "threads=25" in first.reply, first.reply  # the daemon's percentage, not the env's
    second = await cuda_client(mps_kit, pipe, 1000, env=lying)  # the namespace's sum: 1500 + 1000 > 2048
    assert not second.ok and "1500M in use" in second.reply, second.reply
    await second.release()
    other_card = await cuda_client(mps_kit, pipe, 10, env={"NVIDIA_VISIBLE_DEVICES": "GPU-b"})
    assert not other_card.ok and "not in namespace" in other_card.reply, other_card.reply
    await other_card.release()
    await first.release()


async def test_namespaces_are_separate_tenants_on_one_card(mps_kit: MpsKit) -> None:
    control = mps_kit.control()
    await control.start()
    mine = await control.open_namespace(UID, [CardLimit("GPU-a", 4096, 50)])
    theirs = await control.open_namespace(OTHER, [CardLimit("GPU-a", 4096, 50)])
    await eventually(
        lambda: all((control.pipe_dir / "hami" / n / "control").is_socket() for n in (UID, OTHER)),
        "both sockets",
        within=60,
    )
    held = await cuda_client(mps_kit, mine, 4000)
    assert held.ok, held.reply
    neighbour = await cuda_client(mps_kit, theirs, 4000)
    assert neighbour.ok, neighbour.reply  # a full neighbour takes nothing of the other namespace's share
    over = await cuda_client(mps_kit, theirs, 200)
    assert not over.ok and f"namespace {OTHER}" in over.reply
    for client in (held, neighbour, over):
        await client.release()
