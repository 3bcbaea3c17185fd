"""``hami simulate`` through its command line: the table, the ``--json`` object the issue specifies, the
``--plot`` PNG, progress on stderr, refusals with exit code 2, and a live cluster (kmock) as node list;
plus the replay's curve rules (drops counted, x rounding, the neighbour fallback, seeds)."""

from __future__ import annotations

import asyncio
import datetime
import json
from pathlib import Path

import kmock
import pytest

from hami import cli
from hami.annotations import (
    NODE_HANDSHAKE,
    NODE_REGISTER,
    POD_BIND_PHASE,
    allocation_annotations,
    encode_node_devices,
)
from hami.core.model import Device, Grant
from hami.simulate.replay import _Curve, replay
from hami.simulate.trace import parse_nodes, parse_pods
from hami.simulate.workload import target_workload
from hami_testkit.processes import PortReservations
from tests.builders import create_hostile_nodes

NODES = "sn,cpu_milli,memory_mib,gpu,model\nn0,8000,16384,1,T4\nn1,8000,16384,1,T4\n"
# 3000 milli of GPU demand on 2000 of capacity (x ends at 150): two whole cards fit, the third never
PODS = (
    "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec\n"
    "w1,1000,100,1,1000,\nw2,1000,100,1,1000,T4\nw3,1000,100,1,1000,\ncpu,500,100,0,0,\n"
)


@pytest.fixture
def files(tmp_path: Path) -> tuple[Path, Path]:
    nodes, pods = tmp_path / "nodes.csv", tmp_path / "openb_pod_list_tiny.csv"
    nodes.write_text(NODES)
    pods.write_text(PODS)
    return nodes, pods


def test_replay_counts_drops_and_ends_with_everything_allocated() -> None:
    pods = parse_pods(PODS)
    for policy in ("bestfit", "fgd", "fragmentation", "hami-spread", "random"):
        result = replay(parse_nodes(NODES), pods, policy, 7, inflate=1.5, classes=target_workload(pods))
        assert (result.pods, result.placed) == (4, 3)
        assert result.dropped == {"cpu": 0, "share": 0, "1-gpu": 1, "multi-gpu": 0}
        assert result.unallocated[150] == 0.0
        assert max(result.unallocated) == 150


def test_curve_means_per_x_and_the_neighbour_fallback() -> None:
    curve = _Curve()
    curve.add(98, (10.0,))
    curve.add(100, (4.0,))
    curve.add(100, (6.0,))
    means = curve.means(0, 100)
    assert means[100] == 5.0
    assert means[99] == pytest.approx((10 + 4 + 6) / 3)  # no pod at 99: 98..100
    assert 96 not in means


def test_json_object_per_policy(files: tuple[Path, Path], capsys: pytest.CaptureFixture[str]) -> None:
    nodes, pods = files
    argv = ["simulate", "--nodes", str(nodes), "--pods", str(pods), "--policy", "bestfit,hami-binpack"]
    assert cli.main([*argv, "--seeds", "1..3", "--inflate", "1.5", "--json"]) == 0
    out, err = capsys.readouterr()
    objects = [json.loads(line) for line in out.splitlines()]
    assert [o["policy"] for o in objects] == ["bestfit", "hami-binpack"]
    first = objects[0]
    assert list(first)[:7] == [
        "trace",
        "policy",
        "seeds",
        "at_100",
        "curve",
        "frag_total_at_100",
        "seconds_per_run",
    ]
    assert (first["trace"], first["seeds"]) == ("tiny", [1, 2, 3])
    assert set(first["at_100"]) == {"mean", "sd"}
    assert first["curve"]["150"] == 0.0 and first["dropped"]["1-gpu"] == 1.0
    assert "tiny bestfit seed 3 (3/3): 4 pods" in err  # progress, one line per run off a terminal


def test_table_and_plot(files: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    nodes, pods = files
    png = tmp_path / "curves.png"
    argv = ["simulate", "--nodes", str(nodes), "--pods", str(pods), "--policy", "all", "--seeds", "5"]
    assert cli.main([*argv, "--inflate", "1.5", "--plot", str(png)]) == 0
    out = capsys.readouterr().out
    assert "trace tiny (4 pods; 4 per run)" in out
    for policy in (
        "random",
        "dotprod",
        "clustering",
        "packing",
        "bestfit",
        "fgd",
        "hami-binpack",
        "fragmentation",
    ):
        assert f"\n{policy} " in out
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize(
    ("extra", "says"),
    [
        (["--pods", "missing.csv"], "cannot read"),
        (["--kubeconfig", "x"], "exactly one of --nodes"),
    ],
)
def test_bad_inputs_exit_2(
    files: tuple[Path, Path], extra: list[str], says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    nodes, pods = files
    argv = ["simulate", "--nodes", str(nodes), "--pods", str(pods), *extra]
    assert cli.main(argv) == 2
    assert says in capsys.readouterr().err


@pytest.mark.parametrize(
    "extra",
    [
        ["--seeds", "5..3"],
        ["--seeds", "1,1"],
        ["--seeds", "0..5000"],
        ["--policy", "tetris"],
        ["--inflate", "0"],
    ],
)
def test_bad_arguments_are_refused_by_the_parser(files: tuple[Path, Path], extra: list[str]) -> None:
    nodes, pods = files
    with pytest.raises(SystemExit) as caught:
        cli.main(["simulate", "--nodes", str(nodes), "--pods", str(pods), *extra])
    assert caught.value.code == 2


@pytest.mark.parametrize("hostile", [False, True], ids=["plain", "with-hostile-nodes"])
async def test_a_live_cluster_as_the_node_list(
    apiserver: kmock.KubernetesEmulator,
    kubeconfig: Path,
    files: tuple[Path, Path],
    capsys: pytest.CaptureFixture[str],
    hostile: bool,
) -> None:
    """Two registered T4 cards, one already held by a running pod: of the trace's three whole-card pods
    only one fits; the CPU already requested on the node counts too. Nodes of shapes no API server
    stores beside it (registration not a string, annotations or allocatable not objects, metadata not
    an object) are left out like unregistered ones, and change nothing (before: the snapshot raised)."""
    cards = [
        Device(uuid=f"GPU-{i}", index=i, count=10, memory_mib=16000, cores=100, type="NVIDIA T4", health=True)
        for i in range(2)
    ]
    await apiserver.post(
        "/api/v1/nodes",
        json={
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": "live-0",
                "annotations": {
                    NODE_REGISTER: encode_node_devices(cards),
                    NODE_HANDSHAKE: "Reported 2024-01-01 00:00:00",
                },
            },
            "status": {"allocatable": {"cpu": "8", "memory": "16Gi", "nvidia.com/gpu": "20"}},
        },
    )
    holder = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "holder",
            "namespace": "default",
            "annotations": {
                **allocation_annotations(
                    node="live-0",
                    devices=((Grant(uuid="GPU-0", memory_mib=16000, cores=100),),),
                    now=datetime.datetime(2024, 1, 1, tzinfo=datetime.UTC),
                ),
                POD_BIND_PHASE: "success",
            },
        },
        "spec": {
            "nodeName": "live-0",
            "containers": [{"name": "m", "image": "x", "resources": {"requests": {"cpu": "6500m"}}}],
        },
        "status": {"phase": "Running"},
    }
    await apiserver.post("/api/v1/namespaces/default/pods", json=holder)
    if hostile:
        await create_hostile_nodes(apiserver)
    _, pods = files
    code = await asyncio.to_thread(
        cli.main,
        [
            "simulate",
            "--kubeconfig",
            str(kubeconfig),
            "--pods",
            str(pods),
            "--policy",
            "bestfit",
            "--seeds",
            "1",
            "--inflate",
            "1.5",
            "--json",
        ],
    )
    assert code == 0
    result = json.loads(capsys.readouterr().out)
    # capacity 2000 milli, demand 3000: one card left -> one whole pod placed, two dropped; the CPU-only
    # pod (500m) still fits: 6500m held + 1000m + 500m = the 8 cores
    assert result["dropped"] == {"cpu": 0.0, "share": 0.0, "1-gpu": 2.0, "multi-gpu": 0.0}
    assert result["curve"]["150"] == 0.0


def test_hami_help_lists_simulate(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as caught:
        cli.main(["--help"])
    assert caught.value.code == 0
    assert "simulate" in capsys.readouterr().out


def test_a_node_list_without_cards_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    nodes, pods = tmp_path / "nodes.csv", tmp_path / "pods.csv"
    nodes.write_text("sn,cpu_milli,memory_mib,gpu,model\ncpu-0,8000,16384,0,\n")
    pods.write_text(PODS)
    assert cli.main(["simulate", "--nodes", str(nodes), "--pods", str(pods), "--seeds", "1"]) == 2
    assert "no GPU card" in capsys.readouterr().err


def test_demand_that_never_reaches_100_has_no_value_there(
    tmp_path: Path, files: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    nodes, _ = files
    pods = tmp_path / "cpu.csv"
    pods.write_text("name,cpu_milli,memory_mib,num_gpu,gpu_milli\na,100,10,0,0\n")
    assert cli.main(["simulate", "--nodes", str(nodes), "--pods", str(pods), "--seeds", "1", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["at_100"] == {"mean": None, "sd": None} and result["curve"] == {"0": 100.0}


@pytest.mark.parametrize("content", [None, "clusters: [\n", "apiVersion: v1\nkind: Config\n"])
def test_a_broken_kubeconfig_is_one_line_and_exit_2(
    tmp_path: Path, files: tuple[Path, Path], content: str | None, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "kubeconfig"
    if content is not None:
        config.write_text(content)
    _, pods = files
    assert cli.main(["simulate", "--kubeconfig", str(config), "--pods", str(pods), "--seeds", "1"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("hami simulate: ") and err.count("\n") == 1 and "Traceback" not in err


def test_a_refused_connection_is_one_line_and_exit_2(
    tmp_path: Path, files: tuple[Path, Path], capsys: pytest.CaptureFixture[str], ports: PortReservations
) -> None:
    port = ports.take()  # held here, nobody listens on it
    config = tmp_path / "kubeconfig"
    config.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: c\n"
        f"clusters:\n- name: c\n  cluster: {{server: 'http://127.0.0.1:{port}'}}\n"
        "contexts:\n- name: c\n  context: {cluster: c, user: u}\nusers:\n- name: u\n  user: {token: t}\n"
    )
    _, pods = files
    assert cli.main(["simulate", "--kubeconfig", str(config), "--pods", str(pods), "--seeds", "1"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("hami simulate: ") and "Traceback" not in err
