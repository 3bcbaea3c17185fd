"""Fixtures for the end-to-end tests: the whole system on an embedded cluster, processes on loopback."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Generator, Iterator
from pathlib import Path

import pytest

#: lines of each component's log shown when a test fails (its work directory is removed after)
LOG_TAIL = 40


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    if report.when == "call" and report.failed:
        item.stash[FAILED] = True
    return report


FAILED = pytest.StashKey[bool]()


@pytest.fixture
def workdir(request: pytest.FixtureRequest) -> Iterator[Path]:
    """A short directory under /tmp (device-plugin unix socket paths are limited to 107 bytes); when the
    test failed, the tail of every component's log there is printed before it is removed."""
    path = Path(tempfile.mkdtemp(prefix="hami-e2e-", dir="/tmp"))
    yield path
    if request.node.stash.get(FAILED, False):
        for log in sorted(path.rglob("*.log")):
            lines = log.read_text(errors="replace").splitlines()[-LOG_TAIL:]
            print(f"----- {log.relative_to(path)} (last {len(lines)} lines)", *lines, sep="\n")
    shutil.rmtree(path, ignore_errors=True)
