"""
Tests of the DSL front end: each statement, the design example, and every diagnostic it emits.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from lark.lexer import PatternStr

from poprun.core.diagnostic import Diagnostic, DiagnosticError
from poprun.core.record import fields
from poprun.core.span import SourceSpan
from poprun.planner.dsl.grammar import dsl_parser
from poprun.planner.dsl.read import load_dsl, parse_dsl
from poprun.planner.dsl.write import to_dsl
from poprun.planner.spec import EnvVarSpec, InstanceArgsSpec, Sourced, Spec

EXAMPLES = Path(__file__).parents[2] / "examples"  # design.md section 4, as files
DESIGN_DSL = (EXAMPLES / "train.pop").read_text(encoding="utf-8")

DESIGN_TOML = (EXAMPLES / "train.toml").read_text(encoding="utf-8")


def values(spec: Spec) -> dict[str, Any]:
    """Return the fields a spec sets, without their origins."""
    result: dict[str, Any] = {}
    for name in (f.name for f in fields(Spec)):
        value = getattr(spec, name)
        if isinstance(value, Sourced):
            result[name] = value.value
        elif value:
            result[name] = tuple(item.value for item in value)
    return result


def diagnostics(text: str) -> tuple[Diagnostic, ...]:
    """Return the diagnostics that parsing ``text`` raises."""
    with pytest.raises(DiagnosticError) as info:
        parse_dsl(text, file="job.pop")
    return info.value.diagnostics


def only(text: str) -> Diagnostic:
    """Return the one diagnostic that parsing ``text`` raises."""
    found = diagnostics(text)
    assert len(found) == 1, found
    return found[0]


# ---- the design example ----------------------------------------------------------------


def test_design_example_sets_hosts_topology_partition_env_and_program() -> None:
    """The DSL example of design.md section 4 gives the values its TOML twin describes."""
    spec = parse_dsl(DESIGN_DSL, file="train.pop")

    assert {
        "hosts": ("pod1", "pod2"), "replicas": 32, "instances": 2, "ilds": 2, "partition": "my_partition",
        "vipu_server_host": "vipu.my_domain", "vipu_server_port": 34521, "update_partition": True,
        "remove_partition": False,
        "env": (EnvVarSpec(name="PYTHONPATH", value=None),
                EnvVarSpec(name="POPLAR_ENGINE_OPTIONS", value='{"autoReport.all":"true"}')),
        "program": ("python3", "train.py", "--epochs", "3"),
    } == values(spec)


def test_design_example_equals_its_toml_twin() -> None:
    """The DSL and TOML forms of the design example give equal specs."""
    from poprun.planner.tomlspec import parse_toml

    assert parse_toml(DESIGN_TOML, file="train.toml") == parse_dsl(DESIGN_DSL, file="train.pop")


def test_design_example_is_written_back_as_it_was_written() -> None:
    """to_dsl of the design example's spec gives the example's text."""
    assert DESIGN_DSL == to_dsl(parse_dsl(DESIGN_DSL, file="train.pop"))


def test_every_grammar_rule_has_an_example_comment() -> None:
    """Each rule and terminal of spec.lark is preceded by a comment (its example line)."""
    grammar = (Path(__file__).resolve().parents[2] / "poprun" / "grammars" / "spec.lark").read_text(encoding="utf-8")
    lines = grammar.splitlines()
    bare = [line.split(":")[0] for i, line in enumerate(lines)
            if re.match(r"[?_A-Za-z][\w]*:", line) and not lines[i - 1].startswith("//")]

    assert [] == bare


# ---- each statement --------------------------------------------------------------------

STATEMENTS: list[tuple[str, dict[str, Any]]] = [
    ("hosts pod1, pod2", {"hosts": ("pod1", "pod2")}),
    ("hosts pod[01-03],login", {"hosts": ("pod01", "pod02", "pod03", "login")}),
    ("hosts 'pod[1-2]'", {"hosts": ("pod1", "pod2")}),
    ("hosts ''", {"hosts": ()}),
    ("hosts from file hosts.txt", {"host_file": "hosts.txt"}),
    ("hosts from file 'my hosts.txt'", {"host_file": "my hosts.txt"}),
    ("8 replicas", {"replicas": 8}),
    ("1 replica", {"replicas": 1}),
    ("8 replicas over 2 instances", {"replicas": 8, "instances": 2}),
    ("8 replicas with 2 ipus per replica", {"replicas": 8, "ipus_per_replica": 2}),
    ("1 replica with 1 ipu per replica over 1 instance in 1 ild",
     {"replicas": 1, "ipus_per_replica": 1, "instances": 1, "ilds": 1}),
    ("2 instances in 2 ilds", {"instances": 2, "ilds": 2}),
    ("2 ilds", {"ilds": 2}),
    ("4 ipus per replica", {"ipus_per_replica": 4}),
    ("partition p", {"partition": "p"}),
    ("partition at vipu", {"vipu_server_host": "vipu"}),
    ("partition at vipu:8090", {"vipu_server_host": "vipu", "vipu_server_port": 8090}),
    ("partition at [::1]:8090", {"vipu_server_host": "::1", "vipu_server_port": 8090}),
    ("partition at :8090", {"vipu_server_port": 8090}),
    ("partition 'my part' at 'odd host' (port 8090)",
     {"partition": "my part", "vipu_server_host": "odd host", "vipu_server_port": 8090}),
    ("partition (update, reset, remove)", {"update_partition": True, "reset_partition": True,
                                           "remove_partition": True}),
    ("partition (no update, no reset, keep)", {"update_partition": False, "reset_partition": False,
                                               "remove_partition": False}),
    ("partition (allocation a1, timeout 600, attempts 3)",
     {"allocation": "a1", "vipu_server_timeout": 600, "partition_attempts": 3}),
    ("partition (sync st_pod_native_default, ipu-link routing dnc, gw-link routing DEFAULT)",
     {"sync_type": "ST_POD_NATIVE_DEFAULT", "ipu_link_routing_type": "DNC", "gw_link_routing_type": "DEFAULT"}),
    ("forward A, B", {"env": (EnvVarSpec(name="A", value=None), EnvVarSpec(name="B", value=None))}),
    ("set A = 'it is \"x\"'", {"env": (EnvVarSpec(name="A", value='it is "x"'),)}),
    ('set A = "it\'s\\n"', {"env": (EnvVarSpec(name="A", value="it's\n"),)}),
    ("set A = two words # and all  ", {"env": (EnvVarSpec(name="A", value="two words # and all"),)}),
    ("set A=1", {"env": (EnvVarSpec(name="A", value="1"),)}),
    ('mpi global "--tag-output --output-filename out"',
     {"mpi_global_args": ("--tag-output", "--output-filename", "out")}),
    ("mpi local \"--bind-to core -x B='c d'\"",
     {"mpi_local_args": ("--bind-to", "core"), "env": (EnvVarSpec(name="B", value="c d"),)}),
    ("mpi global ''", {"mpi_global_args": ()}),
    ('instance 0 set A = "b"', {"instance_args": (InstanceArgsSpec(index=0, env=(EnvVarSpec(name="A", value="b"),)),)}),
    ("instance 1 forward X, Y", {"instance_args": (InstanceArgsSpec(
        index=1, env=(EnvVarSpec(name="X", value=None), EnvVarSpec(name="Y", value=None))),)}),
    ('instance 0 mpi "--bind-to core -x A=1"', {"instance_args": (InstanceArgsSpec(
        index=0, env=(EnvVarSpec(name="A", value="1"),), mpi_args=("--bind-to", "core")),)}),
    ("placement SpreadNuma", {"process_placement": "spreadnuma"}),
    ("numa aware", {"numa_aware": True}),
    ("numa unaware", {"numa_aware": False}),
    ("cache /tmp/x", {"executable_cache_path": "/tmp/x"}),
    ("cache off", {"executable_cache_path": ""}),
    ("cache 'off'", {"executable_cache_path": "off"}),
    ("cd off", {"working_dir": "off"}),
    ("offline", {"offline_mode": True}),
    ("offline for pod16", {"offline_mode": True, "offline_target": "pod16"}),
    ("offline target pod16", {"offline_target": "pod16"}),
    ("no offline", {"offline_mode": False}),
    ("autoreport to /tmp/p", {"autoreport_dir": "/tmp/p"}),
    ("subnet 10.5.1.0/16", {"host_subnet": "10.5.0.0/16"}),
    ("print topology", {"print_topology": True}),
    ("no print topology", {"print_topology": False}),
    ("output from instance 0", {"only_output_from_instance": 0}),
    ("distribute ssh key", {"distribute_ssh_key": True}),
    ("distribute ssh key (path ~/.ssh, type ed25519)",
     {"distribute_ssh_key": True, "distribute_ssh_key_path": "~/.ssh", "distribute_ssh_key_type": "ed25519"}),
    ("no distribute ssh key", {"distribute_ssh_key": False}),
    ("ssh key (type rsa)", {"distribute_ssh_key_type": "rsa"}),
    ("allow run as root", {"allow_run_as_root": True}),
    ("no allow run as root", {"allow_run_as_root": False}),
    ("verbosity 2", {"verbosity": 2}),
    ("backend ssh", {"backend": "ssh"}),
    ("cd /work/dir", {"working_dir": "/work/dir"}),
    ("run python3 train.py --name 'my run' # all of it", {"program": (
        "python3", "train.py", "--name", "my run", "#", "all", "of", "it")}),
    ('run ["python3", "-c", "print(\'a\\nb\')"]', {"program": ("python3", "-c", "print('a\nb')")}),
    ("run [abc]", {"program": ("[abc]",)}),
]


@pytest.mark.parametrize(("line", "expected"), STATEMENTS, ids=[line for line, _ in STATEMENTS])
def test_statement_sets_its_fields(line: str, expected: dict[str, Any]) -> None:
    """Each statement sets exactly the spec fields it stands for."""
    assert expected == values(parse_dsl(line, file="job.pop"))


@pytest.mark.parametrize(("line", "expected"), STATEMENTS, ids=[line for line, _ in STATEMENTS])
def test_statement_reads_back_from_to_dsl(line: str, expected: dict[str, Any]) -> None:
    """Every statement's spec survives to_dsl and parse_dsl."""
    spec = parse_dsl(line, file="job.pop")

    assert spec == parse_dsl(to_dsl(spec), file="job.pop")


def test_comments_blank_lines_and_crlf_are_ignored() -> None:
    """Comments, blank lines, indentation and CRLF line ends do not change the spec."""
    text = "# a job\r\n\r\n   8 replicas  # all of them\r\n\t# done\r\n"

    assert {"replicas": 8} == values(parse_dsl(text, file="job.pop"))


def test_repeated_statements_add_variables_instances_and_mpi_arguments() -> None:
    """Variables and per-instance entries add up in order; mpi arguments merge like repeated flags."""
    text = 'forward A\nmpi global "-x B=1 --a"\nset C = 2\nmpi global "--b"\ninstance 0 forward D\ninstance 0 mpi ""'
    spec = parse_dsl(text, file="job.pop")

    assert (["A", "B", "C"], ("--a", "--b"), 2) == (
        [e.value.name for e in spec.env], spec.mpi_global_args and spec.mpi_global_args.value,
        len(spec.instance_args))


def test_same_value_twice_is_accepted() -> None:
    """A statement repeated with the same value is not an error."""
    assert {"replicas": 8} == values(parse_dsl("8 replicas\n8 replicas", file="job.pop"))


def test_values_carry_their_spans() -> None:
    """Values point at their words, with the readable key path and an end column."""
    spec = parse_dsl("hosts pod1\n32 replicas over 2 instances\npartition p at vipu:8090", file="job.pop")

    assert [
        SourceSpan(file="job.pop", key_path="topology.hosts", line=1, column=7, end_line=1, end_column=11),
        SourceSpan(file="job.pop", key_path="topology.replicas", line=2, column=1, end_line=2, end_column=12),
        SourceSpan(file="job.pop", key_path="topology.instances", line=2, column=18, end_line=2, end_column=29),
        SourceSpan(file="job.pop", key_path="partition.name", line=3, column=11, end_line=3, end_column=12),
        SourceSpan(file="job.pop", key_path="partition.server_port", line=3, column=21, end_line=3, end_column=25),
    ] == [s.origin for s in (spec.hosts, spec.replicas, spec.instances, spec.partition, spec.vipu_server_port)
          if s is not None]


def test_load_dsl_reads_a_file(tmp_path: Path) -> None:
    """load_dsl reads the file and names it in the spans."""
    path = tmp_path / "job.pop"
    path.write_text("8 replicas\n", encoding="utf-8")
    spec = load_dsl(str(path))

    assert (8, str(path)) == (spec.replicas and spec.replicas.value, spec.replicas and spec.replicas.origin.file)


def test_load_dsl_reports_a_missing_file(tmp_path: Path) -> None:
    """A file that cannot be read is PR113."""
    with pytest.raises(DiagnosticError) as info:
        load_dsl(str(tmp_path / "missing.pop"))

    assert "PR113" == info.value.diagnostics[0].code


# ---- writing ---------------------------------------------------------------------------


def test_to_dsl_quotes_keywords_and_text_that_is_not_a_word() -> None:
    """Values that would read as keywords or several words are quoted; control characters are escaped."""
    span = SourceSpan(file="<test>", key_path="$")
    spec = Spec(partition=Sourced("at", span), executable_cache_path=Sourced("off", span),
                working_dir=Sourced("my dir", span), env=(Sourced(EnvVarSpec(name="A", value="it's"), span),),
                program=Sourced(("echo", "a\nb"), span))

    assert (
        "partition 'at'\nset A = \"it's\"\ncache 'off'\ncd 'my dir'\nrun [\"echo\", \"a\\nb\"]\n"
    ) == to_dsl(spec)


@pytest.mark.parametrize("field", ["host_file", "vipu_server_host", "partition", "allocation", "executable_cache_path",
                                   "offline_target", "autoreport_dir", "distribute_ssh_key_path", "working_dir"])
def test_every_keyword_reads_back_as_a_value(field: str) -> None:
    """A value spelt like any keyword of the language is written so that it reads back unchanged."""
    span = SourceSpan(file="<test>", key_path="$")
    keywords = [t.pattern.value for t in dsl_parser().terminals if isinstance(t.pattern, PatternStr)]
    specs = [Spec(**{field: Sourced(keyword, span)}) for keyword in [*keywords, "from file", "from"]]

    assert specs == [parse_dsl(to_dsl(spec), file="job.pop") for spec in specs]


def test_to_dsl_writes_simple_values_bare() -> None:
    """Values of shell-safe characters are written without quotes."""
    span = SourceSpan(file="<test>", key_path="$")
    spec = Spec(env=(Sourced(EnvVarSpec(name="N", value="8"), span),), backend=Sourced("ssh", span))

    assert "set N = 8\nbackend ssh\n" == to_dsl(spec)


def test_full_example_of_the_docs_reads_back_unchanged() -> None:
    """The full example of docs/spec-dsl.md sets all but three fields, and its spec survives to_dsl."""
    doc = (Path(__file__).resolve().parents[2] / "docs" / "spec-dsl.md").read_text(encoding="utf-8")
    example = doc.split("## A full example")[1].split("```")[1]
    spec = parse_dsl(example, file="full.pop")

    assert {"host_file", "offline_mode", "offline_target"} == {f.name for f in fields(Spec)} - set(values(spec))
    assert spec == parse_dsl(to_dsl(spec), file="full.pop")


def test_to_dsl_keeps_the_order_of_hosts() -> None:
    """Hosts not in natural order are listed as written rather than compressed."""
    span = SourceSpan(file="<test>", key_path="$")

    assert "hosts pod2, pod1\n" == to_dsl(Spec(hosts=Sourced(("pod2", "pod1"), span)))


# ---- diagnostics -----------------------------------------------------------------------

ERRORS = [
    # text, code, summary, line, column, end column
    ("replics 8", "PR108", "unknown statement 'replics'", 1, 1, 8),
    ("host pod1", "PR108", "unknown statement 'host'", 1, 1, 5),
    ("replicas 8", "PR108", "number missing before 'replicas'", 1, 1, 9),
    ("8", "PR108", "number without what it counts", 1, 2, 3),
    ("8 replics", "PR108", "DSL syntax error", 1, 3, 10),
    ("partition p (update, keep", "PR108", "unclosed '('", 1, 26, 27),
    ("distribute ssh key (path ~/.ssh", "PR108", "unclosed '('", 1, 32, 33),
    ("set A b", "PR108", "missing '=' after the variable name", 1, 7, 8),
    ("run", "PR108", "no program after 'run'", 1, 4, 5),
    ("hosts", "PR108", "no hosts after 'hosts'", 1, 6, 7),
    ("8 replicas#x", "PR108", "DSL syntax error", 1, 11, 13),
    ("\x0b", "PR108", "unknown statement '\\x0b'", 1, 1, 2),
    ('set A = "a\\qb"', "PR108", "invalid escape in quoted string", 1, 11, 13),
    ("\n  hosts pod[1-4", "PR103", "unclosed host range", 2, 12, 13),
    ("hosts 'pod[4-1]'", "PR103", "reversed host range '4-1'", 1, 12, 15),
    ("0 replicas", "PR200", "invalid value for topology.replicas", 1, 1, 2),
    ("8 replicas over 0 instances", "PR200", "invalid value for topology.instances", 1, 17, 18),
    ("partition (timeout 0)", "PR200", "invalid value for partition.timeout", 1, 20, 21),
    ("partition at vipu:99999", "PR212", "invalid value for partition.server_port", 1, 19, 24),
    ("partition (port 0)", "PR212", "invalid value for partition.server_port", 1, 17, 18),
    ("partition at [::1", "PR105", "invalid value for partition.server_host", 1, 14, 18),
    ("placement spredanuma", "PR105", "invalid value for placement.strategy", 1, 11, 21),
    ("backend ssh/x", "PR105", "invalid value for run.backend", 1, 9, 14),
    ("distribute ssh key (type ed2551)", "PR105", "invalid value for ssh.key_type", 1, 26, 32),
    ("subnet 10.5.0.0/33", "PR213", "invalid value for network.host_subnet", 1, 8, 19),
    ("set 1A = x", "PR105", "invalid environment variable name", 1, 5, 7),
    ("forward A, B-C", "PR105", "invalid environment variable name", 1, 12, 15),
    ('mpi local "-x 1B"', "PR105", "invalid value for mpi.local_args", 1, 11, 18),
    ("run python3 'train.py", "PR107", "invalid value for program.argv", 1, 5, 22),
    ("8 replicas\n16 replicas", "PR111", "topology.replicas given twice", 2, 1, 12),
    ("partition at vipu:1 (port 2)", "PR111", "partition.server_port given twice", 1, 27, 28),
]


@pytest.mark.parametrize("case", ERRORS, ids=[text for text, *_ in ERRORS])
def test_error_has_code_summary_and_place(case: tuple[str, str, str, int, int, int]) -> None:
    """Each mistake gets its code and summary, placed on its line and columns."""
    text, code, summary, line, column, end_column = case
    found = only(text)

    assert (code, summary, line, column, line, end_column) == (
        found.code, found.summary, found.span.line, found.span.column, found.span.end_line, found.span.end_column)


def test_syntax_error_at_the_start_names_every_statement() -> None:
    """An unknown first word lists what may start a statement and suggests the nearest keyword."""
    found = only("replics 8")

    assert (
        ("expected a count (as in '8 replicas'), 'hosts', 'partition', 'forward', 'set', 'mask', 'mpi', 'instance', "
         "'placement', 'numa', 'cache', 'offline', 'autoreport', 'subnet', 'print', 'output', 'distribute', "
         "'ssh', 'allow', 'verbosity', 'backend', 'never', 'cd', 'run', 'no', 'spare', 'rank', 'network', 'devices', 'device', "
         "'max', 'restart', 'min', 'crash', 'pre', 'timeout', 'stall', 'signal', 'heartbeat', 'straggler', 'health', 'notify' "
         "or 'metrics' at the start "
         "of a statement, found 'replics'"),
        "did you mean 'replicas'? (the number goes first, as in '8 replicas')",
        "replics 8",
        "job.pop",
    ) == (found.detail, found.hint, found.source_line, found.span.file)


def test_unknown_statement_suggests_the_nearest_keyword() -> None:
    """A misspelt statement keyword gets a did-you-mean."""
    assert "did you mean 'hosts'?" == only("host pod1").hint


def test_misspelt_word_inside_a_statement_gets_a_suggestion() -> None:
    """A misspelt keyword after the first word is suggested from the words expected there."""
    found = only("partition p (updte)")

    assert (("expected 'update', 'no', 'reset', 'keep', 'remove', 'allocation', 'timeout', 'attempts', 'sync', "
             "'ipu-link', 'gw-link' or 'port' after '(', found 'updte'"), "did you mean 'update'?") == (
        found.detail, found.hint)


def test_labelled_mistakes_explain_what_to_do() -> None:
    """Mistakes labelled by example carry their own detail and hint."""
    unclosed = only("partition my_partition (update, keep")
    number = only("replicas 8 over 2 instances")

    assert (
        "expected ',' or ')' after 'keep', found the end of the line", "close the options with ')'",
        "put the number first: 8 replicas",
    ) == (unclosed.detail, unclosed.hint, number.hint)


def test_host_list_error_points_inside_the_line() -> None:
    """A host list error carries hostlist's message and hint, with the caret at the bracket."""
    found = only("hosts pod[1-4")

    assert ("PR103", "in host list 'pod[1-4'", "add ']' to close the range", 10, "hosts pod[1-4") == (
        found.code, found.detail, found.hint, found.span.column, found.source_line)


def test_bad_choice_suggests_the_nearest_choice() -> None:
    """A misspelt choice is PR105 with a did-you-mean."""
    found = only("placement spredanuma")

    assert ("'spredanuma' is not one of the choices", "did you mean 'spreadnuma'?") == (found.detail, found.hint)


def test_value_given_twice_points_at_both_places() -> None:
    """PR111 names both values and relates the first place."""
    found = only("8 replicas\n16 replicas")

    assert ("first 8 (line 1), then 16", 1, "16 replicas") == (
        found.detail, found.related[0].line, found.source_line)


def test_every_bad_line_is_reported_together() -> None:
    """All errors of a file are raised at once, one per bad line, in order."""
    found = diagnostics("replics 8\n8 replicas\nhosts pod[1-4\nrun\n0 instances\n")

    assert [("PR108", 1), ("PR103", 3), ("PR108", 4), ("PR200", 5)] == [(d.code, d.span.line) for d in found]
