"""The credential refresh hook the official client runs before every request runs at most once a second
(``hami.kube.client.RefreshAtMost``), and still refreshes when due."""

from __future__ import annotations

import copy as copy_module
import time
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from kubernetes.config import kube_config

from hami.kube.client import NotFound, RefreshAtMost, load_api_client
from hami.kube.nodes import get_node


class LoaderLike:
    """A hook that behaves as the official loaders' hooks do: it sets the token and installs a new hook
    of its own on each run."""

    def __init__(self) -> None:
        self.runs = 0
        self.fail = False

    def install(self, configuration: Any) -> None:
        def hook(conf: Any) -> None:
            self.runs += 1
            if self.fail:
                raise OSError("token file unreadable")
            conf.api_key["BearerToken"] = f"token-{self.runs}"
            self.install(conf)

        configuration.refresh_api_key_hook = hook


def _configuration(loader: LoaderLike, now: list[float]) -> Any:
    configuration = client.Configuration()
    loader.install(configuration)
    RefreshAtMost.install(configuration, every=1.0, clock=lambda: now[0])
    return configuration


def test_the_hook_runs_once_a_second_and_stays_installed() -> None:
    loader, now = LoaderLike(), [100.0]
    configuration = _configuration(loader, now)
    for _ in range(50):
        assert configuration.get_api_key_with_prefix("BearerToken") == "token-1"
    assert loader.runs == 1
    assert isinstance(configuration.refresh_api_key_hook, RefreshAtMost)
    now[0] += 0.999
    configuration.get_api_key_with_prefix("BearerToken")
    assert loader.runs == 1
    now[0] += 0.001  # due: the loader's newest hook runs, and the token it sets is the one sent
    assert configuration.get_api_key_with_prefix("BearerToken") == "token-2"
    assert loader.runs == 2
    assert isinstance(configuration.refresh_api_key_hook, RefreshAtMost)


def test_a_failing_hook_is_tried_again_on_the_next_request() -> None:
    loader, now = LoaderLike(), [100.0]
    configuration = _configuration(loader, now)
    loader.fail = True
    with pytest.raises(OSError, match="token file unreadable"):
        configuration.get_api_key_with_prefix("BearerToken")
    loader.fail = False
    assert configuration.get_api_key_with_prefix("BearerToken") == "token-2"  # no wait for a second
    assert isinstance(configuration.refresh_api_key_hook, RefreshAtMost)


def test_a_copied_configuration_is_refreshed_on_its_own_timer() -> None:
    """A deep copy gets its own wrapper: with a shared one, the original's calls inside each second kept
    the copy's token from ever being written (found by review)."""
    loader, now = LoaderLike(), [100.0]
    original = _configuration(loader, now)
    assert original.get_api_key_with_prefix("BearerToken") == "token-1"
    copy = copy_module.deepcopy(original)
    copy.api_key["BearerToken"] = "expired"
    assert copy.refresh_api_key_hook is not original.refresh_api_key_hook
    assert copy.get_api_key_with_prefix("BearerToken") == "token-2"  # due at once, in the copy itself
    assert original.get_api_key_with_prefix("BearerToken") == "token-1"  # the original's second not up


def test_a_configuration_without_a_hook_is_left_alone() -> None:
    configuration = client.Configuration()
    RefreshAtMost.install(configuration)
    assert configuration.refresh_api_key_hook is None


async def test_the_kubeconfig_hook_does_not_run_per_request(
    kubeconfig: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With the official kubeconfig loader: many requests, the loader's re-application runs about once a
    second (it ran once per request before)."""
    applied: list[float] = []
    original: Any = kube_config.KubeConfigLoader._set_config

    def counting(self: Any, configuration: Any) -> None:
        applied.append(time.monotonic())
        original(self, configuration)

    monkeypatch.setattr(kube_config.KubeConfigLoader, "_set_config", counting)
    started = time.monotonic()
    api = load_api_client(str(kubeconfig), request_timeout=30.0)
    try:
        requests = 40
        for _ in range(requests):
            with pytest.raises(NotFound):
                await get_node(api, "absent")
        seconds = time.monotonic() - started
        configuration: Any = api.configuration
        assert isinstance(configuration.refresh_api_key_hook, RefreshAtMost)
        assert configuration.api_key["BearerToken"]
        # once at load, then at most once per started second
        assert len(applied) <= 2 + int(seconds), (len(applied), seconds)
        assert len(applied) < requests
    finally:
        api.close()
