"""
Unit tests for ``poprun.planner.tomlspec``: the TOML front end, its diagnostics and to_toml.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from poprun.core.diagnostic import Diagnostic, DiagnosticError
from poprun.core.span import SourceSpan
from poprun.planner.spec import EnvVarSpec, InstanceArgsSpec, Sourced, Spec
from poprun.planner.tomlspec import SECTIONS, load_toml, parse_toml, section_keys, to_toml

DESIGN_EXAMPLE = (Path(__file__).parents[2] / "examples" / "train.toml").read_text(encoding="utf-8")

SPAN = SourceSpan(file="<test>", key_path="$")


def _s(value: Any) -> Sourced[Any]:
    return Sourced(value, SPAN)


def _problems(text: str) -> tuple[Diagnostic, ...]:
    with pytest.raises(DiagnosticError) as caught:
        parse_toml(text, file="job.toml")
    return caught.value.diagnostics


def _only(text: str) -> Diagnostic:
    (diagnostic,) = _problems(text)
    return diagnostic


FIELDS = [
    ('[topology]\nhosts = "pod[1-3]"', "hosts", ("pod1", "pod2", "pod3")),
    ('[topology]\nhosts = ["pod2", "pod[1-2]", "login"]', "hosts", ("pod2", "pod1", "login")),
    ('[topology]\nhost_file = "hosts.txt"', "host_file", "hosts.txt"),
    ("[topology]\nreplicas = 16", "replicas", 16),
    ("[topology]\nipus_per_replica = 4", "ipus_per_replica", 4),
    ("[topology]\ninstances = 2", "instances", 2),
    ("[topology]\nilds = 1", "ilds", 1),
    ('[partition]\nserver_host = "vipu"', "vipu_server_host", "vipu"),
    ("[partition]\nserver_port = 8091", "vipu_server_port", 8091),
    ("[partition]\ntimeout = 30", "vipu_server_timeout", 30),
    ('[partition]\nname = "p"', "partition", "p"),
    ('[partition]\nallocation = "a"', "allocation", "a"),
    ("[partition]\nupdate = true", "update_partition", True),
    ("[partition]\nreset = false", "reset_partition", False),
    ("[partition]\nremove = true", "remove_partition", True),
    ("[partition]\nattempts = 3", "partition_attempts", 3),
    ('[partition]\nsync_type = "st_pod_native"', "sync_type", "ST_POD_NATIVE"),
    ('[partition]\nipu_link_routing_type = "DNC"', "ipu_link_routing_type", "DNC"),
    ('[partition]\ngw_link_routing_type = "swnc"', "gw_link_routing_type", "SWNC"),
    ('[partition]\nserver = "vipu:8092"', "vipu_server_port", 8092),
    ('[partition]\nserver = "vipu:8092"', "vipu_server_host", "vipu"),
    ('[partition]\nserver = "[::1]:8092"', "vipu_server_host", "::1"),
    ('[cache]\npath = ""', "executable_cache_path", ""),
    ('[mpi]\nglobal_args = ["--tag-output", "--bind-to", "none"]', "mpi_global_args",
     ("--tag-output", "--bind-to", "none")),
    ("[mpi]\nlocal_args = \"--mca btl_tcp_if_include 'eth0 eth1'\"", "mpi_local_args",
     ("--mca", "btl_tcp_if_include", "eth0 eth1")),
    ("[placement]\nnuma_aware = true", "numa_aware", True),
    ('[placement]\nstrategy = "close"', "process_placement", "close"),
    ("[output]\nprint_topology = true", "print_topology", True),
    ("[output]\nonly_from_instance = 0", "only_output_from_instance", 0),
    ("[offline]\nmode = true", "offline_mode", True),
    ('[offline]\ntarget = "pod16"', "offline_target", "pod16"),
    ('[profile]\nautoreport_dir = "reports"', "autoreport_dir", "reports"),
    ('[network]\nhost_subnet = "10.5.1.7/16"', "host_subnet", "10.5.0.0/16"),
    ("[ssh]\ndistribute_key = true", "distribute_ssh_key", True),
    ('[ssh]\nkey_path = "~/.ssh"', "distribute_ssh_key_path", "~/.ssh"),
    ('[ssh]\nkey_type = "ed25519"', "distribute_ssh_key_type", "ed25519"),
    ("[run]\nverbosity = 2", "verbosity", 2),
    ("[run]\nallow_run_as_root = true", "allow_run_as_root", True),
    ('[run]\nbackend = "ssh"', "backend", "ssh"),
    ('[program]\nargv = ["python3", "a b.py"]', "program", ("python3", "a b.py")),
    ("[program]\nargv = \"python3 'a b.py' -v\"", "program", ("python3", "a b.py", "-v")),
    ('[program]\ncwd = "/work"', "working_dir", "/work"),
    ("topology.replicas = 8", "replicas", 8),
    ("topology = { replicas = 8 }", "replicas", 8),
]


@pytest.mark.parametrize(("text", "field", "value"), FIELDS, ids=[f"{f}:{t[:30]}" for t, f, _ in FIELDS])
def test_each_key_sets_its_spec_field(text: str, field: str, value: object) -> None:
    """Every section and key of the schema lands in its Spec field with the right value."""
    spec = parse_toml(text, file="job.toml")

    assert value == getattr(spec, field).value


def test_design_example_parses_to_the_expected_spec() -> None:
    """The example spec in design.md section 4 parses to the launch it describes."""
    expected = Spec(
        hosts=_s(("pod1", "pod2")), replicas=_s(32), instances=_s(2), ilds=_s(2),
        partition=_s("my_partition"), vipu_server_host=_s("vipu.my_domain"), vipu_server_port=_s(34521),
        update_partition=_s(value=True), remove_partition=_s(value=False),
        env=(_s(EnvVarSpec(name="PYTHONPATH", value=None)),
             _s(EnvVarSpec(name="POPLAR_ENGINE_OPTIONS", value='{"autoReport.all":"true"}'))),
        program=_s(("python3", "train.py", "--epochs", "3")),
    )

    assert expected == parse_toml(DESIGN_EXAMPLE, file="train.toml")


def test_byte_order_mark_is_ignored() -> None:
    """A file saved with a byte-order mark reads as without it, at the same columns."""
    origin = parse_toml("\ufeff[topology]\nreplicas = 2\n", file="job.toml").replicas.origin  # type: ignore[union-attr]

    assert (2, 12) == (origin.line, origin.column)


def test_empty_file_is_an_empty_spec() -> None:
    """A file with only comments asks for nothing."""
    assert Spec() == parse_toml("# nothing yet\n", file="job.toml")


def test_env_entries_come_forward_then_set_then_export_then_mpi_args() -> None:
    """
    GIVEN variables in [env] and -x pairs in both mpi argument keys
    WHEN the file is parsed
    THEN the spec's env lists them in the documented order and -x leaves the arguments.
    """
    text = """
[mpi]
local_args = ["-x", "L=1"]
global_args = "-x G --tag-output"
[env]
export = ["E=2", "F"]
set = { S = "v" }
forward = ["P"]
"""

    spec = parse_toml(text, file="job.toml")

    assert [("P", None), ("S", "v"), ("E", "2"), ("F", None), ("G", None), ("L", "1")] == [
        (e.value.name, e.value.value) for e in spec.env]
    assert ("--tag-output",) == spec.mpi_global_args.value  # type: ignore[union-attr]
    assert () == spec.mpi_local_args.value  # type: ignore[union-attr]


def test_instance_tables_become_instance_args_sorted_by_index() -> None:
    """[instances.N] tables give InstanceArgsSpec values, sorted by index, with -x taken into env."""
    text = """
[instances.2]
mpi_args = "-x A=1 --bind-to none"
[instances.0]
forward = ["B"]
set = { C = "3" }
"""

    spec = parse_toml(text, file="job.toml")

    assert (InstanceArgsSpec(index=0, env=(EnvVarSpec(name="B", value=None), EnvVarSpec(name="C", value="3"))),
            InstanceArgsSpec(index=2, env=(EnvVarSpec(name="A", value="1"),), mpi_args=("--bind-to", "none")),
            ) == tuple(entry.value for entry in spec.instance_args)


def test_values_carry_spans_at_the_value_text() -> None:
    """Each Sourced value points at its value's line and columns, with a cattrs-style key path."""
    spec = parse_toml(DESIGN_EXAMPLE, file="train.toml")

    assert SourceSpan(file="train.toml", key_path="$.topology.replicas", line=3, column=12, end_line=3,
                      end_column=14) == spec.replicas.origin  # type: ignore[union-attr]
    assert SourceSpan(file="train.toml", key_path="$.env.forward[0]", line=15, column=12, end_line=15,
                      end_column=24) == spec.env[0].origin
    assert SourceSpan(file="train.toml", key_path="$.env.set.POPLAR_ENGINE_OPTIONS", line=16, column=33,
                      end_line=16, end_column=60) == spec.env[1].origin
    assert ("$.program.argv", 19, 8) == (spec.program.origin.key_path, spec.program.origin.line,  # type: ignore[union-attr]
                                          spec.program.origin.column)  # type: ignore[union-attr]


def test_spans_follow_dotted_quoted_and_inline_keys() -> None:
    """Values written with dotted keys, quoted keys and inline tables are located too."""
    text = 'env."set" = { A = "1", "B" = "2" }\n[instances]\n3 = { forward = ["X"] }\n'

    spec = parse_toml(text, file="job.toml")

    assert [("$.env.set.B", 1, 30)] == [(e.origin.key_path, e.origin.line, e.origin.column) for e in spec.env[1:]]
    assert ("$.instances.3", 3, 5) == (spec.instance_args[0].origin.key_path, spec.instance_args[0].origin.line,
                                        spec.instance_args[0].origin.column)


def test_multiline_array_items_are_located_on_their_own_lines() -> None:
    """An item of an array written over several lines points at its own line."""
    text = '[topology]\nhosts = [\n  "pod1",  # first\n  "pod2",\n]\n[mpi]\nglobal_args = ["-x", "A"]\n'

    spec = parse_toml(text, file="job.toml")

    assert (2, 9, 5, 2) == (spec.hosts.origin.line, spec.hosts.origin.column,  # type: ignore[union-attr]
                            spec.hosts.origin.end_line, spec.hosts.origin.end_column)  # type: ignore[union-attr]
    assert ("$.mpi.global_args[1]", 7, 22) == (spec.env[0].origin.key_path, spec.env[0].origin.line,
                                               spec.env[0].origin.column)


NAME_RULE = "use letters, digits and underscores, not starting with a digit"
FORWARD_RULE = "forward takes names only; put variables with a value under set"

# Each case: the file's text, then the code, summary, detail, hint, line and column expected.
DIAGNOSTICS = [
    ("[topology]\nreplicas = 4 4\n", "PR100", "TOML syntax error",
     "Expected newline or end of document after a statement", "put each key = value on a line of its own", 2, 14),
    ("[topology]\nreplicas = four\n", "PR100", "TOML syntax error", "Invalid value",
     'quote text: key = "text"; booleans are true and false, numbers have no quotes', 2, 12),
    ("[topology]\nreplicas = 1\nreplicas = 2\n", "PR100", "TOML syntax error", "Cannot overwrite a value",
     "give each key and each [table] once", 3, 13),
    ('a = "open', "PR100", "TOML syntax error", "Unterminated string",
     "close the string with the quote that opened it", 1, 10),
    ('[topology]\nhosts = "pod[1-4"\n', "PR103", "unclosed host range", "in host list 'pod[1-4'",
     "add ']' to close the range", 2, 13),
    ('[topology]\nhosts = ["login", "pod[5-1]"]\n', "PR103", "reversed host range '5-1'",
     "in host list 'pod[5-1]'", "write pod[1-5]", 2, 24),
    ('[placement]\nstrategy = "spread"\n', "PR105", "invalid value for [placement] strategy",
     "'spread' is not one of the choices", "did you mean 'spreadnuma'?", 2, 12),
    ('[env]\nforward = ["PATH", "A=1"]\n', "PR105", "invalid value for [env] forward",
     "'A=1' is not an environment variable name", FORWARD_RULE, 2, 20),
    ('[env]\nset = { "1A" = "x" }\n', "PR105", "invalid value for [env] set",
     "'1A' is not an environment variable name", NAME_RULE, 2, 9),
    ('[mpi]\nglobal_args = ["-x", "A-B=1"]\n', "PR105", "invalid value for [mpi] global_args",
     "'A-B' is not an environment variable name", NAME_RULE, 2, 22),
    ('[partition]\nserver = ":8090"\n', "PR105", "invalid value for [partition] server", "':8090' names no host",
     'write server = "host:port"', 2, 10),
    ("[mpi]\nlocal_args = \"-x 'A\"\n", "PR107", "invalid value for [mpi] local_args",
     "unbalanced quotes in \"-x 'A\"", "close the quote, or quote the whole value once", 2, 14),
    ("[program]\nargv = 'python3 \"x'\n", "PR107", "invalid value for [program] argv",
     "unbalanced quotes in 'python3 \"x'", "close the quote, or quote the whole value once", 2, 8),
    ("replicas = 8\n", "PR109", "unknown key 'replicas'", "'replicas' is outside of any section",
     "did you mean [topology] replicas?", 1, 1),
    ("[topolgy]\nreplicas = 8\n", "PR109", "unknown section [topolgy]", "the spec has no section [topolgy]",
     "did you mean [topology]?", 1, 2),
    ("[topology]\nreplicaz = 8\n", "PR109", "unknown key 'replicaz' in [topology]",
     "[topology] has no key 'replicaz'", "did you mean 'replicas'?", 2, 1),
    ('[topology]\nname = "p"\n', "PR109", "unknown key 'name' in [topology]", "[topology] has no key 'name'",
     "did you mean [partition] name?", 2, 1),
    ("[instances.first]\n", "PR109", "unknown key 'first' in [instances]",
     "instance tables are named by an instance index, not 'first'",
     "name the table by its index, e.g. [instances.0]", 1, 12),
    ("[instances.0]\nargs = []\n", "PR109", "unknown key 'args' in [instances.0]",
     "[instances.0] has no key 'args'", "did you mean 'mpi_args'?", 2, 1),
    ('[topology]\nreplicas = "4"\n', "PR110", "wrong type for [topology] replicas",
     "expected an integer, found a string '4'", "write replicas = 4 without quotes", 2, 12),
    ("[topology]\nreplicas = 4.0\n", "PR110", "wrong type for [topology] replicas",
     "expected an integer, found a float 4.0", "write replicas = 4", 2, 12),
    ('[partition]\nupdate = "yes"\n', "PR110", "wrong type for [partition] update",
     "expected a boolean, found a string 'yes'", "write update = true (true or false, without quotes)", 2, 10),
    ("[partition]\nname = 7\n", "PR110", "wrong type for [partition] name",
     "expected a string, found an integer 7", 'write it with quotes: "7"', 2, 8),
    ("[topology]\nhosts = 3\n", "PR110", "wrong type for [topology] hosts",
     "expected a string or an array of strings, found an integer 3",
     'write hosts = "pod[1-4]" or ["pod1", "login"]', 2, 9),
    ('[env]\nforward = "PYTHONPATH"\n', "PR110", "wrong type for [env] forward",
     "expected an array, found a string 'PYTHONPATH'", 'write forward = ["PYTHONPATH"]', 2, 11),
    ("topology = 4\n", "PR110", "wrong type for [topology]", "expected a table, found an integer 4",
     "write [topology] on a line of its own, its keys below it", 1, 12),
    ("instances = 4\n", "PR110", "wrong type for [instances]", "expected a table, found an integer 4",
     "did you mean [topology] instances?", 1, 13),
    ("[topology]\nreplicas = 0\n", "PR200", "invalid value for [topology] replicas", "0 is not a positive number",
     "use a whole number of at least 1", 2, 12),
    ('[partition]\nserver = "v:1"\nserver_host = "w"\n', "PR211", "[partition] server and server_host both set",
     "server = 'v:1' already gives the V-IPU server's host",
     'keep one: server = "host:port", or server_host and server_port', 2, 10),
    ("[partition]\nserver_port = 70000\n", "PR212", "invalid value for [partition] server_port",
     "70000 is not a port number", "use a port between 1 and 65535", 2, 15),
    ('[partition]\nserver = "vipu:0"\n', "PR212", "invalid value for [partition] server",
     "0 is not a port number", "use a port between 1 and 65535", 2, 10),
    ('[network]\nhost_subnet = "10.0.0.0/33"\n', "PR213", "invalid value for [network] host_subnet",
     "'10.0.0.0/33' is not a subnet", "write it as an address and prefix, e.g. 10.5.0.0/16", 2, 15),
]


@pytest.mark.parametrize("case", DIAGNOSTICS, ids=[f"{d[1]}:{d[2]}" for d in DIAGNOSTICS])
def test_each_problem_gets_its_diagnostic_at_its_place(case: tuple[str, str, str, str, str, int, int]) -> None:
    """Each kind of problem gives one diagnostic with its code, exact words, line and column."""
    text, *expected = case

    diagnostic = _only(text)

    assert expected == [diagnostic.code, diagnostic.summary, diagnostic.detail, diagnostic.hint,
                        diagnostic.span.line, diagnostic.span.column]
    assert "job.toml" == diagnostic.span.file
    assert text.split("\n")[diagnostic.span.line - 1] == diagnostic.source_line  # type: ignore[operator]


def test_diagnostic_about_a_value_spans_the_value_and_about_a_key_the_key() -> None:
    """A wrong value is underlined whole; an unknown key is underlined as the key, with key paths."""
    wrong, unknown = _problems('[topology]\nreplicas = "four"\nreplicaz = 4\n')

    assert ("$.topology.replicas", 12, 18) == (wrong.span.key_path, wrong.span.column, wrong.span.end_column)
    assert ("$.topology.replicaz", 1, 9) == (unknown.span.key_path, unknown.span.column, unknown.span.end_column)


def test_host_list_error_points_into_the_string() -> None:
    """A host-list error underlines the offending characters inside the quoted string."""
    diagnostic = _only('[topology]\nhosts = "a,pod[1-2,x]"\n')

    assert ("invalid host range piece 'x'", 2, 20, 21) == (
        diagnostic.summary, diagnostic.span.line, diagnostic.span.column, diagnostic.span.end_column)


def test_every_problem_is_reported_in_text_order() -> None:
    """
    GIVEN a file with problems in several sections
    WHEN it is parsed
    THEN one DiagnosticError holds all of them, ordered by line.
    """
    text = """\
[run]
backend = "s h"
[topology]
replicas = -2
hosts = ["pod1", 2]
[bogus]
"""

    diagnostics = _problems(text)

    assert [("PR105", 2), ("PR200", 4), ("PR110", 5), ("PR109", 6)] == [
        (d.code, d.span.line) for d in diagnostics]


def test_syntax_error_at_end_of_document_points_after_the_last_character() -> None:
    """A syntax error tomllib places at the end of the document points after the last line."""
    diagnostic = _only("[topology]\nhosts = [\n")

    assert ("PR100", "Invalid value", 3, 1) == (
        diagnostic.code, diagnostic.detail, diagnostic.span.line, diagnostic.span.column)


@pytest.mark.parametrize("text", ["a = " + "[" * 3000 + "]" * 3000, "a = " + "9" * 5000],
                         ids=["deep nesting", "long integer"])
def test_input_tomllib_cannot_handle_is_a_syntax_error(text: str) -> None:
    """Text that makes tomllib itself fail (recursion, giant integers) is a PR100, not a crash."""
    assert "PR100" == _only(text).code


def test_load_toml_reads_the_file(tmp_path: Path) -> None:
    """load_toml parses a file and names it in the spans."""
    path = tmp_path / "train.toml"
    path.write_text(DESIGN_EXAMPLE, encoding="utf-8")

    spec = load_toml(str(path))

    assert (32, str(path)) == (spec.replicas.value, spec.replicas.origin.file)  # type: ignore[union-attr]


def test_load_toml_of_a_missing_file_is_pr113(tmp_path: Path) -> None:
    """A file that cannot be read is a PR113 diagnostic."""
    with pytest.raises(DiagnosticError) as caught:
        load_toml(str(tmp_path / "missing.toml"))

    assert ["PR113"] == [d.code for d in caught.value.diagnostics]


def test_to_toml_writes_the_design_example_in_section_order() -> None:
    """to_toml writes only the values set, sections in fixed order, the server as host and port."""
    expected = """\
[topology]
hosts = "pod[1-2]"
replicas = 32
instances = 2
ilds = 2

[partition]
server_host = "vipu.my_domain"
server_port = 34521
name = "my_partition"
update = true
remove = false

[env]
forward = [
    "PYTHONPATH",
]

[env.set]
POPLAR_ENGINE_OPTIONS = "{\\"autoReport.all\\":\\"true\\"}"

[program]
argv = [
    "python3",
    "train.py",
    "--epochs",
    "3",
]
"""

    assert expected == to_toml(parse_toml(DESIGN_EXAMPLE, file="train.toml"))


def test_to_toml_of_an_empty_spec_is_empty() -> None:
    """A spec with nothing set is an empty document."""
    assert "" == to_toml(Spec())


@pytest.mark.parametrize(("hosts", "written"), [
    (("pod1", "pod2", "pod3"), 'hosts = "pod[1-3]"'),
    (("pod2", "pod1"), 'hosts = [\n    "pod2",\n    "pod1",\n]'),
    ((), "hosts = []"),
])
def test_to_toml_compresses_hosts_only_when_the_order_survives(hosts: tuple[str, ...], written: str) -> None:
    """Hosts are written as a host list when it expands to the same order, otherwise as names."""
    assert f"[topology]\n{written}\n" == to_toml(Spec(hosts=_s(hosts)))


def test_to_toml_writes_out_of_order_variables_as_export() -> None:
    """Variables that forward-then-set cannot keep in order are written as one ordered export array."""
    spec = Spec(env=(_s(EnvVarSpec(name="A", value="1")), _s(EnvVarSpec(name="B", value=None))))

    assert '[env]\nexport = [\n    "A=1",\n    "B",\n]\n' == to_toml(spec)
    assert spec == parse_toml(to_toml(spec), file="job.toml")


def test_to_toml_merges_repeated_instance_indices() -> None:
    """Two --instance-mpi-local-args for one index become one [instances.N] table."""
    spec = Spec(instance_args=(
        _s(InstanceArgsSpec(index=1, mpi_args=("--a",))),
        _s(InstanceArgsSpec(index=1, env=(EnvVarSpec(name="X", value="2"),), mpi_args=("--b",))),
    ))

    back = parse_toml(to_toml(spec), file="job.toml")

    assert (InstanceArgsSpec(index=1, env=(EnvVarSpec(name="X", value="2"),), mpi_args=("--a", "--b")),) == tuple(
        entry.value for entry in back.instance_args)


def _reference() -> str:
    return (Path(__file__).resolve().parents[2] / "docs" / "spec-toml.md").read_text(encoding="utf-8")


def test_every_toml_example_in_the_reference_parses() -> None:
    """Each ```toml block of docs/spec-toml.md is a valid spec."""
    blocks = re.findall(r"```toml\n(.*?)```", _reference(), flags=re.DOTALL)

    assert 3 == len(blocks)
    for block in blocks:
        parse_toml(block, file="spec-toml.md")


def test_the_reference_documents_every_section_and_key() -> None:
    """docs/spec-toml.md has a heading for every section and a row for every key."""
    text = _reference()

    assert [] == [s for s in SECTIONS if f"## `[{s}" not in text]
    assert [] == [f"{s}.{k}" for s in SECTIONS for k in section_keys(s) if f"| `{k}` |" not in text
                  and f"`{k}`," not in text]


def test_server_conflict_names_both_places() -> None:
    """PR211 points at server and lists server_port, where the other value was written, as related."""
    diagnostic = _only('[partition]\nserver_port = 1\nserver = "v:2"\n')

    assert ("[partition] server and server_port both set", 3, ("$.partition.server_port", 2, 15)) == (
        diagnostic.summary, diagnostic.span.line,
        (diagnostic.related[0].key_path, diagnostic.related[0].line, diagnostic.related[0].column))
