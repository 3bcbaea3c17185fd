"""What one ``hami demo`` does: the whole system on an embedded cluster, the example pods, and what
became of them (the flags are :mod:`hami.commands.demo`'s, which imports this module only to run, so
that its ``--help`` needs no ``demo`` extra).

:func:`run`: start an :class:`~hami_testkit.system.EmbeddedSystem`
from the cluster file (``--nodes``, default the packaged 4-node cluster) or a generated cluster
(``--generate N`` nodes of ``--card-mix`` or of ``--node-list``'s mix, :mod:`hami_testkit.clustergen`;
their agents one fleet process, and the example pods only with ``--examples``), submit every pod manifest
of ``--examples`` (default: the packaged examples, :mod:`hami_testkit.manifests`; their PriorityClasses
first) through the admission stand-in, wait (bounded by ``--timeout``) until every pod is decided, print
the table (with whether each pod became what its example declares, who was preempted by whom, and a
legend of HAMi's words), and exit 0 — or, with ``--keep``,
print the kubeconfig, the metrics URLs and the commands to try (with the ``hami`` this installation
runs) and keep everything running until Ctrl-C / SIGTERM. Every child process is stopped on the way
out, whatever happens. With ``--bare`` it starts only the embedded cluster
(:class:`~hami_testkit.bare.BareCluster`: the Nodes and the Job stand-in, none of our components), prints
its kubeconfig and the ``helm install`` of the chart, and keeps it running until Ctrl-C. Must not
import ``webhook``, ``nodeagent`` or the Kubernetes client.
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

from hami import objects
from hami.annotations import read_vgpu_node
from hami.simulate.trace import TraceError, read_nodes
from hami_testkit.admission_standin import PRIORITY_CLASSES_PATH, Admitted, Refused
from hami_testkit.bare import BareCluster
from hami_testkit.cluster import ClusterFileError, ClusterSpec, load_cluster
from hami_testkit.clustergen import describe_mix, generate_cluster, mix_from_nodes, parse_mix
from hami_testkit.kubeapi import JsonDict, pods_path
from hami_testkit.manifests import Example, read_examples
from hami_testkit.manifests import default_examples_dir as default_examples_dir
from hami_testkit.manifests import load_examples as load_examples
from hami_testkit.processes import ChildFailed
from hami_testkit.report import card_index, describe, is_decided, legend, render, verdict
from hami_testkit.system import DEMO_REQUEST_LOG, EmbeddedSystem, SystemOptions


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
    if args.bare:
        return await _bare(args)
    try:
        cluster = demo_cluster(args)
        generated = getattr(args, "generate", None) is not None
        if generated and args.examples is None:
            examples = []  # the examples are written for the packaged cluster's nodes
        else:
            examples = read_examples(args.examples or default_examples_dir())
    except (ClusterFileError, TraceError) as exc:
        print(f"hami demo: {exc}", file=sys.stderr)
        return 2
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="hami-demo-"))
    options = demo_options(args, cluster)
    ok = False
    try:
        started = time.monotonic()
        async with EmbeddedSystem(cluster, workdir, options, progress=_say) as system:
            if generated:
                _say(
                    f"cluster     {len(cluster.nodes)} nodes ({describe_mix(cluster)}), up in "
                    f"{time.monotonic() - started:.1f}s"
                )
            if examples:
                code, placed, pending = await _show(system, examples, args.timeout, keep=args.keep)
            else:
                code, placed, pending = 0, [], []
            ok = code == 0
            if args.keep:
                print(keep_hints(system, placed, pending), flush=True)
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


async def _bare(args: argparse.Namespace) -> int:
    """``--bare``: the embedded cluster alone until Ctrl-C / SIGTERM (then 0)."""
    if args.examples is not None:
        print("hami demo: --bare runs no example pods (drop --examples)", file=sys.stderr)
        return 2
    try:
        cluster = demo_cluster(args)
    except (ClusterFileError, TraceError) as exc:
        print(f"hami demo: {exc}", file=sys.stderr)
        return 2
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="hami-bare-"))
    try:
        async with BareCluster(cluster, workdir, progress=_say) as bare:
            print(bare_hints(bare.kubeconfig, bare.user), flush=True)
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.Event().wait()
            _say("stopping")
    except asyncio.CancelledError:  # interrupted while starting
        print("\nhami demo: interrupted", file=sys.stderr)
        return 130
    return 0


def demo_options(args: argparse.Namespace, cluster: ClusterSpec) -> SystemOptions:
    """The embedded system's knobs the demo's flags set."""
    generated = getattr(args, "generate", None) is not None
    agents = getattr(args, "agents", None) or ("fleet" if generated else "process")
    return SystemOptions(
        register_interval=args.register_interval,
        log_level=args.log_level,
        request_log=DEMO_REQUEST_LOG,
        fleet=agents == "fleet",
        ready_limit=max(60.0, 0.1 * len(cluster.nodes)),  # a thousand nodes register in well under that
        percentage_of_nodes_to_score=getattr(args, "percentage_of_nodes_to_score", 100),
    )


def demo_cluster(args: argparse.Namespace) -> ClusterSpec:
    """The cluster file (``--nodes``, default the packaged one), or with ``--generate N`` N nodes of the
    ``--card-mix`` (or the mix of ``--node-list``); raises :class:`ClusterFileError` / ``TraceError``."""
    size = getattr(args, "generate", None)
    if size is None:
        return load_cluster(args.nodes)
    if args.nodes is not None:
        raise ClusterFileError("--nodes and --generate are two ways to say the nodes: give one")
    if args.node_list is not None:
        shapes = mix_from_nodes(read_nodes(args.node_list), source=str(args.node_list))
    else:
        shapes = parse_mix(args.card_mix)
    return generate_cluster(size, shapes, seed=args.seed)


def bare_hints(kubeconfig: Path, user: str) -> str:
    """What ``--bare`` prints: the kubeconfig, and the chart's install, upgrade and uninstall."""
    chart = "--namespace hami-system"
    registry = "--set image.registry=registry.example.com"
    return "\n".join(
        [
            f"  kubeconfig  {kubeconfig}   (user {user}, who may do everything)",
            f"              export KUBECONFIG={kubeconfig}",
            "Install the chart (from a checkout of this repository; no image is pulled: any registry does):",
            f"  helm install hami charts/hami {chart} --create-namespace {registry}",
            f"  kubectl get deployments,daemonsets,mutatingwebhookconfigurations {chart}",
            f"  helm upgrade hami charts/hami {chart} --reuse-values --set scheduler.replicas=2",
            f"  helm uninstall hami {chart}",
            "Only the chart's certificate Jobs run here; its Deployments and DaemonSet are stored, not run"
            " (`hami demo --keep` runs the whole system).",
            "[hami demo] running     until Ctrl-C (the work directory stays)",
        ]
    )


async def submit_all(
    system: EmbeddedSystem, documents: list[JsonDict], *, limit: float = 120.0
) -> tuple[list[str], dict[str, Refused]]:
    """Create the PriorityClasses among ``documents``, then submit the pods in order through the admission
    stand-in: every pod's ``namespace/name``, and the refusals. A pod whose class ranks above a pod
    submitted before it waits (at most ``limit`` seconds) until every earlier pod is decided:
    kube-scheduler takes higher priorities first, and preemption needs the pods it evicts placed."""
    classes = {objects.name(d): d.get("value") for d in documents if d.get("kind") == "PriorityClass"}
    for document in documents:
        if document.get("kind") == "PriorityClass":
            await system.api.create(PRIORITY_CLASSES_PATH, document)
    names: list[str] = []
    refused: dict[str, Refused] = {}
    below = None  # the lowest priority submitted so far
    for pod in (d for d in documents if d.get("kind", "Pod") == "Pod"):
        value = classes.get(str(objects.spec(pod).get("priorityClassName") or ""))
        if isinstance(value, int) and below is not None and below < value:
            await wait_decided(system, names, refused, limit)
        outcome = await system.admission.submit(pod)
        if isinstance(outcome, Admitted):
            names.append(f"{objects.namespace(outcome.pod)}/{objects.name(outcome.pod)}")
            priority = objects.spec(outcome.pod).get("priority")
            if isinstance(priority, int):
                below = priority if below is None else min(below, priority)
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
            if not is_decided(system.scheduler.pods.get(_key(n)), refused.get(n), system.scheduler, name=n)
        ]
        if not undecided or time.monotonic() >= deadline:
            return undecided
        await asyncio.sleep(0.2)


async def final_state(
    system: EmbeddedSystem, names: list[str], refused: Mapping[str, Refused]
) -> dict[str, Any]:
    """Each pod as the apiserver stores it now (None for refused ones)."""
    return {n: None if n in refused else await system.api.get(pods_path(*_key(n))) for n in names}


async def _show(
    system: EmbeddedSystem, examples: list[Example], limit: float, *, keep: bool
) -> tuple[int, list[str], list[str]]:
    """Submit, wait, print the table; the exit code, the pods placed and the pods left pending."""
    pods = [e for e in examples if e.kind == "Pod"]
    names, refused = await submit_all(system, [e.pod for e in examples], limit=limit)
    _say(f"submitted   {len(pods)} example pods ({len(refused)} refused at admission); waiting for decisions")
    undecided = await wait_decided(system, names, refused, limit)
    stored = await final_state(system, names, refused)
    cards = card_index(system.cluster)
    reports = [describe(n, stored[n], refused.get(n), system.scheduler, cards) for n in names]
    # names follow the pods' order; a pod's declared outcome is keyed by the name it was stored under
    expected = {n: e.outcome for n, e in zip(names, pods, strict=True) if e.outcome}
    print()
    print(render(reports, expected if expected else None), flush=True)
    print(
        legend(reports, expected=bool(expected), width=min(shutil.get_terminal_size((100, 24)).columns, 100))
    )
    differ = verdict(reports, expected)
    if expected:
        summary = f"{len(expected) - len(differ)} of {len(expected)} pods became what their example expects"
        print(summary + (f"; not: {', '.join(differ)}" if differ else "."))
    preempted = system.scheduler.preemption.preemptions
    pending = [
        n for n in names if n not in refused and n not in preempted and not read_vgpu_node(stored[n] or {})
    ]
    placed = [n for n in names if n not in refused and n not in preempted and n not in pending]
    if pending and not keep:
        print(
            f"Why a pod is pending, per node, with the nearest fit: run `{hami_command()} demo --keep` and "
            f"follow its hints (`hami explain {pending[0]} ...`)."
        )
    print()
    if undecided:
        print(f"hami demo: not decided within {limit:.0f}s: {', '.join(undecided)}", file=sys.stderr)
        return 1, placed, pending
    return 0, placed, pending


def hami_command() -> str:
    """How a person runs this installation's ``hami`` from here: ``hami`` when that is what PATH finds,
    else the console script beside this interpreter (relative when under the current directory, e.g.
    ``.venv/bin/hami``), else ``python -m hami.cli``."""
    script = Path(sys.executable).parent / "hami"
    if not script.is_file():
        return f"{sys.executable} -m hami.cli"
    found = shutil.which("hami")
    if found and Path(found).resolve() == script.resolve():
        return "hami"
    with contextlib.suppress(ValueError):
        return str(script.absolute().relative_to(Path.cwd()))
    return str(script)


def keep_hints(system: EmbeddedSystem, placed: list[str], pending: list[str]) -> str:
    """What ``--keep`` prints: the kubeconfig, the metrics URLs, and commands to paste (paths that exist
    while the demo runs)."""
    hami = hami_command()
    kubeconfig = system.kubeconfig
    lines = [
        f"  kubeconfig  {kubeconfig}",
        f"              export KUBECONFIG={kubeconfig}",
        "  metrics     "
        + "\n              ".join(f"{url}  ({who})" for who, url in system.metrics_urls.items()),
        f"  logs        {system.supervisor.log_dir}",
        "Try:",
        f"  kubectl --kubeconfig {kubeconfig} get pods -o wide",
    ]
    if placed:
        namespace, _, name = placed[0].partition("/")
        lines.append(
            f"  kubectl --kubeconfig {kubeconfig} -n {namespace} get pod {name} -o yaml"
            "   # hami.io/vgpu-devices-allocated"
        )
    lines += [
        f"  kubectl --kubeconfig {kubeconfig} get nodes -o yaml   # hami.io/node-nvidia-register",
    ]
    if system.scheduler.preemption.preemptions:
        lines.append(
            f"  kubectl --kubeconfig {kubeconfig} get events --field-selector reason=Preempted"
            "   # who was preempted, by which pod"
        )
    if pending:
        lines.append(f"  {hami} explain {pending[0]} --kubeconfig {kubeconfig}")
    lines += [
        f"  {hami} doctor --kubeconfig {kubeconfig}",
        f"  {hami} cordon {system.cluster.nodes[0].name} --list --kubeconfig {kubeconfig}",
    ]
    notes = []
    if hami != "hami":
        activate = Path(sys.prefix) / "bin" / "activate"
        how = f"`source {_here(activate)}` puts it there" if activate.is_file() else "use the path above"
        notes.append(f"(`hami` is not on your PATH: {how})")
    if shutil.which("kubectl") is None:
        notes.append("(no `kubectl` on your PATH: any kubectl works with this kubeconfig)")
    last = "[hami demo] running     until Ctrl-C (which stops every component; the work directory stays)"
    return "\n".join([*lines, *notes, last])


def _here(path: Path) -> str:
    with contextlib.suppress(ValueError):
        return str(path.relative_to(Path.cwd()))
    return str(path)


def _key(name: str) -> tuple[str, str]:
    namespace, _, pod = name.partition("/")
    return namespace, pod


def _say(text: str) -> None:
    print(f"[hami demo] {text}", flush=True)
