"""Kubernetes quantity parser: exact values, Go's AsInt64 "plain integer" view, explicit errors."""

from __future__ import annotations

import time
from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hami.core.quantity import SUFFIXES, QuantityError, parse_quantity, plain_int


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("0", Fraction(0)),
        ("1", Fraction(1)),
        ("+7", Fraction(7)),
        ("-3", Fraction(-3)),
        ("500m", Fraction(1, 2)),
        ("1.5", Fraction(3, 2)),
        (".5", Fraction(1, 2)),
        ("5.", Fraction(5)),
        ("1k", Fraction(1000)),
        ("1.5k", Fraction(1500)),
        ("2M", Fraction(2_000_000)),
        ("1E", Fraction(10**18)),  # "E" alone is exa, not an exponent
        ("1e3", Fraction(1000)),
        ("1E-2", Fraction(1, 100)),
        ("1e+2", Fraction(100)),
        ("3n", Fraction(3, 10**9)),
        ("3u", Fraction(3, 10**6)),
        ("1Ki", Fraction(1024)),
        ("16Gi", Fraction(16 * 2**30)),
        ("0.5Ki", Fraction(512)),
        ("16.0Gi", Fraction(16 * 2**30)),
    ],
)
def test_exact_values(text: str, value: Fraction) -> None:
    assert parse_quantity(text).value == value


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("1", 1),
        ("0", 0),
        ("-4", -4),
        ("007", 7),
        ("1k", 1000),
        ("1.5k", 1500),  # scale 3 - 1 fractional digit = 2 >= 0: Go's fast path gives 1500
        ("2e3", 2000),
        ("16Gi", 16 * 2**30),
        ("1024", 1024),
        ("999999999999999999", 10**18 - 1),  # 18 digits: the most Go's int64 fast path keeps
        ("9223372036854775807", None),  # INT64_MAX has 19 digits, so Go leaves the fast path
        # Go keeps the digits as written: a negative scale is "not ok" even for whole values.
        ("1.0", None),
        ("1000m", None),
        ("16.0Gi", None),  # binary suffix with a fraction leaves Go's int64 fast path
        ("0.5Ki", None),
        ("1.5", None),
        ("500m", None),
        ("1e-1", None),
        ("-9223372036854775807", None),  # -INT64_MAX: in range, beyond Go's fast path
        ("9E", 9 * 10**18),  # one digit, scale 18: Go's fast path, and it fits int64
        ("1Ei", None),  # 2^60 fits int64 but Go's binary fast path gives up (precision < 0)
        ("100000Gi", None),  # likewise: 6 digits + Gi exceed the fast path's precision
    ],
)
def test_plain_int_mirrors_go_as_int64(text: str, expected: int | None) -> None:
    assert plain_int(text) == expected


@pytest.mark.parametrize(
    "text", ["", " 1", "1 ", "abc", "1K", "1kb", "1e", "1Mib", "--1", "1.2.3", ".", "e3", "0x10"]
)
def test_malformed_quantities_raise_with_the_text(text: str) -> None:
    with pytest.raises(QuantityError) as caught:
        parse_quantity(text)
    assert caught.value.text == text
    assert repr(text) in str(caught.value)
    assert isinstance(caught.value, ValueError)


def test_suffix_table_covers_decimal_and_binary_si() -> None:
    assert set(SUFFIXES) == {
        "",
        "n",
        "u",
        "m",
        "k",
        "M",
        "G",
        "T",
        "P",
        "E",
        "Ki",
        "Mi",
        "Gi",
        "Ti",
        "Pi",
        "Ei",
    }
    for suffix, (base, exponent) in SUFFIXES.items():
        assert parse_quantity(f"3{suffix}").value == 3 * Fraction(base) ** exponent


@given(st.integers(min_value=-(10**17), max_value=10**17))
def test_every_plain_decimal_integer_round_trips(number: int) -> None:
    quantity = parse_quantity(str(number))
    assert quantity.value == number
    assert quantity.plain_int == number


@given(st.text(alphabet="0123456789", min_size=1, max_size=25))
def test_plain_digits_read_as_the_grammar_reads_them(digits: str) -> None:
    """Unsigned digit strings (the common case, read without the grammar) give what the grammar gives
    for the same digits behind a "+" sign: leading zeros, and 18 against 19 digits (Go's int64 fast path)
    included."""
    try:
        through_grammar = parse_quantity("+" + digits)
    except QuantityError as exc:
        with pytest.raises(QuantityError, match="out of range"):
            parse_quantity(digits)
        assert "out of range" in str(exc)
        return
    quantity = parse_quantity(digits)
    assert (quantity.text, quantity.value, quantity.plain_int) == (
        digits,
        through_grammar.value,
        through_grammar.plain_int,
    )


# Go's binary fast path keeps 15 - digits - exponent*0.3 - 1 >= 0 digits of precision: 3 digits for Gi.
@given(st.integers(min_value=0, max_value=999), st.sampled_from(["Ki", "Mi", "Gi"]))
def test_binary_suffixes_are_plain_integers(number: int, suffix: str) -> None:
    base, exponent = SUFFIXES[suffix]
    assert plain_int(f"{number}{suffix}") == number * base**exponent


# ------------------------------------------------------------------------------- hostile quantities


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("1e10000000", "larger than"),  # valid syntax: computed exactly it took 32 s
        ("-1e10000000", "larger than"),
        ("1e-10000000", "smaller than 1n"),
        ("9223372036854775808", "larger than"),  # INT64_MAX + 1
        ("10E", "larger than"),
        ("8Ei", "larger than"),  # 2^63: Kubernetes caps it at 2^63 - 1, we refuse
        ("0.5n", "smaller than 1n"),  # Kubernetes rounds up to 1n, we refuse
        ("1e2147483648", "does not fit in 32 bits"),
        ("1" * 65, "longer than 64 characters"),
        ("0" * 5000 + "1", "longer than 64 characters"),
        ("9" * 5000, "longer than 64 characters"),
        ("1e" + "9" * 5000, "longer than 64 characters"),
    ],
)
def test_out_of_range_quantities_are_refused_before_any_arithmetic(text: str, why: str) -> None:
    started = time.process_time()  # CPU time: a parallel test run on the same cores does not count
    with pytest.raises(QuantityError, match=why):
        parse_quantity(text)
    assert time.process_time() - started < 0.5


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("9223372036854775807", Fraction(2**63 - 1)),  # the largest value kept
        ("-9223372036854775807", Fraction(-(2**63) + 1)),
        ("1n", Fraction(1, 10**9)),  # the smallest value other than 0 kept
        ("0.000000001", Fraction(1, 10**9)),
        ("7Ei", Fraction(7 * 2**60)),
        ("0e2147483647", Fraction(0)),  # zero whatever the exponent, without computing 10 ** exponent
        ("0.00000000000000000000000000000000000000000000000000001e44", Fraction(1, 10**9)),
    ],
)
def test_values_at_the_bounds(text: str, value: Fraction) -> None:
    assert parse_quantity(text).value == value


def test_unicode_digits_are_not_digits() -> None:
    for text in ("١٢", "１２", "१Gi", "1e٣"):
        with pytest.raises(QuantityError):
            parse_quantity(text)


@settings(max_examples=300, deadline=None)
@given(
    st.one_of(
        st.text(),
        st.text(alphabet="0123456789.eE+-kMGTPimnu", max_size=80),
        st.tuples(st.integers(-(10**12), 10**12), st.integers(-(10**12), 10**12)).map(
            lambda t: f"{t[0]}e{t[1]}"
        ),
    )
)
def test_only_quantity_errors_escape(text: str) -> None:
    try:
        quantity = parse_quantity(text)
    except QuantityError:
        return
    assert quantity.value == 0 or Fraction(1, 10**9) <= abs(quantity.value) <= 2**63 - 1
