"""SIMULATION ONLY: kube-scheduler's preemption rules, as the preemption stand-in applies them (pure).

Owns :class:`Victim` and :class:`Candidate` (a node and its victims), :func:`victim` (its priority and
start read by the rules the extender reads them by: :func:`hami.objects.priority` and
:func:`hami.objects.start_time`), :func:`eligible` (``preemptionPolicy: Never``; a victim of an earlier
attempt still terminating on the nominated node), :func:`nodes_message` (kube-scheduler's ``0/N nodes
are available: ...`` text) and :func:`pick_one_node` (kube-scheduler's pickOneNodeForPreemption: fewest
PDB violations, the lowest priority of the first victim listed, the lowest sum of priorities, the fewest
victims, the latest start among the highest-priority victims; ties by node name instead of map order).
The flow that uses them is :mod:`hami_testkit.preemption_standin`. Pure: stdlib and :mod:`hami.objects`
only.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from hami import objects

NOT_HELPFUL = "Preemption is not helpful for scheduling"
NO_VICTIMS = "No preemption victims found for incoming pod"
NEVER = "not eligible due to preemptionPolicy=Never."
TERMINATING = "not eligible due to a terminating pod on the nominated node."
NO_CANDIDATE = "no candidate node for preemption"
DISRUPTION_TARGET = "DisruptionTarget"
PREEMPTION_BY_SCHEDULER = "PreemptionByScheduler"
_INT32 = 2**31


@dataclass(frozen=True, slots=True, kw_only=True)
class Victim:
    """A pod evicted (or to be evicted) for the preemptor."""

    namespace: str
    name: str
    uid: str
    priority: int
    started: float  # Unix seconds: hami.objects.start_time (status.startTime, else now)

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True, slots=True, kw_only=True)
class Candidate:
    """One node the preemptor could take once ``victims`` are gone."""

    node: str
    victims: tuple[Victim, ...]
    pdb_violations: int = 0


def victim(pod: Mapping[str, Any], now: float) -> Victim:
    return Victim(
        namespace=objects.namespace(pod),
        name=objects.name(pod),
        uid=objects.uid(pod),
        priority=objects.priority(pod),
        started=objects.start_time(pod, now),
    )


def terminating_by_preemption(pod: Mapping[str, Any]) -> bool:
    """Being deleted with the scheduler's ``DisruptionTarget`` condition."""
    if not objects.meta(pod).get("deletionTimestamp"):
        return False
    for condition in objects.status(pod).get("conditions") or []:
        if isinstance(condition, Mapping) and condition.get("type") == DISRUPTION_TARGET:
            return condition.get("status") == "True" and condition.get("reason") == PREEMPTION_BY_SCHEDULER
    return False


def eligible(pod: Mapping[str, Any], nominated_node_pods: Iterable[Mapping[str, Any]]) -> str:
    """Why the pod may not preempt now ("" when it may): ``preemptionPolicy: Never``, or a lower-priority
    pod on its nominated node still terminating by preemption (victims of an earlier attempt)."""
    if objects.spec(pod).get("preemptionPolicy") == "Never":
        return NEVER
    own = objects.priority(pod)
    if any(objects.priority(p) < own and terminating_by_preemption(p) for p in nominated_node_pods):
        return TERMINATING
    return ""


def nodes_message(total: int, statuses: Mapping[str, str]) -> str:
    """kube-scheduler's FitError text: ``0/N nodes are available: <count> <reason>, ....`` (the counted
    reasons sorted as text)."""
    counted = sorted(f"{count} {reason}" for reason, count in Counter(statuses.values()).items())
    return f"0/{total} nodes are available: {', '.join(counted)}."


def _earliest_start_of_highest(victims: Sequence[Victim]) -> float:
    """kube-scheduler's GetEarliestPodStartTime: the earliest start among the highest-priority victims."""
    highest = max(v.priority for v in victims)
    return min(v.started for v in victims if v.priority == highest)


def pick_one_node(candidates: Sequence[Candidate]) -> Candidate | None:
    """kube-scheduler's pickOneNodeForPreemption; ties go to the first node by name."""
    if not candidates:
        return None
    scores: tuple[Callable[[Candidate], float], ...] = (
        lambda c: -c.pdb_violations,
        lambda c: -c.victims[0].priority,  # kube-scheduler takes Pods[0] as the highest priority
        lambda c: -sum(v.priority + _INT32 for v in c.victims),
        lambda c: -len(c.victims),
        lambda c: _earliest_start_of_highest(c.victims),
    )
    left = sorted(candidates, key=lambda c: c.node)
    for score in scores:
        best = max(score(c) for c in left)
        left = [c for c in left if score(c) == best]
        if len(left) == 1:
            break
    return left[0]
