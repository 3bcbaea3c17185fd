"""``hami demo``: the whole system on an embedded cluster, the example pods, and what became of them.

Owns the subcommand (``add_arguments`` / ``run``): start an :class:`~hami.sim.system.EmbeddedSystem`
from the cluster file (``--nodes``, default the packaged 4-node cluster), submit every pod manifest
of ``--examples`` (default: the repository's ``examples/``) through the admission stand-in, wait
(bounded by ``--timeout``) until every pod is decided, print the table, and exit 0 — or, with
``--keep``, keep everything running until Ctrl-C / SIGTERM. Every child process is stopped on the way
out, whatever happens. Must not import ``webhook``, ``monitor`` or the Kubernetes client.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

import hami
from hami.annotations import read_vgpu_node
from hami.sim.admission_standin import Admitted, Refused
from hami.sim.cluster import ClusterFileError, load_cluster
from hami.sim.kubeapi import JsonDict, pods_path
from hami.sim.processes import ChildFailed
from hami.sim.report import card_index, describe, is_decided, render
from hami.sim.system import EmbeddedSystem, SystemOptions


def default_examples_dir() -> Path:
    return Path(hami.__file__).resolve().parent.parent / "examples"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--nodes", type=Path, default=None, help="cluster file (default: the packaged 4-node one)"
    )
    parser.add_argument(
        "--examples",
        type=Path,
        default=None,
        help="directory of pod manifests (default: the repo's examples/)",
    )
    parser.add_argument("--keep", action="store_true", help="keep the cluster running until Ctrl-C")
    parser.add_argument(
        "--timeout", type=float, default=120.0, help="seconds to wait for every pod to be decided"
    )
    parser.add_argument("--workdir", type=Path, default=None, help="where kubeconfig, logs and node files go")
    parser.add_argument(
        "--register-interval", type=float, default=1.0, help="node agents' registration period"
    )
    parser.add_argument(
        "--log-level", default="INFO", help="components' log level (their logs are in workdir)"
    )


def load_examples(directory: Path) -> list[JsonDict]:
    """Every Pod document of ``directory/*.yaml`` in file-name order; errors name the file."""
    if not directory.is_dir():
        raise ClusterFileError(f"examples directory {str(directory)!r} does not exist (pass --examples DIR)")
    pods: list[JsonDict] = []
    for path in sorted(directory.glob("*.yaml")):
        try:
            documents = [d for d in yaml.safe_load_all(path.read_text(encoding="utf-8")) if d]
        except yaml.YAMLError as exc:
            raise ClusterFileError(f"example {str(path)!r}: not valid YAML: {exc}") from exc
        for document in documents:
            if not isinstance(document, Mapping) or document.get("kind") != "Pod":
                raise ClusterFileError(f"example {str(path)!r}: only Pod documents are supported")
            pods.append(dict(document))
    return pods


def run(args: argparse.Namespace) -> int:
    try:
        return asyncio.run(_main(args))
    except KeyboardInterrupt:  # a second Ctrl-C while stopping: children were already signalled
        return 130


async def _main(args: argparse.Namespace) -> int:
    task = asyncio.current_task()
    assert task is not None
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, task.cancel)
    try:
        cluster = load_cluster(args.nodes)
        pods = load_examples(args.examples or default_examples_dir())
    except ClusterFileError as exc:
        print(f"hami demo: {exc}", file=sys.stderr)
        return 2
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="hami-demo-"))
    options = SystemOptions(register_interval=args.register_interval, log_level=args.log_level)
    ok = False
    try:
        async with EmbeddedSystem(cluster, workdir, options, progress=_say) as system:
            code = await _show(system, pods, args.timeout)
            ok = code == 0
            if args.keep:
                _say("running     until Ctrl-C. Try:")
                print(f"  kubectl --kubeconfig {system.kubeconfig} get pods -o wide", flush=True)
                print(f"  kubectl --kubeconfig {system.kubeconfig} get pods -o yaml", flush=True)
                print(f"  kubectl --kubeconfig {system.kubeconfig} get nodes -o yaml", flush=True)
                print(f"  hami explain default/too-much-memory --kubeconfig {system.kubeconfig}", flush=True)
                print(f"  hami doctor --kubeconfig {system.kubeconfig}", flush=True)
                print(f"  logs: {system.supervisor.log_dir}", flush=True)
                with contextlib.suppress(asyncio.CancelledError):
                    await asyncio.Event().wait()
                _say("stopping")
            return code
    except asyncio.CancelledError:
        print("\nhami demo: interrupted; every component was stopped", file=sys.stderr)
        return 130
    except (ChildFailed, TimeoutError) as exc:
        print(f"hami demo: {exc}\nlogs are in {workdir / 'logs'}", file=sys.stderr)
        return 1
    finally:
        if ok and not args.keep and args.workdir is None:
            shutil.rmtree(workdir, ignore_errors=True)


async def submit_all(system: EmbeddedSystem, pods: list[JsonDict]) -> tuple[list[str], dict[str, Refused]]:
    """Submit ``pods`` in order through the admission stand-in: every ``namespace/name``, and the refusals."""
    names: list[str] = []
    refused: dict[str, Refused] = {}
    for pod in pods:
        outcome = await system.admission.submit(pod)
        if isinstance(outcome, Admitted):
            meta = outcome.pod["metadata"]
            names.append(f"{meta['namespace']}/{meta['name']}")
        else:
            names.append(f"{outcome.namespace}/{outcome.name}")
            refused[names[-1]] = outcome
    return names, refused


async def wait_decided(
    system: EmbeddedSystem, names: list[str], refused: Mapping[str, Refused], limit: float
) -> list[str]:
    """Poll (bounded by ``limit`` seconds) until every pod is decided; returns the undecided ones."""
    deadline = time.monotonic() + limit
    while True:
        system.check_standin()
        system.supervisor.check()
        undecided = [
            n
            for n in names
            if not is_decided(system.scheduler.pods.get(_key(n)), refused.get(n), system.scheduler)
        ]
        if not undecided or time.monotonic() >= deadline:
            return undecided
        await asyncio.sleep(0.2)


async def final_state(
    system: EmbeddedSystem, names: list[str], refused: Mapping[str, Refused]
) -> dict[str, Any]:
    """Each pod as the apiserver stores it now (None for refused ones)."""
    return {n: None if n in refused else await system.api.get(pods_path(*_key(n))) for n in names}


async def _show(system: EmbeddedSystem, pods: list[JsonDict], limit: float) -> int:
    names, refused = await submit_all(system, pods)
    _say(f"submitted   {len(pods)} example pods ({len(refused)} refused at admission); waiting for decisions")
    undecided = await wait_decided(system, names, refused, limit)
    stored = await final_state(system, names, refused)
    cards = card_index(system.cluster)
    print()
    print(
        render([describe(n, stored[n], refused.get(n), system.scheduler, cards) for n in names]), flush=True
    )
    pending = [n for n in names if n not in refused and not read_vgpu_node(stored[n] or {})]
    if pending:
        print(
            "Why a pod is pending, per node, with the nearest fit (while the cluster runs, see --keep):\n"
            f"  hami explain {pending[0]} --kubeconfig {system.kubeconfig}"
        )
    print()
    if undecided:
        print(f"hami demo: not decided within {limit:.0f}s: {', '.join(undecided)}", file=sys.stderr)
        return 1
    return 0


def _key(name: str) -> tuple[str, str]:
    namespace, _, pod = name.partition("/")
    return namespace, pod


def _say(text: str) -> None:
    print(f"[hami demo] {text}", flush=True)
