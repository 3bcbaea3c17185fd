"""The demo's enforcement: a node's ``hami_core`` in the cluster file (default true; strictly a boolean)
decides whether its files hold the stand-in library the agent's own check accepts, and the demo's table
has an ENFORCEMENT column read from ``hami.io/vgpu-enforcement`` (``-`` when not recorded, ``?`` when
unreadable), explained in the legend when a card has none."""

from __future__ import annotations

from pathlib import Path
from typing import Any, cast

import pytest

from hami.annotations import POD_DEVICES_ALLOCATED, POD_VGPU_ENFORCEMENT, encode_pod_devices
from hami.core.model import Grant
from hami_testkit.cluster import ClusterFileError, parse_cluster, write_node_files
from hami_testkit.report import CardLine, PodReport, describe, legend, render
from hami_testkit.scheduler_standin import SchedulerStandIn
from nodeagent.registrar import hami_core_installed

NODES = """
nodes:
  - name: with
    cards: [{uuid: GPU-w, model: NVIDIA A10, memory_mib: 100}]
  - name: without
    hami_core: false
    cards: [{uuid: GPU-o, model: NVIDIA A10, memory_mib: 100}]
"""


def test_hami_core_is_installed_by_default_and_the_agent_accepts_the_stand_in(tmp_path: Path) -> None:
    with_, without = parse_cluster(NODES).nodes
    assert with_.hami_core and not without.hami_core
    installed = write_node_files(with_, tmp_path)
    assert installed.hook is not None and hami_core_installed(installed.hook)
    assert write_node_files(without, tmp_path).hook is None
    assert not (tmp_path / "without" / "hook").exists()


@pytest.mark.parametrize("value", ['"false"', "0", "null", "[]"])
def test_hami_core_must_be_a_boolean(value: str) -> None:
    text = NODES.replace("hami_core: false", f"hami_core: {value}")
    with pytest.raises(ClusterFileError, match=r"nodes\[1\] \(without\)\.hami_core: must be true or false"):
        parse_cluster(text)


class _Preemption:
    preemptions: dict[str, Any] = {}  # noqa: RUF012  (read only)
    preempted_for: dict[str, Any] = {}  # noqa: RUF012


class _Scheduler:
    preemption = _Preemption()


def _placed(annotations: dict[str, str]) -> PodReport:
    devices = encode_pod_devices(((Grant(uuid="GPU-w", memory_mib=10, cores=5),),))
    pod = {
        "metadata": {
            "name": "p",
            "namespace": "default",
            "annotations": {POD_DEVICES_ALLOCATED: devices, **annotations},
        },
        "spec": {"nodeName": "with", "containers": [{"name": "c"}]},
        "status": {"phase": "Running"},
    }
    return describe(
        "default/p", pod, None, cast(SchedulerStandIn, _Scheduler()), {"GPU-w": (0, "NVIDIA A10")}
    )


@pytest.mark.parametrize(
    ("annotations", "shown"),
    [
        ({POD_VGPU_ENFORCEMENT: "GPU-w:hami-core"}, "hami-core"),
        ({POD_VGPU_ENFORCEMENT: "GPU-w:none"}, "none"),
        ({}, "-"),  # bound by a scheduler that does not record it
        ({POD_VGPU_ENFORCEMENT: "GPU-w:strong"}, "?"),  # unreadable: the card is still shown
    ],
)
def test_each_card_shows_its_enforcement(annotations: dict[str, str], shown: str) -> None:
    report = _placed(annotations)
    (line,) = report.cards
    assert line.enforcement == shown
    header, row = render([report]).splitlines()
    column = header.index("ENFORCEMENT")
    assert row[column:].split()[0] == shown


def test_the_legend_explains_none_only_when_shown() -> None:
    bare = CardLine(container="c", card="#0 GPU-w", model="A10", memory_mib=1, cores=1, enforcement="none")
    enforced = CardLine(container="c", card="#0 GPU-w", model="A10", memory_mib=1, cores=1, enforcement="mig")
    with_none = " ".join(legend([PodReport(name="a", status="Running", cards=(bare,))]).split())
    assert "ENFORCEMENT = what holds the container to its slice on the card" in with_none
    assert "NoEnforcement" in with_none
    assert legend([PodReport(name="a", status="Running", cards=(enforced,))]) == ""
