"""``--pods DIR``: pod manifests as the replay's pods — requests read with HAMi's codec, CPU and memory as
kube-scheduler counts them, and what a trace pod cannot express refused with the file and pod named."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from hami import cli
from hami.simulate.manifests import read_manifest_pods
from hami.simulate.trace import TraceError


def manifest(
    name: str,
    limits: dict[str, str],
    cpu: str = "2",
    annotations: dict[str, str] | None = None,
    containers: int = 1,
) -> dict[str, Any]:
    box = {
        "name": "c",
        "image": "cuda",
        "resources": {"limits": limits, "requests": {"cpu": cpu, "memory": "1Gi"}},
    }
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "ml", "annotations": annotations or {}},
        "spec": {"containers": [dict(box, name=f"c{k}") for k in range(containers)]},
    }


def test_manifests_become_trace_pods(tmp_path: Path) -> None:
    share = manifest(
        "share",
        {"nvidia.com/gpu": "1", "nvidia.com/gpumem-percentage": "47"},
        annotations={"nvidia.com/use-gputype": "T4,V100"},
    )
    (tmp_path / "a.yaml").write_text(json.dumps(share))
    items = [manifest("cpu", {}, cpu="500m"), manifest("two", {"nvidia.com/gpu": "2"})]
    (tmp_path / "b.json").write_text(json.dumps({"apiVersion": "v1", "kind": "List", "items": items}))
    (tmp_path / "notes.txt").write_text("ignored")
    pods = read_manifest_pods(tmp_path)
    assert [(p.name, p.num_gpu, p.gpu_milli, p.cpu_milli, p.memory_mib) for p in pods] == [
        ("ml/share", 1, 470, 2000, 1024),
        ("ml/cpu", 0, 0, 500, 1024),
        ("ml/two", 2, 1000, 2000, 1024),
    ]
    assert pods[0].gpu_spec == ("T4", "V100")


@pytest.mark.parametrize(
    ("pod", "says"),
    [
        (manifest("abs", {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "4000"}), "gpumem in MiB"),
        (manifest("multi", {"nvidia.com/gpu": "1"}, containers=2), "several containers"),
        (
            manifest("split", {"nvidia.com/gpu": "2", "nvidia.com/gpumem-percentage": "50"}),
            "only one can be shared",
        ),
    ],
)
def test_what_a_trace_pod_cannot_express_is_refused(tmp_path: Path, pod: dict[str, Any], says: str) -> None:
    (tmp_path / "p.yaml").write_text(json.dumps(pod))
    with pytest.raises(TraceError) as caught:
        read_manifest_pods(tmp_path)
    assert f"p.yaml: pod ml/{pod['metadata']['name']}" in str(caught.value) and says in str(caught.value)


def test_parts_of_a_manifest_that_are_not_objects_read_as_absent(tmp_path: Path) -> None:
    """A hand-written file may hold anything: metadata, containers or resources of the wrong JSON type
    read as absent (no name, no containers, no requests) instead of failing with a traceback."""
    gpu = manifest("named-later", {"nvidia.com/gpu": "1"})
    odd = [
        {"kind": "Pod", "metadata": "p", "spec": gpu["spec"]},
        {"kind": "Pod", "metadata": {"name": "strings"}, "spec": {"containers": "abc", "initContainers": 3}},
        {
            "kind": "Pod",
            "metadata": {"name": "boxes"},
            "spec": {"containers": ["c", {"name": "c", "resources": "x"}]},
        },
        {
            "kind": "Pod",
            "metadata": {"name": "asks"},
            "spec": {"containers": [{"resources": {"requests": "4"}}]},
        },
        {"kind": "Pod", "metadata": {"name": 5, "namespace": ["ml"]}, "spec": "c"},
    ]
    (tmp_path / "odd.json").write_text(json.dumps({"kind": "List", "items": odd}))
    pods = read_manifest_pods(tmp_path)
    assert [(p.name, p.num_gpu, p.cpu_milli, p.memory_mib) for p in pods] == [
        ("default/?", 1, 2000, 1024),
        ("default/strings", 0, 0, 0),
        ("default/boxes", 0, 0, 0),
        ("default/asks", 0, 0, 0),
        ("default/?", 0, 0, 0),
    ]


def test_an_empty_or_broken_folder_is_refused(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match="no Pod manifests"):
        read_manifest_pods(tmp_path)
    (tmp_path / "bad.yaml").write_text("kind: Pod\n  bad: [indent")
    with pytest.raises(TraceError, match="not YAML/JSON"):
        read_manifest_pods(tmp_path)


def test_the_command_replays_a_folder(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    nodes = tmp_path / "nodes.csv"
    nodes.write_text("sn,cpu_milli,memory_mib,gpu,model\nn0,8000,16384,2,T4\n")
    folder = tmp_path / "pods"
    folder.mkdir()
    for k in range(3):
        (folder / f"p{k}.yaml").write_text(json.dumps(manifest(f"p{k}", {"nvidia.com/gpu": "1"}, cpu="1")))
    argv = [
        "simulate",
        "--nodes",
        str(nodes),
        "--pods",
        str(folder),
        "--policy",
        "fgd",
        "--seeds",
        "1",
        "--json",
    ]
    assert cli.main([*argv, "--inflate", "1.5"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["trace"] == "pods" and result["dropped"]["1-gpu"] == 1.0
