"""The one HOST:PORT parser, the one number parser and the HAMI_<FLAG> env fallback every service uses."""

from __future__ import annotations

from typing import Any

import pytest

from hami.process.flags import (
    Address,
    env_default,
    env_name,
    parse_address,
    parse_bool,
    parse_number,
    parse_whole,
)


class FlagError(ValueError):
    """A service's own error class: the parser raises what the caller asks for."""


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("0.0.0.0:9394", Address(host="0.0.0.0", port=9394)),
        ("127.0.0.1:0", Address(host="127.0.0.1", port=0)),
        ("[::]:9394", Address(host="::", port=9394)),
        ("[fe80::1%eth0]:80", Address(host="fe80::1%eth0", port=80)),
        ("hami-scheduler.kube-system.svc:443", Address(host="hami-scheduler.kube-system.svc", port=443)),
        (":9395", Address(host="0.0.0.0", port=9395)),  # Go's form, HAMi's defaults
        ("localhost:65535", Address(host="localhost", port=65535)),
    ],
)
def test_host_port(text: str, expected: Address) -> None:
    assert parse_address("listen", text) == expected


@pytest.mark.parametrize(
    "text",
    [
        "",
        "9394",
        "host:",
        "host:port",
        "host:70000",
        "host:-1",
        "host:+80",
        "host: 80",
        "host:٨٠",  # Arabic-Indic digits: int() reads 80
        "host:²",  # a digit to str.isdigit, not to int()
        "host:" + "9" * 5000,  # int() refuses more than 4300 digits with its own ValueError
        "[]:80",
        "[::1:80",
        "ho st:80",
        "host\n:80",
        "h/x:80",
    ],
)
def test_bad_addresses_name_the_flag_and_text(text: str) -> None:
    with pytest.raises(FlagError) as raised:
        parse_address("metrics-listen", text, FlagError)
    assert str(raised.value).startswith(f"--metrics-listen must be HOST:PORT, got {text!r}")


def test_an_ipv6_address_needs_its_brackets() -> None:
    # "::1:80" is the host ::1 on port 80, or the address ::1:80 with its port missing
    with pytest.raises(FlagError, match=r"an IPv6 address goes in brackets, e\.g\. \[::1\]:80"):
        parse_address("listen", "::1:80", FlagError)


@pytest.mark.parametrize(
    "address",
    [Address(host="::1", port=8443), Address(host="0.0.0.0", port=0), Address(host="example.org", port=1)],
)
def test_an_address_prints_as_it_is_parsed(address: Address) -> None:
    assert parse_address("listen", str(address)) == address
    assert str(Address(host="::1", port=8443)) == "[::1]:8443"


def test_env_fallback() -> None:
    assert env_name("node-lock-timeout") == "HAMI_NODE_LOCK_TIMEOUT"
    assert env_default("node-lock-timeout", "300", {"HAMI_NODE_LOCK_TIMEOUT": "60"}) == "60"
    assert env_default("node-lock-timeout", "300", {"NODE_LOCK_TIMEOUT": "60"}) == "300"
    assert env_default("kubeconfig", None, {}) is None


@pytest.mark.parametrize(
    ("text", "bounds", "message"),
    [
        ("soon", {"unit": "seconds"}, "--f must be a number of seconds, got 'soon'"),
        ("nan", {}, "--f must be a number, got 'nan'"),  # a NaN deadline never passes
        ("inf", {"positive": True}, "--f must be a number, got 'inf'"),  # an infinite wait never ends
        ("-inf", {}, "--f must be a number, got '-inf'"),
        ("0", {"positive": True}, "--f must be positive, got '0'"),
        (
            "29",
            {"minimum": 0, "maximum": 28, "unit": "seconds"},
            "--f must be between 0 and 28 seconds, got '29'",
        ),
        ("0.001", {"minimum": 0.01}, "--f must be at least 0.01, got '0.001'"),
        ("2e9", {"maximum": 10**9}, "--f must be at most 1000000000, got '2e9'"),
    ],
)
def test_a_number_flag_is_finite_and_within_its_bounds(
    text: str, bounds: dict[str, Any], message: str
) -> None:
    with pytest.raises(FlagError) as caught:
        parse_number("f", text, error=FlagError, **bounds)
    assert str(caught.value) == message


def test_numbers_in_bounds_are_read() -> None:
    assert parse_number("f", "28", minimum=0, maximum=28) == 28.0
    assert parse_number("f", " 1.5e1 ", positive=True) == 15.0
    assert parse_whole("f", "1024", unit="bytes", minimum=1024) == 1024
    with pytest.raises(ValueError, match=r"^--f must be a whole number of bytes, got '1KiB'$"):
        parse_whole("f", "1KiB", unit="bytes")
    with pytest.raises(ValueError, match=r"^--f must be between 1 and 3, got '4'$"):
        parse_whole("f", "4", minimum=1, maximum=3)


@pytest.mark.parametrize(
    ("text", "value"),
    [
        *[("1", True), ("true", True), (" TRUE ", True), ("yes", True), ("On", True)],
        *[("0", False), ("false", False), ("No", False), ("off", False), ("", False)],
    ],
)
def test_one_switch_rule_for_every_service(text: str, value: bool) -> None:
    """The webhook's env switches and the agent's true/false flags read alike (the agent refused "on")."""
    assert parse_bool("--f", text, FlagError) is value


@pytest.mark.parametrize("text", ["maybe", "2", "t", "enabled"])
def test_anything_else_is_not_a_switch(text: str) -> None:
    with pytest.raises(FlagError) as caught:
        parse_bool("HAMI_F", text, FlagError)
    assert str(caught.value) == f"HAMI_F must be true or false, got {text!r}"
