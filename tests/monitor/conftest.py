"""Fixtures for the node agent: a real API client on the embedded API server, object builders, a
simulated-cards file, and a short temporary directory for unix sockets (their paths are limited to
~107 bytes, which pytest's tmp_path can exceed)."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from hami.kube.client import load_api_client


@pytest.fixture
def api(kubeconfig: Path) -> Iterator[Any]:
    client = load_api_client(str(kubeconfig), request_timeout=5.0)
    yield client
    client.close()


@pytest.fixture
def sock_dir() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="hm-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)
