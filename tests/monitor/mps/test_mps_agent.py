"""The MPS back end in the agent: the enforcement registered per card follows the daemon's actual
state (``mps-namespaced``, ``mps``, ``none`` when down), its metrics, the pass that closes the
namespaces of pods gone, and the flags."""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

import kmock
import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from hami.annotations import NODE_ENFORCEMENT, Enforcement, decode_node_enforcement
from hami.core.model import Device
from monitor.__main__ import mps_control
from monitor.backends.sim import SimBackend
from monitor.config import AgentConfig, ConfigError, NodeSettings, parse_agent_config
from monitor.exporter import NodeCollector
from monitor.grants import GrantBook
from monitor.inventory import Inventory
from monitor.mps.control import MpsControl, pid_alive
from monitor.mps.keeper import close_gone
from monitor.mps.protocol import CardLimit, MpsState
from monitor.registrar import Registrar, card_enforcement
from tests.builders import create, make_pod
from tests.eventually import eventually

from ..agent_helpers import annotations_of, card, create_node, write_cards
from .kit import MpsKit

MPS = NodeSettings(mode="mps")
NO_API: Any = None


@pytest.mark.parametrize(
    ("state", "expected"),
    [
        (None, Enforcement.NONE),
        (MpsState(running=False, detail="down"), Enforcement.NONE),
        (MpsState(running=True, protocol=2), Enforcement.MPS),
        (MpsState(running=True, protocol=3, namespaces=False), Enforcement.MPS),
        (MpsState(running=True, protocol=3, namespaces=True), Enforcement.MPS_NAMESPACED),
    ],
)
def test_an_mps_card_reports_what_the_daemon_answered(state: MpsState | None, expected: Enforcement) -> None:
    devices = [
        Device(uuid="GPU-a", index=0, count=4, memory_mib=1, cores=100, type="T4", mode="mps"),
        Device(uuid="GPU-b", index=1, count=4, memory_mib=1, cores=100, type="T4", mode="hami-core"),
    ]
    found = card_enforcement(devices, hami_core=True, mps=state)
    assert found == {"GPU-a": expected, "GPU-b": Enforcement.HAMI_CORE}


async def _registered(apiserver: kmock.KubernetesEmulator, registrar: Registrar) -> set[Enforcement]:
    await registrar.register_once()
    stored = await annotations_of(apiserver, "/api/v1/nodes/n1")
    return set(decode_node_enforcement(stored[NODE_ENFORCEMENT]).values())


async def test_registration_follows_the_daemon_namespaced_then_down(
    apiserver: kmock.KubernetesEmulator, api: Any, tmp_path: Path, mps_kit: MpsKit
) -> None:
    await create_node(apiserver, "n1")
    cards = write_cards(tmp_path / "cards.yaml", [card("GPU-a"), card("GPU-b")])
    control = mps_kit.control()
    registrar = Registrar(
        api=api, node_name="n1", inventory=Inventory(SimBackend(cards)), settings=MPS, mps=control
    )
    assert await _registered(apiserver, registrar) == {Enforcement.NONE}  # no daemon yet
    await control.start()
    assert await _registered(apiserver, registrar) == {Enforcement.MPS_NAMESPACED}
    pid = mps_kit.daemon_pid()
    assert pid is not None
    os.kill(pid, signal.SIGKILL)  # read from the daemon, not the config: down is none at the next pass
    await eventually(lambda: not pid_alive(pid), "the daemon to die", within=60)
    assert await _registered(apiserver, registrar) == {Enforcement.NONE}


async def test_registration_is_mps_on_an_older_driver(
    apiserver: kmock.KubernetesEmulator, api: Any, tmp_path: Path, mps_kit: MpsKit
) -> None:
    mps_kit.driver_protocol = 2
    await create_node(apiserver, "n1")
    cards = write_cards(tmp_path / "cards.yaml", [card("GPU-a")])
    control = mps_kit.control()
    await control.start()
    registrar = Registrar(
        api=api, node_name="n1", inventory=Inventory(SimBackend(cards)), settings=MPS, mps=control
    )
    assert await _registered(apiserver, registrar) == {Enforcement.MPS}


def _scrape(collector: NodeCollector) -> dict[str, float]:
    registry = CollectorRegistry()
    registry.register(collector)
    text = generate_latest(registry).decode()
    return {
        sample.name: sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name.startswith("hami_node_mps_")
    }


def _collector(tmp_path: Path, control: MpsControl | None) -> NodeCollector:
    return NodeCollector(
        node_name="n1",
        inventory=Inventory(SimBackend(write_cards(tmp_path / "c.yaml", []))),
        settings=MPS,
        grants=GrantBook(api=NO_API, node_name="n1"),
        mps=control,
    )


async def test_metrics_report_the_daemon(tmp_path: Path, mps_kit: MpsKit) -> None:
    control = mps_kit.control()
    assert _scrape(_collector(tmp_path, control)) == {
        "hami_node_mps_daemon_up": 0,
        "hami_node_mps_daemon_restarts_total": 0,
        "hami_node_mps_namespaces_open": 0,
    }
    await control.start()
    await control.open_namespace("uid-p1-0", [CardLimit("GPU-a", 1024, 50)])
    control.restarts = 2  # as counted by watch(): the counter is read as it stands
    assert _scrape(_collector(tmp_path, control)) == {
        "hami_node_mps_daemon_up": 1,
        "hami_node_mps_protocol_version": 3,
        "hami_node_mps_daemon_restarts_total": 2,
        "hami_node_mps_namespaces_open": 1,
    }


def test_docs_list_the_mps_metrics(tmp_path: Path) -> None:
    collector = _collector(tmp_path, MpsControl(root=tmp_path / "mps"))
    names = {f.name for f in collector.describe() if f.name.startswith("hami_node_mps_")}
    assert len(names) == 4
    docs = (Path(__file__).resolve().parents[3] / "docs" / "metrics.md").read_text()
    assert {name for name in names if f"`{name}" not in docs} == set()  # the counter: `..._total`
    assert _scrape(_collector(tmp_path, None)) == {}  # not an MPS node: no MPS families


async def test_namespaces_of_pods_gone_or_finished_are_closed(
    apiserver: kmock.KubernetesEmulator, api: Any, mps_kit: MpsKit
) -> None:
    await create(
        apiserver,
        make_pod("running", node="n1", phase="Running"),
        make_pod("done", node="n1", phase="Succeeded"),
        make_pod("elsewhere", node="n2", phase="Running"),
    )
    control = mps_kit.control()
    await control.start()
    limits = [CardLimit("GPU-a", 512, 10)]
    for name in ("uid-running-0", "uid-running-1", "uid-done-0", "uid-gone-0", "uid-elsewhere-0"):
        await control.open_namespace(name, limits)
    closed = await close_gone(control, api=api, node_name="n1")
    assert sorted(closed) == ["uid-done-0", "uid-elsewhere-0", "uid-gone-0"]
    assert control.namespaces == ("uid-running-0", "uid-running-1")
    _, listing = await mps_kit.client("namespace", "list", "--server=hami")
    assert sorted(line.split()[0] for line in listing.splitlines()) == ["uid-running-0", "uid-running-1"]


def test_the_mps_flags(tmp_path: Path) -> None:
    config = parse_agent_config(
        ["--node-name=n1", "--mps-control=/usr/bin/mps", "--mps-root=/run/x", "--mps-protocol=2"],
        {"HAMI_MPS_QUIT_ON_STOP": "true"},
    )
    assert (config.mps_control, config.mps_root, config.mps_protocol, config.mps_quit_on_stop) == (
        "/usr/bin/mps",
        Path("/run/x"),
        2,
        True,
    )
    defaults = parse_agent_config(["--node-name=n1"], {})
    assert defaults.mps_root == Path("/run/hami/mps") and defaults.mps_control == "nvidia-cuda-mps-control"
    for flag, message in (
        ("--mps-root=relative", "--mps-root must be an absolute"),
        ("--mps-protocol=4", "--mps-protocol must be 2 or 3"),
        ("--mps-control=", "--mps-control must name"),
        ("--mps-quit-on-stop=maybe", "--mps-quit-on-stop"),
    ):
        with pytest.raises(ConfigError, match=message):
            parse_agent_config(["--node-name=n1", flag], {})


def test_only_an_mps_node_runs_the_daemon(tmp_path: Path) -> None:
    config = AgentConfig(node_name="n1", mps_root=tmp_path)
    assert mps_control(config, NodeSettings()) is None
    assert mps_control(config, NodeSettings(mode="mig")) is None
    control = mps_control(config, MPS)
    assert control is not None and control.pipe_dir == tmp_path / "pipe"
