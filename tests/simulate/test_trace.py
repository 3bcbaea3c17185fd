"""The trace reader: the shipped openb files (tests/data/openb, gzipped) load as their README says, and
every malformed row is refused with the file, the line and the value named (never a traceback, never a
silently skewed replay)."""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest

from hami.simulate import trace
from hami.simulate.trace import (
    TraceError,
    openb_folder,
    parse_nodes,
    parse_pods,
    read_nodes,
    read_pods,
    trace_name,
)
from tests.simulate import shipped

NODES_HEADER = "sn,cpu_milli,memory_mib,gpu,model\n"
PODS_HEADER = "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec\n"


def test_openb_files_load_as_documented() -> None:
    nodes = read_nodes(shipped.NODES)
    assert len(nodes) == 1213
    assert sum(n.gpus for n in nodes) == 6212
    g2 = [n for n in nodes if n.model == "G2"]
    assert (len(g2), sum(n.gpus for n in g2)) == (549, 4392)
    pods = read_pods(shipped.pods("default"))
    assert len(pods) == 8152
    assert {p.num_gpu for p in pods} == {0, 1, 2, 4, 8}
    spec = read_pods(shipped.pods("gpuspec20"))
    assert ("V100M16", "V100M32") in {p.gpu_spec for p in spec}
    multi = read_pods(shipped.pods("multigpu20"))  # only the first five columns
    assert all(p.gpu_spec == () for p in multi)


def test_pod_kinds_and_requests() -> None:
    pods = parse_pods(PODS_HEADER + "a,1000,10,0,0,\nb,1000,10,1,470,T4|P100\nc,1,1,1,1000,\nd,1,1,8,1000,\n")
    assert [p.kind for p in pods] == ["cpu", "share", "1-gpu", "multi-gpu"]
    assert [p.gpu_request for p in pods] == [0, 470, 1000, 8000]
    assert pods[1].gpu_spec == ("T4", "P100")


@pytest.mark.parametrize(
    ("row", "says"),
    [
        ("a,1000,10,2,500,", "only one card can be shared"),
        ("a,1000,10,1,0,", "gpu_milli 0"),
        ("a,1000,10,0,300,", "without a card"),
        ("a,1000,10,1,1001,", "between 0 and 1000"),
        ("a,-5,10,1,100,", "not a non-negative whole number"),
        ("a,1.5,10,1,100,", "not a non-negative whole number"),
        ("a,1000,10,65,1000,", "between 0 and 64"),
        ("a,1000,10,1,100,T4|bad;model", "not a model name"),
        ("a,1000,10,1,100", "5 fields, the header has 6"),
        (",1000,10,1,100,", "is not a name"),
        ("a,99999999999999999999,10,1,100,", "not a non-negative whole number"),
    ],
)
def test_bad_pod_rows_are_refused_with_line_and_value(row: str, says: str) -> None:
    with pytest.raises(TraceError) as caught:
        parse_pods(PODS_HEADER + "ok,1,1,0,0,\n" + row + "\n", "pods.csv")
    assert str(caught.value).startswith("pods.csv:3")
    assert says in str(caught.value)


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("", "empty file"),
        ("sn,cpu_milli,gpu,model\nn,1,1,T4\n", "missing column(s) memory_mib"),
        (NODES_HEADER, "no nodes"),
        (NODES_HEADER + "n,1,1,1,T4\nn,1,1,1,T4\n", "appears twice"),
        (NODES_HEADER + "n,1,1,65,T4\n", "between 0 and 64"),
        (NODES_HEADER + "n,1,1,2,\n", "not a model name"),
        (NODES_HEADER + 'n,1,1,2,"T4\n', "not valid CSV"),
        ("sn,sn,cpu_milli,memory_mib,gpu,model\n", "appears twice"),
        ("sn,cpu_milli,memory_mib,gpu,model\x00\n", "NUL byte"),
    ],
)
def test_bad_node_files_are_refused(text: str, says: str) -> None:
    with pytest.raises(TraceError) as caught:
        parse_nodes(text, "nodes.csv")
    assert says in str(caught.value)


def test_unreadable_and_non_utf8_files(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match="cannot read"):
        read_pods(tmp_path / "missing.csv")
    latin = tmp_path / "latin.csv"
    latin.write_bytes(PODS_HEADER.encode() + b"p\xe9,1,1,0,0,\n")
    with pytest.raises(TraceError, match="not UTF-8"):
        read_pods(latin)


def test_cpu_node_without_model_and_blank_lines() -> None:
    nodes = parse_nodes(NODES_HEADER + "cpu-only,64000,1024,0,\n\n")
    assert nodes[0].gpus == 0 and nodes[0].model == ""


def test_trace_name() -> None:
    assert trace_name("x/openb_pod_list_gpushare40.csv") == "gpushare40"
    assert trace_name("x/openb_pod_list_gpushare40.csv.gz") == "gpushare40"
    assert trace_name("x/pods.csv.gz") == "pods"
    assert trace_name("mine.csv") == "mine"


def test_a_node_list_too_large_to_replay_is_refused() -> None:
    rows = "".join(f"n{i},1,1,64,T4\n" for i in range(20_000))  # 1.28 M cards: arrays of GBs
    with pytest.raises(TraceError, match="more than 1000000 cards"):
        parse_nodes(NODES_HEADER + rows, "nodes.csv")


def test_gzipped_files_read_as_their_text(tmp_path: Path) -> None:
    text = PODS_HEADER + "a,1000,10,1,470,T4\n"
    packed = tmp_path / "pods.csv.gz"
    packed.write_bytes(gzip.compress(text.encode()))
    assert read_pods(packed) == parse_pods(text)


@pytest.mark.parametrize(
    ("content", "says"),
    [
        (b"name,cpu_milli\n", "not a whole gzip file"),  # plain text under a .gz name
        (gzip.compress(PODS_HEADER.encode() * 50, mtime=0)[:40], "not a whole gzip file"),  # cut short
    ],
    ids=["plain text", "cut short"],  # ids fixed: every xdist worker collects the same tests
)
def test_bad_gzip_is_refused_naming_the_file(tmp_path: Path, content: bytes, says: str) -> None:
    bad = tmp_path / "pods.csv.gz"
    bad.write_bytes(content)
    with pytest.raises(TraceError) as caught:
        read_pods(bad)
    assert str(caught.value).startswith(str(bad)) and says in str(caught.value)


def test_gzip_is_held_to_the_size_bound_unpacked(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(trace, "MAX_BYTES", 1000)
    bomb = tmp_path / "pods.csv.gz"
    bomb.write_bytes(gzip.compress(PODS_HEADER.encode() + b"a,1,1,0,0,\n" * 200))  # small only packed
    assert bomb.stat().st_size < 1000
    with pytest.raises(TraceError, match=r"larger than .* unpacked"):
        read_pods(bomb)


def test_openb_folder_finds_plain_and_gzipped_lists(tmp_path: Path) -> None:
    (tmp_path / "openb_node_list_gpu_node.csv.gz").write_bytes(gzip.compress(NODES_HEADER.encode()))
    (tmp_path / "openb_pod_list_default.csv").write_text(PODS_HEADER)
    (tmp_path / "openb_pod_list_cpu050.csv.gz").write_bytes(gzip.compress(PODS_HEADER.encode()))
    (tmp_path / "notes.txt").write_text("")
    nodes, pods = openb_folder(tmp_path)
    assert nodes == tmp_path / "openb_node_list_gpu_node.csv.gz"
    assert pods == {
        "cpu050": tmp_path / "openb_pod_list_cpu050.csv.gz",
        "default": tmp_path / "openb_pod_list_default.csv",
    }
    (tmp_path / "openb_pod_list_default.csv.gz").write_bytes(b"")
    with pytest.raises(TraceError, match=r"both openb_pod_list_default\.csv or"):
        openb_folder(tmp_path)


def test_openb_folder_without_lists_is_refused(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match="no openb_pod_list_"):
        openb_folder(tmp_path)
    (tmp_path / "openb_pod_list_default.csv").write_text(PODS_HEADER)
    with pytest.raises(TraceError, match=r"no openb_node_list_gpu_node\.csv"):
        openb_folder(tmp_path)


def test_the_shipped_folder_holds_the_nine_published_variants() -> None:
    nodes, pods = openb_folder(shipped.OPENB)
    assert nodes == shipped.NODES
    published = ["default", "gpushare40", "gpushare60", "multigpu20", "multigpu30", "gpuspec10", "gpuspec20"]
    assert sorted(pods) == sorted([*published, "cpu050", "cpu100"])
    assert all(path == shipped.pods(name) for name, path in pods.items())
