"""
Tests of the DSL's one-field statements: each comes from its row of the option table, and only from there.
"""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from poprun.core.span import SourceSpan
from poprun.planner.dsl.grammar import STATEMENTS, Statement, grammar_text
from poprun.planner.dsl.read import parse_dsl
from poprun.planner.dsl.write import to_dsl
from poprun.planner.option import OPTIONS
from poprun.planner.spec import Sourced, Spec

GRAMMAR_FILE = Path(__file__).resolve().parents[2] / "poprun" / "grammars" / "spec.lark"
# A value of each kind, as written in a statement.
SAMPLES = {"int": "3", "nonneg": "0", "count": "2", "port": "8090", "str": "x", "path": "/tmp/x",
           "subnet": "10.5.0.0/16", "seconds": "0.5", "signal": "USR1@60", "statuses": "2,126"}
# The one-field statements whose `on` form has structure, written in spec.lark.
WRITTEN_APART = {"offline_mode": "offline", "distribute_ssh_key": "distribute ssh key"}


def sample(statement: Statement) -> str:
    """Return a value of the statement's option, as written."""
    option = statement.option
    return option.choices[0] if option.choices else SAMPLES[option.kind]


def line(statement: Statement) -> str:
    """Return a line made of the statement (with a value where it takes one), in its place."""
    words = " ".join(statement.words) + (f" {sample(statement)}" if statement.role == "value" else "")
    return {"": words, "partition": f"partition ({words})", "ssh key": f"ssh key ({words})"}[statement.option.dsl_in]


def test_the_table_declares_the_one_field_statements() -> None:
    """The 53 one-field statements of the language come from 46 rows of the option table."""
    rows = {id(s.option) for s in STATEMENTS.values()}

    assert (55, 48) == (len(STATEMENTS), len(rows))


@pytest.mark.parametrize("statement", STATEMENTS.values(), ids=list(STATEMENTS))
def test_every_table_statement_sets_its_field(statement: Statement) -> None:
    """A statement of the table sets its row's field: a switch to its constant, a value through the row's converter."""
    expected = statement.option.convert(sample(statement)) if statement.role == "value" else statement.constant
    spec = parse_dsl(line(statement), file="job.pop")

    assert expected == getattr(spec, statement.field).value


@pytest.mark.parametrize("statement", STATEMENTS.values(), ids=list(STATEMENTS))
def test_every_table_statement_is_written_back(statement: Statement) -> None:
    """to_dsl writes every value a table statement sets so that it reads back unchanged."""
    spec = parse_dsl(line(statement), file="job.pop")

    assert spec == parse_dsl(to_dsl(spec), file="job.pop")


@pytest.mark.parametrize("statement", STATEMENTS.values(), ids=list(STATEMENTS))
def test_no_table_statement_is_also_written_by_hand_in_the_grammar_file(statement: Statement) -> None:
    """spec.lark does not spell a table statement's keywords: its rule comes from the table only."""
    keywords = " ".join(f'"{word}"' for word in statement.words)

    assert keywords not in GRAMMAR_FILE.read_text(encoding="utf-8")
    assert re.search(rf"^{statement.rule}: {re.escape(keywords)}", grammar_text(), re.MULTILINE)


def test_a_yes_no_option_with_a_statement_has_both_switches() -> None:
    """A boolean row with a DSL statement says both yes and no, or its other half is written apart in spec.lark."""
    half = sorted(o.field for o in OPTIONS if o.kind == "bool" and o.field and bool(o.dsl_on) != bool(o.dsl_off))

    assert sorted(WRITTEN_APART) == half


def test_cache_off_is_the_empty_path_and_a_quoted_off_is_a_directory() -> None:
    """The off switch of a path sets the empty path; the writer quotes a directory named like it."""
    span = SourceSpan(file="<test>", key_path="$")
    spec = Spec(executable_cache_path=Sourced("off", span))

    assert ("", "cache 'off'\n") == (parse_dsl("cache off", file="job.pop").executable_cache_path.value, to_dsl(spec))


def test_a_new_option_is_one_table_row(tmp_path: Path) -> None:
    """A row added to the table gives its flag, its TOML key and its DSL statement, with no other edit."""
    # GIVEN a row for a new option (here a second spelling of the V-IPU server host)
    program = textwrap.dedent("""
        from poprun.planner import option
        row = option._o("--vipu-host-name", "vipu_server_host", "str", "The V-IPU server's host",
                        "partition.host_name", group="V-IPU", dsl="host name", dsl_in="partition")
        option.OPTIONS = (*option.OPTIONS, row)
        option.BY_FLAG["--vipu-host-name"] = row
        option.TOML_KEYS["partition"]["host_name"] = "vipu_server_host"
        from poprun.planner.dsl.read import parse_dsl
        from poprun.planner.flags import parse_flags
        from poprun.planner.tomlspec import parse_toml
        print(parse_flags(["--vipu-host-name", "a", "true"]).spec.vipu_server_host.value,
              parse_toml('[partition]\\nhost_name = "b"', file="job.toml").vipu_server_host.value,
              parse_dsl("partition (host name c)", file="job.pop").vipu_server_host.value)
    """)
    # WHEN the front ends read it
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, check=False, cwd=tmp_path)

    # THEN each sets the field
    assert ("a b c\n", "") == (done.stdout, done.stderr)
