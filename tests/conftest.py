"""Shared fixtures: an embedded API server (kmock + reactions) per test, and a kubeconfig pointing at it."""

from __future__ import annotations

from pathlib import Path

import kmock
import pytest

from hami.sim.apiserver import add_reactions, write_kubeconfig


@pytest.fixture
async def apiserver(kmock: kmock.KubernetesEmulator) -> kmock.KubernetesEmulator:
    """This test's own kmock emulator with discovery data and the binding/discovery/list reactions."""
    await add_reactions(kmock)
    return kmock


@pytest.fixture
def kubeconfig(apiserver: kmock.KubernetesEmulator, tmp_path: Path) -> Path:
    """A kubeconfig file for the official client, Kopf and kubectl, pointing at this test's apiserver."""
    return write_kubeconfig(tmp_path / "kubeconfig", str(apiserver.url))
