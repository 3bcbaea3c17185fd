"""Shared fixtures and suite-wide settings.

Fixtures: an embedded API server (kmock + reactions) per test, and a kubeconfig pointing at it.

Hypothesis runs without its per-example deadline and its too-slow health check: both are wall-clock
budgets that a loaded machine breaks (``make test`` runs the suite in parallel, maybe beside another
run; see "Running them" in docs/architecture.md). Its example database stays where Hypothesis keeps it
(``.hypothesis/``, ignored by git); each test's examples are its own, so workers never share an entry.
"""

from __future__ import annotations

from pathlib import Path

import kmock
import pytest
from hypothesis import HealthCheck, settings

from hami_testkit.apiserver import add_reactions, write_kubeconfig

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
