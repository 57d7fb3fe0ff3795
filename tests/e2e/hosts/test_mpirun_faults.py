"""
The mpirun backend on real hosts when things go wrong: every line once, a host that stops answering, Ctrl-C.

The hosts of these tests (``fault_hosts``, h1..h3) are their own: the tests take links down.
Every process a launch starts here carries the ``marked`` fixture's variable (mpirun's ssh
clients too); on the hosts, the instances carry a mark in their command line.
"""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import Marked
from tests.e2e.hosts.test_host_faults import signal_on
from tests.e2e.hosts.test_ssh_backend import SLEEPER, marked_anywhere, poprun, wait_for
from tests.golden.harness import assert_golden
from tests.testhosts import TestHosts

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

GOLDEN = Path(__file__).parent / "golden_mpirun"
TAG = re.compile(r"^\[1,(\d+)\]<(stdout|stderr)>:(.*)$")
HOST_TIMEOUT_S = 15.0


@pytest.fixture
def h2_comes_back(fault_hosts: TestHosts) -> Iterator[TestHosts]:
    """Return the fault hosts; bring h2's link back up after the test, whatever happened."""
    yield fault_hosts
    fault_hosts.set_link("h2", up=True)

    def answers() -> bool:
        try:
            return fault_hosts.ssh("h2", "true", timeout=5).returncode == 0
        except subprocess.TimeoutExpired:
            return False

    assert wait_for(answers, within_s=30), "h2 does not answer ssh again"


def start(hosts: TestHosts, marked: Marked, mark: str, *args: str) -> subprocess.Popen[str]:
    """Start poprun --backend mpirun on h1..h3, one instance each, running ``SLEEPER`` marked ``mark``."""
    return subprocess.Popen([sys.executable, "-m", "poprun.cli.main", "--backend", "mpirun", "--host", "h1,h2,h3",
                             "--num-instances", "3", "--num-replicas", "3", *args, "sh", "-c",
                             f"echo started; {SLEEPER.format(mark=mark)}", mark],
                            env=marked.env | hosts.env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def running(mark: str) -> str:
    """Return the pattern of the command line of SLEEPER's child: the program itself runs (not its wrapper)."""
    return rf"^sh -c sleep 60; : {mark}-child$"


def normalised(hosts: TestHosts, text: str) -> str:
    """Return poprun's stderr with the hosts' subnet written 10.77.X."""
    return text.replace(hosts.subnet.rsplit(".", 1)[0] + ".", "10.77.X.")


def test_short_lines_from_every_host_arrive_once(test_hosts: TestHosts, tmp_path: Path) -> None:
    """4 hosts x 2 instances, each seq 1 10000 on stdout and stderr: every line once, by the right instance."""
    done = poprun(test_hosts, "--backend", "mpirun", "--host", ",".join(test_hosts.names), "--num-instances", "8",
                  "--num-replicas", "8", "--mpi-global-args=--tag-output", "sh", "-c", "seq 1 10000; seq 1 10000 >&2",
                  cwd=tmp_path)

    assert 0 == done.returncode, done.stderr[-2000:]
    found: dict[tuple[int, str], list[str]] = {}
    for line in done.stdout.splitlines() + done.stderr.splitlines():
        if re.match(r"\[[^\]]+:\d+\] plm:", line):  # mpirun's own warning (a setpgid race of its rsh launcher)
            continue
        match = TAG.match(line)
        assert match is not None, line
        found.setdefault((int(match[1]), match[2]), []).append(match[3])
    numbers = [str(n) for n in range(1, 10001)]
    assert {(i, s): numbers for i in range(8) for s in ("stdout", "stderr")} == found


def test_a_host_whose_link_goes_down_is_named_and_everything_ends(h2_comes_back: TestHosts, marked: Marked) -> None:
    """
    h2's link goes down mid-run: poprun says PR411 for h2 within the host timeout, and nothing is left.

    Nothing here (poprun, mpirun, its ssh clients), nothing on h1 and h3, and nothing on h2 within the
    host timeout, its link still down: the relay helper of its instance, whose connection to poprun
    broke, kills the instance (and mpirun's daemon there, which may not notice).
    """
    # GIVEN
    hosts, mark = h2_comes_back, f"poprun-mark-{uuid.uuid4().hex[:8]}"
    proc = start(hosts, marked, mark)
    assert wait_for(lambda: len(marked_anywhere(hosts, running(mark))) == 3, within_s=20), "never ran"

    # WHEN
    hosts.set_link("h2", up=False)
    down = time.monotonic()
    _, err = proc.communicate(timeout=HOST_TIMEOUT_S + 15)
    took = time.monotonic() - down

    # THEN
    diagnostic = err[err.find("error["):]  # after what mpirun said before poprun noticed (it races poprun)
    diagnostic = re.sub(r"= .*; poprun stopped", "= <how>; poprun stopped", diagnostic)  # relay, ssh or mpirun: a race
    assert_golden(GOLDEN / "PR411_link_of_a_host_goes_down", normalised(hosts, f"{diagnostic}exit {proc.returncode}\n"))
    assert took < HOST_TIMEOUT_S + 5, f"poprun took {took:.1f} s to notice"
    assert {} == marked.survivors(within_s=3)
    assert wait_for(lambda: not marked_anywhere(hosts, mark).keys() - {"h2"}, within_s=3), marked_anywhere(hosts, mark)
    left = lambda: marked_anywhere(hosts, mark) or hosts.processes("h2", "^orted ")  # noqa: E731
    assert wait_for(lambda: not left(), within_s=HOST_TIMEOUT_S + 5), left()  # h2 still cut off


def test_a_host_whose_sessions_are_killed_is_named(fault_hosts: TestHosts, marked: Marked) -> None:
    """Every process of h2's ssh sessions is killed mid-run (mpirun's daemon with them): PR411 names h2, all ends."""
    mark = f"poprun-mark-{uuid.uuid4().hex[:8]}"
    proc = start(fault_hosts, marked, mark)
    assert wait_for(lambda: len(marked_anywhere(fault_hosts, running(mark))) == 3, within_s=20), "never ran"

    fault_hosts.kill_sessions("h2")
    _, err = proc.communicate(timeout=HOST_TIMEOUT_S + 15)

    assert 125 == proc.returncode, err
    assert "error[PR411]: host h2 stopped answering" in err
    assert "Root cause" not in err
    assert {} == marked.survivors(within_s=3)
    assert wait_for(lambda: not marked_anywhere(fault_hosts, mark), within_s=5), marked_anywhere(fault_hosts, mark)


def test_ctrl_c_while_a_host_does_not_answer_ends_within_the_grace_period(h2_comes_back: TestHosts,
                                                                          marked: Marked) -> None:
    """h2's link is down and poprun gets SIGINT at once: it ends within the grace period (5 s) plus 3 s, all gone."""
    hosts, mark = h2_comes_back, f"poprun-mark-{uuid.uuid4().hex[:8]}"
    proc = start(hosts, marked, mark)
    assert wait_for(lambda: len(marked_anywhere(hosts, running(mark))) == 3, within_s=20), "never ran"

    hosts.set_link("h2", up=False)
    time.sleep(0.5)
    proc.send_signal(signal.SIGINT)
    interrupted = time.monotonic()
    proc.communicate(timeout=30)
    took = time.monotonic() - interrupted

    assert took < 5 + 3, f"poprun took {took:.1f} s after SIGINT"
    assert proc.returncode != 0
    assert {} == marked.survivors(within_s=3)
    assert wait_for(lambda: not marked_anywhere(hosts, mark).keys() - {"h2"}, within_s=3), marked_anywhere(hosts, mark)


@pytest.mark.parametrize("case", ["PR422_host_name_nobody_knows"])
def test_mpirun_that_cannot_reach_a_host_says_so(case: str, fault_hosts: TestHosts, tmp_path: Path) -> None:
    """A host that mpirun's ssh cannot reach: PR422 names it, exit 125, and no instance is blamed."""
    done = poprun(fault_hosts, "--backend", "mpirun", "--host", "h1,nosuchhost.invalid", "--num-instances", "2",
                  "--num-replicas", "2", "true", cwd=tmp_path)

    text = normalised(fault_hosts, f"{done.stderr}exit {done.returncode}\n")
    text = re.sub(r"(resolve hostname \S+: ).*", r"\1<resolver's reason>", text)
    assert_golden(GOLDEN / case, text)



@pytest.mark.parametrize("hung", [False, True], ids=["daemon-alive", "daemon-hung"])
def test_a_host_whose_every_sshd_is_killed_keeps_nothing_of_the_launch(fault_hosts: TestHosts, marked: Marked,
                                                                       hung: bool) -> None:
    """
    Every sshd of h2 (its listener too) is SIGKILLed mid-run: PR411 names h2, exit 125, and nothing is left anywhere.

    mpirun's daemon on h2 lives on (its connection to mpirun is its own, not ssh's); when it
    has hung too (SIGSTOPped: it never ends h2's instance), each instance's relay helper, whose
    connection to poprun ended, kills its program and the daemon: on h2, nothing of the launch
    (instance, relay helper, orted) outlives poprun by more than the host timeout.
    """
    mark = f"poprun-mark-{uuid.uuid4().hex[:8]}"
    proc = start(fault_hosts, marked, mark)
    try:
        assert wait_for(lambda: len(marked_anywhere(fault_hosts, running(mark))) == 3, within_s=20), "never ran"
        if hung:
            assert signal_on(fault_hosts, "h2", "^orted ", signal.SIGSTOP), "the check below would see nothing"

        fault_hosts.stop_sshd("h2")
        _, err = proc.communicate(timeout=HOST_TIMEOUT_S + 15)
        ended = time.monotonic()

        assert 125 == proc.returncode, err
        assert "error[PR411]: host h2 stopped answering" in err, err
        assert not re.search(r"host h[13] stopped answering|Root cause", err), err  # the healthy hosts are not blamed
        assert {} == marked.survivors(within_s=3)
        left = lambda: marked_anywhere(fault_hosts, mark) or fault_hosts.processes("h2", "^orted ")  # noqa: E731
        assert wait_for(lambda: not left(), within_s=HOST_TIMEOUT_S + 5), left()
        assert time.monotonic() - ended < HOST_TIMEOUT_S + 5
    finally:
        proc.kill()
        proc.wait()
        signal_on(fault_hosts, "h2", f"^orted |{mark}", signal.SIGKILL)  # what a failed check left
        fault_hosts.start_sshd("h2")


@pytest.mark.parametrize("what", ["sshd-and-instance", "everything"])
def test_a_frozen_host_is_named_and_keeps_nothing_once_it_wakes(fault_hosts: TestHosts, marked: Marked,
                                                                what: str) -> None:
    """
    h2's sshd and instance are SIGSTOPped mid-run (or everything of the launch there: its daemon and relay helper
    too): PR411 names h2, exit 125; nothing of the launch is left there once it can run again (at once, or once woken).
    """
    mark = f"poprun-mark-{uuid.uuid4().hex[:8]}"
    frozen = f"^sshd|^sh -c echo started|{running(mark)}" + ("|^orted |" + mark if what == "everything" else "")
    proc = start(fault_hosts, marked, mark)
    try:
        assert wait_for(lambda: len(marked_anywhere(fault_hosts, running(mark))) == 3, within_s=20), "never ran"
        assert signal_on(fault_hosts, "h2", frozen, signal.SIGSTOP)
        cut = time.monotonic()
        _, err = proc.communicate(timeout=HOST_TIMEOUT_S + 30)
        noticed = time.monotonic() - cut

        assert 125 == proc.returncode, err
        assert "error[PR411]: host h2 stopped answering" in err, err
        assert not re.search(r"host h[13] stopped answering|Root cause", err), err  # the healthy hosts are not blamed
        assert noticed < HOST_TIMEOUT_S + 10, noticed
        assert {} == marked.survivors(within_s=3)
        signal_on(fault_hosts, "h2", frozen, signal.SIGCONT)  # the host wakes up
        left = lambda: marked_anywhere(fault_hosts, mark) or fault_hosts.processes("h2", "^orted ")  # noqa: E731
        assert wait_for(lambda: not left(), within_s=HOST_TIMEOUT_S + 5), left()
    finally:
        proc.kill()
        proc.wait()
        signal_on(fault_hosts, "h2", "^sshd", signal.SIGCONT)
        signal_on(fault_hosts, "h2", f"^orted |{mark}", signal.SIGKILL)  # what a failed check left


def test_a_host_whose_ssh_server_is_down_before_the_launch_is_named(fault_hosts: TestHosts, tmp_path: Path) -> None:
    """h2's sshd is down: PR422 names h2 (not its address, nor mpirun's own setpgid warning), exit 125."""
    fault_hosts.stop_sshd("h2")
    try:
        done = poprun(fault_hosts, "--backend", "mpirun", "--host", "h1,h2,h3", "--num-instances", "3",
                      "--num-replicas", "3", "true", cwd=tmp_path)
    finally:
        fault_hosts.start_sshd("h2")

    assert_golden(GOLDEN / "PR422_ssh_server_of_a_host_is_down",
                  normalised(fault_hosts, f"{done.stderr}exit {done.returncode}\n"))


def test_a_host_cut_off_with_a_hung_daemon_keeps_nothing(h2_comes_back: TestHosts, marked: Marked) -> None:
    """
    h2's daemon hangs (SIGSTOP) and its link goes down: PR411 names h2, exit 125; with h2 still cut off, its
    instance's relay helper, whose keepalives to poprun get no answer, kills the instance and the daemon there.
    """
    hosts, mark = h2_comes_back, f"poprun-mark-{uuid.uuid4().hex[:8]}"
    proc = start(hosts, marked, mark)
    try:
        assert wait_for(lambda: len(marked_anywhere(hosts, running(mark))) == 3, within_s=20), "never ran"
        assert signal_on(hosts, "h2", "^orted ", signal.SIGSTOP), "the check below would see nothing"
        hosts.set_link("h2", up=False)
        _, err = proc.communicate(timeout=HOST_TIMEOUT_S + 30)

        assert 125 == proc.returncode, err
        assert "error[PR411]: host h2 stopped answering" in err, err
        assert {} == marked.survivors(within_s=3)
        left = lambda: marked_anywhere(hosts, mark) or hosts.processes("h2", "^orted ")  # noqa: E731
        assert wait_for(lambda: not left(), within_s=HOST_TIMEOUT_S + 10), left()  # h2 still cut off
    finally:
        proc.kill()
        proc.wait()
        signal_on(hosts, "h2", f"^orted |{mark}", signal.SIGKILL)  # what a failed check left


def test_a_host_whose_daemon_is_killed_keeps_nothing_of_the_launch(fault_hosts: TestHosts, marked: Marked) -> None:
    """
    mpirun's daemon on h2 is SIGKILLed mid-run (its instance, orphaned, would run on): poprun ends 125 naming
    h2, and nothing of the launch is left anywhere (the instance's relay helper kills it).
    """
    mark = f"poprun-mark-{uuid.uuid4().hex[:8]}"
    proc = start(fault_hosts, marked, mark)
    try:
        assert wait_for(lambda: len(marked_anywhere(fault_hosts, running(mark))) == 3, within_s=20), "never ran"
        assert signal_on(fault_hosts, "h2", "^orted ", signal.SIGKILL), "the check below would see nothing"
        _, err = proc.communicate(timeout=HOST_TIMEOUT_S + 15)

        assert 125 == proc.returncode, err
        assert "host h2" in err, err
        assert not re.search(r"host h[13] stopped answering|Root cause", err), err
        assert {} == marked.survivors(within_s=3)
        assert wait_for(lambda: not marked_anywhere(fault_hosts, mark), within_s=HOST_TIMEOUT_S + 5), \
            marked_anywhere(fault_hosts, mark)
    finally:
        proc.kill()
        proc.wait()
        signal_on(fault_hosts, "h2", mark, signal.SIGKILL)  # what a failed check left
