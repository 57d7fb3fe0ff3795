"""The PopRun command line front end: real users' quirks and every diagnostic it emits."""

import pytest

from poprun.core.diagnostic import DiagnosticError
from poprun.planner.flags import CommandLine, parse_flags
from poprun.planner.spec import EnvVarSpec, InstanceArgsSpec


def parse(*argv: str, environ: dict[str, str] | None = None) -> CommandLine:
    return parse_flags(list(argv), environ=environ)


def failure(*argv: str):
    with pytest.raises(DiagnosticError) as info:
        parse(*argv)
    errors = [d for d in info.value.diagnostics if d.is_error]
    return errors[0]


@pytest.mark.parametrize("argv", [("--num-replicas=8",), ("--num-replicas", "8")])
def test_value_may_follow_with_equals_or_space(argv):
    """``--opt=v`` and ``--opt v`` mean the same."""
    assert 8 == parse(*argv, "prog").spec.replicas.value


def test_value_taking_option_consumes_a_token_starting_with_dash():
    """``--mpi-global-args --tag-output`` (Graphcore's own tests) gives the value ``--tag-output``."""
    spec = parse("--mpi-global-args", "--allow-run-as-root", "--num-replicas", "2", "python3", "x.py").spec

    assert ("--allow-run-as-root",) == spec.mpi_global_args.value
    assert 2 == spec.replicas.value


def test_unambiguous_prefix_is_accepted():
    """``--num-instance 2`` (missing 's', seen in real commands) is ``--num-instances``."""
    assert 2 == parse("--num-instance", "2", "prog").spec.instances.value


def test_ambiguous_prefix_is_rejected_with_did_you_mean():
    """``--num=ilds 4`` (a real benchmark typo) is PR102 suggesting ``--num-ilds``."""
    diag = failure("--num=ilds", "4", "python3", "x.py")

    assert ("PR102", "ambiguous option '--num'") == (diag.code, diag.summary)
    assert "did you mean '--num-ilds'?" == diag.hint
    assert "--num-ilds" in diag.detail


def test_unknown_option_suggests_the_nearest():
    """A misspelt option is PR101 with a did-you-mean."""
    diag = failure("--num-replcas", "4", "prog")

    assert ("PR101", "did you mean '--num-replicas'?") == (diag.code, diag.hint)


@pytest.mark.parametrize(("word", "value"), [("yes", True), ("no", False), ("1", True), ("0", False),
                                             ("true", True), ("False", False), ("on", True), ("off", False)])
def test_boolean_words(word, value):
    """Booleans accept yes/no/1/0/true/false/on/off in any case."""
    assert value == parse(f"--numa-aware={word}", "prog").spec.numa_aware.value


@pytest.mark.parametrize(("word", "value"), [("SSH", "ssh"), ("Local", "local"), ("gpu-cluster", "gpu-cluster"),
                                             ("my_backend.v2", "my_backend.v2")])
def test_backend_names_are_built_ins_in_canonical_case_or_plugin_names_as_written(word, value):
    """--backend takes poprun's backends in any case and a plugin's name as it is written."""
    assert value == parse(f"--backend={word}", "prog").spec.backend.value


@pytest.mark.parametrize("word", ["a b", "", "gpu/cluster", ".hidden"])
def test_backend_that_is_no_name_is_pr105(word):
    """A --backend value that cannot name an entry point is PR105, listing poprun's backends."""
    diag = failure(f"--backend={word}", "prog")

    assert ("PR105", "invalid value for --backend") == (diag.code, diag.summary)
    assert "or the name of an installed backend plugin" in diag.hint


def test_invalid_boolean_is_pr105():
    """A boolean option with another word is PR105."""
    diag = failure("--offline-mode=maybe", "prog")

    assert ("PR105", "invalid value for --offline-mode") == (diag.code, diag.summary)
    assert "'maybe' is not a yes/no value" == diag.detail


@pytest.mark.parametrize(("argv", "level"), [(("-v",), 1), (("-vv",), 2), (("--vv",), 2), (("-v", "-v"), 2),
                                             (("--verbose",), 1)])
def test_verbosity_spellings(argv, level):
    """``-v``, ``-vv`` and ``--vv`` all occur in real commands."""
    assert level == parse(*argv, "prog").spec.verbosity.value


def test_repeated_mpi_args_merge():
    """Repeated ``--mpi-global-args`` merge in order (changelog 2.1)."""
    spec = parse("--mpi-global-args=--tag-output", "--mpi-global-args", "--mca btl_tcp_if_include eno1", "p").spec

    assert ("--tag-output", "--mca", "btl_tcp_if_include", "eno1") == spec.mpi_global_args.value


def test_x_variables_become_the_environment():
    """``-x NAME`` forwards, ``-x NAME=VALUE`` sets, quoted values keep their spaces."""
    spec = parse("--mpi-local-args=-x PYTHONPATH -x TF_CPP_VMODULE='poplar_compiler=0, poplar_executor=0' "
                 "--bind-to core", "prog").spec

    assert [EnvVarSpec(name="PYTHONPATH", value=None),
            EnvVarSpec(name="TF_CPP_VMODULE", value="poplar_compiler=0, poplar_executor=0")] == [
        e.value for e in spec.env]
    assert ("--bind-to", "core") == spec.mpi_local_args.value


def test_host_list_split_by_a_space_names_the_stray_token():
    """``--host a, b`` (seen in real READMEs) is PR106, not a program called ``b``."""
    diag = failure("--host", "host_address_1,", "host_address_2", "python3", "x.py")

    assert ("PR106", "host list split by a space") == (diag.code, diag.summary)
    assert "'host_address_2' follows as a separate word" in diag.detail
    assert "remove the space: --host host_address_1,host_address_2" == diag.hint


def test_host_ranges_expand():
    """``--host pod[1-4]`` is four hosts."""
    assert ("pod1", "pod2", "pod3", "pod4") == parse("-H", "pod[1-4]", "prog").spec.hosts.value


def test_short_host_option_with_attached_value():
    """``-Hpod1,pod2`` is accepted like ``-H pod1,pod2``."""
    assert ("pod1", "pod2") == parse("-Hpod1,pod2", "prog").spec.hosts.value


def test_host_range_error_points_into_the_value():
    """An unclosed range is PR103 with the caret at the bracket."""
    diag = failure("--host=pod[1-4", "prog")

    assert ("PR103", "unclosed host range") == (diag.code, diag.summary)
    assert diag.span.column == len("poprun --host=pod") + 1


def test_option_without_value_at_the_end_is_pr104():
    """A value-taking option as the last word is PR104."""
    assert "PR104" == failure("--num-replicas").code


def test_swallowed_option_hints_at_the_lost_value():
    """``--ipus-per-replica --mpi-local-args=...`` (a real mistake) says the value was lost."""
    diag = failure("--ipus-per-replica", "--mpi-local-args=--tag-output", "prog")

    assert "PR105" == diag.code
    assert "'--mpi-local-args=--tag-output' looks like an option: did --ipus-per-replica lose its value?" == diag.hint


def test_scalar_given_twice_with_different_values_is_pr111():
    """``--vipu-server-host`` twice with different values (a real mistake) is PR111."""
    diag = failure("--vipu-server-host=a", "--vipu-server-host=b", "prog")

    assert ("PR111", "first 'a', then 'b'") == (diag.code, diag.detail)


def test_flag_with_a_value_is_pr112():
    """``--vv=3`` is PR112."""
    assert "PR112" == failure("--vv=3", "prog").code


def test_unbalanced_quotes_are_pr107():
    """An unclosed quote inside ``--mpi-global-args`` is PR107."""
    assert "PR107" == failure('--mpi-global-args=--mca "x', "prog").code


def test_everything_after_the_program_belongs_to_it():
    """Options after PROGRAM are the program's, untouched."""
    spec = parse("--num-replicas", "2", "python3", "train.py", "--num-replicas", "5", "--host").spec

    assert 2 == spec.replicas.value
    assert ("python3", "train.py", "--num-replicas", "5", "--host") == spec.program.value


def test_double_dash_ends_the_options():
    """``--`` makes the next word the program even when it starts with ``-``."""
    assert ("-weird", "x") == parse("--", "-weird", "x").spec.program.value


def test_instance_mpi_local_args_set_one_instance():
    """``--instance-mpi-local-args=0:-x VAR=VALUE`` (changelog 2.1)."""
    spec = parse("--instance-mpi-local-args=1:-x A=b --bind-to none", "prog").spec

    assert (InstanceArgsSpec(index=1, env=(EnvVarSpec(name="A", value="b"),), mpi_args=("--bind-to", "none")),) == tuple(
        a.value for a in spec.instance_args)


def test_instance_mpi_local_args_without_index_is_pr204():
    """A value without ``INDEX:`` is PR204."""
    assert "PR204" == failure("--instance-mpi-local-args=-x A=b", "prog").code


def test_environment_fallback_fills_options_not_given():
    """``POPRUN_NUM_REPLICAS`` stands in for ``--num-replicas``; the flag wins over it."""
    assert 4 == parse("prog", environ={"POPRUN_NUM_REPLICAS": "4"}).spec.replicas.value
    assert 2 == parse("--num-replicas=2", "prog", environ={"POPRUN_NUM_REPLICAS": "4"}).spec.replicas.value


def test_deprecated_cluster_sets_the_allocation_with_a_warning():
    """``--vipu-cluster`` still works, with PR210."""
    command = parse("--vipu-cluster=c64", "prog")

    assert "c64" == command.spec.allocation.value
    assert ["PR210"] == [w.code for w in command.warnings]


@pytest.mark.parametrize(("argv", "code"), [
    (("--num-replicas=0",), "PR200"), (("--num-instances=-2",), "PR200"), (("--num-replicas=four",), "PR105"),
    (("--vipu-server-port=70000",), "PR212"), (("--host-subnet=10.5.0.0/99",), "PR213"),
    (("--process-placement=spread",), "PR105"),
])
def test_invalid_values(argv, code):
    """Values are checked where they are written."""
    assert code == failure(*argv, "prog").code


def test_choice_suggests_the_nearest():
    """A misspelt placement strategy suggests the nearest."""
    assert "did you mean 'scatternuma'?" == failure("--process-placement=scatternum", "p").hint


def test_allow_run_as_root_takes_a_value():
    """``--allow-run-as-root 1`` (EIDF docs) is a boolean option."""
    assert parse("--allow-run-as-root", "1", "prog").spec.allow_run_as_root.value is True


def test_version_and_help_flags():
    """``--version`` and ``--help`` are recognised, with ``--version-format``."""
    command = parse("--version", "--version-format=full-json")

    assert (True, "full-json") == (command.version, command.version_format)
    assert parse("--help").help


def test_every_error_carries_the_command_line_for_a_caret():
    """Flag diagnostics point into the command line text."""
    diag = failure("--num-replicas=x", "prog")

    assert "poprun --num-replicas=x prog" == diag.source_line
    assert (1, 8) == (diag.span.line, diag.span.column)
