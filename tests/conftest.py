"""Shared fixtures and suite-wide settings.

Fixtures: an embedded API server (kmock + reactions) per test, a kubeconfig pointing at it, and ports
held for the listeners a test's children bind (``ports``).

Hypothesis runs without its per-example deadline and its too-slow health check: both are wall-clock
budgets that a loaded machine breaks (``make test`` runs the suite in parallel, maybe beside another
run; see "Running them" in docs/architecture.md). Its example database stays where Hypothesis keeps it
(``.hypothesis/``, ignored by git); each test's examples are its own, so workers never share an entry.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import kmock
import pytest
from hypothesis import HealthCheck, settings

from hami_testkit.apiserver import add_reactions, write_kubeconfig
from hami_testkit.processes import PortReservations

settings.register_profile(
    "suite", deadline=None, suppress_health_check=[HealthCheck.too_slow], print_blob=True
)
settings.load_profile("suite")


@pytest.fixture
async def apiserver(kmock: kmock.KubernetesEmulator) -> kmock.KubernetesEmulator:
    """This test's own kmock emulator with discovery data and the binding/discovery/list reactions."""
    await add_reactions(kmock)
    return kmock


@pytest.fixture
def kubeconfig(apiserver: kmock.KubernetesEmulator, tmp_path: Path) -> Path:
    """A kubeconfig file for the official client, Kopf and kubectl, pointing at this test's apiserver."""
    return write_kubeconfig(tmp_path / "kubeconfig", str(apiserver.url))


@pytest.fixture
def ports() -> Iterator[PortReservations]:
    """Ports held for this test's listeners until it ends (``ports.take()``); nobody else gets one."""
    with PortReservations() as held:
        yield held
