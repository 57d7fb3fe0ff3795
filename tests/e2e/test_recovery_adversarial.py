"""
Recovery attacked: signals and limits at awkward moments, output without newlines, junk ports, what the report says.

Each test runs ``python -m poprun.cli.main`` in a subprocess with its own runs directory, with
real processes, and reads what the run left: its exit status, its stderr, ``report.json``,
``events.jsonl`` and the processes still alive.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.e2e.test_recovery_cli import events, report, the_run

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

ROOT = Path(__file__).resolve().parents[2]
FAST = ("--restart-backoff", "0.05", "--min-uptime", "0")  # restarts at once, no crash-loop guard
TWO = ("--num-instances", "2", "--num-replicas", "2")


def environment(cwd: Path, env: dict[str, str] | None = None) -> dict[str, str]:
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("POPDIST_", "MASTER_", "OMPI_", "POPRUN_"))}
    environ["POPRUN_RUNS_DIR"] = str(cwd / "runs")
    environ["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{environ.get('PATH', '')}"
    return {**environ, **(env or {})}


def poprun(*args: str, cwd: Path, env: dict[str, str] | None = None,
           timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "poprun.cli.main", *args], cwd=cwd, capture_output=True, text=True,
                          env=environment(cwd, env), timeout=timeout, check=False)


def started(*args: str, cwd: Path) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "poprun.cli.main", *args], cwd=cwd, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=environment(cwd))


def pids_with(needle: str) -> list[int]:
    """Return the pids of this machine's processes whose command line holds ``needle``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            line = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if needle.encode() in line:
            found.append(int(entry.name))
    return found


def await_pid(needle: str, within_s: float = 20) -> list[int]:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        found = pids_with(needle)
        if found:
            return found
        time.sleep(0.05)
    return []


def gone(needle: str, within_s: float = 3) -> bool:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        if not pids_with(needle):
            return True
        time.sleep(0.05)
    return False


def test_the_pre_restart_command_dies_with_a_killed_poprun(tmp_path: Path) -> None:
    """poprun SIGKILLed while its health check runs: nothing of the check is left (its whole process group)."""
    seconds = f"60.{os.getpid()}{time.monotonic_ns() % 100000}"  # only the check's sleeps have it in their argv
    marker = f"sleep\0{seconds}\0"
    (tmp_path / "check.sh").write_text(f"sh -c 'sleep {seconds}' & sleep {seconds}\n")
    proc = started(*TWO, "--max-restarts", "2", *FAST, "--pre-restart", "sh check.sh", "sh", "-c", "exit 3",
                   cwd=tmp_path)
    try:
        assert await_pid(marker), "the pre-restart command did not start"
        proc.kill()
        proc.wait(10)
        assert gone(marker), f"left running: {pids_with(marker)}"
    finally:
        for pid in pids_with(marker):
            os.kill(pid, signal.SIGKILL)
        proc.kill()
        proc.communicate()


def test_a_progress_bar_without_newlines_is_no_stall(tmp_path: Path) -> None:
    """An instance that writes '\\r40%' every 0.1 s writes output: the stall limit is not reached."""
    bar = ("import sys, time\n"
           "for i in range(25):\n"
           "    sys.stdout.write(f'\\r{i}%'); sys.stdout.flush(); time.sleep(0.1)\n"
           "print()\n")
    done = poprun(*TWO, "--stall-timeout", "1", sys.executable, "-c", bar, cwd=tmp_path)

    assert 0 == done.returncode, done.stderr
    assert "--stall-timeout" not in done.stderr


def test_a_stopped_attempt_is_not_told_as_a_success(tmp_path: Path) -> None:
    """SIGTERM while an attempt runs: the attempt is recorded as stopped (143), never as status 0, 'succeeded'."""
    proc = started(*TWO, "--max-restarts", "2", sys.executable, "-c",
                   "import time; print('up', flush=True); time.sleep(30)", cwd=tmp_path)
    try:
        assert proc.stdout is not None
        assert "up" in proc.stdout.readline()
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=20)
    finally:
        proc.kill()
    assert 143 == proc.returncode, err
    attempts = report(tmp_path)["attempts"]
    assert [143] == [a["status"] for a in attempts], attempts
    ended = [e for e in events(tmp_path) if e["event"] == "attempt-ended"]
    assert [143] == [e["status"] for e in ended]
    assert "succeeded" not in ended[0]["reason"]
    assert "SIGTERM" in ended[0]["reason"]


def test_an_attempt_cut_by_the_time_limit_is_not_a_success(tmp_path: Path) -> None:
    """--timeout ends an attempt: it is recorded with 124 and the limit, not 'succeeded'."""
    done = poprun(*TWO, "--max-restarts", "2", "--timeout", "1", sys.executable, "-c", "import time; time.sleep(30)",
                  cwd=tmp_path)

    assert 124 == done.returncode, done.stderr
    attempts = report(tmp_path)["attempts"]
    assert [124] == [a["status"] for a in attempts], attempts
    assert "(--timeout)" in attempts[0]["next"]


def test_an_instance_killed_by_the_signal_before_the_limit_is_not_restarted(tmp_path: Path) -> None:
    """--signal USR1@1 kills a program that does not catch it: poprun sent it, so no restart (the limit is near)."""
    done = poprun(*TWO, "--max-restarts", "3", *FAST, "--timeout", "2", "--signal", "USR1@1", sys.executable, "-c",
                  "import time; time.sleep(30)", cwd=tmp_path)

    attempts = report(tmp_path)["attempts"]
    assert 1 == len(attempts), done.stderr
    assert "--signal" in attempts[0]["next"], attempts
    assert "restart 1 of 3" not in done.stderr


def test_a_time_limit_while_waiting_to_restart_does_not_say_it_stopped_the_instances(tmp_path: Path) -> None:
    """--timeout during the back-off: 124, but the failure that came first is still the root cause, not 'stopped'."""
    done = poprun(*TWO, "--max-restarts", "2", "--restart-backoff", "30", "--min-uptime", "0", "--timeout", "1",
                  "sh", "-c", "exit 3", cwd=tmp_path, timeout=20)

    assert 124 == done.returncode, done.stderr
    assert "every instance was stopped" not in done.stderr
    assert "install py-spy" not in done.stderr
    assert re.search(r"poprun: the run timed out after 1(\.\d+)? s \(--timeout\), while waiting to restart; "
                     r"nothing was started again", done.stderr), done.stderr
    assert "Root cause: instance 0 on localhost exited with status 3" in done.stderr
    assert 124 == report(tmp_path)["status"]


@pytest.mark.parametrize("value", ["abc", "0", "70000", "-1", "29500x"])
def test_a_junk_master_port_is_refused_before_anything_starts(tmp_path: Path, value: str) -> None:
    """MASTER_PORT=abc in the launching shell: PR212 at plan time (status 2), not a torch error in every instance."""
    marker = tmp_path / "ran"
    done = poprun(*TWO, "--max-restarts", "2", *FAST, "sh", "-c", f"touch {marker}", cwd=tmp_path,
                  env={"MASTER_PORT": value})

    assert 2 == done.returncode, done.stderr
    assert "PR212" in done.stderr and "MASTER_PORT" in done.stderr
    assert "Traceback" not in done.stderr
    assert not marker.exists()


def test_an_empty_master_port_is_unset(tmp_path: Path) -> None:
    """MASTER_PORT= (empty, as `export MASTER_PORT=` leaves it): poprun picks a port, as when it is unset."""
    done = poprun(*TWO, "sh", "-c", 'echo "port=$MASTER_PORT"', cwd=tmp_path, env={"MASTER_PORT": ""})

    assert 0 == done.returncode, done.stderr
    ports = {line.split("=")[1] for line in done.stdout.split()}
    assert 1 == len(ports) and ports.pop().isdigit(), done.stdout


def test_a_master_port_with_spaces_around_is_kept_and_checked(tmp_path: Path) -> None:
    """MASTER_PORT=' 29517 ' is a port the user set: kept as the user wrote it (torch strips it), no error."""
    done = poprun(*TWO, "sh", "-c", 'echo "port=[$MASTER_PORT]"', cwd=tmp_path, env={"MASTER_PORT": " 29517 "})

    assert 0 == done.returncode, done.stderr
    assert "port=[ 29517 ]" in done.stdout


@pytest.mark.parametrize("shell", [None, ""])
def test_a_forwarded_master_port_that_the_shell_leaves_unset_is_chosen(tmp_path: Path, shell: str | None) -> None:
    """-x MASTER_PORT with nothing (or nothing but '') to forward: poprun picks one; instances never lack it."""
    env = environment(tmp_path)
    env.pop("MASTER_PORT", None)
    if shell is not None:
        env["MASTER_PORT"] = shell
    done = subprocess.run([sys.executable, "-m", "poprun.cli.main", *TWO, "--mpi-global-args=-x MASTER_PORT", "sh",
                           "-c", 'echo "port=${MASTER_PORT-unset}"'], cwd=tmp_path, capture_output=True, text=True,
                          env=env, timeout=60, check=False)

    assert 0 == done.returncode, done.stderr
    ports = {line.split("=")[1] for line in done.stdout.split()}
    assert 1 == len(ports) and ports.pop().isdigit(), done.stdout


def test_a_junk_master_port_of_one_instance_is_refused(tmp_path: Path) -> None:
    """--instance-mpi-local-args=1:-x MASTER_PORT=x1: PR212 names that flag."""
    done = poprun(*TWO, "--instance-mpi-local-args=1:-x MASTER_PORT=x1", "true", cwd=tmp_path)

    assert 2 == done.returncode
    assert "PR212" in done.stderr and "--instance-mpi-local-args" in done.stderr


def test_waiting_to_restart_one_instance_alone_is_no_stall(tmp_path: Path) -> None:
    """--restart-scope instance: instance 1 is done, instance 0 waits 2 s to start again: no instance runs, no stall."""
    text = '[ "$POPDIST_INSTANCE_INDEX" = 0 ] && [ "$POPRUN_RESTART_COUNT" = 0 ] && exit 3; echo "ok $POPDIST_INSTANCE_INDEX"'
    done = poprun(*TWO, "--max-restarts", "2", "--restart-scope", "instance", "--restart-backoff", "2",
                  "--min-uptime", "0", "--stall-timeout", "1", "sh", "-c", text, cwd=tmp_path)

    assert 0 == done.returncode, done.stderr
    assert ["ok 0", "ok 1"] == sorted(done.stdout.splitlines())


@pytest.mark.parametrize("link", ["logs", "attempts/1"])
def test_poprun_logs_does_not_follow_a_link_out_of_the_run(tmp_path: Path, link: str) -> None:
    """The record's `logs` (or an attempt) swapped for a link elsewhere: PR602, nothing of the outside is shown."""
    done = poprun(*TWO, "--max-restarts", "1", *FAST, "sh", "-c", 'echo "mine $POPRUN_RESTART_COUNT"; exit 3',
                  cwd=tmp_path)
    assert 3 == done.returncode, done.stderr
    outside = tmp_path / "outside"
    (outside / "logs").mkdir(parents=True)
    for where in (outside, outside / "logs"):
        (where / "0.stdout").write_text("SECRET\n")
        (where / "order").write_text("0 stdout 7\n")
    planted = the_run(tmp_path) / link
    if planted.is_dir() and not planted.is_symlink():
        shutil.rmtree(planted)
    else:
        planted.unlink()
    planted.symlink_to(outside)

    shown = poprun("logs", "last", *(("--attempt", "1") if link != "logs" else ()), cwd=tmp_path)

    assert "SECRET" not in shown.stdout
    assert "PR602" in shown.stderr and "out of the run" in shown.stderr
    assert 0 != shown.returncode


def test_what_the_pre_restart_command_leaves_in_the_background_ends_with_it(tmp_path: Path) -> None:
    """A health check that starts `sleep &` (or a daemon of its own session) and exits 0: nothing of it outlives it."""
    seconds = f"61.{os.getpid()}{time.monotonic_ns() % 100000}"
    check = f"sleep {seconds} >/dev/null 2>&1 & setsid sleep {seconds} >/dev/null 2>&1 &"
    try:
        done = poprun(*TWO, "--max-restarts", "1", *FAST, "--pre-restart", check, "sh", "-c", "exit 3",
                      cwd=tmp_path)
        assert 3 == done.returncode, done.stderr
        assert gone(f"sleep\0{seconds}\0"), "the pre-restart command's background processes outlived the run"
    finally:
        for pid in pids_with(f"sleep\0{seconds}\0"):
            os.kill(pid, signal.SIGKILL)


def test_a_stop_while_one_instance_waits_to_restart_alone_ends_as_a_stop(tmp_path: Path) -> None:
    """--restart-scope instance: SIGTERM during instance 0's back-off is 143 and 'stopped before restart 1', as for scope all."""
    proc = started(*TWO, "--max-restarts", "2", "--restart-scope", "instance", "--restart-backoff", "30",
                   "--min-uptime", "0", "sh", "-c", '[ "$POPDIST_INSTANCE_INDEX" = 0 ] && exit 3; echo up; sleep 30',
                   cwd=tmp_path)
    try:
        assert proc.stdout is not None
        assert "up" in proc.stdout.readline()
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not all(  # the launch has returned (a stop now stops it), and 0 waits
                needle in (the_run(tmp_path) / "events.jsonl").read_text()
                for needle in ('"launch-running"', '"restarting":true')):
            time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=20)
    finally:
        proc.kill()
    assert 143 == proc.returncode, err
    assert "poprun: stopped by SIGTERM before restart 1" in err
    attempts = report(tmp_path)["attempts"]
    assert "not restarted: poprun was stopped (SIGTERM)" == attempts[-1]["next"], attempts


def test_no_attempt_starts_after_the_signal_before_the_limit(tmp_path: Path) -> None:
    """--signal USR1@2 with --timeout 3 comes during a 30 s back-off: the run ends then, no attempt starts to be cut."""
    done = poprun(*TWO, "--max-restarts", "2", "--restart-backoff", "30", "--min-uptime", "0", "--timeout", "3",
                  "--signal", "USR1@2", "sh", "-c", "exit 3", cwd=tmp_path, timeout=20)

    assert 3 == done.returncode, done.stderr
    attempts = report(tmp_path)["attempts"]
    assert 1 == len(attempts)
    assert "not restarted: SIGUSR1 was sent 2 s before the time limit (--signal)" == attempts[0]["next"], attempts


HANG = "import time\nprint('up', flush=True)\ndef hang_here():\n    time.sleep(60)\nhang_here()\n"


def test_every_faulthandler_dump_comes_before_the_teardown(tmp_path: Path) -> None:
    """No py-spy, 6 hung instances: each dies of its SIGABRT with its dump, none of the teardown's SIGTERM first."""
    base_python = os.path.realpath(sys.executable)  # no py-spy beside it (py-spy is in the virtual environment)
    no_py_spy = ":".join(d for d in os.environ.get("PATH", "").split(":") if not Path(d, "py-spy").exists())
    (tmp_path / "hang.py").write_text(HANG)
    done = poprun("--num-instances", "6", "--num-replicas", "6", "--stall-timeout", "1", base_python, "hang.py",
                  cwd=tmp_path, env={"PATH": no_py_spy})

    assert 124 == done.returncode, done.stderr
    stacks = report(tmp_path)["stacks"]
    assert all("in hang_here" in stacks[str(i)] for i in range(6)), stacks
    assert "killed by SIGTERM" not in done.stderr
