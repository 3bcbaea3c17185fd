"""kube-scheduler's preemption rules as the stand-in applies them: which node, who may preempt, the text.

The flow itself (the extender's /preempt, evictions, Events, nomination) is exercised against the
embedded apiserver in test_scheduler_standin.py; these are the pure rules, as tables.
"""

from __future__ import annotations

from typing import Any

import pytest

from hami.objects import start_time
from hami_testkit.preemption_rules import (
    NEVER,
    NO_VICTIMS,
    NOT_HELPFUL,
    TERMINATING,
    Candidate,
    Victim,
    eligible,
    nodes_message,
    pick_one_node,
)


def _victim(name: str, priority: int, started: float = 0.0) -> Victim:
    return Victim(namespace="default", name=name, uid=f"uid-{name}", priority=priority, started=started)


def _candidate(node: str, *victims: Victim, pdb: int = 0) -> Candidate:
    return Candidate(node=node, victims=victims, pdb_violations=pdb)


@pytest.mark.parametrize(
    ("candidates", "chosen"),
    [
        # 1. fewest PodDisruptionBudget violations, before anything else
        ([_candidate("a", _victim("x", 1), pdb=1), _candidate("b", _victim("y", 9), _victim("z", 9))], "b"),
        # 2. the lowest priority of the first victim (kube-scheduler reads Pods[0] as the highest)
        ([_candidate("a", _victim("x", 5)), _candidate("b", _victim("y", 3), _victim("z", 3))], "b"),
        # ... even when a later victim is higher: the extender's order decides
        ([_candidate("a", _victim("x", 4)), _candidate("b", _victim("y", 3), _victim("z", 8))], "b"),
        # 3. the lowest sum of priorities (each + 2^31, so fewer negative-priority pods win)
        ([_candidate("a", _victim("x", -5), _victim("y", -5)), _candidate("b", _victim("z", -5))], "b"),
        (
            [
                _candidate("a", _victim("x", 2), _victim("y", 2)),
                _candidate("b", _victim("z", 2), _victim("w", 1)),
            ],
            "b",
        ),
        # 5. the latest start among the highest-priority victims (younger pods are cheaper to lose)
        (
            [
                _candidate("a", _victim("x", 1, started=100.0)),
                _candidate("b", _victim("y", 1, started=200.0)),
            ],
            "b",
        ),
        (
            [
                _candidate("a", _victim("x", 2, started=300.0), _victim("y", 1, started=50.0)),
                _candidate("b", _victim("z", 2, started=200.0), _victim("w", 1, started=400.0)),
            ],
            "a",
        ),
        # 6. a full tie: the first node by name (kube-scheduler: map order)
        ([_candidate("b", _victim("x", 1)), _candidate("a", _victim("y", 1))], "a"),
    ],
    ids=["pdb", "first-victim", "extender-order", "sum-negative", "sum", "start", "start-of-highest", "tie"],
)
def test_pick_one_node_follows_kube_schedulers_order(candidates: list[Candidate], chosen: str) -> None:
    picked = pick_one_node(candidates)
    assert picked is not None and picked.node == chosen


def test_pick_one_node_of_none_is_none() -> None:
    assert pick_one_node([]) is None


def _pod(name: str, priority: int | None = None, **extra: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {} if priority is None else {"priority": priority}
    spec.update(extra.pop("spec", {}))
    return {
        "metadata": {"name": name, **extra.pop("metadata", {})},
        "spec": spec,
        "status": extra.pop("status", {}),
    }


PREEMPTED = {
    "conditions": [{"type": "DisruptionTarget", "status": "True", "reason": "PreemptionByScheduler"}]
}
DELETING = {"deletionTimestamp": "2026-01-01T00:00:00Z"}


@pytest.mark.parametrize(
    ("pod", "on_nominated_node", "why"),
    [
        (_pod("p", 10), [], ""),
        (_pod("p", 10, spec={"preemptionPolicy": "Never"}), [], NEVER),
        # a victim of an earlier attempt still terminating on the nominated node: wait for it
        (_pod("p", 10), [_pod("v", 1, metadata=DELETING, status=PREEMPTED)], TERMINATING),
        # terminating for another reason, or not a lower priority, or not yet deleted: no reason to wait
        (_pod("p", 10), [_pod("v", 1, metadata=DELETING)], ""),
        (_pod("p", 10), [_pod("v", 10, metadata=DELETING, status=PREEMPTED)], ""),
        (_pod("p", 10), [_pod("v", 1, status=PREEMPTED)], ""),
        (_pod("p"), [_pod("v", -1, metadata=DELETING, status=PREEMPTED)], TERMINATING),  # absent = 0
    ],
    ids=["eligible", "never", "terminating", "other-deletion", "not-lower", "not-deleting", "default-zero"],
)
def test_who_may_preempt(pod: dict[str, Any], on_nominated_node: list[dict[str, Any]], why: str) -> None:
    assert eligible(pod, on_nominated_node) == why


def test_the_message_counts_reasons_as_kube_scheduler_sorts_them() -> None:
    statuses = {"n1": NOT_HELPFUL, "n2": NO_VICTIMS, "n3": NO_VICTIMS}
    assert nodes_message(3, statuses) == (
        "0/3 nodes are available: 1 Preemption is not helpful for scheduling, "
        "2 No preemption victims found for incoming pod."
    )


@pytest.mark.parametrize(
    ("status", "seconds"),
    [({"startTime": "2026-01-01T00:00:10Z"}, 1767225610.0), ({}, 42.0), ({"startTime": "soon"}, 42.0)],
)
def test_start_time_is_now_when_unknown(status: dict[str, Any], seconds: float) -> None:
    assert start_time({"status": status}, now=42.0) == seconds
