"""Admission latency of ``hami-webhook`` over loopback HTTPS at a fixed arrival rate.

Set-up: three processes, as in a cluster. The embedded API server (kmock) runs in a child process
(``benchmarks.childserver``: it prints its URL and serves until its stdin closes); ``python -m webhook
--manage-config`` is another; the load client is this process alone, so
neither the API server's work (the webhook's ResourceQuota list + watch, Kopf's watch of its
configuration) nor the webhook's can stall the client's clock. The client reads the URL and caBundle
from the MutatingWebhookConfiguration the webhook published and POSTs AdmissionReview v1 requests, open
loop at 200 requests/s (each request starts on schedule whether or not earlier ones finished; a request
that finds no idle connection opens a new one, as kube-apiserver's client does), cycling through three
pods: a bare-card pod (mutated), a pod refused for ``gpucores: 150``, a shared-card pod. Latency =
request start to full response. Rows: keep-alive connections (what kube-apiserver does) and a fresh
TLS connection per request. Baseline, measured in the same run: the pure decision
(``webhook.mutation.plan``) in this process on the same pods; ``x baseline`` is each row's p99 over
the baseline's. Target: p99 <= 10 ms (keep-alive).

Duration: ``HAMI_BENCH_WEBHOOK_SECONDS`` (default 30; the fresh-connection row runs a third of it).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import os
import signal
import ssl
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp

from benchmarks.childserver import apiserver_process
from benchmarks.table import Table, ms, percentile, summary
from hami.kube.admissionreview import pod_create_review
from hami_testkit.apiserver import write_kubeconfig
from hami_testkit.processes import PortReservations
from webhook.config import MutationSettings
from webhook.mutation import plan

RATE = 200.0
CONFIG_NAME = "hami-webhook-bench"


def _pod(limits: dict[str, str]) -> dict[str, Any]:
    container = {"name": "main", "image": "cuda:12", "resources": {"limits": limits}}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "p", "namespace": "default"},
        "spec": {"containers": [container]},
    }


PODS = (
    _pod({"nvidia.com/gpu": "1"}),
    _pod({"nvidia.com/gpu": "1", "nvidia.com/gpucores": "150"}),
    _pod({"nvidia.com/gpu": "2", "nvidia.com/gpumem": "4000", "nvidia.com/gpucores": "30"}),
)


#: the webhook's listen ports, held for the life of the bench (the child binds them)
PORTS = PortReservations()


def _free_port() -> int:
    return PORTS.take()


#: The child process: the embedded API server on an OS-chosen port; prints its URL, serves until stdin closes.
SERVER = """
import asyncio, sys
from hami_testkit.apiserver import embedded_apiserver

async def main():
    async with embedded_apiserver() as k:
        print(str(k.url).rstrip("/"), flush=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)  # until stdin closes

asyncio.run(main())
"""


@contextlib.contextmanager
def _webhook_process(api_url: str, workdir: Path) -> Iterator[subprocess.Popen[bytes]]:
    kubeconfig = write_kubeconfig(workdir / "kubeconfig", api_url)
    command = [
        sys.executable,
        "-m",
        "webhook",
        "--kubeconfig",
        str(kubeconfig),
        "--listen",
        f"127.0.0.1:{_free_port()}",
        "--tls-dir",
        str(workdir / "tls"),
        "--manage-config",
        "--config-name",
        CONFIG_NAME,
        "--health-listen",
        f"127.0.0.1:{_free_port()}",
        "--metrics-listen",
        f"127.0.0.1:{_free_port()}",
        "--log-level",
        "WARNING",
    ]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        yield process
    finally:
        process.send_signal(signal.SIGINT)  # Kopf exits gracefully and removes its webhook
        try:
            process.wait(20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(5)


async def _published(api_url: str, process: subprocess.Popen[bytes]) -> tuple[str, bytes]:
    """The scoped webhook's URL and CA, once the process has published them (bounded wait)."""
    path = f"{api_url}/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations/{CONFIG_NAME}"
    deadline = time.monotonic() + 30
    async with aiohttp.ClientSession() as session:
        while time.monotonic() < deadline and process.poll() is None:
            async with session.get(path) as response:
                hooks = (await response.json()).get("webhooks") if response.status == 200 else None
            if hooks and "matchConditions" in hooks[0]:
                config = hooks[0]["clientConfig"]
                return str(config["url"]), base64.b64decode(config["caBundle"])
            await asyncio.sleep(0.1)
    raise RuntimeError("the webhook did not publish its configuration")


async def _load(url: str, ca: bytes, seconds: float, *, keep_alive: bool) -> tuple[list[float], int]:
    """Open-loop load at RATE for ``seconds``; returns latencies and the count of failed requests."""
    context = ssl.create_default_context(cadata=ca.decode())
    connector = aiohttp.TCPConnector(ssl=context, limit=0, force_close=not keep_alive)
    latencies: list[float] = []
    failures = 0
    bodies = [pod_create_review(pod, username="bench") for pod in PODS]

    async def one(session: aiohttp.ClientSession, body: dict[str, Any]) -> None:
        nonlocal failures
        start = time.perf_counter()
        async with session.post(url, json=body) as response:
            data = await response.json()
        latencies.append(time.perf_counter() - start)
        if response.status != 200 or "response" not in data:
            failures += 1

    async with aiohttp.ClientSession(connector=connector) as session:
        await one(session, bodies[0])  # warm-up: first TLS handshake, Kopf's first request
        latencies.clear()
        count = int(seconds * RATE)
        begin = time.perf_counter()
        tasks = []
        for i in range(count):
            delay = begin + i / RATE - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(one(session, bodies[i % len(bodies)])))
        await asyncio.gather(*tasks)
    return latencies, failures


async def _measure(seconds: float) -> list[tuple[str, list[float], int]]:
    with (
        tempfile.TemporaryDirectory() as tmp,
        apiserver_process(SERVER) as api_url,
        _webhook_process(api_url, Path(tmp)) as process,
    ):
        url, ca = await _published(api_url, process)
        kept, kept_failures = await _load(url, ca, seconds, keep_alive=True)
        fresh, fresh_failures = await _load(url, ca, max(seconds / 3, 1.0), keep_alive=False)
    return [
        ("HTTPS, keep-alive", kept, kept_failures),
        ("HTTPS, new TLS connection per request", fresh, fresh_failures),
    ]


def _pure_plan(repetitions: int = 3000) -> list[float]:
    settings = MutationSettings()
    samples = []
    for i in range(repetitions):
        pod = PODS[i % len(PODS)]
        start = time.perf_counter()
        plan(pod, settings)
        samples.append(time.perf_counter() - start)
    return samples


def run() -> list[Table]:
    seconds = float(os.environ.get("HAMI_BENCH_WEBHOOK_SECONDS", "30"))
    table = Table(
        title=f"webhook admission latency at {RATE:.0f} req/s, client / API server / webhook in 3 processes "
        "(ms; target p99 <= 10 on keep-alive); baseline: mutation.plan in process",
        columns=("path", "requests", "failed", "p50", "p99", "max", "baseline p99", "x baseline (p99)"),
    )
    measured = asyncio.run(_measure(seconds))
    pure = _pure_plan()  # right after the load, on the same machine state
    base_p99 = percentile(pure, 99)
    for name, samples, failures in measured:
        ratio = f"{percentile(samples, 99) / base_p99:.0f}"
        table.rows.append((name, str(len(samples)), str(failures), *summary(samples), ms(base_p99), ratio))
    baseline = ("mutation.plan only (baseline)", str(len(pure)), "0", *summary(pure), ms(base_p99), "1")
    table.rows.append(baseline)
    return [table]


if __name__ == "__main__":
    for result in run():
        print(result.render())
