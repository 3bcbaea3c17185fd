"""The settings schema (:class:`hami.process.flags.Flag`, :class:`~hami.process.flags.Switch`): one
declaration gives the option, the env fallback, the typed default and the help line; precedence is the
flag, then ``HAMI_<FLAG>``, then the flag's other variables, then the default; errors name where the
text came from."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Mapping

import pytest

from hami.process.flags import LOG_LEVEL, Flag, Flags, Switch, add_flags, whole
from hami.settings import ConfigError


def _parse_go_seconds(variable: str, text: str) -> int:
    if not text.endswith("s"):
        raise ConfigError(f"{variable} must end in s, got {text!r}")
    return int(text[:-1])


WAIT = Flag(
    name="wait",
    parse=whole(minimum=0),
    default="30",
    help="seconds to wait (100% sure)",
    also_env=("OLD_WAIT",),
    parse_also=_parse_go_seconds,
)
NAME = Flag(name="name", parse=lambda flag, text: text or "?", help="a name", also_env=("NAME",))
LOUD = Switch(name="loud", default="false", help="shout")


def _args(
    argv: list[str], environ: Mapping[str, str], flags: Flags = (WAIT, NAME, LOUD)
) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_flags(parser, flags, environ)
    return parser.parse_args(argv)


def test_the_flag_then_its_variable_then_the_others_then_the_default() -> None:
    assert WAIT.read(_args([], {})) == WAIT.default_value == 30
    assert WAIT.read(_args([], {"OLD_WAIT": "7s"})) == 7
    assert WAIT.read(_args([], {"OLD_WAIT": "7s", "HAMI_WAIT": "8"})) == 8
    assert WAIT.read(_args(["--wait", "9"], {"OLD_WAIT": "7s", "HAMI_WAIT": "8"})) == 9


def test_an_empty_other_variable_is_unset_and_an_empty_own_variable_is_a_value() -> None:
    assert WAIT.read(_args([], {"OLD_WAIT": ""})) == 30
    assert NAME.read(_args([], {"NAME": "", "HAMI_NAME": "x"})) == "x"
    with pytest.raises(ConfigError, match=r"^--wait must be a whole number, got ''$"):
        WAIT.read(_args([], {"HAMI_WAIT": ""}))


def test_errors_name_the_flag_for_its_own_variable_and_the_variable_for_the_others() -> None:
    with pytest.raises(ConfigError, match=r"^--wait must be at least 0, got '-1'$"):
        WAIT.read(_args([], {"HAMI_WAIT": "-1"}))
    with pytest.raises(ConfigError, match=r"^--wait must be a whole number, got 'x'$"):
        WAIT.read(_args(["--wait", "x"], {}))
    with pytest.raises(ConfigError, match=r"^OLD_WAIT must end in s, got '7'$"):
        WAIT.read(_args([], {"OLD_WAIT": "7"}))


def test_another_variable_without_its_own_parser_reads_as_the_flag() -> None:
    assert NAME.read(_args([], {"NAME": "n1"})) == "n1"
    assert NAME.read(_args([], {})) == NAME.default_value == "?"


def test_a_switch_reads_its_options_and_its_variable() -> None:
    assert LOUD.options == ("--loud", "--no-loud")
    assert LOUD.read(_args([], {})) is False
    assert LOUD.read(_args(["--loud"], {})) is True
    assert LOUD.read(_args([], {"HAMI_LOUD": "yes"})) is True
    assert LOUD.read(_args(["--no-loud"], {"HAMI_LOUD": "true"})) is False
    with pytest.raises(ConfigError, match=r"^HAMI_LOUD must be true or false, got 'maybe'$"):
        LOUD.read(_args([], {"HAMI_LOUD": "maybe"}))
    # the flag wins: a bad variable it overrides is never read
    assert LOUD.read(_args(["--loud"], {"HAMI_LOUD": "maybe"})) is True


def test_the_help_line_says_the_default_and_every_variable() -> None:
    assert WAIT.help_text() == "seconds to wait (100% sure) (default: 30) [env HAMI_WAIT, then OLD_WAIT]"
    assert NAME.help_text() == "a name [env HAMI_NAME, then NAME]"
    parser = argparse.ArgumentParser()
    add_flags(parser, (WAIT, NAME, LOUD), {})
    shown = " ".join(parser.format_help().split())
    assert "seconds to wait (100% sure) (default: 30) [env HAMI_WAIT, then OLD_WAIT]" in shown
    assert "--loud, --no-loud shout (default: false) [env HAMI_LOUD]" in shown


def test_choices_hold_the_command_line_only() -> None:
    mode = Flag(name="mode", parse=lambda flag, text: text.upper(), default="a", choices=("a", "b"), help="m")
    with pytest.raises(SystemExit):
        _args(["--mode", "c"], {}, (mode,))
    assert mode.read(_args(["--mode", "b"], {}, (mode,))) == "B"
    assert mode.read(_args([], {"HAMI_MODE": "c"}, (mode,))) == "C"  # the parser checks what it is given


def _scheduler(argv: list[str]) -> int:
    from hami.cli import main as hami

    return hami(["scheduler", *argv])


def _webhook(argv: list[str]) -> int:
    from webhook.__main__ import main as webhook

    return webhook(argv)


def _agent(argv: list[str]) -> int:
    from nodeagent.__main__ import main as agent

    return agent(["--node-name", "n1", *argv])


def _certgen(argv: list[str]) -> int:
    from webhook.certgen import main as certgen

    return certgen(["inject", "--namespace=ns", "--secret=s", "--webhook-config=w", *argv], {})


@pytest.mark.parametrize("program", [_scheduler, _webhook, _agent, _certgen])
def test_every_program_refuses_an_unknown_log_level_in_one_line(
    program: Callable[[list[str]], int], capsys: pytest.CaptureFixture[str]
) -> None:
    """One declaration of --log-level (hami.process.flags.LOG_LEVEL) for every program: a level that
    is not one is exit 2 naming the flag, before anything starts (the agent used to take any word)."""
    try:
        code = program(["--log-level", "loud"])
    except SystemExit as stopped:  # argparse's own usage error (certgen)
        code = int(stopped.code or 0)
    assert code == 2
    err = capsys.readouterr().err
    assert "--log-level must be one of debug, info, warning, error (any case), got 'loud'" in err
    assert "Traceback" not in err


@pytest.mark.parametrize("text", ["warning", "WARNING", "Warning", " error "])
def test_a_log_level_is_taken_in_any_case(text: str) -> None:
    assert LOG_LEVEL.read(_args(["--log-level", text], {}, (LOG_LEVEL,))) == text.strip().lower()
    assert LOG_LEVEL.read(_args([], {"HAMI_LOG_LEVEL": text}, (LOG_LEVEL,))) == text.strip().lower()
