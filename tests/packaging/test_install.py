"""The wheel, installed as a user installs it: without extras every entry point answers, with one each
command that needs it works, and the product pulls in neither the demo nor the simulator.

This checkout is built as a wheel (from a copy of what the image's build context holds, so the checkout
gets no build/ directory) and installed into fresh virtual environments, outside the repository: the
product alone, ``[sim]`` and ``[demo]``. Their dependencies come from one wheelhouse that ``pip download``
fills once per run, pinned to the versions of the environment running the tests (a pip cache or a local
index makes it quick; on a fresh CI machine it is one download from PyPI); each install then reads only
that wheelhouse (``--no-index``). The Dockerfile does the same install in its product and demo targets.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

REPO = Path(__file__).resolve().parents[2]

#: distributions only an extra brings (pyproject.toml's ``demo`` and ``sim``; the demo's jsonpatch is
#: also Kopf's, so the product has it)
EXTRA_ONLY = {
    "demo": {"hami-testkit", "kmock", "common-expression-language", "kubernetes-validate"},
    "sim": {"numpy", "matplotlib"},
}

#: every entry point a user or the chart runs, with --help
HELP = [
    ["hami"],
    *(["hami", command] for command in ("scheduler", "explain", "cordon", "uncordon", "doctor", "simulate")),
    ["hami-webhook"],
    ["hami-node-agent"],
    ["python", "-m", "webhook.certs"],
    ["python", "-m", "webhook.certs", "secret"],
    ["python", "-m", "hami.cli"],
]

NODES = "sn,cpu_milli,memory_mib,gpu,model\nn1,32000,131072,4,A100\nn2,32000,131072,2,V100\n"
PODS = "name,cpu_milli,memory_mib,num_gpu,gpu_milli\n" + "".join(
    f"p{i},1000,2048,1,{250 * (1 + i % 4)}\n" for i in range(12)
)


def _name(distribution: str) -> str:
    return re.sub(r"[-_.]+", "-", distribution).lower()


@dataclass(frozen=True)
class Install:
    """A fresh virtual environment with the wheel installed (and the extra, if any)."""

    root: Path
    work: Path

    def run(self, *argv: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        """``argv`` with this environment's bin/ first on PATH, from a directory outside the checkout."""
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
        env["PATH"] = f"{self.root / 'bin'}{os.pathsep}{env.get('PATH', '')}"
        program = str(self.root / "bin" / argv[0])
        return subprocess.run(
            [program, *argv[1:]],
            capture_output=True,
            text=True,
            cwd=self.work,
            env=env,
            timeout=timeout,
            check=False,
        )

    def packages(self) -> set[str]:
        listed = _pip("--python", str(self.root / "bin" / "python"), "list", "--format", "json")
        return {_name(p["name"]) for p in json.loads(listed.stdout)}


def _pip(*argv: str) -> subprocess.CompletedProcess[str]:
    """This environment's pip (fresh environments are made without one: ``pip --python`` drives them)."""
    done = subprocess.run(
        [sys.executable, "-m", "pip", "--disable-pip-version-check", *argv],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, f"pip {' '.join(argv)}:\n{done.stdout}\n{done.stderr}"
    return done


@dataclass(frozen=True)
class Wheelhouse:
    wheel: Path
    links: Path


@pytest.fixture(scope="module")
def wheelhouse(tmp_path_factory: pytest.TempPathFactory) -> Wheelhouse:
    out = tmp_path_factory.mktemp("wheelhouse")
    context = out / "context"
    context.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(REPO / name, context / name)
    skip = shutil.ignore_patterns("__pycache__", "*.pyc")
    for package in ("hami", "webhook", "nodeagent", "testkit"):
        shutil.copytree(REPO / package, context / package, symlinks=True, ignore=skip)
    policy = Path("charts") / "hami" / "files" / "annotation-policy.yaml"
    (context / policy).parent.mkdir(parents=True)
    shutil.copy2(REPO / policy, context / policy)
    links = out / "links"
    for project in (context, context / "testkit"):
        _pip("wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(links), str(project))
    (wheel,) = links.glob("hami_py-*.whl")
    assert len(list(links.glob("hami_testkit-*.whl"))) == 1  # the test kit: what the demo extra installs
    # the versions this environment runs (it has every extra), so the download is what was tested;
    # our two distributions come from the wheels above only, never from an index
    ours = {"hami-py", "hami-testkit"}
    pins = sorted(
        f"{d.metadata['Name']}=={d.version}"
        for d in importlib.metadata.distributions()
        if _name(d.metadata["Name"]) not in ours
    )
    constraints = out / "constraints.txt"
    constraints.write_text("\n".join(pins) + "\n")
    with (REPO / "testkit" / "pyproject.toml").open("rb") as file:
        needs = tomllib.load(file)["project"]["dependencies"]
    kit_needs = [r for r in needs if _name(re.split(r"[<>=!~;\[ ]", r)[0]) not in ours]
    _pip("download", "-q", "-d", str(links), "-c", str(constraints), f"{wheel}[sim]", *kit_needs)
    return Wheelhouse(wheel=wheel, links=links)


@pytest.fixture(scope="module")
def install(
    wheelhouse: Wheelhouse, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Callable[[str], Install]]:
    made: dict[str, Install] = {}

    def make(extra: str) -> Install:
        if extra not in made:
            root = tmp_path_factory.mktemp(f"venv-{extra or 'product'}")
            subprocess.run(
                [sys._base_executable, "-m", "venv", "--without-pip", str(root)],  # type: ignore[attr-defined]
                check=True,
                timeout=120,
            )
            python = str(root / "bin" / "python")
            target = f"{wheelhouse.wheel}[{extra}]" if extra else str(wheelhouse.wheel)
            _pip("--python", python, "install", "-q", "--no-compile", "--no-index", "--find-links",
                 str(wheelhouse.links), target)  # fmt: skip
            work = root / "work"
            work.mkdir()
            made[extra] = Install(root=root, work=work)
        return made[extra]

    yield make


def _one_line(done: subprocess.CompletedProcess[str], command: str, extra: str) -> None:
    assert done.returncode == 2 and done.stdout == "", done.stderr
    assert done.stderr == f"hami {command}: needs the '{extra}' extra: pip install 'hami-py[{extra}]'\n"


# ------------------------------------------------------------------------------------- the product
def test_the_product_pulls_in_no_extra(install: Callable[[str], Install]) -> None:
    product = install("")
    packages = product.packages()
    assert "hami-py" in packages and {"kopf", "aiohttp", "kubernetes"} <= packages
    assert packages & (EXTRA_ONLY["demo"] | EXTRA_ONLY["sim"]) == set()
    found = product.run("python", "-c", "import importlib.util as u; print(u.find_spec('hami_testkit'))")
    assert found.returncode == 0 and found.stdout.strip() == "None", found  # no emulator in the product
    _pip("--python", str(product.root / "bin" / "python"), "check")


@pytest.mark.parametrize("argv", HELP, ids=" ".join)
def test_every_entry_point_answers_help_without_extras(
    install: Callable[[str], Install], argv: list[str]
) -> None:
    done = install("").run(*argv, "--help")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("usage: ") and done.stderr == ""


def test_commands_needing_an_extra_name_it(install: Callable[[str], Install]) -> None:
    product = install("")
    (product.work / "nodes.csv").write_text(NODES)
    (product.work / "pods.csv").write_text(PODS)
    _one_line(
        product.run("hami", "simulate", "--nodes", "nodes.csv", "--pods", "pods.csv"), "simulate", "sim"
    )
    _one_line(product.run("hami", "demo"), "demo", "demo")
    helped = product.run("hami", "demo", "--help")  # the flags need no extra
    assert helped.returncode == 0 and helped.stdout.startswith("usage: hami demo "), helped.stderr


def test_every_product_module_imports_without_extras(install: Callable[[str], Install]) -> None:
    """What the chart's pods run never reaches for an extra, whichever code path imports it."""
    probe = (
        "import importlib, pkgutil, hami, nodeagent, webhook\n"
        "demo_or_sim = ('hami_testkit', 'hami.simulate', 'hami_testkit.demo_session',\n"
        "               'hami.commands.simulate')\n"
        "names = [m.name for p in (hami, nodeagent, webhook)\n"
        "         for m in pkgutil.walk_packages(p.__path__, p.__name__ + '.')]\n"
        "product = [n for n in names if not n.startswith(demo_or_sim)]\n"
        "for name in product:\n"
        "    importlib.import_module(name)\n"
        "print(len(product))\n"
    )  # fmt: skip
    done = install("").run("python", "-c", probe)
    assert done.returncode == 0, done.stderr
    assert int(done.stdout) > 50


# ------------------------------------------------------------------------------------- the extras
def test_the_sim_extra_runs_the_simulator(install: Callable[[str], Install]) -> None:
    sim = install("sim")
    assert EXTRA_ONLY["sim"] <= sim.packages() and not EXTRA_ONLY["demo"] & sim.packages()
    (sim.work / "nodes.csv").write_text(NODES)
    (sim.work / "pods.csv").write_text(PODS)
    done = sim.run("hami", "simulate", "--nodes", "nodes.csv", "--pods", "pods.csv", "--seeds", "1..2")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("trace pods (12 pods") and "\nfgd " in done.stdout
    assert "fragmentation" in sim.run("hami", "simulate", "--help").stdout  # the policies, listed
    _one_line(sim.run("hami", "demo"), "demo", "demo")


def test_the_demo_extra_runs_the_demo(install: Callable[[str], Install]) -> None:
    demo = install("demo")
    assert EXTRA_ONLY["demo"] <= demo.packages() and not EXTRA_ONLY["sim"] & demo.packages()
    helped = demo.run("hami", "demo", "--help")
    assert helped.returncode == 0 and helped.stdout.startswith("usage: hami demo "), helped.stderr
    # the whole system from the installed package: its data files, its components as processes
    done = demo.run("hami", "demo", "--workdir", str(demo.work / "demo"), timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    became = re.search(r"(\d+) of (\d+) pods became what their example expects\.", done.stdout)
    assert became and became[1] == became[2] and int(became[1]) > 0, done.stdout[-3000:]
    _one_line(demo.run("hami", "simulate", "--nodes", "x.csv", "--pods", "y.csv"), "simulate", "sim")
