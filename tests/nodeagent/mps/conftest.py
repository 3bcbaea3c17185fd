"""Fixtures of the MPS tests: ``mps_kit`` (a short directory under /tmp: the daemon's sockets must fit
a unix socket address), every daemon stopped at the end."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from .kit import MpsKit


@pytest.fixture
async def mps_kit() -> AsyncIterator[MpsKit]:
    base = Path(tempfile.mkdtemp(prefix="mps-", dir="/tmp"))
    kit = MpsKit(base=base)
    try:
        yield kit
    finally:
        await kit.stop_all()
        shutil.rmtree(base, ignore_errors=True)
