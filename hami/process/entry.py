"""What every entry point does before and around its service: logging, start-up errors, the API
client, and running until SIGTERM or SIGINT.

Owns the log format, :func:`refuse` (a start-up problem is one line on stderr, ``<program>: <problem>``,
and an exit code: 2 for configuration, flags and an API server that cannot be reached; 1 for the
rest), :func:`reachable_api` (the client, asked once for ``/version`` so that a wrong server is a
clear line at start-up instead of a watch retrying forever) and :func:`until_signalled` (the
service's main coroutine, cancelled by SIGTERM/SIGINT: a normal stop). Must not import the
Kubernetes client (only ``hami.kube``) or a service.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import sys
from collections.abc import Coroutine
from typing import Any

from hami.kube.client import DEFAULT_TIMEOUT, KubeError, check_reachable, load_api_client

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
#: Exit codes: a problem with the configuration (flags, files, kubeconfig, API server), or another.
BAD_CONFIG = 2
FAILED = 1


def configure_logging(level: str) -> None:
    """The process's log lines: time, level, logger, message, at ``level`` (any case)."""
    logging.basicConfig(level=level.upper(), format=LOG_FORMAT)


def refuse(program: str, problem: object, code: int = BAD_CONFIG) -> int:
    """Print ``<program>: <problem>`` on stderr; the exit code to return."""
    print(f"{program}: {problem}", file=sys.stderr)
    return code


def reachable_api(kubeconfig: str | None, *, component: str, request_timeout: float = DEFAULT_TIMEOUT) -> Any:
    """The API client for ``kubeconfig`` (in-cluster or ``~/.kube/config`` when None), with the API
    server asked once: raises :class:`~hami.kube.client.KubeError` (the client closed) when it cannot be
    reached, or the kubeconfig is unusable."""
    try:
        api = load_api_client(kubeconfig, request_timeout=request_timeout, component=component)
    except (OSError, ValueError) as exc:  # an unreadable or malformed kubeconfig file
        raise KubeError(0, "Config", f"cannot load the kubeconfig: {exc}") from exc
    try:
        check_reachable(api)
    except KubeError:
        api.close()
        raise
    return api


async def until_signalled(main: Coroutine[Any, Any, None]) -> bool:
    """Run ``main`` until it returns or SIGTERM/SIGINT cancels it; True when a signal stopped it."""
    task = asyncio.get_running_loop().create_task(main, name="main")
    signalled = asyncio.Event()

    def stop() -> None:
        signalled.set()
        task.cancel()

    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop)
    try:
        await task
    except asyncio.CancelledError:
        if not signalled.is_set():
            raise
    finally:
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(signum)
    return signalled.is_set()
