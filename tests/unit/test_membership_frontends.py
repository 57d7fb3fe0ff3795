"""Declared membership in every front end: flags, POPRUN_<FLAG> fallbacks, TOML, the DSL, export and explain."""

import io
import json
from contextlib import redirect_stderr, redirect_stdout

import pytest

from poprun.cli.main import main
from poprun.core.diagnostic import DiagnosticError
from poprun.planner.dsl.read import parse_dsl
from poprun.planner.dsl.write import to_dsl
from poprun.planner.flags import parse_flags
from poprun.planner.tomlspec import parse_toml, to_toml

FOUR = ["--host", "pod[1-4]", "--num-instances", "4", "--num-replicas", "8"]


def run(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        status = main(list(argv))
    return status, out.getvalue(), err.getvalue()


def membership(*argv: str) -> dict:
    status, out, err = run("plan", "--format", "json", *argv)
    assert 0 == status, err
    return json.loads(out)["membership"]


def only(problem: pytest.ExceptionInfo[DiagnosticError]) -> tuple[str, str, str | None]:
    [found] = problem.value.diagnostics
    return found.code, found.summary, found.span.key_path


def test_the_classic_command_line_declares_spares_a_minimum_and_a_health_check():
    """`poprun --spare-host h[9-10] --min-hosts 3 --health-check CMD PROGRAM` is the plan's membership."""
    found = membership(*FOUR, "--spare-host", "pod[9-10]", "--min-hosts", "3", "--health-check",
                       "test -e /dev/shm", "--health-check-timeout", "2.5", "python3", "train.py")

    assert (["pod9", "pod10"], 3, "test -e /dev/shm", 2500) == (
        found["spares"], found["min_hosts"], found["health_check"], found["health_check_timeout_ms"])
    assert "[membership]" in found["spec"]


def test_repeated_spare_hosts_add_in_the_order_given():
    """Each --spare-host adds its hosts after the ones before (the order in which spares take places)."""
    spec = parse_flags(["--spare-host", "pod9", "--spare-hosts=pod[7-8]", "--spare-host", "login1", "prog"]).spec

    assert ("pod9", "pod7", "pod8", "login1") == spec.spare_hosts.value


def test_an_empty_spare_host_means_none_in_every_front_end():
    """--spare-host '', POPRUN_SPARE_HOST='', spare_hosts = [] and spare hosts "" all read as no spare."""
    flags = parse_flags(["--spare-host", "", "prog"]).spec.spare_hosts.value
    fallback = parse_flags(["prog"], environ={"POPRUN_SPARE_HOST": ""}).spec.spare_hosts.value
    toml = parse_toml("[membership]\nspare_hosts = []\n", file="a.toml").spare_hosts.value
    dsl = parse_dsl('spare hosts ""\n', file="a.pop").spare_hosts.value

    assert ((), (), (), ()) == (flags, fallback, toml, dsl)
    assert [] == membership(*FOUR, "--spare-host", "", "python3", "train.py")["spares"]


def test_the_fallbacks_declare_membership_and_the_command_line_overrides_them():
    """POPRUN_SPARE_HOST, POPRUN_MIN_HOSTS, POPRUN_HEALTH_CHECK(_TIMEOUT) fill what the command line leaves out."""
    environ = {"POPRUN_SPARE_HOST": "pod[9-10]", "POPRUN_MIN_HOSTS": "2", "POPRUN_HEALTH_CHECK": "true 'x' $(id)",
               "POPRUN_HEALTH_CHECK_TIMEOUT": "7"}
    spec = parse_flags(["--min-hosts", "3", "prog"], environ=environ).spec

    assert (("pod9", "pod10"), 3, "true 'x' $(id)", 7000) == (
        spec.spare_hosts.value, spec.min_hosts.value, spec.health_check.value, spec.health_check_timeout.value)
    assert "environment variable POPRUN_SPARE_HOST" == spec.spare_hosts.origin.describe()


@pytest.mark.parametrize("bad", ["pod\x00x", "pod1\npod2", "pod1,,pod2", "pod[9-", "pod[]", "-pod9"])
def test_a_bad_spare_list_gets_the_same_diagnostic_as_a_bad_host_list(bad):
    """NUL, newline, an empty name or a bad range: PR103 with --host's message, for --spare-host too."""
    with pytest.raises(DiagnosticError) as as_host:
        parse_flags(["--host", bad, "prog"])
    with pytest.raises(DiagnosticError) as as_spare:
        parse_flags(["--spare-host", bad, "prog"])

    assert as_host.value.diagnostics[0].code == as_spare.value.diagnostics[0].code
    assert as_host.value.diagnostics[0].summary == as_spare.value.diagnostics[0].summary
    assert "--spare-host" == as_spare.value.diagnostics[0].span.key_path


@pytest.mark.parametrize("bad", ["pod\x00x", "pod1,,pod2", "pod[9-"])
def test_a_bad_spare_list_in_toml_and_the_dsl_is_pr103_where_it_stands(bad):
    """The TOML key and the DSL statement report a bad spare list as their host lists do, at the key."""
    with pytest.raises(DiagnosticError) as toml:
        parse_toml(f"[membership]\nspare_hosts = {json.dumps(bad)}\n", file="a.toml")
    with pytest.raises(DiagnosticError) as dsl:
        parse_dsl(f"spare hosts {json.dumps(bad)}\n", file="a.pop")

    assert ("PR103", "$.membership.spare_hosts") == (toml.value.diagnostics[0].code,
                                                      toml.value.diagnostics[0].span.key_path)
    assert ("PR103", "membership.spare_hosts", 1) == (dsl.value.diagnostics[0].code,
                                                       dsl.value.diagnostics[0].span.key_path,
                                                       dsl.value.diagnostics[0].span.line)


def test_a_spare_host_statement_reads_ranges_lists_and_repeats():
    """`spare hosts pod[9-10]`, `spare hosts a, b` and a second statement add up, in order."""
    spec = parse_dsl("spare hosts pod[9-10]\nspare hosts login1, login2 # the login nodes\n", file="a.pop")

    assert ("pod9", "pod10", "login1", "login2") == spec.spare_hosts.value
    assert "spare hosts pod9, pod10, login1, login2\n" == to_dsl(spec)  # a range would lose the order


def test_spare_hosts_from_file_is_not_a_statement():
    """`spare hosts from file F` is a syntax error: only `hosts` reads a file."""
    with pytest.raises(DiagnosticError) as problem:
        parse_dsl("spare hosts from file hosts.txt\n", file="a.pop")

    assert "PR108" == problem.value.diagnostics[0].code


def test_a_hostile_health_check_round_trips_through_every_front_end():
    """Quotes, $(), backslashes and a newline in the health check survive TOML and the DSL unchanged."""
    command = "test -e '/tmp/a b' && echo \"$(id)\" \\\n; printf '%s' `hostname`"
    spec = parse_flags(["--health-check", command, "prog"]).spec

    assert command == parse_toml(to_toml(spec), file="a.toml").health_check.value
    assert command == parse_dsl(to_dsl(spec), file="a.pop").health_check.value


def test_export_config_carries_the_membership_keys(tmp_path, monkeypatch):
    """--export-config writes [membership], and --import-config plans the same membership from it."""
    monkeypatch.chdir(tmp_path)
    given = [*FOUR, "--spare-host", "pod[5-6]", "--min-hosts", "2", "--health-check", "true"]
    assert 0 == run("plan", "--export-config", "job.conf", *given, "python3", "train.py")[0]

    text = (tmp_path / "job.conf").read_text()

    assert 'spare_hosts = "pod[5-6]"\nmin_hosts = 2\nhealth_check = "true"\n' in text
    assert membership(*given, "python3", "train.py") == membership("--import-config", "job.conf")


def test_a_plan_without_membership_explains_as_before():
    """Without a membership option, the plan has the default record and no membership lines in explain."""
    status, out, _ = run("plan", "--explain", *FOUR, "python3", "train.py")

    assert 0 == status
    assert "membership" not in out
    assert {"spares": [], "min_hosts": 0, "health_check": "", "health_check_timeout_ms": 30000, "spec": ""} == \
        membership(*FOUR, "python3", "train.py")


def test_a_health_check_alone_keeps_no_spec_to_solve_again():
    """A health check without spares or a smaller minimum keeps no spec: no re-plan can change the hosts."""
    found = membership(*FOUR, "--health-check", "true", "python3", "train.py")

    assert ("", [], 0) == (found["spec"], found["spares"], found["min_hosts"])


def test_a_health_check_with_the_local_backend_is_accepted():
    """A health check alone does not need other hosts: the local backend takes it (PR228 is for spares and a minimum)."""
    found = membership("--num-replicas", "2", "--health-check", "true", "python3", "train.py")

    assert "true" == found["health_check"]


def test_min_hosts_zero_is_refused_as_a_count():
    """--min-hosts 0 is not a size: PR200, like any count below 1."""
    with pytest.raises(DiagnosticError) as problem:
        parse_flags(["--min-hosts", "0", "prog"])

    assert "PR200" == problem.value.diagnostics[0].code


def test_a_spare_named_again_in_a_second_dsl_statement_is_pr226_at_that_line(tmp_path, monkeypatch):
    """`spare hosts pod9` twice adds up to pod9 twice: PR226, pointing at the second statement."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "job.pop").write_text("hosts pod[1-2]\n2 replicas over 2 instances\nspare hosts pod[8-9]\n"
                                      "spare hosts pod9\nrun python3 train.py\n")

    status, _, err = run("plan", "job.pop")

    assert 2 == status
    assert "error[PR226]: spare host named twice\n  --> job.pop:4:13  (membership.spare_hosts)" in err
