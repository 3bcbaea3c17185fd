"""``hami demo --bare`` starts the embedded cluster alone, and real kubectl gets honest answers there:
``auth whoami`` names the kubeconfig's user, ``auth can-i`` says yes (SelfSubject reviews sent in
protobuf), ``logs`` and ``exec`` fail with kube-apiserver's NotFound instead of printing the pod, and
deletes with DeleteOptions work; Ctrl-C stops it with exit 0."""

from __future__ import annotations

import asyncio
import signal
import sys
from pathlib import Path

import pytest

from tests.e2e.commands import run_kubectl

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]


async def kubectl(workdir: Path, *args: str) -> tuple[int, str, str]:
    return await run_kubectl(workdir / "kubeconfig", workdir / "kube-cache", *args)


async def test_bare_demo_answers_kubectl_honestly_and_stops_on_ctrl_c(workdir: Path) -> None:
    demo = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "hami.cli",
        "demo",
        "--bare",
        "--workdir",
        str(workdir),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    assert demo.stdout is not None
    printed: list[str] = []
    try:
        while not any("running" in line and "Ctrl-C" in line for line in printed):
            line = await demo.stdout.readline()
            assert line, f"hami demo --bare ended: {printed}"
            printed.append(line.decode().rstrip())
        text = "\n".join(printed)
        assert f"kubeconfig  {workdir / 'kubeconfig'}" in text and "helm install hami charts/hami" in text

        code, out, err = await kubectl(workdir, "auth", "whoami")
        assert code == 0 and "kubernetes-admin" in out, (out, err)
        code, out, err = await kubectl(workdir, "auth", "can-i", "create", "pods", "-n", "hami-system")
        assert (code, out.strip()) == (0, "yes"), err
        code, out, err = await kubectl(workdir, "auth", "can-i", "--list")
        assert code == 0 and "*.*" in out, (out, err)
        code, out, err = await kubectl(workdir, "get", "nodes", "-o", "name")
        assert code == 0 and out.split(), err

        code, out, err = await kubectl(workdir, "run", "p", "--image=busybox", "--restart=Never")
        assert code == 0, err
        code, out, err = await kubectl(workdir, "logs", "p")
        assert code != 0 and out == "", out
        assert "NotFound" in err and "does not serve pods/log (it runs no containers)" in err, err
        code, out, err = await kubectl(workdir, "exec", "p", "--", "true")
        assert code != 0 and '"kind"' not in out, out
        code, out, err = await kubectl(workdir, "delete", "pod", "p", "--cascade=foreground", "--wait=false")
        assert code == 0 and 'pod "p" deleted' in out, err
        code, out, err = await kubectl(workdir, "get", "pod", "p")
        assert code != 0 and "NotFound" in err, (out, err)
    finally:
        if demo.returncode is None:
            demo.send_signal(signal.SIGINT)
        rest, _ = await asyncio.wait_for(demo.communicate(), 60)  # a hang guard, not a budget
    assert demo.returncode == 0, "\n".join(printed) + rest.decode()
    assert "stopping" in rest.decode()
