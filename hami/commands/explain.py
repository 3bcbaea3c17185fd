"""``hami explain NAMESPACE/POD``: why a pod is pending, per node, in words, and the nearest fit.

Owns the command: read the pod, the nodes, the pods and the pod's namespace ResourceQuotas from any
cluster (the embedded one included), build the same :class:`~hami.scheduler.snapshot.Snapshot` the
extender keeps, and ask the core's :func:`~hami.core.explain.explain_node` about every node (with the
namespace's GPU quota). It says which enforcement the pod requires (its ``hami.io/require-enforcement``
and the cluster's floor, ``--require-enforcement``), which enforcement each node's cards have, and for a
placed pod the enforcement of its cards (``hami.io/vgpu-enforcement``). When no node fits, it also names
the cheapest preemption that would make room
(:func:`~hami.core.explain.cheapest_preemption` over the pods the extender's ``/preempt`` may evict:
bound there, of lower ``spec.priority``), or says that none would. Read-only: writes nothing to the
cluster.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import sys
from collections.abc import Mapping, Sequence
from typing import Any, TextIO

from hami import objects
from hami.annotations import (
    POD_REQUIRE_ENFORCEMENT,
    POD_VGPU_ENFORCEMENT,
    AnnotationError,
    decode_pod_enforcement,
    pod_annotations,
    read_pod_devices,
    read_pod_request,
    read_vgpu_node,
)
from hami.core.allocate import Policy, required
from hami.core.enforcement import LEVEL_WORDS, Enforcement, Level, parse_level
from hami.core.explain import NodeExplanation, cheapest_preemption, explain_node
from hami.core.model import PERCENT_NOT_GIVEN, PodRequest
from hami.core.rejection import Rejection
from hami.devicefile import load_device_config
from hami.kube import nodes as kube_nodes
from hami.kube import pods as kube_pods
from hami.kube import quotas as kube_quotas
from hami.kube.client import KubeError, NotFound, load_api_client
from hami.kube.protocol import KubeApi
from hami.scheduler.nominations import DEFAULT_SCHEDULER, NominationBook, Nominations
from hami.scheduler.quotas import QuotaBook
from hami.scheduler.snapshot import Snapshot
from hami.scheduler.victims import node_holders
from hami.settings import DeviceConfig


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "pod", metavar="NAMESPACE/POD", help="the pod to explain (namespace defaults to 'default')"
    )
    parser.add_argument(
        "--kubeconfig", default=None, help="kubeconfig file (default: in-cluster, then ~/.kube/config)"
    )
    parser.add_argument(
        "--device-config", default=None, help="HAMi device-config YAML (resource names, defaults)"
    )
    parser.add_argument(
        "--node-scheduler-policy", default="binpack", choices=("binpack", "spread", "fragmentation")
    )
    parser.add_argument("--gpu-scheduler-policy", default="spread")
    parser.add_argument(
        "--require-enforcement",
        default="none",
        choices=LEVEL_WORDS,
        help="the cluster's floor, as the scheduler's --require-enforcement (default: none)",
    )


def run(args: argparse.Namespace) -> int:
    namespace, _, name = str(args.pod).rpartition("/")
    try:
        config = load_device_config(args.device_config)
        api = load_api_client(args.kubeconfig, component="hami-explain")
        policy = Policy(
            node_policy=args.node_scheduler_policy,
            gpu_policy=args.gpu_scheduler_policy,
            enforcement=parse_level(args.require_enforcement) or Level.NONE,
        )
        return asyncio.run(explain(api, namespace or "default", name, config, policy, out=sys.stdout))
    except (KubeError, ValueError) as exc:
        print(f"hami explain: {exc}", file=sys.stderr)
        return 2


async def explain(
    api: KubeApi, namespace: str, name: str, config: DeviceConfig, policy: Policy, *, out: TextIO
) -> int:
    """Print the explanation; 0 when the pod is placed or fits somewhere, 1 when it fits nowhere."""
    try:
        pod = await kube_pods.get_pod(api, namespace, name)
    except NotFound:
        print(f"pod {namespace}/{name} not found", file=out)
        return 2
    nodes, _ = await kube_nodes.list_nodes(api)
    pods = await kube_pods.list_pods(api)
    try:
        request = read_pod_request(pod, config)
    except AnnotationError as exc:
        print(f"pod {namespace}/{name} cannot be scheduled: {exc}", file=out)
        return 1
    print(f"pod {namespace}/{name}: {describe_request(request, config)}", file=out)
    if not request.has_devices:
        print("it asks for no GPU resources: the GPU scheduler lets every node pass", file=out)
        return 0
    placed = read_vgpu_node(pod)
    if placed:
        print(f"placed on node {placed}: {describe_grants(pod)}", file=out)
        print(describe_enforcement(pod), file=out)
        return 0
    print(describe_requirement(request, policy), file=out)
    book = QuotaBook(
        memory_resource=config.resources.memory,
        cores_resource=config.resources.cores,
        memory_factor=config.effective_memory_factor,
    )
    # the live view's rules, the allocating horizon included (a leftover unbound allocation is free)
    # cards held for a nominated pod that outranks this one are taken, as /filter counts them
    nominations = Nominations(
        scheduler_name=objects.scheduler_name(pod) or DEFAULT_SCHEDULER, device_config=config, policy=policy
    )
    snapshot = Snapshot(
        count_resource=config.resources.count,
        quotas=book,
        clock=lambda: datetime.datetime.now(datetime.UTC),
        nominations=NominationBook(nominations),
    )
    snapshot.replace_nodes(nodes)
    snapshot.replace_quotas(await kube_quotas.list_resource_quotas(api, namespace))
    snapshot.replace_pods(pods)
    results = explain_all(snapshot, request, objects.priority(pod), policy, (namespace, name))
    print_results(results, out)
    print_enforcement(snapshot, out)
    if any(r.fits for r in results):
        return 0
    print(preemption_option(snapshot, request, pod, policy, (namespace, name)), file=out)
    return 1


def explain_all(
    snapshot: Snapshot, request: PodRequest, priority: int, policy: Policy, key: tuple[str, str]
) -> list[NodeExplanation]:
    now = datetime.datetime.now(datetime.UTC)
    holders: dict[str, dict[str, Any]] = {}
    for (ns, pod_name), record in snapshot.tracked().items():
        if (ns, pod_name) != key:
            holders.setdefault(record.node, {})[f"{ns}/{pod_name}"] = record.usage
    quotas = snapshot.quotas_for(request.namespace, exclude=key)
    results = []
    for entry in sorted(snapshot.entries(), key=lambda e: e.name):
        state = snapshot.candidate(entry.name, now, exclude=key, priority=priority)
        if isinstance(state, Rejection):
            results.append(NodeExplanation(node=entry.name, rejection=state))
            continue
        results.append(explain_node(request, state, policy, quotas=quotas, pods=holders.get(entry.name, {})))
    return results


def preemption_option(
    snapshot: Snapshot, request: PodRequest, pod: Mapping[str, Any], policy: Policy, key: tuple[str, str]
) -> str:
    """One line: the cheapest preemption that would let the pod fit (victims by name and priority, the
    node), or why there is none."""
    if objects.spec(pod).get("preemptionPolicy") == "Never":
        return "preemption: not tried (preemptionPolicy: Never)"
    priority = objects.priority(pod)
    now = datetime.datetime.now(datetime.UTC)
    names: dict[str, str] = {}
    nodes = []
    for entry in sorted(snapshot.entries(), key=lambda e: e.name):
        state = snapshot.candidate(entry.name, now, exclude=key, priority=priority)
        if isinstance(state, Rejection):
            continue
        for (ns, pod_name), _, observed in snapshot.holders(entry.name):
            if observed is not None and observed.meta is not None:
                names[observed.meta.uid] = f"{ns}/{pod_name}"
        holders = node_holders(snapshot, entry.name, exclude=key)
        nodes.append((state, [h for uid, h in holders.by_uid.items() if uid in holders.evictable]))
    quotas = snapshot.quotas_for(request.namespace, exclude=key)
    found = cheapest_preemption(request, priority, nodes, policy, quotas=quotas)
    if found is None:
        return (
            f"preemption: none would make room (no node has pods of priority below {priority} whose "
            "eviction frees enough)"
        )
    victims = ", ".join(f"{names.get(h.uid, h.uid)} (priority {h.priority})" for h in found.added)
    maybe = "" if found.exact else "; found by the greedy pass, maybe not the cheapest"
    return (
        f"preemption: evicting {victims} on node {found.node} would make room (this pod's priority is "
        f"{priority}; kube-scheduler preempts when no node fits{maybe})"
    )


def print_results(results: Sequence[NodeExplanation], out: TextIO) -> None:
    fitting = [r.node for r in results if r.fits]
    print(f"{len(results)} nodes, {len(fitting)} fit{': ' + ', '.join(fitting) if fitting else ''}", file=out)
    width = max((len(r.node) for r in results), default=4)
    for r in results:
        if r.fits:
            continue
        never = "" if r.resolvable else "  (never fits this pod as asked)"
        print(f"  {r.node.ljust(width)}  {r.reason}{never}", file=out)
        for hint in r.hints:
            print(f"  {' ' * width}    - {hint}", file=out)
    if not fitting:
        hinted = [r for r in results if r.distance is not None]
        nearest = min(hinted, key=lambda r: (r.distance or 0.0, r.node), default=None)
        if nearest is not None:
            print(f"nearest fit: node {nearest.node} {nearest.hints[0]}", file=out)


def describe_requirement(request: PodRequest, policy: Policy) -> str:
    """One line: the enforcement level the pod's cards must have, and where it comes from."""
    level = required(request, policy).enforcement
    source = (
        f"the pod's {POD_REQUIRE_ENFORCEMENT}"
        if request.enforcement > policy.enforcement
        else "the cluster's --require-enforcement"
    )
    if level is Level.NONE:
        return "enforcement required: none (any card; a card without enforcement does not hold its limits)"
    return f"enforcement required: {level.word} ({source}); cards below it are not used"


def print_enforcement(snapshot: Snapshot, out: TextIO) -> None:
    """Each node's cards by enforcement (``hami.io/node-enforcement`` as the scheduler reads it)."""
    entries = sorted(snapshot.entries(), key=lambda e: e.name)
    if not entries:
        return
    print("enforcement per node:", file=out)
    width = max(len(e.name) for e in entries)
    for entry in entries:
        if entry.base is None:
            print(f"  {entry.name.ljust(width)}  no usable registration", file=out)
            continue
        counts: dict[str, int] = {}
        for state in entry.base.devices:
            kind = state.device.enforcement.value
            counts[kind] = counts.get(kind, 0) + 1
        text = ", ".join(f"{kind} x{n}" for kind, n in counts.items()) or "no cards"
        print(f"  {entry.name.ljust(width)}  {text}", file=out)


def describe_enforcement(pod: Mapping[str, Any]) -> str:
    """One line: the enforcement of the pod's cards as the scheduler recorded it at bind."""
    text = pod_annotations(pod).get(POD_VGPU_ENFORCEMENT)
    if text is None:
        return f"enforcement: not recorded (no {POD_VGPU_ENFORCEMENT}: bound by HAMi's or an older scheduler)"
    try:
        cards = decode_pod_enforcement(text)
    except AnnotationError as exc:
        return f"enforcement: unreadable: {exc}"
    bare = [uuid for uuid, kind in cards.items() if kind is Enforcement.NONE]
    listed = ", ".join(f"{uuid} {kind.value}" for uuid, kind in cards.items()) or "no cards"
    warning = f"; {', '.join(bare)} without enforcement: its limits are not held" if bare else ""
    return f"enforcement: {listed}{warning}"


def describe_request(request: PodRequest, config: DeviceConfig) -> str:
    names = config.resources
    parts = []
    for position, container in enumerate(request.containers):
        if container is None:
            continue
        kind = "init container" if position < request.init_count else "container"
        memory = (
            f"{names.memory}={container.memory_mib}"
            if container.percentage == PERCENT_NOT_GIVEN
            else f"{names.memory_percentage}={container.percentage}"
        )
        parts.append(
            f"{kind} #{position} asks {names.count}={container.nums} {memory} {names.cores}={container.cores}"
        )
    return "; ".join(parts) or "no GPU request"


def describe_grants(pod: Mapping[str, Any]) -> str:
    try:
        devices = read_pod_devices(pod) or ()
    except AnnotationError as exc:
        return str(exc)
    return "; ".join(
        ", ".join(f"{g.uuid} {g.memory_mib} MiB {g.cores}%" for g in grants) or "-" for grants in devices
    )
