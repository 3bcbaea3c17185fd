"""Shared fixtures and suite-wide settings.

Fixtures: an embedded API server (kmock + reactions) per test, and a kubeconfig pointing at it.

Settings for running on a busy machine and in parallel (``make test`` runs pytest-xdist with
``--dist loadgroup``; see "Running them" in docs/architecture.md):

- Hypothesis has no per-example deadline and no too-slow health check: both are wall-clock budgets that
  a loaded machine breaks. Its example database stays where Hypothesis keeps it (``.hypothesis/``,
  ignored by git); each test's examples are its own, so workers never share an entry.
- Tests that share a module-scoped (or wider) fixture of this suite run on one worker, in one piece
  (an ``xdist_group`` per module), so the fixture is built once; every other test is its own unit.
- On a worker, the tests that declare they are heavy (a ``timeout`` marker above the suite's default,
  or ``e2e``/``slow``) are handed out first, so none of them starts last and leaves a worker idle.
"""

from __future__ import annotations

import inspect
from pathlib import Path

import kmock
import pytest
from hypothesis import HealthCheck, settings

from hami.sim.apiserver import add_reactions, write_kubeconfig

TESTS = Path(__file__).resolve().parent

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


# ------------------------------------------------------------------------------------- parallel runs
def _shared_fixture_group(item: pytest.Item) -> str | None:
    """The group of tests that must share ``item``'s worker: one per module (or package, or session)
    whose fixture of this suite outlives a single test; None when every fixture it uses is its own."""
    info = getattr(item, "_fixtureinfo", None)
    if info is None:
        return None
    groups: list[str] = []
    for name in info.names_closure:
        for definition in info.name2fixturedefs.get(name, ()):
            if definition.scope == "function" or not _defined_in_suite(definition.func):
                continue
            if definition.scope in ("module", "class"):
                groups.append(str(item.path.relative_to(TESTS)))
            elif definition.scope == "package":
                groups.append(str(item.path.parent.relative_to(TESTS)))
            else:
                groups.append(f"session:{name}")
    return min(groups) if groups else None


def _defined_in_suite(func: object) -> bool:
    try:
        return Path(inspect.getfile(func)).resolve().is_relative_to(TESTS)  # type: ignore[arg-type]
    except TypeError:
        return False


def _heavy(item: pytest.Item, default_timeout: float) -> bool:
    marker = item.get_closest_marker("timeout")
    declared = float(marker.args[0]) if marker is not None and marker.args else 0.0
    return declared > default_timeout or any(item.iter_markers("e2e")) or any(item.iter_markers("slow"))


@pytest.hookimpl(tryfirst=True)  # before xdist reads the xdist_group marks
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        group = _shared_fixture_group(item)
        if group is not None and item.get_closest_marker("xdist_group") is None:
            item.add_marker(pytest.mark.xdist_group(group))
    if hasattr(config, "workerinput"):  # an xdist worker: hand the heavy ungrouped tests out first
        default = float(config.getini("timeout") or 0)
        items.sort(
            key=lambda item: not (item.get_closest_marker("xdist_group") is None and _heavy(item, default))
        )
