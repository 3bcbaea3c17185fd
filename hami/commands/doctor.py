"""``hami doctor``: a read-only health check of an installation, one line per finding.

Owns the command: read the MutatingWebhookConfigurations, Nodes and Pods through ``hami.kube``, build
the scheduler's own :class:`~hami.scheduler.snapshot.Snapshot` from them (the per-card usage the
extender counts), hand everything to the pure rules in :mod:`hami.doctor.checks` (and ``pods``) and print the
findings. Writes nothing to the cluster. Exit code: 0 when nothing FAILs, 1 otherwise, 2 on errors
(no cluster access, a bad device config). Must not import the Kubernetes client directly.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import sys
from collections import Counter
from typing import TextIO

from hami.devicefile import load_device_config
from hami.doctor.checks import run_checks
from hami.doctor.findings import DoctorSettings, Finding, exit_code
from hami.kube import nodes as kube_nodes
from hami.kube import pods as kube_pods
from hami.kube.client import KubeError, load_api_client
from hami.kube.protocol import KubeApi
from hami.kube.webhookconfigs import list_mutating_webhook_configurations
from hami.scheduler.quotas import QuotaBook
from hami.scheduler.snapshot import Snapshot, local_time


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number of seconds, got {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be positive, got {text!r}")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--kubeconfig", default=None, help="kubeconfig file (default: in-cluster, then ~/.kube/config)"
    )
    parser.add_argument(
        "--device-config", default=None, help="HAMi device-config YAML (resource names, defaults)"
    )
    parser.add_argument(
        "--scheduler-name", default="hami-scheduler", help="the schedulerName the webhook sets on GPU pods"
    )
    parser.add_argument(
        "--lock-timeout",
        type=_seconds,
        default=300.0,
        metavar="SECONDS",
        help="the scheduler's --node-lock-timeout (locks and hand-offs older than this are reported)",
    )


def run(args: argparse.Namespace) -> int:
    try:
        settings = DoctorSettings(
            scheduler_name=args.scheduler_name,
            lock_timeout=datetime.timedelta(seconds=args.lock_timeout),
            config=load_device_config(args.device_config),
        )
        api = load_api_client(args.kubeconfig, component="hami-doctor")
        return asyncio.run(doctor(api, settings, out=sys.stdout))
    except (KubeError, ValueError) as exc:
        print(f"hami doctor: {exc}", file=sys.stderr)
        return 2


async def diagnose(api: KubeApi, settings: DoctorSettings, *, now: datetime.datetime) -> list[Finding]:
    """Read the cluster and return every finding, in report order."""
    configs = await list_mutating_webhook_configurations(api)
    nodes, _ = await kube_nodes.list_nodes(api)
    pods = await kube_pods.list_pods(api)
    names = settings.config.resources
    book = QuotaBook(
        memory_resource=names.memory,
        cores_resource=names.cores,
        memory_factor=settings.config.effective_memory_factor,
    )
    snapshot = Snapshot(count_resource=names.count, quotas=book, handshake_window=settings.handshake_window)
    snapshot.replace_nodes(nodes)
    snapshot.replace_pods(pods)
    holders: dict[tuple[str, str], list[str]] = {}
    for (namespace, name), record in snapshot.tracked().items():
        for card in record.usage.cards:
            holders.setdefault((record.node, card.uuid), []).append(f"{namespace}/{name}")
    return run_checks(
        configs=configs,
        nodes=nodes,
        pods=pods,
        states=[e.state for e in snapshot.entries() if e.state is not None],
        holders=holders,
        settings=settings,
        now=now,
        local_now=local_time(now),
    )


async def doctor(
    api: KubeApi, settings: DoctorSettings, *, out: TextIO, now: datetime.datetime | None = None
) -> int:
    """Print the findings and a count per severity; 0 when nothing FAILs, 1 otherwise."""
    findings = await diagnose(api, settings, now=now or datetime.datetime.now(datetime.UTC))
    for finding in findings:
        print(finding.line(), file=out)
    counts = Counter(f.severity.value for f in findings)
    print(f"{counts['FAIL']} FAIL, {counts['WARN']} WARN, {counts['OK']} OK", file=out)
    return exit_code(findings)
