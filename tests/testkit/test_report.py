"""The demo's table: whether each pod became what its example declares, and HAMi's words explained."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, cast

from hami_testkit.report import CardLine, PodReport, describe, legend, render, verdict
from hami_testkit.scheduler_standin import Attempt, SchedulerStandIn

RUNNING = PodReport(
    name="default/a",
    node="n1",
    status="Running (success)",
    cards=(CardLine(container="c", card="#0 GPU-1", model="A10", memory_mib=100, cores=10),),
)
PENDING = PodReport(
    name="default/b",
    status="Pending",
    details=(
        "n1: 1/4 CardInsufficientMemory, 3/4 AllocatedCardsInsufficientRequest",
        "n2: NodeInsufficientDevice",
    ),
)
REFUSED = PodReport(name="default/c", status="Refused", details=("container c is privileged",))


def test_the_expected_column_says_whether_each_outcome_is_the_declared_one() -> None:
    table = render([RUNNING, PENDING, REFUSED], {"default/a": "Running", "default/b": "Running"})
    header, a, b, _why, _why2, c, _ = table.splitlines()
    assert header.split()[-1] == "EXPECTED"
    assert a.endswith("Running (success)  yes")
    assert b.endswith("Pending            NO: Running")
    assert c.endswith("Refused            -")


def test_without_declared_outcomes_the_table_is_unchanged() -> None:
    assert "EXPECTED" not in render([RUNNING, PENDING])


def test_verdict_lists_only_the_outcomes_that_differ() -> None:
    expected = {"default/a": "Running", "default/b": "Running", "default/c": "Refused"}
    assert verdict([RUNNING, PENDING, REFUSED], expected) == ["default/b (is Pending, expected Running)"]


def test_the_legend_explains_the_words_in_the_table_and_only_those() -> None:
    line = " ".join(legend([RUNNING, PENDING, REFUSED], expected=True, width=1000).split())
    assert line.startswith("Legend: ")
    assert "(success) = HAMi's hami.io/bind-phase" in line
    assert "'n/N Word' = n of the node's N cards failed for Word" in line
    assert "CardInsufficientMemory: short of free memory" in line
    assert "AllocatedCardsInsufficientRequest: n is how many cards (MIG instances) fit" in line
    assert "NodeInsufficientDevice: the node has fewer cards than asked for" in line
    assert "EXPECTED:" in line
    assert "CardTypeMismatch" not in line  # not in this table
    assert legend([REFUSED]) == ""


PREEMPTED = PodReport(
    name="default/d",
    node="n1",
    status="Preempted",
    details=("by default/e (priority 1000 > 10) on node n1, to free the card(s) it needed",),
)


def test_a_preempted_pod_is_an_outcome_and_the_legend_says_what_preemption_did() -> None:
    assert verdict([PREEMPTED], {"default/d": "Preempted"}) == []
    table = render([PREEMPTED], {"default/d": "Preempted"})
    assert table.splitlines()[1].endswith("Preempted  yes")
    line = " ".join(legend([RUNNING, PREEMPTED]).split())
    assert "Preempted: deleted by kube-scheduler's preemption to free the cards a pod of higher" in line
    assert "a 'Preempted' Event on each names it" in line
    assert "Preempted" not in legend([RUNNING, PENDING, REFUSED], expected=True)


class _Preemption:
    preemptions: dict[str, Any] = {}  # noqa: RUF012  (read only)
    preempted_for: dict[str, Any] = {}  # noqa: RUF012


class _Scheduler:
    """What :func:`describe` asks the kube-scheduler stand-in: the pod's last attempt, the preemptions."""

    def __init__(self, attempt: Attempt) -> None:
        self.preemption = _Preemption()
        self._attempt = attempt

    def attempt(self, pod: Mapping[str, Any]) -> Attempt:
        return self._attempt


def _pending(message: str, failed: dict[str, str]) -> PodReport:
    attempt = Attempt(kind="unschedulable", message=message, generation=1, retry_at=0.0, failed_nodes=failed)
    pod = {"metadata": {"name": "b", "namespace": "default"}, "spec": {}, "status": {"phase": "Pending"}}
    return describe("default/b", pod, None, cast(SchedulerStandIn, _Scheduler(attempt)), {})


def test_a_pending_pods_reasons_read_as_words_not_as_kube_schedulers_counts() -> None:
    """kube-scheduler's text puts a node count before each reason (``1 1/1 CardInsufficientMemory``) and
    ends the preemption part in ``..``; the table says each node's reason once, counts after reasons."""
    report = _pending(
        "0/4 nodes are available: 1 1/1 CardInsufficientMemory, 1 2/2 CardInsufficientMemory, "
        "1 4/4 CardInsufficientMemory, 1 8/8 CardInsufficientMemory. preemption: 0/4 nodes are "
        "available: 4 Preemption is not helpful for scheduling..",
        {"a10": "2/2 CardInsufficientMemory", "a100": "8/8 CardInsufficientMemory",
         "mig": "1/1 CardInsufficientMemory", "v100": "4/4 CardInsufficientMemory"},
    )  # fmt: skip
    assert report.details == (
        "0/4 nodes are available (each node's reason below); "
        "preemption: Preemption is not helpful for scheduling (4 nodes)",
        "a10: 2/2 CardInsufficientMemory",
        "a100: 8/8 CardInsufficientMemory",
        "mig: 1/1 CardInsufficientMemory",
        "v100: 4/4 CardInsufficientMemory",
    )
    table = render([report])
    assert not re.search(r"\b\d+ \d+/\d+ ", table) and ".." not in table, table


def test_reasons_no_node_line_gives_keep_their_count_and_a_reason_with_a_comma_stays_whole() -> None:
    report = _pending(
        "0/3 nodes are available: 1 1/1 CardMigTopologyInfeasible, 2/1 AllocatedCardsInsufficientRequest, "
        "2 node(s) didn't match Pod's node affinity/selector. preemption: not eligible due to "
        "preemptionPolicy=Never..",
        {"mig": "1/1 CardMigTopologyInfeasible, 2/1 AllocatedCardsInsufficientRequest"},
    )
    assert report.details == (
        "0/3 nodes are available: node(s) didn't match Pod's node affinity/selector (2 nodes), the others' "
        "reasons below; preemption: not eligible due to preemptionPolicy=Never",
        "mig: 1/1 CardMigTopologyInfeasible, 2/1 AllocatedCardsInsufficientRequest",
    )


def test_a_message_of_another_shape_is_shown_as_it_is() -> None:
    report = _pending("filter: HTTP 500 from the extender", {})
    assert report.details == ("filter: HTTP 500 from the extender",)


def test_the_legend_is_wrapped_to_the_width_one_entry_per_line() -> None:
    """Before: one line of about 1,000 characters."""
    reports = [RUNNING, PENDING, REFUSED, PREEMPTED]
    for width in (100, 60):
        lines = legend(reports, expected=True, width=width).splitlines()
        assert lines[0] == "Legend:" and len(lines) > 6, lines
        assert all(len(line) <= width for line in lines), lines
    text = legend(reports, expected=True)
    assert "\n    CardInsufficientMemory: short of free memory\n" in text
    assert "\n  EXPECTED: whether the pod became" in text
