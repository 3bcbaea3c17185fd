"""The fleet (``python -m nodeagent.fleet``): fifty simulated nodes' agents in one event loop, each running
the agent's own code (docs/node-agent.md, "Fleet"), against the embedded API server under looptime: every
node registers its own cards on the 30 s cadence (one GET of its Node per round, one patch), its device
plugin registers with the test kit's kubelet stand-in on its own socket, and a pod bound to any node is
admitted there (Allocate answers with that node's card, bind-phase success, that node's lock released,
the other nodes' locks untouched). The file, the flags and the merged metrics are checked too."""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import kmock
import pytest
import yaml
from prometheus_client import CollectorRegistry, generate_latest

from hami.annotations import NODE_LOCK, NODE_REGISTER, POD_BIND_PHASE, decode_node_devices
from hami.kube.watch import GONE
from hami.settings import ConfigError
from hami_testkit.apiserver import embedded_apiserver
from hami_testkit.kubelet_standin import NodeKubelet
from nodeagent.fleet import (
    FleetCollector,
    main,
    parse_fleet_config,
    parse_fleet_file,
    read_fleet_file,
    run,
)
from nodeagent.podcache import PodCache, PodCacheCollector, PodFanout
from tests.eventually import eventually

from .agent_helpers import POD, annotations_of, card, create_node, g, placed, take_lock, write_cards

NODES = kmock.resource("v1/nodes")
SIZE = 50


def node_name(i: int) -> str:
    return f"fleet-{i:02d}"


def cards_of(i: int) -> list[str]:
    return [f"GPU-{i:02d}-a", f"GPU-{i:02d}-b"]


def write_fleet(root: Path, size: int) -> Path:
    """``size`` nodes, two cards each, their files under ``root/<i>/`` (short: unix socket paths)."""
    entries = []
    for i in range(size):
        base = root / str(i)
        (base / "dp").mkdir(parents=True)
        write_cards(base / "devices.yaml", [card(uuid, numa=j) for j, uuid in enumerate(cards_of(i))])
        entries.append({"name": node_name(i), "sim_devices": f"{i}/devices.yaml", "kubelet_dir": f"{i}/dp"})
    path = root / "fleet.yaml"
    path.write_text(yaml.safe_dump({"nodes": entries}))
    return path


def node_requests(k: kmock.KubernetesEmulator, method: str, name: str) -> int:
    """Requests ``method`` of exactly ``/api/v1/nodes/<name>`` (its status subresource not counted)."""
    return sum(1 for r in k[method, NODES] if r.url.path == f"/api/v1/nodes/{name}")


@pytest.fixture
async def apiserver() -> AsyncIterator[kmock.KubernetesEmulator]:
    """The test kit's embedded API server (a constant cost per request, every request kept): kmock's own
    walks its whole request history on every request, which fifty nodes' requests make quadratic."""
    async with embedded_apiserver(request_log=None) as emulator:
        yield emulator


@pytest.fixture
async def kubelets(api: Any, sock_dir: Path) -> AsyncIterator[list[NodeKubelet]]:
    """The kubelet stand-in of every fleet node (its kubelet.sock served under the node's directory)."""
    standins = [NodeKubelet(api, node_name(i), sock_dir / str(i) / "dp", plugin_wait=60) for i in range(SIZE)]
    fleet_file = write_fleet(sock_dir, SIZE)
    assert fleet_file.exists()
    for standin in standins:
        await standin.start()
    yield standins
    for standin in standins:
        await standin.stop()


@pytest.mark.looptime
@pytest.mark.timeout(600)
async def test_fifty_nodes_register_every_30s_and_each_serves_allocate_and_releases_its_lock(
    apiserver: kmock.KubernetesEmulator,
    api: Any,
    kubeconfig: Path,
    sock_dir: Path,
    kubelets: list[NodeKubelet],
) -> None:
    for i in range(SIZE):
        await create_node(apiserver, node_name(i))
    fleet = parse_fleet_config(
        ["--fleet", str(sock_dir / "fleet.yaml"), "--kubeconfig", str(kubeconfig), "--start-spread", "20"],
        {},
    )
    task = asyncio.create_task(run(fleet))
    try:
        # node i starts at 0.4 i s (0 .. 19.6): its rounds at start, +30, +60; the next at 90 or later
        await asyncio.sleep(85)
        gets = {node_name(i): node_requests(apiserver, "get", node_name(i)) for i in range(SIZE)}
        patches = {node_name(i): node_requests(apiserver, "patch", node_name(i)) for i in range(SIZE)}
        assert gets == dict.fromkeys(gets, 3)  # one GET of its Node per round
        assert patches == dict.fromkeys(patches, 1)  # one patch: only the change is written
        for i in range(SIZE):
            stored = await annotations_of(apiserver, f"/api/v1/nodes/{node_name(i)}")
            assert [d.uuid for d in decode_node_devices(stored[NODE_REGISTER])] == cards_of(i)
        assert task.done() is False

        # every device plugin registered with its own kubelet (the stand-in published the capacity)
        async def capacities() -> bool | None:
            return (
                True
                if all(sum(k.plugins["nvidia.com/gpu"].devices.values()) == 20 for k in kubelets)
                else None
            )

        await eventually(capacities, "every node's 20 replicas with its kubelet stand-in", within=60)

        chosen = [0, 17, 33, SIZE - 1]
        await take_lock(api, "bystander", node_name(5))  # a bind in flight elsewhere: never touched
        for i in chosen:
            await placed(
                apiserver, api, f"p{i}", ((g(cards_of(i)[1]),),), grant_node=node_name(i), node=node_name(i)
            )
            pod = await (await apiserver.get(POD + f"p{i}")).json()
            kubelets[i].observe("ADDED", pod)  # the stand-in's pod watch, as it dispatches by spec.nodeName

        async def admitted() -> list[str] | None:
            phases = [
                (await (await apiserver.get(POD + f"p{i}")).json())["status"].get("phase") for i in chosen
            ]
            return None if any(p != "Running" for p in phases) else phases

        await eventually(admitted, "the four pods admitted by their nodes' kubelets", within=60)
        for i in chosen:
            (entry,) = kubelets[i].assigned[("default", f"p{i}")].entries
            assert entry["envs"]["NVIDIA_VISIBLE_DEVICES"] == cards_of(i)[1]  # that node's card, as granted
            assert (await annotations_of(apiserver, POD + f"p{i}"))[POD_BIND_PHASE] == "success"
            assert NODE_LOCK not in await annotations_of(apiserver, f"/api/v1/nodes/{node_name(i)}")
        assert NODE_LOCK in await annotations_of(apiserver, f"/api/v1/nodes/{node_name(5)}")
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


# ------------------------------------------------------------------------------------------ the parts
def test_the_fleet_file_is_strict_and_names_the_entry_and_field(tmp_path: Path) -> None:
    good = {"nodes": [{"name": "n1", "sim_devices": "a.yaml", "kubelet_dir": "/abs/dp", "hook_path": "h"}]}
    (node,) = parse_fleet_file(json.dumps(good), source="f.json", base_dir=tmp_path)
    assert (node.sim_devices, node.kubelet_dir, node.hook_path) == (
        tmp_path / "a.yaml",
        Path("/abs/dp"),
        tmp_path / "h",
    )
    assert node.config is None
    cases = {
        "nodes[0]: unknown field 'sim_device'": {
            "nodes": [{"name": "n1", "sim_device": "a", "kubelet_dir": "d"}]
        },
        "nodes[0].name: must be a Node name": {
            "nodes": [{"name": "N_1", "sim_devices": "a", "kubelet_dir": "d"}]
        },
        "nodes[0] (n1).kubelet_dir: must be a path, got None": {
            "nodes": [{"name": "n1", "sim_devices": "a"}]
        },
        "node 'n1': name 'n1' is used twice": {
            "nodes": [{"name": "n1", "sim_devices": "a", "kubelet_dir": d} for d in ("d1", "d2")]
        },
        "kubelet_dir": {"nodes": [{"name": n, "sim_devices": "a", "kubelet_dir": "d"} for n in ("n1", "n2")]},
        "'nodes' must be a non-empty list": {"nodes": []},
        "top level must be a mapping with only 'nodes'": {"nodes": [], "extra": 1},
    }
    for expected, document in cases.items():
        with pytest.raises(ConfigError, match=re.escape(expected)):
            parse_fleet_file(json.dumps(document), source="f.json", base_dir=tmp_path)
    with pytest.raises(ConfigError, match="cannot read fleet file"):
        read_fleet_file(tmp_path / "absent.yaml")


def test_the_fleet_takes_the_agents_flags_refuses_per_node_ones_and_nvml(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    fleet_file = write_fleet(tmp_path, 2)
    fleet = parse_fleet_config(["--fleet", str(fleet_file), "--register-interval", "10"], {})
    assert fleet.start_spread == 10.0  # one registration interval by default
    configs = fleet.node_configs()
    assert [(c.node_name, c.backend, c.register_interval) for c in configs] == [
        ("fleet-00", "sim", 10.0),
        ("fleet-01", "sim", 10.0),
    ]
    assert (
        configs[1].sim_devices == tmp_path / "1" / "devices.yaml"
        and configs[1].kubelet_dir == tmp_path / "1" / "dp"
    )
    with pytest.raises(ConfigError, match="simulated nodes only"):
        parse_fleet_config(["--fleet", str(fleet_file), "--backend", "nvml"], {})
    with pytest.raises(ConfigError, match="HAMI_BACKEND='auto'"):
        parse_fleet_config(["--fleet", str(fleet_file)], {"HAMI_BACKEND": "auto"})
    with pytest.raises(ConfigError, match=re.escape("--start-spread must be at least 0, got '-1'")):
        parse_fleet_config(["--fleet", str(fleet_file), "--start-spread", "-1"], {})
    with pytest.raises(SystemExit) as exited:  # argparse's usage error, as for the agent's own flags
        main(["--fleet", str(fleet_file), "--sim-devices", "x.yaml"])
    assert exited.value.code == 2
    assert "--sim-devices is per node: set it in the --fleet file" in capsys.readouterr().err
    assert main(["--fleet", str(tmp_path / "absent.yaml")]) == 2
    assert "cannot read fleet file" in capsys.readouterr().err


def test_an_mps_node_is_refused(tmp_path: Path) -> None:
    fleet_file = write_fleet(tmp_path, 1)
    (tmp_path / "config.json").write_text(
        json.dumps({"nodeconfig": [{"name": "fleet-00", "operatingmode": "mps"}]})
    )
    document = yaml.safe_load(fleet_file.read_text())
    document["nodes"][0]["config"] = "config.json"
    fleet_file.write_text(yaml.safe_dump(document))
    fleet = parse_fleet_config(["--fleet", str(fleet_file)], {})
    with pytest.raises(ConfigError, match="fleet node fleet-00: operatingmode mps"):
        asyncio.run(run(fleet))


def test_the_shared_watch_gives_each_node_its_own_pods() -> None:
    api: Any = object()  # never called: the test feeds the watch's callbacks
    caches = {name: PodCache(api, name) for name in ("a", "b")}
    fanout = PodFanout(api, caches)

    def pod(name: str, node: str) -> dict[str, Any]:
        return {"metadata": {"name": name, "namespace": "default"}, "spec": {"nodeName": node}}

    fanout.on_list([pod("p1", "a"), pod("p2", "b"), pod("p3", "elsewhere"), pod("p4", "")])
    assert [[p["metadata"]["name"] for p in c.pods] for c in caches.values()] == [["p1"], ["p2"]]
    assert all(c.synced for c in caches.values())
    fanout.on_event("ADDED", pod("p5", "b"))
    fanout.on_event("DELETED", pod("p1", "a"))
    fanout.on_event("ADDED", pod("p6", "elsewhere"))
    assert [[p["metadata"]["name"] for p in c.pods] for c in caches.values()] == [[], ["p2", "p5"]]
    fanout.on_restart(GONE)
    assert not any(c.synced for c in caches.values())


def test_the_merged_collector_serves_every_nodes_samples_under_one_name() -> None:
    api: Any = object()  # never called: nothing lists
    merged = FleetCollector()
    registry = CollectorRegistry()
    registry.register(merged)
    for name in ("a", "b"):
        merged.add(PodCacheCollector(PodCache(api, name), name))
    text = generate_latest(registry).decode()
    assert text.count("# TYPE hami_node_pod_cache_pods gauge") == 1
    assert 'hami_node_pod_cache_pods{node="a",zone="vGPU"} 0.0' in text
    assert 'hami_node_pod_cache_pods{node="b",zone="vGPU"} 0.0' in text
