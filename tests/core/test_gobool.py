"""Go's ``strconv.ParseBool`` and the ``CUDA_DISABLE_CONTROL`` rule built on it (``hami.core.gobool``).

The webhook (``webhook.isolation``), the node agent (``monitor.allocate_rules``) and the codec
(``nvidia.com/numa-bind``, the registration's health field) read booleans through this one module.
"""

from __future__ import annotations

from typing import Any

import pytest

from hami.core.gobool import ENV_DISABLE_CONTROL, disabling_value, go_bool

#: Go 1.22 strconv.ParseBool: exactly these texts parse; nothing is trimmed, no other case is folded.
GO_TRUE = ["1", "t", "T", "TRUE", "true", "True"]
GO_FALSE = ["0", "f", "F", "FALSE", "false", "False"]
NOT_BOOLEANS = ["", " true", "true ", "tRUE", "yes", "no", "on", "y", "2", "01", "truE", "\u0131"]


@pytest.mark.parametrize("text", GO_TRUE)
def test_go_true_spellings(text: str) -> None:
    assert go_bool(text) is True


@pytest.mark.parametrize("text", GO_FALSE)
def test_go_false_spellings(text: str) -> None:
    assert go_bool(text) is False


@pytest.mark.parametrize("text", NOT_BOOLEANS)
def test_everything_else_is_an_error(text: str) -> None:
    assert go_bool(text) is None


def env(*entries: dict[str, Any]) -> dict[str, Any]:
    return {"name": "c", "env": list(entries)}


@pytest.mark.parametrize("text", GO_TRUE)
def test_a_true_literal_disables_control(text: str) -> None:
    assert disabling_value(env({"name": ENV_DISABLE_CONTROL, "value": text})) == text


@pytest.mark.parametrize("text", [*GO_FALSE, *NOT_BOOLEANS])
def test_false_or_unreadable_literals_do_not(text: str) -> None:
    assert disabling_value(env({"name": ENV_DISABLE_CONTROL, "value": text})) is None


def test_any_true_entry_counts_and_the_first_true_is_named() -> None:
    # HAMi skips a false or unreadable entry and keeps looking
    container = env(
        {"name": ENV_DISABLE_CONTROL, "value": "false"},
        {"name": ENV_DISABLE_CONTROL, "value": "yes"},
        {"name": ENV_DISABLE_CONTROL, "value": "T"},
        {"name": ENV_DISABLE_CONTROL, "value": "1"},
    )
    assert disabling_value(container) == "T"


@pytest.mark.parametrize(
    "entry",
    [
        {"name": ENV_DISABLE_CONTROL, "valueFrom": {"configMapKeyRef": {"name": "x", "key": "y"}}},
        {"name": ENV_DISABLE_CONTROL},  # no value: an empty string for Kubernetes, not true
        {"name": ENV_DISABLE_CONTROL, "value": 1},  # not text (a hand-built dict): not judged
        {"name": ENV_DISABLE_CONTROL, "value": ["1"]},  # unhashable: must not raise
        {"name": "cuda_disable_control", "value": "1"},  # env names are case-sensitive
        {"name": "OTHER", "value": "1"},
    ],
)
def test_only_literal_text_of_the_exact_name_is_judged(entry: dict[str, Any]) -> None:
    assert disabling_value(env(entry)) is None


def test_a_container_without_env_keeps_control() -> None:
    assert disabling_value({"name": "c"}) is None
    assert disabling_value({"name": "c", "env": None}) is None
