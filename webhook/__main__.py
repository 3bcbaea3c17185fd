"""ENTRY POINT ``hami-webhook`` (= ``python -m webhook``): flags -> settings -> the Kopf operator.

Owns process set-up only: logging, parsing flags (env fallbacks ``HAMI_<FLAG>``), clear errors for bad
configuration (exit code 2: flags, an unusable kubeconfig, an API server that cannot be reached at
start-up) and running :func:`webhook.handlers.run` until SIGINT/SIGTERM.
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
from collections.abc import Sequence

from prometheus_client import CollectorRegistry

from hami.kube.client import KubeError, check_reachable, load_api_client
from webhook.certs import CertificateError
from webhook.config import ConfigError, parse_settings


def main(argv: Sequence[str] | None = None) -> int:
    try:
        settings = parse_settings(argv, os.environ)
    except ConfigError as exc:
        print(f"hami-webhook: {exc}", file=sys.stderr)
        return 2
    logging.basicConfig(level=settings.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:  # before Kopf, whose login handler would log the same problem as a traceback, retried forever
        api = load_api_client(settings.kubeconfig, component="hami-webhook")
        try:
            check_reachable(api)
        finally:
            api.close()
    except KubeError as exc:
        print(f"hami-webhook: {exc}", file=sys.stderr)
        return 2
    # Imported here so `hami-webhook --help` and flag errors do not pay for importing Kopf.
    from webhook.handlers import run

    # The process's one Prometheus registry (no global default registry), passed down.
    registry = CollectorRegistry()
    try:
        asyncio.run(run(settings, registry=registry))
    except (CertificateError, OSError) as exc:
        print(f"hami-webhook: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
