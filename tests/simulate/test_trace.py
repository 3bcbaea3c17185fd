"""The trace reader: the openb files load as the README says, and every malformed row is refused with the
file, the line and the value named (never a traceback, never a silently skewed replay)."""

from __future__ import annotations

from pathlib import Path

import pytest

from hami.simulate.trace import TraceError, parse_nodes, parse_pods, read_nodes, read_pods, trace_name

OPENB = Path(__file__).resolve().parents[3] / "shared" / "data" / "openb"
NODES_HEADER = "sn,cpu_milli,memory_mib,gpu,model\n"
PODS_HEADER = "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec\n"


@pytest.mark.skipif(not OPENB.is_dir(), reason="shared/data/openb not beside the checkout")
def test_openb_files_load_as_documented() -> None:
    nodes = read_nodes(OPENB / "openb_node_list_gpu_node.csv")
    assert len(nodes) == 1213
    assert sum(n.gpus for n in nodes) == 6212
    g2 = [n for n in nodes if n.model == "G2"]
    assert (len(g2), sum(n.gpus for n in g2)) == (549, 4392)
    pods = read_pods(OPENB / "openb_pod_list_default.csv")
    assert len(pods) == 8152
    assert {p.num_gpu for p in pods} == {0, 1, 2, 4, 8}
    spec = read_pods(OPENB / "openb_pod_list_gpuspec20.csv")
    assert ("V100M16", "V100M32") in {p.gpu_spec for p in spec}
    multi = read_pods(OPENB / "openb_pod_list_multigpu20.csv")  # only the first five columns
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
    assert trace_name("mine.csv") == "mine"


def test_a_node_list_too_large_to_replay_is_refused() -> None:
    rows = "".join(f"n{i},1,1,64,T4\n" for i in range(20_000))  # 1.28 M cards: arrays of GBs
    with pytest.raises(TraceError, match="more than 1000000 cards"):
        parse_nodes(NODES_HEADER + rows, "nodes.csv")
