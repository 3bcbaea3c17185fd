"""ENTRY POINT ``hami-webhook`` (= ``python -m webhook``): flags -> settings -> the Kopf operator.

Owns process set-up only, through the shared :mod:`hami.process.entry`: logging, parsing flags (env
fallbacks ``HAMI_<FLAG>``), one-line errors for bad configuration (exit code 2: flags, an unusable
kubeconfig, an API server that cannot be reached at start-up) and running :func:`webhook.handlers.run`
until SIGINT/SIGTERM (Kopf handles the signals itself).
"""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import Sequence

from prometheus_client import CollectorRegistry

from hami.kube.client import KubeError
from hami.process.entry import FAILED, configure_logging, reachable_api, refuse
from hami.settings import ConfigError
from webhook.config import parse_settings
from webhook.tlsbundle import CertificateError

PROGRAM = "hami-webhook"


def main(argv: Sequence[str] | None = None) -> int:
    try:
        settings = parse_settings(argv, os.environ)
    except ConfigError as exc:
        return refuse(PROGRAM, exc)
    configure_logging(settings.log_level)
    try:  # before Kopf, whose login handler would log the same problem as a traceback, retried forever
        reachable_api(settings.kubeconfig, component=PROGRAM).close()  # Kopf has its own client
    except KubeError as exc:
        return refuse(PROGRAM, exc)
    # Imported here so `hami-webhook --help` and flag errors do not pay for importing Kopf.
    from webhook.handlers import run

    # The process's one Prometheus registry (no global default registry), passed down.
    registry = CollectorRegistry()
    try:
        asyncio.run(run(settings, registry=registry, freeze_gc=True))
    except (CertificateError, OSError) as exc:
        return refuse(PROGRAM, exc, FAILED)
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
