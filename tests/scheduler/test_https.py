"""``hami scheduler --tls-cert/--tls-key``: the verbs over HTTPS, as HAMi serves its extender
(docs/protocol.md, "Extender").

Runs the real command as a process (the TLS set-up is part of start-up) against this test's embedded
API server, with a certificate for 127.0.0.1 signed by a CA made here by ``webhook.tlsbundle``. The
probes and metrics stay plain HTTP on their own listener.
"""

from __future__ import annotations

import asyncio
import datetime
import ssl
from pathlib import Path

import aiohttp
import kmock
import pytest

from hami_testkit.processes import ChildFailed, PortReservations, Supervisor, python_argv
from tests.builders import make_node, make_pod
from tests.eventually import eventually, time_scale
from webhook import tlsbundle

pytestmark = pytest.mark.timeout(120)
#: bound on the child's start-up (imports, first lists), stretched by the machine's load; polled, not slept
START_WITHIN = 60.0


def issue(directory: Path) -> tuple[Path, Path, Path]:
    """A CA and a serving certificate for 127.0.0.1 signed by it (the webhook's own issuer, which the
    chart's certgen Jobs run): (ca.pem, tls.crt, tls.key)."""
    bundle = tlsbundle.generate(["127.0.0.1"], now=datetime.datetime.now(datetime.UTC))
    paths = directory / "ca.pem", directory / "tls.crt", directory / "tls.key"
    for path, pem in zip(paths, (bundle.ca_cert, bundle.cert, bundle.key), strict=True):
        path.write_bytes(pem)
    return paths


def scheduler_argv(kubeconfig: Path, port: int, metrics_port: int, *tls: str) -> list[str]:
    return python_argv(
        "-m", "hami.cli", "scheduler",
        "--kubeconfig", str(kubeconfig),
        "--listen", f"127.0.0.1:{port}",
        "--metrics-listen", f"127.0.0.1:{metrics_port}",
        *tls,
    )  # fmt: skip


async def test_the_verbs_are_served_over_https(
    apiserver: kmock.KubernetesEmulator, kubeconfig: Path, tmp_path: Path, ports: PortReservations
) -> None:
    await apiserver.post("/api/v1/nodes", json=make_node("n1"))
    ca, cert, key = issue(tmp_path)
    port, metrics_port = ports.take(), ports.take()
    argv = scheduler_argv(kubeconfig, port, metrics_port, "--tls-cert", str(cert), "--tls-key", str(key))
    trusted = ssl.create_default_context(cafile=str(ca))
    body = {"Pod": make_pod("p"), "NodeNames": ["n1", "n2"]}
    async with Supervisor(tmp_path / "logs") as supervisor, aiohttp.ClientSession() as http:

        async def ready() -> bool | None:
            try:
                async with http.get(f"http://127.0.0.1:{metrics_port}/readyz") as response:
                    return True if response.status == 200 else None
            except aiohttp.ClientError:
                return None

        await supervisor.start("scheduler", argv)
        await eventually(ready, "/readyz", within=START_WITHIN, alive=supervisor.check)
        url = f"https://127.0.0.1:{port}"
        async with http.post(f"{url}/filter", json=body, ssl=trusted) as response:
            assert response.status == 200
            answer = await response.json()
        assert answer["NodeNames"] == ["n1"]
        assert answer["FailedAndUnresolvableNodes"] == {"n2": "node unregistered"}
        async with http.post(f"{url}/prioritize", json=body, ssl=trusted) as response:
            assert await response.json() == [{"Host": "n1", "Score": 0}, {"Host": "n2", "Score": 0}]
        # the certificate is checked by the client as kube-scheduler would (tlsConfig with a CA)
        with pytest.raises(aiohttp.ClientConnectorCertificateError):
            await http.post(f"{url}/filter", json=body, ssl=ssl.create_default_context())
        # no plain-HTTP fallback on the verbs port
        with pytest.raises(aiohttp.ClientError):
            async with http.post(f"http://127.0.0.1:{port}/filter", json=body) as response:
                await response.read()
        # the probes stay plain HTTP on their own listener
        async with http.get(f"http://127.0.0.1:{metrics_port}/healthz") as response:
            assert response.status == 200
        assert await supervisor.stop("scheduler") == 0  # SIGTERM: a clean stop


@pytest.mark.parametrize("problem", ["missing", "not-pem", "key-mismatch"])
async def test_an_unusable_certificate_stops_the_start_in_one_line(
    apiserver: kmock.KubernetesEmulator,
    kubeconfig: Path,
    tmp_path: Path,
    problem: str,
    ports: PortReservations,
) -> None:
    _, cert, key = issue(tmp_path)
    if problem == "missing":
        cert = tmp_path / "absent.crt"
    elif problem == "not-pem":
        cert.write_text("not a certificate\n")
    else:
        other = tmp_path / "other"
        other.mkdir()
        _, _, key = issue(other)
    argv = scheduler_argv(
        kubeconfig, ports.take(), ports.take(), "--tls-cert", str(cert), "--tls-key", str(key)
    )
    process = await asyncio.create_subprocess_exec(
        *argv, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    try:
        _, stderr = await asyncio.wait_for(process.communicate(), START_WITHIN * time_scale())
    except TimeoutError:
        process.kill()
        await process.wait()
        raise ChildFailed("hami scheduler kept running with an unusable certificate") from None
    lines = stderr.decode().strip().splitlines()
    assert process.returncode != 0, lines
    assert len(lines) == 1 and lines[0].startswith("hami scheduler: "), lines  # no traceback
