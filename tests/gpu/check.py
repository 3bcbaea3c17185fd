"""The enforcement check on a real GPU: ``python3 -m tests.gpu.check --library LIB --out DIR``.

Owns the scenarios and their expectations (docs/security.md, "On a real GPU"), each a separate process
started by ``tests.gpu.runtime`` and probed by ``tests.gpu.probe``:

* ``bare``: no answer, nothing preloaded: 4 GiB allocates (the card can; a refusal later is the library's);
* ``granted``: the agent's answer for a 3,000 MiB grant (``tests.gpu.answer``, on the card our NVML
  backend lists first): 2 GiB allocates, 4 GiB is refused, CUDA reports about 3,000 MiB, HAMi-core is
  mapped and ``/etc/ld.so.preload`` is not writable;
* ``env-edited``: the same answer with the tenant's own ``CUDA_DEVICE_MEMORY_LIMIT_0=8000m`` and a fresh
  cache file: 4 GiB allocates. This one documents a limit (HAMi-core reads the limit from the
  process's environment), so its expectation is what docs/security.md claims: not held.

Part (b), MPS, is :mod:`tests.gpu.mps_check` (skipped, and said so, where the driver has no
``nvidia-cuda-mps-control``). Writes ``DIR/enforcement.json`` (driver, card, answers, each scenario's
outcome and verdict, what MPS offered) and exits 0 only when every verdict matches its expectation; 2
when the check cannot run (no library, no card).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from tests.gpu.answer import agent_answer
from tests.gpu.mps_check import mps_scenarios
from tests.gpu.runtime import Outcome, namespace_available, probe_argv, run_in_container

REPO = Path(__file__).resolve().parents[2]
GRANT_MIB, GRANT_CORES = 3000, 100
WITHIN_MIB, BEYOND_MIB = 2048, 4096
EDITED_LIMIT = "8000m"
PROCESS_BOUND = 90.0


class CannotRun(Exception):
    """The check has nothing to run on (no card, no library): exit 2 with the reason."""


def driver_facts(timeout: float = 30.0) -> dict[str, str]:
    """nvidia-smi's driver version, name and memory of each card (the raw CSV line per card)."""
    query = "--query-gpu=driver_version,name,uuid,memory.total,compute_mode,mig.mode.current"
    try:
        done = subprocess.run(
            ["nvidia-smi", query, "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return {"error": f"nvidia-smi: {exc}"}
    return {"csv": done.stdout.strip(), "returncode": str(done.returncode), "stderr": done.stderr.strip()}


def first_card() -> str:
    """The UUID of the first card our agent's NVML backend lists (what it registers)."""
    from nodeagent.backends import open_backend  # pynvml: only where the check runs
    from nodeagent.backends.base import BackendError, BackendUnavailable

    try:
        backend = open_backend("auto")
    except (BackendUnavailable, BackendError) as exc:
        raise CannotRun(f"no NVML here: {exc}") from exc
    try:
        if backend.name != "nvml":
            raise CannotRun(f"the agent's backend here is {backend.name!r}, not nvml")
        cards = backend.cards()
    finally:
        backend.close()
    if not cards:
        raise CannotRun("NVML lists no card")
    return cards[0].uuid


def allocation(outcome: Outcome, mib: int) -> bool | None:
    """Whether the probe allocated ``mib`` MiB (None when it did not try or failed before)."""
    for attempt in outcome.result.get("allocations") or ():
        if isinstance(attempt, Mapping) and attempt.get("mib") == mib:
            return bool(attempt.get("ok"))
    return None


def verdicts(scenarios: Mapping[str, Outcome]) -> dict[str, dict[str, Any]]:
    """Each claim: what was expected, what was seen, and whether they agree."""
    bare, granted, edited = scenarios["bare"], scenarios["granted"], scenarios["env-edited"]
    total = granted.result.get("total_mib")
    seen = {
        "bare: the card allocates 4 GiB without HAMi-core": (True, allocation(bare, BEYOND_MIB)),
        "granted: HAMi-core is mapped into the process": (True, bool(granted.result.get("mapped"))),
        "granted: 2 GiB within the 3000 MiB grant allocates": (True, allocation(granted, WITHIN_MIB)),
        "granted: 4 GiB beyond the grant is refused": (False, allocation(granted, BEYOND_MIB)),
        "granted: CUDA reports the grant as the card's memory (±64 MiB)": (
            True,
            isinstance(total, int) and abs(total - GRANT_MIB) <= 64,
        ),
        "env-edited: a tenant's own limit env lifts the limit (not held)": (
            True,
            allocation(edited, BEYOND_MIB),
        ),
    }
    if granted.mechanism != "LD_PRELOAD":
        seen["granted: /etc/ld.so.preload is read-only in the container"] = (
            False,
            granted.result.get("preload_writable"),
        )
    return {claim: {"expected": e, "seen": s, "agrees": e == s} for claim, (e, s) in seen.items()}


def hami_core_scenarios(library: Path, work: Path, card: str) -> dict[str, Any]:
    """Part (a): HAMi-core with the agent's answer for a 3,000 MiB grant."""
    hook, lock_dir = work / "hook", work / "vgpulock"
    vgpu = hook / "vgpu"
    vgpu.mkdir(parents=True, exist_ok=True)
    installed = vgpu / "libvgpu.so"
    installed.write_bytes(library.read_bytes())
    installed.chmod(0o755)
    (vgpu / "ld.so.preload").write_text(f"{installed}\n")  # what the chart's init container writes
    answer = agent_answer(card, GRANT_MIB, GRANT_CORES, hook=hook, lock_dir=lock_dir)
    namespace = namespace_available()
    if not namespace:  # LD_PRELOAD on this host: HAMi-core's lock directory is the host's own
        Path("/tmp/vgpulock").mkdir(exist_ok=True)
    common: dict[str, Any] = {
        "timeout": PROCESS_BOUND,
        "stage": work / "stage",
        "library": installed,
        "namespace": namespace,
        "cwd": REPO,
    }
    scenarios = {
        "bare": run_in_container(None, probe_argv(BEYOND_MIB), **common),
        "granted": run_in_container(answer, probe_argv(WITHIN_MIB, BEYOND_MIB), **common),
        "env-edited": run_in_container(
            answer,
            probe_argv(BEYOND_MIB),
            env_changes={
                "CUDA_DEVICE_MEMORY_LIMIT_0": EDITED_LIMIT,
                "CUDA_DEVICE_MEMORY_SHARED_CACHE": f"{vgpu}/tenant-own.cache",
            },
            **common,
        ),
    }
    return {
        "answer": {"envs": dict(answer.envs), "mounts": [asdict(m) for m in answer.mounts]},
        "scenarios": {name: outcome.as_json() for name, outcome in scenarios.items()},
        "verdicts": verdicts(scenarios),
    }


def write(out: Path, report: Mapping[str, Any]) -> None:
    """``out/enforcement.json`` as far as the check got (written after each part: a run killed at its
    bound still leaves what it found)."""
    (out / "enforcement.json").write_text(json.dumps(report, indent=2, default=str) + "\n")


def run(library: Path, out: Path, work: Path) -> tuple[int, dict[str, Any]]:
    report: dict[str, Any] = {"driver": driver_facts()}
    try:
        if not library.is_file() or library.stat().st_size == 0:
            raise CannotRun(
                f"no HAMi-core library at {library} (build it there first: tests/gpu/device_check.sh)"
            )
        report["card"] = card = first_card()
        report["hami_core"] = hami_core_scenarios(library, work, card)
        write(out, report)
        report["mps"] = asyncio.run(mps_scenarios(card, work, repo=REPO))
    except CannotRun as exc:
        report["cannot_run"] = str(exc)
        return 2, report
    verdicts = [*report["hami_core"]["verdicts"].values(), *report["mps"].get("verdicts", {}).values()]
    return (0 if all(v["agrees"] for v in verdicts) else 1), report


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python3 -m tests.gpu.check", description=__doc__.splitlines()[0])
    parser.add_argument(
        "--library", type=Path, required=True, help="HAMi-core's libvgpu.so built on this machine"
    )
    parser.add_argument("--out", type=Path, required=True, help="directory for enforcement.json")
    parser.add_argument(
        "--work", type=Path, default=None, help="scratch directory (default: a new temporary one)"
    )
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    work = args.work or Path(tempfile.mkdtemp(prefix="hami-gpu-check-"))
    code, report = run(args.library.resolve(), args.out, work)
    report["exit"] = code
    write(args.out, report)
    print(json.dumps(report, indent=2, default=str))
    return code


if __name__ == "__main__":
    sys.exit(main())
