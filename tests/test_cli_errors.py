"""Every command line that talks to a cluster fails in one clear line (exit 2) when it cannot.

A missing, malformed or absent kubeconfig, and an API server that refuses the connection, give one line
on stderr that says what is wrong and what to do -- never a traceback, never ``Timeout:`` for a refused
connection -- for each ``hami`` subcommand that reads a kubeconfig, ``hami-webhook`` and ``hami-node-agent``
(their start-up). Driven through each program's ``main(argv)``; the no-kubeconfig-at-all case runs the
real console entry points as processes (the client reads ``KUBECONFIG`` and ``HOME`` when imported).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from hami.cli import main as hami_main
from nodeagent.__main__ import main as agent_main
from webhook.__main__ import main as webhook_main

pytestmark = pytest.mark.timeout(60)

Program = Callable[[list[str]], int]

KUBECONFIG_OK = """\
apiVersion: v1
kind: Config
clusters:
- name: c
  cluster: {{server: "{server}"}}
contexts:
- name: c
  context: {{cluster: c, user: u}}
current-context: c
users:
- name: u
  user: {{token: t}}
"""

#: name -> file content (None: the file does not exist)
BROKEN: dict[str, str | bytes | None] = {
    "missing": None,
    "not YAML": "clusters: [\n",
    "empty": "",
    "a list": "- a\n- b\n",
    "a scalar": "just words\n",
    "no current context": "apiVersion: v1\nkind: Config\n",
    "context names no cluster": (
        "apiVersion: v1\nkind: Config\ncurrent-context: c\ncontexts:\n- name: c\n"
        "  context: {cluster: nowhere, user: u}\nusers:\n- name: u\n  user: {token: t}\nclusters: []\n"
    ),
    "binary": b"\x00\xff\xfe\x89PNG\r\n",
}


LOCAL = "127.0.0.1:0"
SCHEDULER = ["scheduler", "--listen", LOCAL, "--metrics-listen", LOCAL]
WEBHOOK = ["--metrics-listen", LOCAL, "--health-listen", LOCAL]
MONITOR = ["--node-name", "n1", "--backend", "sim", "--metrics-listen", LOCAL]


def commands(tmp: Path) -> dict[str, tuple[Program, list[str], str]]:
    """command -> (main, argv without --kubeconfig, the prefix of its error line)."""
    pods = tmp / "pods.csv"
    pods.write_text("name,cpu_milli,memory_mib,num_gpu,gpu_milli\np1,1000,100,1,500\n", encoding="utf-8")
    return {
        "scheduler": (
            hami_main,
            ["scheduler", "--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0"],
            "hami scheduler: ",
        ),
        "explain": (hami_main, ["explain", "default/p"], "hami explain: "),
        "doctor": (hami_main, ["doctor"], "hami doctor: "),
        "cordon": (hami_main, ["cordon", "n1", "#0"], "hami cordon: "),
        "uncordon": (hami_main, ["uncordon", "n1", "#0"], "hami uncordon: "),
        "simulate": (hami_main, ["simulate", "--pods", str(pods)], "hami simulate: "),
        "hami-webhook": (
            webhook_main,
            [
                "--tls-dir",
                str(tmp / "tls"),
                "--metrics-listen",
                "127.0.0.1:0",
                "--health-listen",
                "127.0.0.1:0",
            ],
            "hami-webhook: ",
        ),
        "hami-node-agent": (
            agent_main,
            MONITOR,
            "hami-node-agent: ",
        ),
    }


COMMANDS = [
    "scheduler",
    "explain",
    "doctor",
    "cordon",
    "uncordon",
    "simulate",
    "hami-webhook",
    "hami-node-agent",
]


def one_line(err: str) -> str:
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    assert "Traceback" not in err
    return lines[0]


@pytest.fixture
def refusing_port() -> Iterator[int]:
    """A TCP port that is bound but not listening: connecting to it is refused (and nobody else gets it)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    try:
        yield int(sock.getsockname()[1])
    finally:
        sock.close()


@pytest.mark.parametrize("broken", list(BROKEN))
@pytest.mark.parametrize("command", COMMANDS)
def test_a_broken_kubeconfig_is_one_line_and_exit_2(
    command: str, broken: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    program, argv, prefix = commands(tmp_path)[command]
    path = tmp_path / "kubeconfig"
    content = BROKEN[broken]
    if isinstance(content, bytes):
        path.write_bytes(content)
    elif content is not None:
        path.write_text(content, encoding="utf-8")

    code = program([*argv, "--kubeconfig", str(path)])

    line = one_line(capsys.readouterr().err)
    assert code == 2, line
    assert line.startswith(prefix), line
    assert str(path) in line and "--kubeconfig" in line, line  # what is wrong, and what to do


@pytest.mark.parametrize("command", COMMANDS)
def test_a_refused_connection_is_reported_as_refused(
    command: str, tmp_path: Path, refusing_port: int, capsys: pytest.CaptureFixture[str]
) -> None:
    program, argv, prefix = commands(tmp_path)[command]
    server = f"http://127.0.0.1:{refusing_port}"
    path = tmp_path / "kubeconfig"
    path.write_text(KUBECONFIG_OK.format(server=server), encoding="utf-8")

    code = program([*argv, "--kubeconfig", str(path)])

    line = one_line(capsys.readouterr().err)
    assert code == 2, line
    assert line.startswith(prefix), line
    assert "connection refused" in line and server in line, line
    assert "Timeout" not in line and "HTTPConnectionPool" not in line, line
    assert "--kubeconfig" in line, line  # what to do


CONSOLE = {
    "explain": ["-m", "hami.cli", "explain", "default/p"],
    "doctor": ["-m", "hami.cli", "doctor"],
    "cordon": ["-m", "hami.cli", "cordon", "n1", "#0"],
    "scheduler": [
        "-m",
        "hami.cli",
        "scheduler",
        "--listen",
        "127.0.0.1:0",
        "--metrics-listen",
        "127.0.0.1:0",
    ],
    "hami-node-agent": [
        "-m",
        "nodeagent",
        "--node-name",
        "n1",
        "--backend",
        "sim",
        "--metrics-listen",
        "127.0.0.1:0",
    ],
    "hami-webhook": [
        "-m",
        "webhook",
        "--tls-dir",
        "TMP/tls",
        "--metrics-listen",
        "127.0.0.1:0",
        "--health-listen",
        "127.0.0.1:0",
    ],
}


@pytest.mark.parametrize("command", list(CONSOLE))
def test_no_kubeconfig_anywhere_says_how_to_give_one(command: str, tmp_path: Path) -> None:
    """Not in a cluster, no ``KUBECONFIG``, no ``~/.kube/config``: one line naming the missing file."""
    env = {k: v for k, v in os.environ.items() if k not in ("KUBECONFIG", "KUBERNETES_SERVICE_HOST")}
    env["HOME"] = str(tmp_path)
    argv = [a.replace("TMP", str(tmp_path)) for a in CONSOLE[command]]
    done = subprocess.run(
        [sys.executable, *argv], env=env, capture_output=True, text=True, timeout=120, check=False
    )
    line = one_line(done.stderr)
    assert done.returncode == 2, done.stderr
    assert "~/.kube/config" in line and "--kubeconfig" in line, line
