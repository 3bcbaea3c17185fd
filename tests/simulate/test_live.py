"""``hami simulate --kubeconfig`` on a cluster as small as the demo's: one pod moves the arrived demand
by several points, and the table still has its numbers (before: ``-`` in every column, since no pod
landed within one point of 90, 100, 110)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import kmock
import pytest

from hami import cli
from hami.annotations import NODE_HANDSHAKE, NODE_REGISTER, encode_node_devices
from hami.core.model import Device

#: 3 nodes x 5 cards: a 2-card pod is 13.3 points of demand (x = 13, 27, ..., 93, 107, 120, 133)
NODES, CARDS = 3, 5


async def _register(apiserver: kmock.KubernetesEmulator) -> None:
    for n in range(NODES):
        cards = [
            Device(
                uuid=f"GPU-{n}-{i}",
                index=i,
                count=10,
                memory_mib=16000,
                cores=100,
                type="NVIDIA T4",
                health=True,
            )
            for i in range(CARDS)
        ]
        node = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": f"small-{n}",
                "annotations": {
                    NODE_REGISTER: encode_node_devices(cards),
                    NODE_HANDSHAKE: "Reported 2024-01-01 00:00:00",
                },
            },
            "status": {"allocatable": {"cpu": "64", "memory": "256Gi", "nvidia.com/gpu": "50"}},
        }
        await apiserver.post("/api/v1/nodes", json=node)


async def _simulate(kubeconfig: Path, pods: Path, *extra: str) -> int:
    argv = ["simulate", "--kubeconfig", str(kubeconfig), "--pods", str(pods), "--policy", "bestfit", *extra]
    return await asyncio.to_thread(cli.main, [*argv, "--seeds", "1..2"])


async def test_a_small_live_cluster_has_a_value_at_every_compared_point(
    apiserver: kmock.KubernetesEmulator, kubeconfig: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    await _register(apiserver)
    pods = tmp_path / "pairs.csv"
    pods.write_text("name,cpu_milli,memory_mib,num_gpu,gpu_milli\npair,1000,1024,2,1000\n")
    assert await _simulate(kubeconfig, pods, "--json") == 0
    result = json.loads(capsys.readouterr().out)
    curve = {int(x): v for x, v in result["curve"].items()}
    # the cluster as it stood when that much demand had arrived (the 7th pair, at 93 %)
    assert result["points"]["90"] == curve[80] and result["points"]["100"] == curve[93]
    assert result["points"]["110"] == curve[107]
    assert result["at_100"]["mean"] == pytest.approx(100 - 100 * 12 / 15)  # 2 pairs a node, 1 card left
    assert result["frag_total_at_100"] is not None
    assert result["points"]["130"] == curve[120] and max(curve) == 133  # the last pair took it past 130

    assert await _simulate(kubeconfig, pods) == 0
    row = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("bestfit"))
    cells = row.split()
    assert "-" not in (cells[1], cells[2], cells[5], cells[6], cells[7]), row  # @90 @100 @110 @130 frag
