"""Node lock value (docs/protocol.md, "Node lock") and handshake (docs/protocol.md, "Handshake")."""

from __future__ import annotations

import datetime

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hami.annotations import (
    NODE_LOCK,
    AnnotationError,
    Handshake,
    HandshakeKind,
    NodeLockValue,
    decode_handshake,
    decode_node_lock,
    encode_handshake,
    encode_node_lock,
)
from hami.annotations.lock import go_duration, parse_go_duration

UTC = datetime.UTC
T0 = datetime.datetime(2024, 5, 1, 10, 0, 0, tzinfo=UTC)


def test_lock_golden_values() -> None:
    assert encode_node_lock(NodeLockValue(time=T0, namespace="default", name="train")) == (
        "2024-05-01T10:00:00Z,default,train"
    )
    plus8 = T0.astimezone(datetime.timezone(datetime.timedelta(hours=8)))
    assert (
        encode_node_lock(NodeLockValue(time=plus8, namespace="ns", name="p"))
        == "2024-05-01T18:00:00+08:00,ns,p"
    )
    minus = T0.astimezone(datetime.timezone(-datetime.timedelta(hours=3, minutes=30)))
    assert encode_node_lock(NodeLockValue(time=minus)) == "2024-05-01T06:30:00-03:30"  # legacy form
    assert encode_node_lock(
        NodeLockValue(time=T0.replace(microsecond=999999), namespace="a", name="b")
    ).startswith("2024-05-01T10:00:00Z,")  # whole seconds, like Go's time.RFC3339


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2024-05-01T10:00:00Z,default,train", NodeLockValue(time=T0, namespace="default", name="train")),
        ("2024-05-01T18:00:00+08:00,ns,p", NodeLockValue(time=T0, namespace="ns", name="p")),
        ("2024-05-01T10:00:00Z", NodeLockValue(time=T0)),  # legacy: bare time, no owner
        (
            "2024-05-01T10:00:00.5Z",
            NodeLockValue(time=T0.replace(microsecond=500000)),
        ),  # Go accepts fractions
    ],
)
def test_lock_decoding(text: str, expected: NodeLockValue) -> None:
    value = decode_node_lock(text)
    assert value == expected
    assert value.legacy == (expected.namespace is None)


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("2024-05-01T10:00:00Z,default", "got 2 parts"),
        ("2024-05-01T10:00:00Z,a,b,c", "got 4 parts"),
        ("yesterday,default,train", "'yesterday' is not an RFC3339 time"),
        ("2024-05-01 10:00:00Z,a,b", "is not an RFC3339 time"),
        ("2024-05-01T10:00:00,a,b", "is not an RFC3339 time"),  # no zone
        ("2024-13-01T10:00:00Z", "is not an RFC3339 time"),
        ("", "is not an RFC3339 time"),
    ],
)
def test_lock_errors_name_key_and_text(text: str, reason: str) -> None:
    with pytest.raises(AnnotationError) as caught:
        decode_node_lock(text)
    assert (caught.value.key, caught.value.text) == (NODE_LOCK, text)
    assert reason in caught.value.reason
    assert str(caught.value).startswith(f'{NODE_LOCK} "{text}": malformed lock')


def test_lock_owner_and_expiry() -> None:
    value = NodeLockValue(time=T0, namespace="ns", name="p")
    assert value.owned_by("ns", "p")
    assert not value.owned_by("ns", "q")
    assert not NodeLockValue(time=T0).owned_by("ns", "p")
    five = datetime.timedelta(minutes=5)
    assert not value.expired(T0 + five, five)  # exactly the timeout: not yet older
    assert value.expired(T0 + five + datetime.timedelta(seconds=1), five)


@pytest.mark.parametrize(("namespace", "name"), [("", "p"), ("ns", ""), ("a,b", "p"), ("ns", None)])
def test_lock_encoder_refuses_owners_it_could_not_read_back(namespace: str, name: str | None) -> None:
    with pytest.raises(ValueError, match="lock owner"):
        encode_node_lock(NodeLockValue(time=T0, namespace=namespace, name=name))


def test_lock_encoder_needs_an_aware_time() -> None:
    with pytest.raises(ValueError, match="time zone"):
        encode_node_lock(NodeLockValue(time=T0.replace(tzinfo=None), namespace="a", name="b"))


_names = st.text(st.characters(blacklist_characters=",", codec="utf-8"), min_size=1, max_size=20)
_times = st.datetimes(
    min_value=datetime.datetime(1970, 1, 1),
    max_value=datetime.datetime(9999, 1, 1),
    timezones=st.sampled_from([UTC, datetime.timezone(datetime.timedelta(hours=-7, minutes=-30))]),
).map(lambda moment: moment.replace(microsecond=0))


@given(_times, _names, _names)
def test_lock_round_trip(moment: datetime.datetime, namespace: str, name: str) -> None:
    value = NodeLockValue(time=moment, namespace=namespace, name=name)
    decoded = decode_node_lock(encode_node_lock(value))
    assert decoded == value
    assert decoded.time.utcoffset() == moment.utcoffset()


# ------------------------------------------------------------------------------------------ handshake

LOCAL = datetime.datetime(2024, 5, 1, 10, 0, 0)


def test_handshake_golden_values() -> None:
    assert encode_handshake(HandshakeKind.REQUESTING, LOCAL) == "Requesting_2024-05-01 10:00:00"
    assert encode_handshake(HandshakeKind.DELETED, LOCAL) == "Deleted_2024-05-01 10:00:00"
    assert encode_handshake(HandshakeKind.REPORTED, LOCAL) == "Reported 2024-05-01 10:00:00"
    with pytest.raises(ValueError, match="only"):
        encode_handshake(HandshakeKind.OTHER, LOCAL)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("Requesting_2024-05-01 10:00:00", Handshake(kind=HandshakeKind.REQUESTING, time=LOCAL)),
        ("Requesting_2024-05-01 10:00:00.25", Handshake(kind=HandshakeKind.REQUESTING, time=LOCAL)),
        # HAMi: contains "Requesting" with no '_' or an unreadable stamp -> requesting without a time
        ("Requesting", Handshake(kind=HandshakeKind.REQUESTING)),
        ("Requesting_soon", Handshake(kind=HandshakeKind.REQUESTING)),
        ("Requesting_2024-5-1 10:00:00", Handshake(kind=HandshakeKind.REQUESTING)),
        ("Requesting_2024-02-30 10:00:00", Handshake(kind=HandshakeKind.REQUESTING)),
        ("xRequesting_2024-05-01 10:00:00", Handshake(kind=HandshakeKind.REQUESTING, time=LOCAL)),
        ("Reported 2024-05-01 10:00:00", Handshake(kind=HandshakeKind.REPORTED, time=LOCAL)),
        ("Reported 2024-05-01 10:00:00.123 +0800 CST", Handshake(kind=HandshakeKind.REPORTED)),
        ("Deleted_2024-05-01 10:00:00", Handshake(kind=HandshakeKind.DELETED, time=LOCAL)),
        ("", Handshake(kind=HandshakeKind.OTHER)),
        ("hello", Handshake(kind=HandshakeKind.OTHER)),
        (None, Handshake(kind=HandshakeKind.OTHER)),
    ],
)
def test_handshake_decoding_never_raises(text: str | None, expected: Handshake) -> None:
    assert decode_handshake(text) == expected


@given(
    st.datetimes(min_value=datetime.datetime(1000, 1, 1)).map(lambda m: m.replace(microsecond=0)),
    st.sampled_from([HandshakeKind.REQUESTING, HandshakeKind.REPORTED, HandshakeKind.DELETED]),
)
def test_handshake_round_trip(moment: datetime.datetime, kind: HandshakeKind) -> None:
    assert decode_handshake(encode_handshake(kind, moment)) == Handshake(kind=kind, time=moment)


# ------------------------------------------------------------------------------- Go durations


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("5m", datetime.timedelta(minutes=5)),
        ("300s", datetime.timedelta(minutes=5)),
        ("1h30m", datetime.timedelta(hours=1, minutes=30)),
        ("2h45m0s", datetime.timedelta(hours=2, minutes=45)),
        ("1.5h", datetime.timedelta(minutes=90)),
        ("1m30.5s", datetime.timedelta(seconds=90.5)),
        ("1.h", datetime.timedelta(hours=1)),  # Go allows an empty fraction
        (".5m", datetime.timedelta(seconds=30)),
        ("300ms", datetime.timedelta(milliseconds=300)),
        ("1500us", datetime.timedelta(microseconds=1500)),
        ("1500\u00b5s", datetime.timedelta(microseconds=1500)),  # micro sign
        ("1500\u03bcs", datetime.timedelta(microseconds=1500)),  # Greek mu
        ("1000ns", datetime.timedelta(microseconds=1)),
        ("0", datetime.timedelta(0)),
        ("+5m", datetime.timedelta(minutes=5)),
        ("-5m", datetime.timedelta(minutes=-5)),
        ("1h1h", datetime.timedelta(hours=2)),  # Go adds repeated units
    ],
)
def test_go_durations_parse_as_gos_time_parseduration(text: str, expected: datetime.timedelta) -> None:
    # HAMI_NODELOCK_EXPIRE is read with Go's time.ParseDuration
    assert parse_go_duration(text) == expected


@pytest.mark.parametrize(
    "text",
    [
        *("", "5", "m", "5x", "5 m", " 5m", "5m ", ".m", "1.2.3s", "-", "+", "5M", "1d", "9999999h", "0x10s"),
        "\u0665m",  # an Arabic-Indic digit: Go takes ASCII digits only
    ],
)
def test_what_go_refuses_is_refused(text: str) -> None:
    with pytest.raises(ValueError, match="Go duration"):
        parse_go_duration(text)


def test_go_duration_matches_go_formatting() -> None:
    assert go_duration(datetime.timedelta(minutes=5)) == "5m0s"
    assert go_duration(datetime.timedelta(seconds=30)) == "30s"
    assert go_duration(datetime.timedelta(hours=1, seconds=5)) == "1h0m5s"
    assert go_duration(datetime.timedelta(seconds=90.5)) == "1m30.5s"
    assert go_duration(datetime.timedelta(milliseconds=1500)) == "1.5s"
    assert go_duration(datetime.timedelta(milliseconds=300)) == "300ms"
    assert go_duration(datetime.timedelta(microseconds=1500)) == "1.5ms"
    assert go_duration(datetime.timedelta(microseconds=7)) == "7\u00b5s"
    assert go_duration(datetime.timedelta(0)) == "0s"
    assert go_duration(datetime.timedelta(minutes=-5)) == "-5m0s"


@given(st.timedeltas(min_value=datetime.timedelta(days=-9000), max_value=datetime.timedelta(days=9000)))
def test_go_duration_round_trip(delta: datetime.timedelta) -> None:
    assert parse_go_duration(go_duration(delta)) == delta
