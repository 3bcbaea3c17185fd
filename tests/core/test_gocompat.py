"""Go's value rules, one of each (``hami.core.gocompat``): float32 rounding, encoding/json's
case-insensitive keys, ``strconv.ParseBool`` and the ``CUDA_DISABLE_CONTROL`` rule built on it.

Go's decoder matches a JSON key to a field exactly, else case-insensitively, and assigns in document
order, so of two keys naming one field the later one wins, whatever their case. The codec (node
registration, tests/annotations) and the extender's wire JSON (tests/scheduler/test_filter.py) both read
keys through :func:`fold_keys`. The webhook (``webhook.isolation``), the node agent
(``nodeagent.allocate_rules``) and the codec (``nvidia.com/numa-bind``, the registration's health field)
read booleans through :func:`go_bool`.
"""

from __future__ import annotations

from typing import Any

import pytest

from hami.core.gocompat import ENV_DISABLE_CONTROL, disabling_value, f32, fold_keys, go_bool

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


def test_f32_rounds_to_the_nearest_float32() -> None:
    assert f32(0.1) == 0.10000000149011612 and f32(0.5) == 0.5
    assert f32(1 / 3) == f32(11184811 / 2**25) and 1 / 3 != 11184811 / 2**25


def test_fold_keys_lower_cases_and_the_later_key_wins() -> None:
    assert fold_keys({"Pod": 1, "NODENAMES": 2}) == {"pod": 1, "nodenames": 2}
    assert fold_keys({"id": "a", "ID": "b"}) == {"id": "b"}
    assert fold_keys({"ID": "b", "id": "a"}) == {"id": "a"}
