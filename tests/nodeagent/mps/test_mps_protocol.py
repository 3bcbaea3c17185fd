"""The MPS command language as text and the reading of replies (pure): the documented command names,
our choices where the documentation is silent, and hostile replies and names refused with errors that
name the command and quote the reply."""

from __future__ import annotations

import pytest

from nodeagent.mps.protocol import (
    CardLimit,
    MpsNameError,
    MpsReplyError,
    expect_empty,
    get_server_list,
    memory_spec,
    namespace_create,
    namespace_delete,
    namespace_list,
    namespace_name,
    parse_listing,
    parse_memory,
    parse_namespace_limits,
    parse_server_list,
    protocol_query,
    quit_daemon,
    server_create,
    set_default_active_thread_percentage,
    set_default_device_pinned_mem_limit,
    start_server,
)

UID = "0c9f5a4e-6a53-4b1e-9d8e-2f1c3b4a5d6e"


def test_protocol_2_commands_are_the_documented_shell_lines() -> None:
    assert get_server_list().text == "get_server_list\n"
    assert start_server(1000).text == "start_server -uid 1000\n"
    assert set_default_active_thread_percentage(30).text == "set_default_active_thread_percentage 30\n"
    assert set_default_device_pinned_mem_limit("GPU-a", 2048).text == (
        "set_default_device_pinned_mem_limit GPU-a 2048M\n"
    )
    assert quit_daemon().text == "quit\n"
    assert not any(c.verb for c in (get_server_list(), start_server(0), quit_daemon()))


def test_protocol_3_commands_are_verbs_given_as_arguments() -> None:
    assert protocol_query().verb and protocol_query().words == ("server", "list")
    assert server_create().words == ("server", "create", "--name=hami", "--uid=0")
    limits = [CardLimit("GPU-a", 3000, 30), CardLimit("GPU-b", 4096, 50)]
    assert namespace_create(UID, limits).words == (
        "namespace",
        "create",
        "--server=hami",
        f"--name={UID}",
        "--pinned-memory-limit=GPU-a=3000M,GPU-b=4096M",
        "--active-thread-percentage=30",  # one percentage per namespace: the smallest grant
    )
    assert namespace_delete(UID).words == ("namespace", "delete", "--server=hami", f"--name={UID}")
    assert namespace_list().words == ("namespace", "list", "--server=hami")


@pytest.mark.parametrize(
    "name",
    [
        "",
        "a/b",
        "../x",
        ".",
        "..",
        "default",
        "UPPER",
        "a b",
        "a\nb",
        "-lead",
        "trail-",
        "x" * 64,
        "a=b",
        "a,b",
    ],
)
def test_a_namespace_name_that_is_not_plain_is_refused(name: str) -> None:
    with pytest.raises(MpsNameError, match="namespace name"):
        namespace_name(name)
    with pytest.raises(MpsNameError):
        namespace_create(name, [CardLimit("GPU-a", 1, 1)])


def test_a_pod_uid_is_a_namespace_name() -> None:
    assert namespace_name(UID) == UID
    assert namespace_name(f"{UID}-0") == f"{UID}-0"


@pytest.mark.parametrize(
    ("uuid", "mib", "pct", "field"),
    [
        ("GPU-a,b", 1, 1, "UUID"),
        ("GPU a", 1, 1, "UUID"),
        ("GPU-a=", 1, 1, "UUID"),
        ("GPU-a", 0, 1, "memory_mib"),
        ("GPU-a", True, 1, "memory_mib"),
        ("GPU-a", 1, 0, "thread_percentage"),
        ("GPU-a", 1, 101, "thread_percentage"),
    ],
)
def test_a_card_limit_that_cannot_be_written_is_refused(uuid: str, mib: int, pct: int, field: str) -> None:
    with pytest.raises(MpsNameError, match=field):
        CardLimit(uuid, mib, pct)


def test_limits_need_a_card_each_once() -> None:
    with pytest.raises(MpsNameError, match="at least one card"):
        namespace_create(UID, [])
    with pytest.raises(MpsNameError, match="twice"):
        namespace_create(UID, [CardLimit("GPU-a", 1, 1), CardLimit("GPU-a", 2, 2)])


def test_server_list_reads_pids_and_refuses_anything_else() -> None:
    assert parse_server_list(get_server_list(), "") == ()
    assert parse_server_list(get_server_list(), "123\n456\n") == (123, 456)
    for garbage in ("abc\n", "12 34\n", "-1\n", "0\n", "\x1b[31m1\n", "99999999999\n"):
        with pytest.raises(MpsReplyError) as caught:
            parse_server_list(get_server_list(), garbage)
        assert "get_server_list" in str(caught.value) and repr(garbage)[1:-1] in str(caught.value)


def test_a_refusal_is_an_error_naming_the_command_and_the_reply() -> None:
    command = namespace_delete(UID)
    with pytest.raises(MpsReplyError) as caught:
        expect_empty(command, "Error: no namespace named 'x'\n")
    assert str(command) in str(caught.value) and "no namespace named" in str(caught.value)
    with pytest.raises(MpsReplyError, match="expected no reply"):
        expect_empty(command, "surprise\n")
    expect_empty(command, "\n")


def test_listings_are_names_with_key_values() -> None:
    reply = "hami pid=12 uid=0\nother pid=13 uid=1000\n"
    assert parse_listing(protocol_query(), reply) == {
        "hami": {"pid": "12", "uid": "0"},
        "other": {"pid": "13", "uid": "1000"},
    }
    for garbage in ("hami pid\n", "=x\n", "hami pid=1\nhami pid=2\n", "\x00\n"):
        with pytest.raises(MpsReplyError, match="server list"):
            parse_listing(protocol_query(), garbage)


def test_a_namespace_listing_reads_back_as_card_limits() -> None:
    fields = {"pinned_memory_limit": "GPU-a=3000M,GPU-b=2G", "active_thread_percentage": "25"}
    assert parse_namespace_limits(namespace_list(), UID, fields) == (
        CardLimit("GPU-a", 3000, 25),
        CardLimit("GPU-b", 2048, 25),
    )
    with pytest.raises(MpsReplyError, match=UID):
        parse_namespace_limits(namespace_list(), UID, {"pinned_memory_limit": "GPU-a=lots"})


def test_memory_values_are_the_documented_form() -> None:
    assert memory_spec([CardLimit("GPU-a", 1536, 10)]) == "GPU-a=1536M"
    assert parse_memory("2G") == 2048 and parse_memory("512M") == 512
    for bad in ("2", "2K", "-1M", "M", "1.5G"):
        with pytest.raises(ValueError, match="memory value"):
            parse_memory(bad)
