"""The health check's pure parts: reading a host's answer, the lines kept, the records and the diagnostics' text."""

from __future__ import annotations

import pytest

from poprun.apply import health
from poprun.apply.health import HealthCheck, HealthChecks, health_problems


def test_the_answer_is_read_after_the_begin_mark_and_before_the_last_status_mark():
    """Heartbeat dots before the begin mark are dropped; a status line forged by the check is only output."""
    out = b"...\npoprun-health-B\nhello\npoprun-health-X 0\n\npoprun-health-E 3\n"

    assert (3, b"hello\npoprun-health-X 0\n") == health._parse(out, "B", "E")


@pytest.mark.parametrize(("out", "expected"), [
    (b"....", (None, b"")),  # no answer: the deadline and the time to send it back ran out
    (b"\npoprun-health-B\npartial", (None, b"partial")),  # cut off before its status
    (b"\npoprun-health-B\n\npoprun-health-E x\n", (None, b"")),  # a status that is not a number
])
def test_an_answer_without_a_status_is_none(out, expected):
    """Without the begin mark, or without a status after it, the status is None (the check timed out)."""
    assert expected == health._parse(out, "B", "E")


def test_the_lines_kept_are_the_last_ones_escaped_masked_and_cut():
    """Blank lines dropped, the last ten kept, control characters escaped, secrets masked, long lines cut."""
    tail = b"".join(b"line %d\n\n" % n for n in range(20)) + b"bell\x07 DB_PASSWORD=hunter2\r\n" + b"x" * 400

    lines = health._lines(tail, ())

    assert 10 == len(lines)
    assert "line 12" == lines[0]
    assert "bell\\x07 DB_PASSWORD=****" == lines[-2]
    assert "x" * 297 + "..." == lines[-1]


def test_lost_names_each_host_that_did_not_pass_but_not_those_stopped():
    """What a re-plan leaves out: failed, timed out and unreachable hosts, each with one line."""
    checks = HealthChecks(timeout_ms=2500, checks=(
        HealthCheck(host="h1", outcome="passed", status=0), HealthCheck(host="h2", outcome="failed", status=3),
        HealthCheck(host="h3", outcome="timed out"), HealthCheck(host="h4", outcome="unreachable", reason="no route"),
        HealthCheck(host="h5", outcome="stopped")))

    assert {"h2": "its health check failed with status 3", "h3": "its health check timed out after 2.5 s",
            "h4": "the health check could not reach it: no route"} == checks.lost()
    assert (False, "h3") == (checks.ok, checks.of("h3").host)  # type: ignore[union-attr]
    assert checks.of("h9") is None


def test_problems_name_the_host_the_status_and_the_lines_and_a_spare_left():
    """PR445 for a failed check (its lines, or that it printed nothing), PR446 for an unreachable host."""
    checks = HealthChecks(timeout_ms=1000, checks=(
        HealthCheck(host="h2", outcome="failed", status=3), HealthCheck(host="h4", outcome="unreachable", reason="gone")))

    failed, unreachable = health_problems(checks, spares_left=("h9", "h10"))

    assert ("PR445", "on h2, the health check exited with status 3; it printed nothing") == (failed.code, failed.detail)
    assert failed.hint.startswith("fix h2 (run the check there by hand to see why), a spare (h9, h10) replaces it")
    assert ("PR446", "the health check could not run on h4: gone") == (unreachable.code, unreachable.detail)
    assert () == health_problems(HealthChecks(checks=(HealthCheck(host="h1", outcome="passed", status=0),)))


def test_the_script_holds_the_command_as_data_and_the_deadline_as_a_number():
    """The command is single-quoted into a variable; the deadline, marks and tail size are the only other values."""
    script = health.host_script("echo 'x'; $(rm -rf /)", 2.5, begin="b1", end="e2", mark="m3")

    assert script.startswith("__poprun_hc='echo '\"'\"'x'\"'\"'; $(rm -rf /)'\n__poprun_hk=m3\n"
                             "__poprun_m1=poprun-health-b1\n__poprun_m2=poprun-health-e2\n__poprun_s=2.5\n")
    assert f"tail -c {health.TAIL_BYTES}" in script


class Broken:
    """A plugin-like backend whose run_on_host fails with something other than a LaunchError."""

    name = "broken"

    def run_on_host(self, host, script, *, environ, timeout_s):  # noqa: ARG002 - the protocol's
        raise RuntimeError(f"cable cut\nat {host}")


def test_a_backend_that_fails_otherwise_makes_the_host_unreachable_not_a_crash():
    """An exception from run_on_host is that host's one-line reason (PR446); no host is given: nothing at all."""
    from tests.e2e.helpers import plan_of

    the_plan = plan_of("--health-check", "true", "--num-replicas", "1", "true")

    checks = health.check_hosts(Broken(), the_plan, ["h1", "h2"], environ={})

    assert [("unreachable", "cable cut at h1"), ("unreachable", "cable cut at h2")] == [
        (c.outcome, c.reason) for c in checks.checks]
    assert () == health.check_hosts(Broken(), the_plan, [], environ={}).checks
