"""Fixtures for the end-to-end tests: the whole system on an embedded cluster, processes on loopback."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest


@pytest.fixture
def workdir() -> Iterator[Path]:
    """A short directory under /tmp (device-plugin unix socket paths are limited to 107 bytes)."""
    path = Path(tempfile.mkdtemp(prefix="hami-e2e-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)
