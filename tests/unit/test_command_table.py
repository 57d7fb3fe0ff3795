"""The one command table: dispatch, usage and help come from it; every command's options go through the flags parser."""

from __future__ import annotations

import importlib

import pytest

from poprun.cli.commands import BY_NAME, CLASSIC, COMMANDS
from poprun.cli.helptext import render_command_help, render_help, render_usage
from poprun.cli.main import main
from poprun.core.diagnostic import DiagnosticError
from poprun.partitions.serveroption import ServerOptions, parse_server_options
from poprun.planner.flags import CommandOption, describe_options, parse_arguments

ROWS = (CommandOption("all", ("--all", "-a"), "", "every run"),
        CommandOption("tail", ("--tail", "-n"), "N", "the last N lines"))


def test_every_row_names_a_function_of_its_module() -> None:
    """Each command of the table (and the classic form) is a function of the module the row names."""
    missing = [row.name for row in (*COMMANDS, CLASSIC)
               if not callable(getattr(importlib.import_module(f"poprun.cli.commands.{row.module}"), row.function, None))]

    assert [] == missing


def test_the_top_level_usage_lists_every_row_in_the_table_order() -> None:
    """``poprun --help`` starts with the classic form, then every command's usage lines, in the table's order."""
    expected = ["usage: poprun [options] program [program args]",
                *(f"       poprun {line}" for row in COMMANDS for line in row.usage)]

    assert expected == render_usage().splitlines()
    assert render_help().startswith(render_usage() + "\n")


def test_a_command_with_option_rows_shows_them_in_its_help(capsys: pytest.CaptureFixture[str]) -> None:
    """``poprun stop --help`` is its usage line and its option rows, exit 0."""
    status = main(["stop", "--help"])

    expected = ("usage: poprun stop RUN [--timeout SECONDS]\n\noptions:\n"
                "  --timeout SECONDS                    how long to wait for the run to end (default 15)\n")
    assert (0, expected) == (status, capsys.readouterr().out)
    assert expected == render_command_help(BY_NAME["stop"])


def test_help_of_a_command_without_options_is_its_usage_alone() -> None:
    """``poprun attach --help`` has no options section."""
    assert "usage: poprun attach RUN\n" == render_command_help(BY_NAME["attach"])


def test_describe_options_lays_out_short_and_long_spellings_as_poprun_help_does() -> None:
    """A row with a short and a long flag reads ``-n [ --tail ] N``."""
    text = describe_options(("ps [--all]", "ps --other"), ROWS)

    expected = ("usage: poprun ps [--all]\n       poprun ps --other\n\noptions:\n"
                f"  {'-a [ --all ]':<36} every run\n  {'-n [ --tail ] N':<36} the last N lines\n")
    assert expected == text


@pytest.mark.parametrize("argv", [["--tail", "5", "RUN"], ["RUN", "--tail=5"], ["-n", "5", "RUN"]])
def test_options_and_words_come_in_any_order_with_either_spelling(argv: list[str]) -> None:
    """``--opt v``, ``--opt=v`` and the short spelling all give the option's row name."""
    given = parse_arguments(argv, ROWS, prog="poprun logs", usage="poprun logs RUN", words=1)

    assert (("RUN",), "5", False) == (given.words, given.value("tail"), given.has("all"))


def test_a_value_may_start_with_a_dash() -> None:
    """As in a launch, a value-taking option takes the next word even when it starts with '-'."""
    assert "-1" == parse_arguments(["--tail", "-1"], ROWS, prog="p", usage="p").value("tail")


def _problem(argv: list[str], **kwargs: object) -> tuple[str, str, int | None, int | None]:
    with pytest.raises(DiagnosticError) as caught:
        parse_arguments(argv, ROWS, prog="poprun ps", usage="poprun ps [--all]", **kwargs)  # type: ignore[arg-type]
    first = caught.value.diagnostics[0]
    return first.code, first.summary, first.span.column, first.span.end_column


def test_an_unknown_option_is_pr101_with_its_caret_and_the_nearest_name() -> None:
    """The caret spans exactly the unknown option in ``poprun ps --alk``; the hint names ``--all``."""
    with pytest.raises(DiagnosticError) as caught:
        parse_arguments(["--alk"], ROWS, prog="poprun ps", usage="poprun ps [--all]")
    problem = caught.value.diagnostics[0]

    assert ("PR101", "did you mean '--all'?", "poprun ps --alk") == (problem.code, problem.hint, problem.source_line)
    assert (11, 16) == (problem.span.column, problem.span.end_column)


def test_an_option_without_its_value_is_pr104() -> None:
    """``--tail`` as the last word."""
    assert ("PR104", "option '--tail' needs a value", 11, 17) == _problem(["--tail"])


def test_a_value_for_an_option_without_one_is_pr112() -> None:
    """``--all=yes``."""
    assert ("PR112", "option '--all' takes no value", 11, 20) == _problem(["--all=yes"])


def test_a_word_too_many_is_pr101_under_that_word() -> None:
    """``poprun ps a b`` with one word allowed: the caret under ``b``."""
    assert ("PR101", "unexpected word 'b'", 13, 14) == _problem(["a", "b"], words=1)


def test_help_is_every_commands_and_skips_the_word_count() -> None:
    """``-h`` is read whatever else is there; the words are not counted then."""
    given = parse_arguments(["a", "b", "-h"], ROWS, prog="p", usage="p")

    assert (True, ()) == (given.help, given.options)


def test_leading_options_stop_at_the_first_other_word() -> None:
    """``submit --wait --nodes 2 --num-instances 2 prog``: submit's options, then the launch's words untouched."""
    rows = BY_NAME["submit"].options or ()
    given = parse_arguments(["--wait", "--nodes", "2", "--num-instances", "2", "prog"], rows, prog="poprun submit",
                            usage="u", leading=True)

    assert (True, "2", ("--num-instances", "2", "prog")) == (given.has("wait"), given.value("nodes"), given.rest)


def test_vipu_server_options_have_the_servers_defaults_and_types() -> None:
    """``--port 0 --request-timeout 2.5``: numbers as numbers, the rest the defaults; ``--help`` is None."""
    assert ServerOptions(port=0, request_timeout=2.5) == parse_server_options(["--port", "0", "--request-timeout=2.5"])
    assert parse_server_options(["--help"]) is None


def test_a_vipu_server_number_that_is_none_is_pr105() -> None:
    """``--ipus many`` is PR105, not a traceback."""
    with pytest.raises(DiagnosticError) as caught:
        parse_server_options(["--ipus", "many"])

    assert "PR105" == caught.value.diagnostics[0].code


def test_the_module_entry_point_prints_one_line_per_problem_and_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    """``python -m poprun.partitions.emulator --bogus``: one line on stderr, status 2 (the server's own)."""
    from poprun.partitions.emulator import main as serve

    status = serve(["--bogus"])

    expected = ("poprun vipu-server: error[PR101]: unknown option '--bogus': 'poprun vipu-server' has no option "
                "'--bogus' (did you mean '--ipus'?)\n")
    assert (2, expected) == (status, capsys.readouterr().err)


def test_an_unambiguous_prefix_stands_for_its_option_as_in_a_launch() -> None:
    """``--ta`` is ``--tail`` when no other option starts so; ``--request-t`` is vipu-server's ``--request-timeout``."""
    assert "5" == parse_arguments(["--ta", "5"], ROWS, prog="p", usage="p").value("tail")
    assert ServerOptions(request_timeout=5.0) == parse_server_options(["--req", "5"])


def test_an_ambiguous_prefix_is_pr102_naming_both() -> None:
    """``poprun logs RUN --ta``: --tag or --tail."""
    rows = BY_NAME["logs"].options or ()
    with pytest.raises(DiagnosticError) as caught:
        parse_arguments(["RUN", "--ta", "3"], rows, prog="poprun logs", usage="u", words=1)
    problem = caught.value.diagnostics[0]

    assert ("PR102", "'--ta' could be --tag or --tail") == (problem.code, problem.detail)


def test_submits_leading_options_are_taken_only_as_written() -> None:
    """``submit --wa prog``: a prefix is not submit's ``--wait``; it is left for the launch's own parser."""
    given = parse_arguments(["--wa", "prog"], BY_NAME["submit"].options or (), prog="poprun submit", usage="u",
                            leading=True)

    assert (False, ("--wa", "prog")) == (given.has("wait"), given.rest)


def test_a_vipu_server_number_with_an_escape_is_shown_escaped() -> None:
    """``--port $'\\x1b[2J'``: the diagnostic shows ``\\x1b``, never the escape itself."""
    with pytest.raises(DiagnosticError) as caught:
        parse_server_options(["--port", "\x1b[2J"])

    assert "'\\x1b[2J' is not a whole number" == caught.value.diagnostics[0].detail
