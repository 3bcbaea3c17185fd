"""Go's value rules, one of each: float32 rounding and encoding/json's case-insensitive keys.

Go's decoder matches a JSON key to a field exactly, else case-insensitively, and assigns in document
order, so of two keys naming one field the later one wins, whatever their case. The codec (node
registration, tests/annotations) and the extender's wire JSON (tests/scheduler/test_filter.py) both read
keys through :func:`fold_keys`.
"""

from __future__ import annotations

from hami.core.gocompat import f32, fold_keys


def test_f32_rounds_to_the_nearest_float32() -> None:
    assert f32(0.1) == 0.10000000149011612 and f32(0.5) == 0.5
    assert f32(1 / 3) == f32(11184811 / 2**25) and 1 / 3 != 11184811 / 2**25


def test_fold_keys_lower_cases_and_the_later_key_wins() -> None:
    assert fold_keys({"Pod": 1, "NODENAMES": 2}) == {"pod": 1, "nodenames": 2}
    assert fold_keys({"id": "a", "ID": "b"}) == {"id": "b"}
    assert fold_keys({"ID": "b", "id": "a"}) == {"id": "a"}
