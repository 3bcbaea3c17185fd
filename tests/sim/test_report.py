"""The demo's table: whether each pod became what its example declares, and HAMi's words explained."""

from __future__ import annotations

from hami.sim.report import CardLine, PodReport, legend, render, verdict

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
    line = legend([RUNNING, PENDING, REFUSED], expected=True)
    assert "\n" not in line and line.startswith("Legend: ")
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
    line = legend([RUNNING, PREEMPTED])
    assert "Preempted: deleted by kube-scheduler's preemption to free the cards a pod of higher" in line
    assert "a 'Preempted' Event on each names it" in line
    assert "Preempted" not in legend([RUNNING, PENDING, REFUSED], expected=True)
