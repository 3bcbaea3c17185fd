"""ENTRY POINT of ``hami scheduler``: flags -> settings -> API client -> context -> the two listeners.

Owns ``add_arguments(parser)`` and ``run(args) -> int`` (registered in ``hami/cli.py``): everything is
built here once and passed down; nothing is kept in module globals. The verbs are served on
``--listen`` (loopback by default), probes and metrics on ``--metrics-listen``
(:func:`hami.scheduler.app.serve`, until SIGTERM/SIGINT). The verbs are plain HTTP unless
``--tls-cert``/``--tls-key`` are given. Must not import the Kubernetes client (only ``hami.kube``).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import ssl
import sys

from hami.kube.client import KubeError, check_reachable, load_api_client
from hami.scheduler import config
from hami.scheduler.app import build_context, serve

logger = logging.getLogger(__name__)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    config.add_arguments(parser)


def run(args: argparse.Namespace) -> int:
    try:
        settings = config.from_args(args)
    except config.SettingsError as exc:
        print(f"hami scheduler: {exc}", file=sys.stderr)
        return 2
    logging.basicConfig(
        level=settings.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    try:
        api = load_api_client(
            settings.kubeconfig, request_timeout=settings.api_timeout, component="hami-scheduler"
        )
    except (KubeError, OSError, ValueError) as exc:
        print(f"hami scheduler: {exc}", file=sys.stderr)
        return 2
    try:
        check_reachable(api)  # a wrong server is one clear line at start-up, not a watch retrying forever
    except KubeError as exc:
        api.close()
        print(f"hami scheduler: {exc}", file=sys.stderr)
        return 2
    ssl_context = None
    if settings.tls_cert and settings.tls_key:
        ssl_context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        ssl_context.load_cert_chain(settings.tls_cert, settings.tls_key)
    try:
        asyncio.run(serve(build_context(settings, api), ssl_context=ssl_context))
    except OSError as exc:  # an address in use or not available
        print(f"hami scheduler: cannot listen: {exc}", file=sys.stderr)
        return 1
    finally:
        api.close()
    return 0
