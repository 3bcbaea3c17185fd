"""What happened to each demo pod: decided yet, and the table ``hami demo`` prints.

Owns :func:`is_decided` (refused at admission, Running/Failed, preempted, or unschedulable with no
cluster change since the last try), :func:`describe` (one pod -> a :class:`PodReport` read from the
pod's annotations through the codec: node, and per container the cards with memory and cores from
``hami.io/vgpu-devices-allocated`` and each card's enforcement from ``hami.io/vgpu-enforcement``, or why
it is pending; a pod evicted by preemption is ``Preempted``
with the pod it made room for, and that pod names its victims), :func:`render` (fixed-width text; with
the examples' declared outcomes, an EXPECTED column saying whether each pod became what its example
expects), :func:`pending_details` (kube-scheduler's FailedScheduling text made readable: the counts
kube-scheduler puts before each reason become ``(N nodes)`` after it, the reasons the per-node lines
already give are not repeated, and the preemption part loses its doubled full stop), :func:`legend` (the
HAMi words the table shows, explained, wrapped to a width) and :func:`verdict` (the outcomes that
differ). Must not import ``webhook``, ``nodeagent`` or the Kubernetes client.
"""

from __future__ import annotations

import re
import textwrap
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from hami import objects
from hami.annotations import (
    POD_BIND_PHASE,
    POD_DEVICES_ALLOCATED,
    POD_MIG_ALLOCATIONS,
    POD_VGPU_ENFORCEMENT,
    AnnotationError,
    Enforcement,
    decode_mig_allocations,
    decode_pod_devices,
    decode_pod_enforcement,
)
from hami.core.model import Reason
from hami_testkit.admission_standin import Refused
from hami_testkit.cluster import ClusterSpec
from hami_testkit.scheduler_standin import SchedulerStandIn


@dataclass(frozen=True, slots=True, kw_only=True)
class CardLine:
    container: str
    card: str  # "#3 GPU-a837d17c"
    model: str
    memory_mib: int
    cores: int
    profile: str = ""  # MIG profile when the card is in MIG mode
    enforcement: str = "-"  # hami.io/vgpu-enforcement's kind for the card; "-" when not recorded


@dataclass(frozen=True, slots=True, kw_only=True)
class PodReport:
    name: str  # namespace/name
    node: str = ""
    status: str  # Running / Pending / Failed / Refused / ...
    cards: tuple[CardLine, ...] = ()
    details: tuple[str, ...] = field(default_factory=tuple)  # why it is pending / refused / failed


def is_decided(
    pod: Mapping[str, Any] | None, refused: Refused | None, scheduler: SchedulerStandIn, *, name: str = ""
) -> bool:
    if refused is not None:
        return True
    if pod is None:  # gone: decided when preemption evicted it (``name`` is its namespace/name)
        return name in scheduler.preemption.preemptions
    if ((pod.get("status") or {}).get("phase") or "Pending") in ("Running", "Failed", "Succeeded"):
        return True
    return not (pod.get("spec") or {}).get("nodeName") and scheduler.settled(pod)


def card_index(cluster: ClusterSpec) -> dict[str, tuple[int, str]]:
    """uuid -> (position on its node, model) for every card of the cluster."""
    return {
        str(card["uuid"]): (i, str(card.get("model", "")))
        for node in cluster.nodes
        for i, card in enumerate(node.cards)
    }


def describe(
    name: str,
    pod: Mapping[str, Any] | None,
    refused: Refused | None,
    scheduler: SchedulerStandIn,
    cards: Mapping[str, tuple[int, str]],
) -> PodReport:
    if refused is not None:
        return PodReport(name=name, status="Refused", details=(refused.message,))
    evicted = scheduler.preemption.preemptions.get(name)
    if pod is None and evicted is not None:
        made_room = (
            f"by {evicted.preemptor} (priority {evicted.preemptor_priority} > {evicted.victim.priority}) "
            f"on node {evicted.node}, to free the card(s) it needed"
        )
        return PodReport(name=name, node=evicted.node, status="Preempted", details=(made_room,))
    if pod is None:
        return PodReport(name=name, status="Missing", details=("the pod does not exist",))
    spec, status, annotations = objects.spec(pod), objects.status(pod), objects.annotations(pod)
    phase = objects.pod_phase(pod) or "Pending"
    node = objects.node_name(pod)
    if not node:
        attempt = scheduler.attempt(pod)
        if attempt is None:
            return PodReport(name=name, status="Pending", details=("not tried by the scheduler yet",))
        return PodReport(
            name=name, status="Pending", details=pending_details(attempt.message, attempt.failed_nodes)
        )
    bind_phase = annotations.get(POD_BIND_PHASE, "")
    label = phase if not bind_phase else f"{phase} ({bind_phase})"
    details: tuple[str, ...] = ()
    if phase == "Failed":
        details = (f"{status.get('reason', '')}: {status.get('message', '')}",)
    victims = scheduler.preemption.preempted_for.get(name, ())
    if victims:
        gone = ", ".join(f"{v.victim.key} (priority {v.victim.priority})" for v in victims)
        details = (*details, f"preempted {gone} on node {victims[0].node} to make room")
    try:
        lines = _card_lines(spec, annotations, cards)
    except AnnotationError as exc:
        return PodReport(
            name=name, node=node, status=label, details=(*details, f"unreadable annotation: {exc}")
        )
    return PodReport(name=name, node=node, status=label, cards=lines, details=details)


#: kube-scheduler's FitError: ``0/N nodes are available: <count> <reason>, ....`` and, when preemption
#: was tried and could not help, `` preemption: <why>.`` (whose own text may end in a full stop too).
_FIT_ERROR = re.compile(
    r"0/(?P<total>\d+) nodes are available: (?P<counted>.*?)\.(?: preemption: (?P<preemption>.*))?", re.S
)
_NODES_MESSAGE = re.compile(r"0/\d+ nodes are available: (?P<counted>.*?)\.*", re.S)


def pending_details(message: str, failed_nodes: Mapping[str, str]) -> tuple[str, ...]:
    """Why a pod is pending, for the table: kube-scheduler's ``message`` in words, then each node's reason.

    ``0/4 nodes are available: 1 1/1 CardInsufficientMemory, 3 node(s) didn't match Pod's node
    affinity/selector. preemption: 0/4 nodes are available: 4 Preemption is not helpful for scheduling..``
    reads ``0/4 nodes are available: node(s) didn't match Pod's node affinity/selector (3 nodes), the
    others' reasons below; preemption: Preemption is not helpful for scheduling (4 nodes)`` followed by
    ``<node>: 1/1 CardInsufficientMemory``. A message of another shape is kept as it is."""
    per_node = tuple(f"{node}: {reason}" for node, reason in sorted(failed_nodes.items()))
    match = _FIT_ERROR.fullmatch(message.strip())
    if match is None:
        return (message, *per_node) if message else per_node
    known = {f"{count} {reason}" for reason, count in Counter(failed_nodes.values()).items()}
    others = [_per_count(token) for token in _split_counted(match["counted"], known) if token not in known]
    head = f"0/{match['total']} nodes are available"
    if others:
        head += ": " + ", ".join(others) + (", the others' reasons below" if per_node else "")
    elif per_node:
        head += " (each node's reason below)"
    preemption = match["preemption"]
    if preemption is not None:
        nodes = _NODES_MESSAGE.fullmatch(preemption.strip())
        if nodes is not None:
            why = ", ".join(_per_count(token) for token in _split_counted(nodes["counted"], set()))
        else:
            why = preemption.strip().rstrip(".")
        head += f"; preemption: {why}"
    return (head, *per_node)


def _split_counted(text: str, known: set[str]) -> list[str]:
    """``<count> <reason>`` tokens of a FitError list: a HAMi reason may hold ``, `` itself (``1/2 A, 1/2
    B``), so the tokens ``known`` (the per-node reasons with their counts) are matched whole first."""
    tokens: list[str] = []
    rest = text.strip()
    longest_first = sorted(known, key=len, reverse=True)
    while rest:
        token = next((t for t in longest_first if rest == t or rest.startswith(t + ", ")), None)
        if token is None:
            token = rest.partition(", ")[0]
        tokens.append(token)
        rest = rest[len(token) + 2 :]
    return tokens


def _per_count(token: str) -> str:
    """``3 node(s) didn't match`` -> ``node(s) didn't match (3 nodes)``; a token without a count as is."""
    count, _, reason = token.partition(" ")
    if not count.isdigit() or not reason:
        return token
    return f"{reason} ({count} node{'' if count == '1' else 's'})"


def _card_lines(
    spec: Mapping[str, Any], annotations: Mapping[str, str], cards: Mapping[str, tuple[int, str]]
) -> tuple[CardLine, ...]:
    text = annotations.get(POD_DEVICES_ALLOCATED)
    if not text:
        return ()
    names = [
        c.get("name", "?") for c in [*(spec.get("initContainers") or []), *(spec.get("containers") or [])]
    ]
    profiles: dict[tuple[int, int], str] = {}
    enforcement: dict[str, Enforcement] = {}
    unreadable = False
    if annotations.get(POD_VGPU_ENFORCEMENT) is not None:
        try:
            enforcement = decode_pod_enforcement(annotations[POD_VGPU_ENFORCEMENT])
        except AnnotationError:
            unreadable = True  # the cards are still shown; their enforcement is not known
    if annotations.get(POD_MIG_ALLOCATIONS):
        for mig in decode_mig_allocations(annotations[POD_MIG_ALLOCATIONS]):
            profiles[(mig.container_index, mig.device_index)] = mig.profile
    lines = []
    for c, grants in enumerate(decode_pod_devices(text)):
        container = names[c] if c < len(names) else f"#{c}"
        for d, grant in enumerate(grants):
            index, model = cards.get(grant.uuid, (-1, ""))
            short = grant.uuid[:12] if index < 0 else f"#{index} {grant.uuid[:12]}"
            lines.append(
                CardLine(
                    container=container,
                    card=short,
                    model=model,
                    memory_mib=grant.memory_mib,
                    cores=grant.cores,
                    profile=profiles.get((c, d), ""),
                    enforcement="?" if unreadable else _kind(enforcement.get(grant.uuid)),
                )
            )
    return tuple(lines)


def _kind(kind: Enforcement | None) -> str:
    return "-" if kind is None else kind.value


_HEADERS = ("POD", "NODE", "CONTAINER", "CARD", "MODEL", "MEMORY", "CORES", "ENFORCEMENT", "STATUS")

#: What each of HAMi's per-card reason words (docs/protocol.md, "Reasons") says about a card, for the legend.
MEANINGS: Mapping[str, str] = {
    Reason.CARD_NOT_HEALTH: "unhealthy",
    Reason.CARD_CORDONED: "cordoned",
    Reason.CARD_TYPE_MISMATCH: "a type the pod rules out (use-/nouse-gputype, vgpu-mode)",
    Reason.NUMA_NOT_FIT: "not enough cards on one NUMA node (numa-bind)",
    Reason.CARD_UUID_MISMATCH: "ruled out by use-/nouse-gpuuuid",
    Reason.CARD_TIME_SLICING_EXHAUSTED: "shared by as many containers as allowed",
    Reason.EXCLUSIVE_DEVICE_ALLOCATE_CONFLICT: "held exclusively, or the pod wants one alone",
    Reason.RESOURCE_QUOTA_NOT_FIT: "over the namespace's GPU quota",
    Reason.CARD_INSUFFICIENT_MEMORY: "short of free memory",
    Reason.CARD_INSUFFICIENT_CORE: "short of free cores",
    Reason.CARD_COMPUTE_UNITS_EXHAUSTED: "out of compute units",
    Reason.CARD_MIG_TOPOLOGY_INFEASIBLE: "no free MIG placement for the profile",
    Reason.CARD_NOT_FOUND_CUSTOM_FILTER_RULE: "ruled out by a custom filter",
    Reason.ALLOCATED_CARDS_INSUFFICIENT_REQUEST: "n is how many cards (MIG instances) fit, fewer than "
    "the pod asks for",
}
_COUNTED = re.compile(r"\b\d+/\d+ ([A-Za-z]+)")


def legend(reports: Sequence[PodReport], *, expected: bool = False, width: int = 100) -> str:
    """The HAMi words that appear in the table (bind phases, ``n/N Reason``, ...) explained, one entry per
    line, wrapped at ``width`` columns (continuation lines indented); empty when there is nothing to say."""
    entries: list[tuple[int, str]] = []  # (depth, text)
    phases = sorted({r.status.partition("(")[2].rstrip(")") for r in reports if "(" in r.status})
    if phases:
        entries.append(
            (
                0,
                f"({'|'.join(phases)}) = HAMi's hami.io/bind-phase, the node agent's hand-out of the cards "
                "(success: done; allocating: not yet; failed: it could not)",
            )
        )
    words = dict.fromkeys(w for r in reports for d in r.details for w in _COUNTED.findall(d))
    meanings = [(1, f"{w}: {MEANINGS[w]}") for w in words if w in MEANINGS]
    if meanings:
        entries.append((0, "'n/N Word' = n of the node's N cards failed for Word:"))
        entries.extend(meanings)
    if any(Reason.NODE_INSUFFICIENT_DEVICE.value in d for r in reports for d in r.details):
        entries.append(
            (0, f"{Reason.NODE_INSUFFICIENT_DEVICE.value}: the node has fewer cards than asked for")
        )
    if any(r.status == "Preempted" for r in reports):
        entries.append(
            (
                0,
                "Preempted: deleted by kube-scheduler's preemption to free the cards a pod of higher "
                "spec.priority (from its PriorityClass) needed; HAMi's /preempt chose the fewest, "
                "lowest-priority pods on the cards that pod can use (a 'Preempted' Event on each names it)",
            )
        )
    if any(line.enforcement == Enforcement.NONE.value for r in reports for line in r.cards):
        entries.append(
            (
                0,
                "ENFORCEMENT = what holds the container to its slice on the card (hami.io/vgpu-enforcement);"
                " none: nothing, its memory/core limits are not held (a NoEnforcement Event on the pod;"
                " hami doctor warns about the node; hami.io/require-enforcement keeps a pod off it)",
            )
        )
    if expected:
        entries.append((0, "EXPECTED: whether the pod became the '# outcome:' its example declares"))
    if not entries:
        return ""
    width = max(width, 40)
    lines = ["Legend:"]
    for depth, text in entries:
        indent = "  " * (depth + 1)
        lines.append(
            textwrap.fill(
                text,
                width=width,
                initial_indent=indent,
                subsequent_indent=indent + "    ",
                break_long_words=False,
                break_on_hyphens=False,
            )
        )
    return "\n".join(lines)


def outcome(report: PodReport) -> str:
    """What became of the pod, in the examples' words: the first word of its status."""
    return report.status.split(" ", 1)[0]


def verdict(reports: Sequence[PodReport], expected: Mapping[str, str]) -> list[str]:
    """``namespace/name (is X, expected Y)`` for each pod whose outcome differs from its declared one."""
    return [
        f"{r.name} (is {outcome(r)}, expected {expected[r.name]})"
        for r in reports
        if expected.get(r.name) and outcome(r) != expected[r.name]
    ]


def render(reports: Sequence[PodReport], expected: Mapping[str, str] | None = None) -> str:
    """A fixed-width table: one line per granted card, reasons indented under pods without cards.

    With ``expected`` (pod -> declared outcome) an EXPECTED column: ``yes``, ``NO: <outcome>``, or
    ``-`` where the example declares none."""
    headers = _HEADERS if expected is None else (*_HEADERS, "EXPECTED")
    rows: list[tuple[str, ...]] = []
    notes: dict[int, tuple[str, ...]] = {}
    for report in reports:
        mark: tuple[str, ...] = ()
        if expected is not None:
            want = expected.get(report.name, "")
            mark = ("-" if not want else "yes" if outcome(report) == want else f"NO: {want}",)
        if not report.cards:
            rows.append((report.name, report.node or "-", "-", "-", "-", "-", "-", "-", report.status, *mark))
        for i, line in enumerate(report.cards):
            model = f"{line.model} [{line.profile}]" if line.profile else line.model
            rows.append(
                (
                    report.name if i == 0 else "",
                    report.node if i == 0 else "",
                    line.container,
                    line.card,
                    model,
                    f"{line.memory_mib} MiB",
                    f"{line.cores}%",
                    line.enforcement,
                    report.status if i == 0 else "",
                    *(mark if i == 0 else ("",) * len(mark)),
                )
            )
        if report.details:
            notes[len(rows) - 1] = report.details
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)]
    out = ["  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)).rstrip()]
    for n, row in enumerate(rows):
        out.append("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())
        out.extend(f"    {note}" for note in notes.get(n, ()))
    return "\n".join(out)
