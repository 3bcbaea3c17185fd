"""The MPS back end in the agent: the enforcement registered per card follows the daemon's actual
state (``mps-namespaced``, ``mps``, ``none`` when down), its metrics, the pass that closes the
namespaces of pods gone, and the flags."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
from pathlib import Path
from typing import Any

import kmock
import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from hami.annotations import (
    NODE_ENFORCEMENT,
    POD_DEVICES_ALLOCATED,
    Enforcement,
    decode_node_enforcement,
    encode_pod_devices,
)
from hami.core.model import Device, Grant
from hami.settings import ConfigError
from nodeagent.backends.base import EXCLUSIVE_PROCESS
from nodeagent.backends.simulated import SimBackend
from nodeagent.config import AgentConfig, NodeSettings, parse_agent_config
from nodeagent.exporter import NodeCollector
from nodeagent.grants import GrantBook
from nodeagent.inventory import Inventory
from nodeagent.mps.control import MpsControl, pid_alive
from nodeagent.mps.keeper import close_gone, restore
from nodeagent.mps.protocol import CardLimit, MpsState, namespace_create
from nodeagent.registrar import Registrar, card_enforcement
from nodeagent.wiring import mps_control
from tests.builders import create, make_pod
from tests.eventually import eventually

from ..agent_helpers import annotations_of, card, create_node, g, write_cards
from .kit import MpsKit

MPS = NodeSettings(mode="mps")
NO_API: Any = None


RESTORED = dict(running=True, protocol=3, namespaces=True, restored=True)


@pytest.mark.parametrize(
    ("state", "exclusive", "expected"),
    [
        (None, True, Enforcement.NONE),
        (MpsState(running=False, detail="down"), True, Enforcement.NONE),
        (MpsState(running=True, protocol=2), True, Enforcement.MPS),
        (MpsState(running=True, protocol=3, namespaces=False), True, Enforcement.MPS),
        (MpsState(**RESTORED), True, Enforcement.MPS_NAMESPACED),  # type: ignore[arg-type]
        # a process may leave MPS and run on the card directly unless only the MPS server may hold it
        (MpsState(**RESTORED), False, Enforcement.MPS),  # type: ignore[arg-type]
        # the running pods' namespaces are not rebuilt on this daemon yet: their sockets are missing
        (MpsState(running=True, protocol=3, namespaces=True, restored=False), True, Enforcement.MPS),
    ],
)
def test_an_mps_card_reports_what_the_daemon_answered(
    state: MpsState | None, exclusive: bool, expected: Enforcement
) -> None:
    devices = [
        Device(uuid="GPU-a", index=0, count=4, memory_mib=1, cores=100, type="T4", mode="mps"),
        Device(uuid="GPU-b", index=1, count=4, memory_mib=1, cores=100, type="T4", mode="hami-core"),
    ]
    found = card_enforcement(
        devices, hami_core=True, mps=state, exclusive={"GPU-a", "GPU-b"} if exclusive else set()
    )
    assert found == {"GPU-a": expected, "GPU-b": Enforcement.HAMI_CORE}


async def _registered(apiserver: kmock.KubernetesEmulator, registrar: Registrar) -> set[Enforcement]:
    await registrar.register_once()
    stored = await annotations_of(apiserver, "/api/v1/nodes/n1")
    return set(decode_node_enforcement(stored[NODE_ENFORCEMENT]).values())


async def test_registration_follows_the_daemon_namespaced_then_down(
    apiserver: kmock.KubernetesEmulator, api: Any, tmp_path: Path, mps_kit: MpsKit
) -> None:
    await create_node(apiserver, "n1")
    cards = write_cards(tmp_path / "cards.yaml", [card("GPU-a", compute_mode=EXCLUSIVE_PROCESS)])
    control = mps_kit.control()
    registrar = Registrar(
        api=api, node_name="n1", inventory=Inventory(SimBackend(cards)), settings=MPS, mps=control
    )
    assert await _registered(apiserver, registrar) == {Enforcement.NONE}  # no daemon yet
    await control.start()
    assert await _registered(apiserver, registrar) == {Enforcement.MPS}  # the pods' namespaces: not yet
    assert await restore(control, api=api, node_name="n1")
    assert await _registered(apiserver, registrar) == {Enforcement.MPS_NAMESPACED}
    pid = mps_kit.daemon_pid()
    assert pid is not None
    os.kill(pid, signal.SIGKILL)  # read from the daemon, not the config: down is none at the next pass
    await eventually(lambda: not pid_alive(pid), "the daemon to die", within=60)
    assert await _registered(apiserver, registrar) == {Enforcement.NONE}


async def test_a_card_not_in_exclusive_process_mode_is_mps_and_said_once(
    apiserver: kmock.KubernetesEmulator,
    api: Any,
    tmp_path: Path,
    mps_kit: MpsKit,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A process that points CUDA_MPS_PIPE_DIRECTORY elsewhere runs on the card without MPS, unlimited,
    unless the card is in EXCLUSIVE_PROCESS compute mode: read per card from the backend, not config."""
    await create_node(apiserver, "n1")
    cards = write_cards(
        tmp_path / "cards.yaml",
        [
            card("GPU-a", compute_mode=EXCLUSIVE_PROCESS),
            card("GPU-b"),
            card("GPU-c", compute_mode="prohibited"),
        ],
    )
    control = mps_kit.control()
    await control.start()
    assert await restore(control, api=api, node_name="n1")
    registrar = Registrar(
        api=api, node_name="n1", inventory=Inventory(SimBackend(cards)), settings=MPS, mps=control
    )
    caplog.set_level(logging.WARNING, logger="nodeagent.registrar")
    await registrar.register_once()
    await registrar.register_once()
    stored = await annotations_of(apiserver, "/api/v1/nodes/n1")
    assert decode_node_enforcement(stored[NODE_ENFORCEMENT]) == {
        "GPU-a": Enforcement.MPS_NAMESPACED,
        "GPU-b": Enforcement.MPS,
        "GPU-c": Enforcement.MPS,
    }
    said = [r.getMessage() for r in caplog.records if "tenants can leave MPS" in r.getMessage()]
    assert len(said) == 2 and "GPU-b" in said[0] and "GPU-c" in said[1], said  # once per card


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


UID = "0c9f5a4e-6a53-4b1e-9d8e-2f1c3b4a5d6e"
GONE = "7d2e0b6c-1f3a-4c5d-8e9f-0a1b2c3d4e5f"


def _listed(listing: str) -> list[str]:
    return sorted(line.split()[0] for line in listing.splitlines())


async def test_only_pod_namespaces_are_adopted_and_only_ours_are_deleted(
    apiserver: kmock.KubernetesEmulator, api: Any, mps_kit: MpsKit
) -> None:
    """A daemon's namespace is adopted only when named ``<pod uid>-<container index>``; others are not
    ours and are never deleted. Empty directories a previous daemon left for pods gone are removed."""
    await create(apiserver, make_pod("running", node="n1", phase="Running"))
    await mps_kit.control().start()
    limits = [CardLimit("GPU-a", 512, 10)]
    for name in ("someone-else", UID, "other-tenant-3", f"{UID}-0"):
        status, out = await mps_kit.client(*namespace_create(name, limits).words)
        assert status == 0, out
    hami = mps_kit.pipe / "hami"
    for name in (f"{GONE}-0", "uid-running-0", "not-a-pod"):
        (hami / name).mkdir(parents=True, exist_ok=True)
    with socket.socket(socket.AF_UNIX) as dead:  # a socket a killed daemon left: nobody listens
        dead.bind(str(hami / f"{GONE}-0" / "control"))

    control = mps_kit.control()  # the agent after its container restarted
    await control.start()
    assert control.namespaces == (f"{UID}-0",)
    closed = await close_gone(control, api=api, node_name="n1")
    assert closed == [f"{UID}-0"]
    _, listing = await mps_kit.client("namespace", "list", "--server=hami")
    assert _listed(listing) == sorted([UID, "other-tenant-3", "someone-else"])
    left = sorted(os.listdir(hami))
    assert f"{GONE}-0" not in left and f"{UID}-0" not in left
    assert {"uid-running-0", "not-a-pod", "other-tenant-3", "someone-else"} <= set(left)
    assert (hami / "other-tenant-3" / "control").is_socket()  # a live namespace's socket is kept


def _allocated(name: str, devices: list[list[Grant]], **kw: Any) -> dict[str, Any]:
    containers = [{"name": f"c{i}", "image": "cuda"} for i in range(len(devices))]
    annotations = {POD_DEVICES_ALLOCATED: encode_pod_devices(tuple(tuple(c) for c in devices))}
    return make_pod(name, node=kw.pop("node", "n1"), containers=containers, annotations=annotations, **kw)


async def test_a_new_daemon_gets_the_running_pods_namespaces_back(
    apiserver: kmock.KubernetesEmulator, api: Any, mps_kit: MpsKit
) -> None:
    """After the agent's container restarts its daemon is gone with it: the new daemon lists no
    namespace, and each running pod's namespace is opened again from its grant, with the limits
    Allocate gave it, before the node reports mps-namespaced again."""
    two = [[g("GPU-a", 2048, 40)], [g("GPU-a", 1024, 30), g("GPU-b", 1024, 30)]]
    await create(
        apiserver,
        _allocated("running", two, phase="Running"),
        _allocated("done", [[g("GPU-a", 512, 10)]], phase="Succeeded"),
        _allocated("elsewhere", [[g("GPU-a", 512, 10)]], node="n2", phase="Running"),
        make_pod("plain", node="n1", phase="Running"),
        make_pod("unreadable", node="n1", phase="Running", annotations={POD_DEVICES_ALLOCATED: "GPU-a,x"}),
    )
    expected = [
        "uid-running-0 pinned_memory_limit=GPU-a=2048M active_thread_percentage=40",
        "uid-running-1 pinned_memory_limit=GPU-a=1024M,GPU-b=1024M active_thread_percentage=30",
    ]
    first = mps_kit.control()
    await first.start()
    assert not first.state.restored
    assert await restore(first, api=api, node_name="n1")
    assert first.state.restored and first.namespaces == ("uid-running-0", "uid-running-1")
    _, listing = await mps_kit.client("namespace", "list", "--server=hami")
    assert sorted(listing.splitlines()) == expected

    old = mps_kit.daemon_pid()
    assert old is not None
    os.kill(old, signal.SIGKILL)  # the container restarts: its daemon dies with it
    await eventually(lambda: not pid_alive(old), "the daemon to die", within=60)
    control = mps_kit.control()  # the new agent: remembers nothing

    async def again() -> bool:
        return await restore(control, api=api, node_name="n1")

    watch = asyncio.create_task(control.watch(0.05, restore=again))
    try:
        await eventually(lambda: control.state.restored, "the namespaces restored", within=120)
    finally:
        watch.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watch
    assert mps_kit.daemon_pid() != old and control.restarts == 1
    _, listing = await mps_kit.client("namespace", "list", "--server=hami")
    assert sorted(listing.splitlines()) == expected
    for name in ("uid-running-0", "uid-running-1"):
        path = Path(control.namespace_dir(name)) / "control"
        await eventually(path.is_socket, f"{name}'s socket", within=60)
