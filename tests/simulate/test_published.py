"""The measured table of docs/policies.md ("Measured") is ``hami published``'s output: its layout, the
paper's figures, superscripts and bold are what :mod:`hami.simulate.published` writes; every cell of the
recorded runs (docs/policies-runs.jsonl, ``hami published run``'s output) reads as the page says; and
cells replayed again on the shipped trace (tests/data/openb) read so too (slow: a few cells, each over
all of its planned seeds)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from hami import cli
from hami.commands.heldout import read_results
from hami.simulate import published
from tests.simulate import shipped

POLICIES_MD = Path(__file__).resolve().parents[2] / "docs" / "policies.md"
RECORD = POLICIES_MD.with_name("policies-runs.jsonl")  # hami published run's runs behind the page
_NUMBER = re.compile(r"\d+\.\d+")


def documented() -> dict[tuple[str, str], str]:
    return published.parse(POLICIES_MD.read_text())


def run_lines(runs: list[tuple[str, str, int, float]]) -> str:
    rows = ({"trace": t, "policy": p, "seed": s, "at_100": v, "seconds": 1.0} for t, p, s, v in runs)
    return "".join(json.dumps(row) + "\n" for row in rows)


def test_the_page_has_every_cell_of_the_plan() -> None:
    cells = documented()
    assert sorted(cells) == sorted((t, p) for t in published.TRACES for p in published.COLUMNS)


def test_the_page_shows_the_command_s_table_of_the_recorded_runs(
    capsys: pytest.CaptureFixture[str],
) -> None:
    runs = [(r.trace, r.policy, r.seed) for r in read_results(RECORD)]
    assert sorted(runs) == sorted(published.plan())  # every run the table needs, each once, no other
    assert cli.main(["published", "table", "--results", str(RECORD)]) == 0
    table = capsys.readouterr().out.strip()
    assert table.count("\n") == len(published.TRACES) + 1
    assert table in POLICIES_MD.read_text()


def test_each_cell_says_the_papers_figure_its_seeds_and_its_bold_as_the_command_writes() -> None:
    for (trace, policy), text in documented().items():
        numbers = [float(n) for n in _NUMBER.findall(text)]
        paper = published.PAPER[trace].get(policy)
        ours = numbers[-1]
        assert len(numbers) == (2 if paper is not None else 1), (trace, policy, text)
        if paper is not None:
            assert numbers[0] == round(paper, 2), (trace, policy, text)
        seeds = len(published.plan_seeds(trace, policy))
        assert text.endswith(f"<sup>{seeds}</sup>") == (seeds != len(published.SEEDS)), (trace, policy, text)
        if policy == "fragmentation":
            assert text.startswith("**") == (ours <= published.PAPER[trace]["fgd"]), (trace, text)


def test_render_writes_paper_ours_superscripts_and_bold() -> None:
    runs = [(t, p, s, 5.0) for t, p, s in published.plan()]
    runs = [(t, p, s, 4.79 if (t, p) == ("cpu100", "fragmentation") else v) for t, p, s, v in runs]
    runs = [(t, p, s, 5.0 + (s - 42) / 10 if (t, p) == ("default", "fgd") else v) for t, p, s, v in runs]
    cells = published.parse(published.render(runs))
    assert cells[("default", "fgd")] == "4.77 · 5.45"  # the mean over 42..51
    assert cells[("default", "random")] == "13.70 · 5.00<sup>3</sup>"
    assert cells[("default", "hami-spread")] == "5.00<sup>3</sup>"
    assert cells[("default", "fragmentation")] == "5.00"  # above the paper's FGD: not bold
    assert cells[("gpuspec20", "fragmentation")] == "**5.00**<sup>3</sup>"  # at or below 5.34
    assert cells[("cpu100", "fragmentation")] == "**4.790**"  # a tie with 4.792 at two places: three


def test_render_names_a_missing_run() -> None:
    runs = [(t, p, s, 5.0) for t, p, s in published.plan() if (t, p, s) != ("gpushare60", "bestfit", 47)]
    with pytest.raises(ValueError, match="gpushare60 bestfit seed 47"):
        published.render(runs)
    assert ("gpushare60", "bestfit") not in published.cells(runs)
    assert ("gpushare60", "fgd") in published.cells(runs)


def test_parse_refuses_a_table_of_another_shape() -> None:
    with pytest.raises(ValueError, match="no table"):
        published.parse("| trace | fgd |\n|---|---|\n| default | 1 |\n")


def test_table_action_prints_the_render(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    runs = [(t, p, s, 3.0 + s / 100) for t, p, s in published.plan()]
    results = tmp_path / "runs.jsonl"
    results.write_text(run_lines(runs))
    assert cli.main(["published", "table", "--results", str(results)]) == 0
    assert capsys.readouterr().out == published.render(runs) + "\n"


def test_table_action_names_what_is_missing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    results = tmp_path / "runs.jsonl"
    results.write_text(run_lines([("default", "fgd", 42, 4.7)]))
    assert cli.main(["published", "table", "--results", str(results)]) == 2
    assert "runs missing from the results: default random seed 42" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("extra", "says"),
    [
        (["run"], "--openb DIR is required"),
        (["run", "--openb", "{tmp}"], "no openb_pod_list_"),
        (["table"], "no runs"),
    ],
)
def test_bad_input_exits_2_naming_it(
    extra: list[str], says: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = [a.format(tmp=tmp_path) for a in extra]
    code = cli.main(["published", *args, "--results", str(tmp_path / "none.jsonl")])
    assert code == 2
    assert says in capsys.readouterr().err


def test_a_trace_outside_the_table_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["published", "run", "--openb", str(tmp_path), "--results", "r.jsonl", "--traces", "cpu300"]
    with pytest.raises(SystemExit) as caught:
        cli.main(argv)
    assert caught.value.code == 2
    assert "unknown trace 'cpu300'" in capsys.readouterr().err


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize(
    ("trace", "policy"),
    [("default", "hami-binpack"), ("multigpu30", "hami-spread"), ("cpu100", "random")],
)
def test_cells_replayed_again_read_as_the_page_says(
    trace: str, policy: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    results = tmp_path / "runs.jsonl"
    argv = ["published", "run", "--openb", str(shipped.OPENB), "--results", str(results)]
    assert cli.main([*argv, "--traces", trace, "--policy", policy]) == 0
    runs = [(json.loads(line)) for line in results.read_text().splitlines()]
    assert [(r["trace"], r["policy"], r["seed"]) for r in runs] == [
        (trace, policy, s) for s in published.plan_seeds(trace, policy)
    ]
    replayed = published.cells((r["trace"], r["policy"], r["seed"], r["at_100"]) for r in runs)
    assert replayed == {(trace, policy): documented()[(trace, policy)]}
    assert "seed 42" in capsys.readouterr().out  # one progress line per run
