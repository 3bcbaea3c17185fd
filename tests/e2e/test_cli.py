"""End to end through the command line: ``hami demo --keep`` prints the table, serves kubectl-style
clients, and Ctrl-C stops every process it started."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from hami_testkit.demo_session import default_examples_dir, load_examples

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
    _the_printed_hints_work(output, workdir)
    kubeconfig = yaml.safe_load((workdir / "kubeconfig").read_text())
    assert kubeconfig["clusters"][0]["cluster"]["server"].startswith(
        "https://127.0.0.1:"
    )  # kubectl sends the token
    assert len(_processes_mentioning(str(workdir))) >= 4  # kubelet stand-in, agents, scheduler, webhook
    for pod in load_examples(default_examples_dir()):
        if pod["kind"] == "Pod":
            assert f"default/{pod['metadata']['name']}" in output

    demo.send_signal(signal.SIGINT)
    rest, _ = demo.communicate(timeout=60)
    assert demo.returncode == 0, output + rest
    assert "stopping" in rest
    assert _processes_mentioning(str(workdir)) == []


def _the_printed_hints_work(output: str, workdir: Path) -> None:
    """What ``--keep`` prints: the kubeconfig, every component's metrics URL, and commands that run as
    printed (the ``hami`` of this installation, a kubeconfig that exists while the demo runs)."""
    assert "19 of 19 pods became what their example expects." in output, output
    assert re.search(r"^Legend:\n  \(success\) = HAMi's hami.io/bind-phase", output, re.MULTILINE), output
    assert all(len(line) <= 100 for line in _legend(output)), _legend(output)
    (kubeconfig,) = re.findall(r"^  kubeconfig  (\S+)$", output, re.MULTILINE)
    assert Path(kubeconfig) == workdir / "kubeconfig" and Path(kubeconfig).is_file()
    urls = re.findall(r"(http://127\.0\.0\.1:\d+/metrics)  \((\S+)\)", output)
    assert {who for _, who in urls} >= {"scheduler", "webhook", "agent-gpu-a100", "agent-gpu-mig"}, urls
    for url, who in urls:
        with urllib.request.urlopen(url, timeout=30) as response:
            assert response.status == 200 and b"# TYPE" in response.read(), who
    _the_printed_kubectl_commands_work(output)
    commands = re.findall(r"^  (\S+ (?:explain|doctor) .*--kubeconfig \S+)$", output, re.MULTILINE)
    assert len(commands) == 2, output
    for command in commands:
        argv = shlex.split(command)
        assert argv[0] == "hami" or Path(argv[0]).is_file(), argv[0]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)
        assert "Traceback" not in done.stderr and done.returncode in (0, 1), (command, done.stderr)
        assert done.stdout.strip(), command


def _legend(output: str) -> list[str]:
    """The legend's lines: from ``Legend:`` to the summary line after it."""
    lines = output.splitlines()
    start = lines.index("Legend:")
    end = next(i for i in range(start + 1, len(lines)) if not lines[i].startswith("  "))
    return lines[start:end]


def _the_printed_kubectl_commands_work(output: str) -> None:
    """Every ``kubectl`` hint runs as printed and finds what it names (before: ``get pod batch-1``, a pod
    the demo's preemption had deleted: NotFound)."""
    kubectl = shutil.which("kubectl") or str(Path(sys.executable).parent / "kubectl")
    assert Path(kubectl).is_file(), "no kubectl to run the hints with"
    hints = re.findall(r"^  (kubectl --kubeconfig .*?)(?:   # .*)?$", output, re.MULTILINE)
    assert any(" get pod " in hint for hint in hints), output
    for hint in hints:
        argv = [kubectl, *shlex.split(hint)[1:]]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)
        assert done.returncode == 0 and done.stdout.strip(), (hint, done.stderr)
        if " get pod " in hint:
            assert "hami.io/vgpu-devices-allocated" in done.stdout, (hint, done.stdout)
