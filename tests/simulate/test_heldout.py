"""The held-out protocol: the paired t test (against textbook values), the per-trace verdicts and summary,
and ``hami heldout`` through its command line — generate writes traces ``hami simulate`` reads, run
appends one result per (trace, policy, seed) and resumes, table prints the comparison, bad input exits 2."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hami import cli
from hami.simulate.protocol import Run, compare, holm, paired, render, student_p
from hami.simulate.trace import read_nodes, read_pods
from tests.simulate.test_generate import HEADER

NODE_LIST = "sn,cpu_milli,memory_mib,gpu,model\n" + "".join(
    f"n{k},32000,131072,{(2, 4)[k % 2]},{('T4', 'P100')[k % 2]}\n" for k in range(6)
)
VARIANT_A = HEADER + "".join(f"a{k},4000,16384,1,{(250, 500, 1000)[k % 3]},\n" for k in range(9))
VARIANT_B = HEADER + "".join(f"b{k},8000,32768,{(1, 2)[k % 2]},1000,{('T4', '')[k % 2]}\n" for k in range(8))


@pytest.mark.parametrize(
    ("t", "df", "p"),
    [
        (2.776, 4, 0.05),
        (12.706, 1, 0.05),
        (2.228, 10, 0.05),
        (4.604, 4, 0.01),
        (0.0, 3, 1.0),
        (1.96, 10**6, 0.05),
    ],
)
def test_student_p_matches_the_table(t: float, df: int, p: float) -> None:
    assert student_p(t, df) == pytest.approx(p, abs=2e-4)
    assert student_p(-t, df) == pytest.approx(p, abs=2e-4)


def test_paired_test_says_when_a_difference_is_noise() -> None:
    base = [5.0, 6.0, 4.0, 5.5, 4.5]
    clear = paired(base, [b - 0.5 + 0.01 * k for k, b in enumerate(base)])
    assert clear.verdict == "lower" and clear.wins == 5 and clear.p < 0.001
    worse = paired(base, [b + 0.3 + 0.02 * k for k, b in enumerate(base)])
    assert worse.verdict == "HIGHER" and worse.losses == 5
    noisy = paired(base, [b + d for b, d in zip(base, (0.4, -0.5, 0.3, -0.2, 0.1), strict=True)])
    assert noisy.verdict == "noise" and noisy.mean == pytest.approx(0.02)
    same = paired(base, base)
    assert (same.mean, same.p, same.verdict) == (0.0, 1.0, "noise")
    with pytest.raises(ValueError, match="at least two"):
        paired([1.0], [2.0])


def test_holm_adjusts_for_testing_every_trace() -> None:
    # sorted 0.01, 0.02, 0.04, 0.3: x4, x3, x2, x1, each at least the one before
    assert holm([0.04, 0.01, 0.3, 0.02]) == pytest.approx([0.08, 0.04, 0.3, 0.06])
    assert holm([0.047] + [0.5] * 39)[0] == pytest.approx(1.0)  # one p of 0.047 among 40 is chance
    assert holm([]) == []


def test_compare_pairs_seeds_and_render_names_the_worst_case() -> None:
    runs = [
        Run(trace="t1", policy=p, seed=s, at_100=v, seconds=1.0)
        for p, s, v in (
            ("fgd", 1, 5.0),
            ("fgd", 2, 6.0),
            ("fgd", 3, 5.5),
            ("frag", 1, 4.0),
            ("frag", 2, 5.1),
            ("frag", 3, 4.4),
        )
    ]
    runs += [
        Run(trace="t2", policy=p, seed=s, at_100=v, seconds=1.0)
        for p, s, v in (
            ("fgd", 1, 3.0),
            ("fgd", 2, 3.2),
            ("frag", 1, 3.1),
            ("frag", 2, 3.25),
            ("frag", 9, 0.0),
        )
    ]
    runs += [Run(trace="t3", policy="fgd", seed=1, at_100=1.0, seconds=1.0)]  # one seed: left out
    rows = compare(runs, "fgd", "frag")
    assert [r.trace for r in rows] == ["t1", "t2"]
    assert rows[1].test.n == 2 and rows[1].other == pytest.approx(3.175)  # seed 9 has no fgd pair
    text = render(rows, "fgd", "frag")
    assert "worst case t2: +0.075" in text and "Holm-adjusted over the 2 traces" in text
    assert "2 traces, 2/3 seeds each" in text
    assert render([], "fgd", "frag").startswith("no trace")


@pytest.fixture
def openb(tmp_path: Path) -> Path:
    folder = tmp_path / "openb"
    folder.mkdir()
    (folder / "openb_node_list_gpu_node.csv").write_text(NODE_LIST)
    (folder / "openb_pod_list_alpha.csv").write_text(VARIANT_A)
    (folder / "openb_pod_list_beta.csv").write_text(VARIANT_B)
    return folder


def test_generate_writes_traces_that_simulate_reads(
    openb: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "gen"
    argv = ["heldout", "generate", "--openb", str(openb), "--family", "fam", "--traces", "2", "--size", "5"]
    assert cli.main([*argv, "--out", str(out)]) == 0
    assert sorted(p.name for p in out.iterdir()) == ["fam-000", "fam-001"]
    assert len(read_nodes(out / "fam-001" / "nodes.csv")) == 5 and read_pods(out / "fam-001" / "pods.csv")
    capsys.readouterr()
    code = cli.main(
        [
            "simulate",
            "--nodes",
            str(out / "fam-000" / "nodes.csv"),
            "--pods",
            str(out / "fam-000" / "pods.csv"),
            "--policy",
            "fgd",
            "--seeds",
            "1",
            "--json",
        ]
    )
    assert code == 0 and json.loads(capsys.readouterr().out)["policy"] == "fgd"


def test_run_appends_each_run_once_and_table_compares(
    openb: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    results = tmp_path / "r.jsonl"
    argv = ["heldout", "run", "--openb", str(openb), "--family", "fam", "--traces", "2", "--size", "4"]
    argv += ["--seeds", "1..2", "--results", str(results)]
    assert cli.main(argv) == 0
    rows = [json.loads(line) for line in results.read_text().splitlines()]
    assert sorted((r["trace"], r["policy"], r["seed"]) for r in rows) == sorted(
        (t, p, s) for t in ("fam-000", "fam-001") for p in ("fgd", "fragmentation") for s in (1, 2)
    )
    assert all(0.0 <= r["at_100"] <= 100.0 for r in rows)
    assert cli.main(argv) == 0  # resumed: nothing left to run
    assert cli.main([*argv[:-4], "--seeds", "1..3", "--results", str(results)]) == 0
    assert len(results.read_text().splitlines()) == 12  # only seed 3 was added
    capsys.readouterr()
    assert cli.main(["heldout", "table", "--results", str(results)]) == 0
    table = capsys.readouterr().out
    assert "| fam-000 (" in table and "2 traces, 3 seeds each" in table  # each trace with its recipe


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["generate", "--out", "{tmp}"], "--openb DIR is required"),
        (["run", "--openb", "{openb}"], "--results FILE.jsonl is required"),
        (["generate", "--openb", "{tmp}", "--out", "{tmp}"], "no openb_pod_list_"),
        (["table", "--results", "{bad}"], "bad.jsonl:2: not a result line"),
        (["table", "--results", "{bad}", "--policy", "fgd"], "exactly two policies"),
    ],
)
def test_bad_input_exits_2_naming_it(
    extra: list[str], message: str, openb: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text(
        '{"trace": "t", "policy": "fgd", "seed": 1, "at_100": 1.0, "seconds": 1}\n{"trace": "t"}\n'
    )
    args = [a.format(openb=openb, tmp=tmp_path, bad=bad) for a in extra]
    assert cli.main(["heldout", *args]) == 2
    assert message in capsys.readouterr().err
