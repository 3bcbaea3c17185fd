"""Part (b) of the GPU check: the MPS control daemon started the agent's way, and its limits held.

Owns :func:`mps_scenarios`: ``nodeagent.mps.control.MpsControl`` starts (or adopts) the daemon under a
scratch root, the way the agent does; what it found is recorded (running, protocol, namespaces: what
MPS offered on this driver). Two containers on the card get the agent's answer
(``tests.gpu.answer.mps_agent_answer``: each 3,000 MiB and 50 % of the card; a namespace each where
the daemon has them, else the limits in their environment), started with their mounts (the pipe
directory and ``/dev/shm``) by ``tests.gpu.runtime``:

* ``neighbour`` fills 2 GiB and holds it;
* ``tenant`` then allocates 2 GiB (within its grant) and is refused 4 GiB (beyond it);
* the neighbour's 2 GiB still holds its pattern afterwards.

The daemon sees the shared-memory directory as ``/dev/shm``, as it does in the agent's pod: where a
mount namespace can be had the daemon is started through a wrapper that mounts it there (a file in
the scratch directory); otherwise no container mount is applied and the result says so. The daemon
is told ``quit`` at the end whatever happened (it was started here). Bounded: every command and
process has its own timeout.
"""

from __future__ import annotations

import shlex
import shutil
from collections.abc import Mapping
from dataclasses import asdict
from pathlib import Path
from typing import Any

from nodeagent.mps.control import MpsControl
from nodeagent.mps.protocol import MpsError
from tests.gpu.answer import mps_agent_answer
from tests.gpu.runtime import Held, Outcome, launch, namespace_available, probe_argv, run_in_container

GRANT_MIB, GRANT_CORES = 3000, 50
WITHIN_MIB, BEYOND_MIB, NEIGHBOUR_MIB = 2048, 4096, 2048
PROCESS_BOUND = 90.0
MPS_BINARY = "nvidia-cuda-mps-control"
#: Where the driver's programs are when they are not on the PATH (a mounted driver, a host install).
DRIVER_BINS = (Path("/usr/local/nvidia/bin"), Path("/usr/bin"), Path("/usr/local/bin"))


def find_binary() -> str | None:
    """The driver's MPS control program: on the PATH, else in a driver folder a container is given."""
    found = shutil.which(MPS_BINARY)
    if found:
        return found
    for folder in DRIVER_BINS:
        if (folder / MPS_BINARY).is_file():
            return str(folder / MPS_BINARY)
    return None


def shm_wrapper(binary: str, shm: Path, directory: Path) -> Path:
    """An executable that runs ``binary`` with ``shm`` mounted at ``/dev/shm`` in a private mount
    namespace (the daemon, and the servers it starts, live on in it)."""
    directory.mkdir(parents=True, exist_ok=True)
    shm.mkdir(parents=True, exist_ok=True)
    path = directory / MPS_BINARY
    script = 'mount --bind "$0" /dev/shm && exec "$@"'
    path.write_text(
        "#!/bin/sh\n"
        f"exec unshare --mount --propagation private sh -c {shlex.quote(script)} "
        f'{shlex.quote(str(shm))} {shlex.quote(binary)} "$@"\n'
    )
    path.chmod(0o755)
    return path


def allocated(outcome: Outcome, mib: int) -> bool | None:
    for attempt in outcome.result.get("allocations") or ():
        if isinstance(attempt, Mapping) and attempt.get("mib") == mib:
            return bool(attempt.get("ok"))
    return None


def mps_verdicts(
    running: bool, tenant: Outcome | None, held: Mapping[str, Any], stood: Outcome | None
) -> dict[str, dict[str, Any]]:
    seen: dict[str, tuple[object, object]] = {
        "mps: the control daemon runs, started the agent's way": (True, running),
        "neighbour: holds 2 GiB within its grant": (True, held.get("held")),
        "tenant: 2 GiB within its 3000 MiB grant allocates": (
            True,
            allocated(tenant, WITHIN_MIB) if tenant else None,
        ),
        "tenant: 4 GiB beyond its grant is refused": (
            False,
            allocated(tenant, BEYOND_MIB) if tenant else None,
        ),
        "neighbour: its 2 GiB stands after the tenant's refusal": (
            True,
            stood.result.get("stands") if stood else None,
        ),
    }
    return {claim: {"expected": e, "seen": s, "agrees": e == s} for claim, (e, s) in seen.items()}


async def mps_scenarios(
    card: str, work: Path, *, repo: Path, binary: str | None = None, environ: Mapping[str, str] | None = None
) -> dict[str, Any]:
    """Part (b); ``binary`` defaults to ``nvidia-cuda-mps-control`` on the PATH or beside the driver."""
    found = binary or find_binary()
    if found is None:
        return {"offered": {"binary": None}, "cannot_run": f"no {MPS_BINARY} on the PATH or in {DRIVER_BINS}"}
    root = work / "mps"
    namespace = namespace_available()
    daemon = str(shm_wrapper(found, root / "shm", work / "bin")) if namespace else found
    control = MpsControl(
        binary=daemon,
        root=root,
        quit_on_stop=True,
        command_timeout=60.0,
        start_timeout=60.0,
        environ=environ,
    )
    report: dict[str, Any] = {"binary": found, "shm_mounted": namespace}
    try:
        state = await control.start()
        report["offered"] = asdict(state)
        if not state.running:
            report["verdicts"] = mps_verdicts(False, None, {}, None)
            return report
        neighbour = await mps_agent_answer(
            control, state, card, GRANT_MIB, GRANT_CORES, uid="gpu-check-neighbour", container="neighbour"
        )
        tenant = await mps_agent_answer(
            control, state, card, GRANT_MIB, GRANT_CORES, uid="gpu-check-tenant", container="tenant"
        )
        report["answers"] = {
            name: {"envs": dict(a.envs), "mounts": [asdict(m) for m in a.mounts]}
            for name, a in (("neighbour", neighbour), ("tenant", tenant))
        }
        held = Held.start(
            launch(
                neighbour, probe_argv(NEIGHBOUR_MIB, hold=True), stage=work / "stage-n", namespace=namespace
            ),
            cwd=repo,
        )
        tenant_outcome: Outcome | None = None
        stood: Outcome | None = None
        try:
            first = held.first(PROCESS_BOUND)
            if first.get("held"):
                tenant_outcome = run_in_container(
                    tenant,
                    probe_argv(WITHIN_MIB, BEYOND_MIB),
                    stage=work / "stage-t",
                    namespace=namespace,
                    timeout=PROCESS_BOUND,
                    cwd=repo,
                )
            stood = held.release(PROCESS_BOUND)
        finally:
            held.kill()
        report["scenarios"] = {
            "neighbour-held": first,
            "tenant": tenant_outcome.as_json() if tenant_outcome else None,
            "neighbour-after": stood.as_json() if stood else None,
        }
        report["verdicts"] = mps_verdicts(True, tenant_outcome, first, stood)
        return report
    except MpsError as exc:
        report["error"] = str(exc)
        report.setdefault("verdicts", mps_verdicts(control.state.running, None, {}, None))
        return report
    finally:
        await control.stop()
        report["stopped"] = not control.state.running
