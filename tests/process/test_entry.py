"""An entry point's set-up: the API server asked once, one-line refusals, a signal as a normal stop."""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path

import kmock
import pytest

from hami.kube.client import KubeError
from hami.process.entry import reachable_api, refuse, until_signalled
from hami_testkit.apiserver import write_kubeconfig
from hami_testkit.processes import PortReservations


async def test_the_api_server_is_asked_once(kubeconfig: Path, apiserver: kmock.KubernetesEmulator) -> None:
    api = await asyncio.to_thread(reachable_api, str(kubeconfig), component="hami-test", request_timeout=5.0)
    try:
        assert str(api.user_agent).startswith("hami-test/")
    finally:
        api.close()
    assert any(request.url.path == "/version" for request in apiserver)


def test_an_unreachable_server_or_missing_file_is_a_kube_error(
    tmp_path: Path, ports: PortReservations
) -> None:
    nowhere = write_kubeconfig(tmp_path / "nowhere", f"http://127.0.0.1:{ports.take()}")  # nobody listens
    with pytest.raises(KubeError, match=r"127\.0\.0\.1"):
        reachable_api(str(nowhere), component="hami-test", request_timeout=2.0)
    with pytest.raises(KubeError, match="kubeconfig file not found"):
        reachable_api(str(tmp_path / "absent"), component="hami-test")


def test_refuse_is_one_line_and_an_exit_code(capsys: pytest.CaptureFixture[str]) -> None:
    assert refuse("hami-x", "--listen must be HOST:PORT, got 'x'") == 2
    assert refuse("hami-x", "cannot listen", code=1) == 1
    assert capsys.readouterr().err == "hami-x: --listen must be HOST:PORT, got 'x'\nhami-x: cannot listen\n"


async def test_a_signal_stops_the_service_normally() -> None:
    cleaned = asyncio.Event()
    running = asyncio.Event()

    async def service() -> None:
        running.set()
        try:
            await asyncio.Event().wait()
        finally:
            cleaned.set()

    async def terminate() -> None:
        await running.wait()
        os.kill(os.getpid(), signal.SIGTERM)

    killer = asyncio.create_task(terminate())
    assert await until_signalled(service()) is True
    await killer
    assert cleaned.is_set()
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL  # the handler is gone with the service


async def test_a_service_that_returns_or_fails_is_not_a_signal() -> None:
    async def returns() -> None:
        return None

    async def fails() -> None:
        raise OSError("address in use")

    assert await until_signalled(returns()) is False
    with pytest.raises(OSError, match="address in use"):
        await until_signalled(fails())
