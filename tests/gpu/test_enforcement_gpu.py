"""The GPU check's claims as tests (docs/security.md, "On a real GPU"): HAMi-core with the agent's
answer for a 3,000 MiB grant on this host's card, and MPS with the agent's limits. Marked ``gpu``:
skipped without NVML; skipped too without a HAMi-core library (``HAMI_CORE_LIB``) or CuPy, which only
the GPU machine has. ``HAMI_GPU_REPORT`` names an ``enforcement.json`` the check already wrote on this
machine (tests/gpu/device_check.sh): the tests then judge it instead of running the check again."""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path
from typing import Any

import pytest

from tests.gpu import check

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    written = os.environ.get("HAMI_GPU_REPORT")
    if written:
        found: dict[str, Any] = json.loads(Path(written).read_text())
        if "cannot_run" in found:
            pytest.skip(f"the check could not run here: {found['cannot_run']}")
        return found
    library = Path(os.environ.get("HAMI_CORE_LIB", ".gpu-deps/libvgpu.so"))
    if not library.is_file():
        pytest.skip(f"no HAMi-core library at {library} (HAMI_CORE_LIB; tests/gpu/device_check.sh)")
    if importlib.util.find_spec("cupy") is None:
        pytest.skip("CuPy is not installed here")
    code, found = check.run(
        library.resolve(), tmp_path_factory.mktemp("out"), tmp_path_factory.mktemp("work")
    )
    if code == 2:
        pytest.skip(f"the check cannot run here: {found.get('cannot_run')}")
    return found


def verdict(report: dict[str, Any], prefix: str) -> dict[str, Any]:
    (found,) = [v for claim, v in report["hami_core"]["verdicts"].items() if claim.startswith(prefix)]
    return dict(found)


@pytest.mark.parametrize(
    "claim",
    [
        "granted: HAMi-core is mapped",
        "granted: 2 GiB within",
        "granted: 4 GiB beyond the grant is refused",
        "granted: CUDA reports the grant",
    ],
)
def test_the_agents_answer_holds_a_3000_mib_grant(report: dict[str, Any], claim: str) -> None:
    found = verdict(report, claim)
    assert found["agrees"], (found, report["hami_core"]["scenarios"]["granted"])


def test_without_the_library_the_card_allocates_4_gib(report: dict[str, Any]) -> None:
    found = verdict(report, "bare:")
    assert found["agrees"], (found, report["hami_core"]["scenarios"]["bare"])


def test_a_tenants_own_limit_env_lifts_the_limit(report: dict[str, Any]) -> None:
    """The documented limit of HAMi-core (docs/security.md): not held against environment edits."""
    found = verdict(report, "env-edited:")
    assert found["agrees"], (found, report["hami_core"]["scenarios"]["env-edited"])


def test_the_preload_is_read_only_in_the_container(report: dict[str, Any]) -> None:
    claims = [c for c in report["hami_core"]["verdicts"] if "ld.so.preload is read-only" in c]
    if not claims:
        pytest.skip("no mount namespace on this host: the library was preloaded through LD_PRELOAD")
    found = verdict(report, claims[0])
    assert found["agrees"], (found, report["hami_core"]["scenarios"]["granted"])


@pytest.fixture(scope="module")
def mps(report: dict[str, Any]) -> dict[str, Any]:
    part: dict[str, Any] = report.get("mps") or {}
    if "cannot_run" in part:
        pytest.skip(f"MPS part not run: {part['cannot_run']}")
    return part


@pytest.mark.parametrize(
    "claim",
    [
        "mps: the control daemon runs",
        "neighbour: holds 2 GiB",
        "tenant: 2 GiB within",
        "tenant: 4 GiB beyond its grant is refused",
        "neighbour: its 2 GiB stands",
    ],
)
def test_mps_holds_a_client_to_the_agents_limits_and_the_neighbour_stands(
    mps: dict[str, Any], claim: str
) -> None:
    (found,) = [v for c, v in mps["verdicts"].items() if c.startswith(claim)]
    assert found["agrees"], (found, mps.get("offered"), mps.get("scenarios"))
