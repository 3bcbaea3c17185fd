"""Fixtures for the Kubernetes access layer: a real client pointed at this test's embedded API server."""

from __future__ import annotations

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
