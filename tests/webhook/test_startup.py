"""What start-up leaves the collector (issue 26): every object loaded before the webhook serves (modules,
the API client, the resolved Kubernetes API classes, ~160,000 objects) is frozen out of the cyclic
garbage collector's reach, so a full collection, which stalled admission for 100-300 ms every few
seconds at 200 requests/s, scans only what requests leave behind."""

from __future__ import annotations

import gc
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

import webhook.__main__ as entry
from webhook import handlers

from .webhook_harness import Cluster, operator_settings, running_operator


def test_the_entry_point_asks_run_to_freeze_the_start_up_heap(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    options: dict[str, Any] = {}

    async def run(settings: object, **kwargs: Any) -> None:
        options.update(kwargs)

    monkeypatch.setattr(handlers, "run", run)
    monkeypatch.setattr(entry, "configure_logging", lambda level: None)
    monkeypatch.setattr(entry, "reachable_api", lambda *a, **k: SimpleNamespace(close=lambda: None))
    assert entry.main(["--kubeconfig", str(tmp_path / "kubeconfig")]) == 0
    assert options.get("freeze_gc") is True


def test_run_freezes_what_start_up_loaded(cluster: Cluster, tmp_path: Path) -> None:
    settings = operator_settings(cluster, tmp_path / "tls")
    before = gc.get_freeze_count()
    try:
        with running_operator(settings, freeze_gc=True):
            assert gc.get_freeze_count() > before
    finally:
        gc.unfreeze()  # this test process is not the webhook's: give pytest's objects back
