"""The node-lock expiry of ``hami scheduler``: ``--node-lock-timeout``, then ``HAMI_NODE_LOCK_TIMEOUT``,
then HAMi's own ``HAMI_NODELOCK_EXPIRE`` (a Go duration), then 5 minutes
(docs/protocol.md, "Device config")."""

from __future__ import annotations

import argparse
import datetime

import pytest

from hami.scheduler.config import add_arguments, from_args
from hami.settings import ConfigError

MINUTE = datetime.timedelta(minutes=1)


def _expiry(argv: list[str], environ: dict[str, str]) -> datetime.timedelta:
    parser = argparse.ArgumentParser()
    add_arguments(parser, environ)
    return from_args(parser.parse_args(argv)).node_lock_timeout


def test_hamis_env_var_is_honoured_when_the_flag_is_not_given() -> None:
    assert _expiry([], {}) == 5 * MINUTE
    assert _expiry([], {"HAMI_NODELOCK_EXPIRE": "10m"}) == 10 * MINUTE
    assert _expiry([], {"HAMI_NODELOCK_EXPIRE": "1h30m"}) == 90 * MINUTE


def test_the_flag_and_our_env_var_win_over_hamis() -> None:
    hami = {"HAMI_NODELOCK_EXPIRE": "10m"}
    assert _expiry(["--node-lock-timeout", "60"], hami) == MINUTE
    assert _expiry([], {**hami, "HAMI_NODE_LOCK_TIMEOUT": "120"}) == 2 * MINUTE


def test_the_flag_takes_hamis_go_duration_too() -> None:
    # HAMi's --node-lock-timeout is a Go duration: a chart's `--node-lock-timeout=5m` keeps working
    assert _expiry(["--node-lock-timeout", "5m"], {}) == 5 * MINUTE
    assert _expiry(["--node-lock-timeout", "90.5"], {}) == datetime.timedelta(seconds=90.5)


@pytest.mark.parametrize(
    ("argv", "environ", "message"),
    [
        ([], {"HAMI_NODELOCK_EXPIRE": "soon"}, "HAMI_NODELOCK_EXPIRE must be a positive Go duration"),
        ([], {"HAMI_NODELOCK_EXPIRE": "300"}, "'300' is not a Go duration"),  # Go needs a unit
        ([], {"HAMI_NODELOCK_EXPIRE": "0s"}, "HAMI_NODELOCK_EXPIRE must be a positive Go duration"),
        ([], {"HAMI_NODELOCK_EXPIRE": "-5m"}, "HAMI_NODELOCK_EXPIRE must be a positive Go duration"),
        (["--node-lock-timeout", "soon"], {}, r"got 'soon' \(or a Go duration: 5m, 90s\)"),
        (["--node-lock-timeout", "0"], {}, "--node-lock-timeout must be positive"),
    ],
)
def test_a_bad_expiry_names_where_it_came_from(
    argv: list[str], environ: dict[str, str], message: str
) -> None:
    # HAMi logs a bad HAMI_NODELOCK_EXPIRE and goes on with 5 minutes; here it stops the start-up
    with pytest.raises(ConfigError, match=message):
        _expiry(argv, environ)
