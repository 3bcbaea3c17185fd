"""End to end through the command line: ``hami demo --keep`` prints the table, serves kubectl-style
clients, and Ctrl-C stops every process it started."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from hami.sim.demo import default_examples_dir, load_examples

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]


def _processes_mentioning(text: str) -> list[int]:
    """Pids of live processes whose command line contains ``text`` (our unique work directory)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if text in cmdline:
            found.append(int(entry.name))
    return found


@pytest.fixture
def demo(workdir: Path) -> Iterator[subprocess.Popen[str]]:
    process = subprocess.Popen(
        [sys.executable, "-m", "hami.cli", "demo", "--keep", "--workdir", str(workdir), "--timeout", "120"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    yield process
    if process.poll() is None:  # the test failed early: stop it the way a user would, then for sure
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10)
    for pid in _processes_mentioning(str(workdir)):  # only what this demo started
        os.kill(pid, signal.SIGKILL)


def test_demo_keep_then_ctrl_c_stops_everything(demo: subprocess.Popen[str], workdir: Path) -> None:
    assert demo.stdout is not None
    lines: list[str] = []
    deadline = time.monotonic() + 150
    while time.monotonic() < deadline:  # readline blocks until the demo prints; the timeout bounds it
        line = demo.stdout.readline()
        if not line:
            break
        lines.append(line)
        if "running     until Ctrl-C" in line:
            break
    output = "".join(lines)
    assert "running     until Ctrl-C" in output, output
    kubeconfig = yaml.safe_load((workdir / "kubeconfig").read_text())
    assert kubeconfig["clusters"][0]["cluster"]["server"].startswith("http://127.0.0.1:")
    assert len(_processes_mentioning(str(workdir))) >= 4  # kubelet stand-in, agents, scheduler, webhook
    for pod in load_examples(default_examples_dir()):
        assert f"default/{pod['metadata']['name']}" in output

    demo.send_signal(signal.SIGINT)
    rest, _ = demo.communicate(timeout=60)
    assert demo.returncode == 0, output + rest
    assert "stopping" in rest
    assert _processes_mentioning(str(workdir)) == []
