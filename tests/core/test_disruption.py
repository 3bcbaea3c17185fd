"""kube-scheduler's PodDisruptionBudget rule (filterPodsWithPDBViolation) as a table: which pods a budget
protects, and which budgets cannot be read."""

from __future__ import annotations

from typing import Any

import pytest

from hami.core.disruption import BudgetError, read_budget, violates


def pdb(selector: Any, allowed: Any = 0, namespace: str = "ns", **status: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": "b", "namespace": namespace},
        "spec": {"selector": selector},
        "status": {"disruptionsAllowed": allowed, **status},
    }


APP_DB = {"matchLabels": {"app": "db"}}


@pytest.mark.parametrize(
    ("budget", "namespace", "name", "labels", "expected"),
    [
        (pdb(APP_DB), "ns", "p", {"app": "db"}, True),
        (pdb(APP_DB, allowed=1), "ns", "p", {"app": "db"}, False),  # a disruption left
        (pdb(APP_DB, allowed=-2), "ns", "p", {"app": "db"}, True),
        (pdb(APP_DB), "other", "p", {"app": "db"}, False),  # budgets are namespaced
        (pdb(APP_DB), "ns", "p", {"app": "web"}, False),
        (pdb(APP_DB), "ns", "p", {}, False),
        (pdb({}), "ns", "p", {"app": "db"}, False),  # an empty selector matches nothing here
        (pdb(None), "ns", "p", {"app": "db"}, False),  # so does an absent one
        (pdb(APP_DB, disruptedPods={"p": "2026-05-01T09:00:00Z"}), "ns", "p", {"app": "db"}, False),
        (pdb(APP_DB, disruptedPods={"q": "2026-05-01T09:00:00Z"}), "ns", "p", {"app": "db"}, True),
        (
            {"metadata": {"name": "b", "namespace": "ns"}, "spec": {"selector": APP_DB}},
            "ns",
            "p",
            {"app": "db"},
            True,  # no status yet: disruptionsAllowed reads 0
        ),
        (
            pdb({"matchExpressions": [{"key": "app", "operator": "In", "values": ["db", "x"]}]}),
            "ns",
            "p",
            {"app": "db"},
            True,
        ),
        (
            pdb({"matchExpressions": [{"key": "app", "operator": "NotIn", "values": ["db"]}]}),
            "ns",
            "p",
            {"app": "db"},
            False,
        ),
        (
            pdb({"matchExpressions": [{"key": "app", "operator": "NotIn", "values": ["db"]}]}),
            "ns",
            "p",
            {},
            True,
        ),  # NotIn matches a pod without the label, as labels.Selector does
        (pdb({"matchExpressions": [{"key": "app", "operator": "Exists"}]}), "ns", "p", {"app": ""}, True),
        (
            pdb({"matchExpressions": [{"key": "app", "operator": "DoesNotExist"}]}),
            "ns",
            "p",
            {"app": "x"},
            False,
        ),
        (
            pdb({"matchLabels": {"app": "db"}, "matchExpressions": [{"key": "tier", "operator": "Exists"}]}),
            "ns",
            "p",
            {"app": "db"},
            False,
        ),  # requirements are ANDed
    ],
)
def test_which_pods_a_budget_protects(
    budget: dict[str, Any], namespace: str, name: str, labels: dict[str, str], expected: bool
) -> None:
    assert violates([read_budget(budget)], namespace, name, labels) is expected


@pytest.mark.parametrize(
    "budget",
    [
        pdb({"matchExpressions": [{"key": "app", "operator": "Matches", "values": ["db"]}]}),
        pdb({"matchExpressions": [{"key": "app", "operator": "In", "values": []}]}),
        pdb({"matchExpressions": [{"key": "app", "operator": "Exists", "values": ["db"]}]}),
        pdb({"matchExpressions": [{"operator": "Exists"}]}),
        pdb({"matchExpressions": ["app"]}),
        pdb({"matchLabels": {"app": 1}}),
        pdb({"matchLabels": ["app"]}),
        pdb("app=db"),
        pdb(APP_DB, allowed="0"),
        pdb(APP_DB, allowed=True),
        pdb(APP_DB, disruptedPods=["p"]),
        pdb(APP_DB, namespace=""),
        {"metadata": {"name": "b", "namespace": "ns"}, "spec": [], "status": {}},
    ],
)
def test_unreadable_budgets_are_refused(budget: dict[str, Any]) -> None:
    with pytest.raises(BudgetError):
        read_budget(budget)


def test_any_violated_budget_counts_and_none_is_none() -> None:
    roomy, spent = read_budget(pdb(APP_DB, allowed=3)), read_budget(pdb({"matchLabels": {"tier": "a"}}))
    assert violates([roomy, spent], "ns", "p", {"app": "db", "tier": "a"})
    assert not violates([roomy], "ns", "p", {"app": "db", "tier": "a"})
    assert not violates([], "ns", "p", {"app": "db"})
