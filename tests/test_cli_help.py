"""Every command line answers ``--help``, and a missing optional extra is one line naming it.

In-process: ``--help`` of ``hami`` and of every subcommand in :data:`hami.cli.SUBCOMMANDS` through
``hami.cli.main``, and of each console script's ``main`` (``hami-webhook``, ``hami-node-agent``, ``python -m
webhook.certs`` and its subcommands) exits 0 with a usage text. As processes, with an extra's modules
blocked (``sys.modules[name] = None``, which makes ``import name`` raise ModuleNotFoundError as a missing
package does): help still works, and the commands that need the extra print one line naming it and exit
2. ``tests/packaging`` proves the same on a real install of the wheel without extras.
"""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest

from hami import cli
from nodeagent.__main__ import main as agent_main
from webhook.__main__ import main as webhook_main
from webhook.certgen import main as certs_main

REPO = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.timeout(60)


def _help_of(main: Callable[[list[str]], object], argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit) as exited:
        main(argv)
    out, err = capsys.readouterr()
    assert exited.value.code == 0, err
    assert out.startswith("usage: ") and err == ""
    return out


@pytest.mark.parametrize("command", [None, *cli.SUBCOMMANDS])
def test_hami_help(command: str | None, capsys: pytest.CaptureFixture[str]) -> None:
    out = _help_of(cli.main, [command, "--help"] if command else ["--help"], capsys)
    if command is None:
        assert all(name in out for name in cli.SUBCOMMANDS)
    else:
        assert out.startswith(f"usage: hami {command} ")


@pytest.mark.parametrize(
    ("main", "argv", "program"),
    [
        (webhook_main, ["--help"], "hami-webhook"),
        (agent_main, ["--help"], "hami-node-agent"),
        (certs_main, ["--help"], "python -m webhook.certs"),
        (certs_main, ["secret", "--help"], "python -m webhook.certs secret"),
        (certs_main, ["inject", "--help"], "python -m webhook.certs inject"),
        (certs_main, ["rotate", "--help"], "python -m webhook.certs rotate"),
    ],
    ids=["hami-webhook", "hami-node-agent", "certs", "certs-secret", "certs-inject", "certs-rotate"],
)
def test_console_script_help(
    main: Callable[[list[str]], object], argv: list[str], program: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert _help_of(main, argv, capsys).startswith(f"usage: {program} ")


def test_the_extras_table_names_what_pyproject_declares() -> None:
    """Each blocked-import name maps to the extra whose requirements install it (the demo's through the
    test kit, testkit/pyproject.toml, which the extra names)."""
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    kit = tomllib.loads((REPO / "testkit" / "pyproject.toml").read_text())["project"]
    distribution = {
        "numpy": "numpy",
        "matplotlib": "matplotlib",
        "hami_testkit": "hami-testkit",
        "kmock": "kmock",
        "cel": "common-expression-language",
        "kubernetes_validate": "kubernetes-validate",
    }
    assert set(cli.EXTRAS) == set(distribution)

    def names(requirements: Sequence[str]) -> list[str]:
        return [re.split(r"[<>=!~;\[ ]", requirement, maxsplit=1)[0] for requirement in requirements]

    for module, extra in cli.EXTRAS.items():
        installed = names(extras[extra])
        if kit["name"] in installed:
            installed += names(kit["dependencies"])
        assert distribution[module] in installed, (module, extra)


def _hami(blocked: Sequence[str], *argv: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """``hami ARGV`` in a fresh interpreter where importing any of ``blocked`` fails as if not installed."""
    code = (
        "import sys\n"
        f"for name in {list(blocked)!r}:\n"
        "    sys.modules[name] = None\n"
        "from hami.cli import main\n"
        "sys.exit(main(sys.argv[1:]))\n"
    )
    return subprocess.run(
        [sys.executable, "-c", code, *argv], capture_output=True, text=True, timeout=60, cwd=cwd, check=False
    )


WITHOUT_SIM = ("numpy", "matplotlib")
WITHOUT_DEMO = ("kmock", "cel", "kubernetes_validate")


@pytest.mark.parametrize("argv", [["--help"], ["simulate", "--help"], ["scheduler", "--help"]])
def test_help_needs_no_extra(argv: list[str], tmp_path: Path) -> None:
    done = _hami((*WITHOUT_SIM, *WITHOUT_DEMO), *argv, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("usage: hami") and done.stderr == ""


def test_simulate_without_numpy_names_the_sim_extra(tmp_path: Path) -> None:
    nodes, pods = tmp_path / "nodes.csv", tmp_path / "pods.csv"
    nodes.write_text("sn,cpu_milli,memory_mib,gpu,model\nn1,8000,32768,2,A100\n")
    pods.write_text("name,cpu_milli,memory_mib,num_gpu,gpu_milli\np1,1000,1024,1,500\n")
    for argv in (
        ["simulate", "--nodes", str(nodes), "--pods", str(pods), "--seeds", "1"],
        ["simulate", "--nodes", str(nodes), "--pods", str(pods), "--policy", "fgd"],
    ):
        done = _hami(WITHOUT_SIM, *argv, cwd=tmp_path)
        assert done.returncode == 2 and done.stdout == ""
        assert done.stderr == "hami simulate: needs the 'sim' extra: pip install 'hami-py[sim]'\n"


@pytest.mark.parametrize("argv", [["demo"], ["demo", "--bare"]])
def test_demo_without_its_extra_names_it(argv: list[str], tmp_path: Path) -> None:
    """The demo is the embedded cluster itself: running it needs the extra, and says so."""
    nowhere = ["--nodes", str(tmp_path / "none.yaml"), "--workdir", str(tmp_path / "work")]
    done = _hami(WITHOUT_DEMO, *argv, *nowhere, cwd=tmp_path)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr == "hami demo: needs the 'demo' extra: pip install 'hami-py[demo]'\n"
    assert not (tmp_path / "work").exists()


def test_demo_help_needs_no_extra(tmp_path: Path) -> None:
    """The product image answers ``hami demo --help`` like every other command's."""
    done = _hami(WITHOUT_DEMO, "demo", "--help", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("usage: hami demo ") and "--bare" in done.stdout


def test_simulate_defaults_to_the_replays_split_count() -> None:
    from hami.commands.simulate import DEFAULT_SPLIT_COUNT
    from hami.simulate.cluster import DEFAULT_SPLIT_COUNT as REPLAY_DEFAULT

    assert DEFAULT_SPLIT_COUNT == REPLAY_DEFAULT


def test_a_missing_module_of_no_extra_is_not_disguised(tmp_path: Path) -> None:
    """Only an extra's modules get the one-line hint: a missing base dependency stays a real error."""
    done = _hami(("aiohttp",), "scheduler", "--help", cwd=tmp_path)
    assert done.returncode == 1 and "ModuleNotFoundError" in done.stderr and "extra" not in done.stderr
