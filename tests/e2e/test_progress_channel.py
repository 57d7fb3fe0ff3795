"""
The progress channel on this machine: popdist.progress reaches the record, ps and report (local and offline backends), and survives strangers.

Real processes: poprun's CLI, instances that call ``popdist.progress``, forged datagrams from
other processes (another token, truncated, 64 KiB, not UTF-8, JSON bombs, an older attempt, an
index beyond the plan), a flood, a run without loopback (PR447), and record files replaced by a
FIFO or a link before ``ps`` reads them.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import time
from pathlib import Path

import jsonschema
import pytest

from poprun.apply.channel import FILTER_AFTER
from tests.e2e.progress_helpers import (
    PROGRAM,
    PY,
    TOTAL,
    assert_progress_recorded,
    environ,
    events,
    last_progress,
    only_run,
    ps_shows_progress,
)
from tests.golden.harness import assert_golden

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]

SCHEMA = json.loads((Path(__file__).parents[2] / "docs" / "events.schema.json").read_text())
GOLDEN = Path(__file__).parent / "runs_golden"
TWO = ["--num-instances", "2", "--num-replicas", "2"]
ONE = ["--num-instances", "1", "--num-replicas", "2"]


def poprun(env: dict[str, str], *args: str, cwd: Path, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """Run ``poprun ARGS`` to its end."""
    return subprocess.run([PY, "-m", "poprun.cli.main", *args], env=env, cwd=cwd, capture_output=True, text=True,
                          timeout=timeout, check=False)


def test_local_instances_report_progress_into_events_report_and_schema(tmp_path: Path) -> None:
    """Two local instances: instance-progress events (valid against the schema) with host and last step, step times in the report."""
    (tmp_path / "prog.py").write_text(PROGRAM)

    done = poprun(environ(tmp_path / "runs"), *TWO, PY, "prog.py", cwd=tmp_path)

    assert 0 == done.returncode, done.stderr
    run = only_run(tmp_path / "runs")
    assert_progress_recorded(run, ["localhost", "localhost"])
    for event in events(run):
        jsonschema.validate(event, SCHEMA)
    assert all(dict(e["metrics"])["loss"] > 0 for e in last_progress(run).values())
    shown = poprun(environ(tmp_path / "runs"), "report", "last", cwd=tmp_path).stdout
    assert re.search(r"instance 1 on localhost: step (49|50)/50, \d+ steps in \d+ calls, step time min [\d.]+ / "
                     r"median [\d.]+ / p90 [\d.]+ / max [\d.]+ ms", shown), shown
    assert 0o600 == (run / "progress.json").stat().st_mode & 0o777  # written as the record's other files are
    assert not [p.name for p in run.iterdir() if p.name.startswith(".progress.json")]  # whole, renamed into place
    plan = (run / "plan.json").read_text()
    assert "POPRUN_PROGRESS_TOKEN" not in plan  # the token is kept out of the record (docs/progress.md)
    assert re.search(r'"POPRUN_PROGRESS": "127\.0\.0\.1:\d+"', plan), plan


def test_offline_instances_report_as_their_planned_hosts(tmp_path: Path) -> None:
    """--offline-mode for pod1,pod2: every instance runs here, sends to 127.0.0.1, and is named by its planned host."""
    (tmp_path / "prog.py").write_text(PROGRAM)

    done = poprun(environ(tmp_path / "runs"), "--offline-mode=1", "--host=pod1,pod2", *TWO, PY, "prog.py",
                  cwd=tmp_path)

    assert 0 == done.returncode, done.stderr
    assert_progress_recorded(only_run(tmp_path / "runs"), ["pod1", "pod2"])


def test_ps_shows_step_and_eta_of_a_running_run_and_nothing_of_a_planted_fifo_or_link(tmp_path: Path) -> None:
    """A detached run: ps shows STEP/50 and an ETA; progress.json replaced by a FIFO or a link: ps lists the run, no progress, no hang."""
    (tmp_path / "prog.py").write_text(PROGRAM)
    env = environ(tmp_path / "runs")

    done = poprun(env, "--detach", *TWO, PY, "prog.py", "0.1", "30", cwd=tmp_path)
    assert 0 == done.returncode, done.stderr
    try:
        shown = ps_shows_progress(env)
        assert shown is not None
        assert 0 <= shown["step"] < TOTAL
        assert re.search(r"running .* \d+/50 ETA \d+ s ", str(shown["table"])), shown["table"]
        run = only_run(tmp_path / "runs")
        deadline = time.monotonic() + 60  # the instances' loop ends (5 s), then they sleep: progress.json rests
        while time.monotonic() < deadline and any(e["step"] != TOTAL - 1 for e in last_progress(run).values()):
            time.sleep(0.2)
        time.sleep(1.5)  # the last write of progress.json (at most one a second)
        for plant in ("fifo", "link"):
            (run / "progress.json").unlink()
            if plant == "fifo":
                os.mkfifo(run / "progress.json", 0o600)
            else:
                (tmp_path / "elsewhere.json").write_text(json.dumps(
                    {"v": 1, "time": 1, "attempt": 0, "instances": [{"index": 0, "step": 7, "total": 50, "eta_ms": 1}]}))
                (run / "progress.json").symlink_to(tmp_path / "elsewhere.json")
            listed = json.loads(poprun(env, "ps", "--json", cwd=tmp_path, timeout=20).stdout)
            assert [("running", None)] == [(r["state"], r["progress"]) for r in listed], plant
    finally:
        poprun(env, "stop", "last", cwd=tmp_path)


# The datagrams a stranger sends to the run's port (with or without the token), each alone
FORGED = """\
import json, os, socket, sys
host, _, port = os.environ["POPRUN_PROGRESS"].rpartition(":")
token = os.environ["POPRUN_PROGRESS_TOKEN"].encode()
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
def send(data):
    s.sendto(data, (host, int(port)))
good = json.dumps({"i": 0, "a": 0, "k": "p", "s": 7, "n": 9, "t": 1.0, "c": 1}).encode()
send(b"PRP1 " + b"f" * 32 + b" " + good)                       # another token
send((b"PRP1 " + token + b" " + good)[:50])                    # truncated
send(b"PRP1 " + token + b" " + b" " * 65000 + good)            # 64 KiB
send(b"PRP1 " + token + b" \\xff\\xfe" + good)                  # not UTF-8
send(b"PRP1 " + token + b" " + b"[" * 700 + b"]" * 700)        # nested
send(b"PRP1 " + token + b" " + b'{"i":0,"a":0,"k":"p","s":' + b"9" * 1300 + b',"t":1}')  # a huge number
"""


def test_forged_datagrams_are_dropped_counted_and_told_once(tmp_path: Path) -> None:
    """Six datagrams that are not the run's: none reaches the record; PR448 once, with the count; the run's own kept."""
    program = FORGED + "import popdist\npopdist.progress(3, 9)\n"
    env = environ(tmp_path / "runs")

    done = poprun(env, *ONE, PY, "-c", program, cwd=tmp_path)

    assert 0 == done.returncode, done.stderr
    assert_golden(GOLDEN / "PR448_strangers_send_to_the_progress_port", f"{done.stderr}exit {done.returncode}\n")
    run = only_run(tmp_path / "runs")
    assert [(0, 3, 9)] == [(e["index"], e["step"], e["total"]) for e in events(run) if e["event"] == "instance-progress"]
    progress = json.loads((run / "report.json").read_text())["progress"]
    assert (6, 1) == (progress["forged"], progress["received"])


def test_an_older_attempts_datagram_and_an_index_beyond_the_plan_are_dropped(tmp_path: Path) -> None:
    """Attempt 1 sends as attempt 0 and as instance 99, with the run's token: dropped; its own progress kept as attempt 1."""
    program = """\
import json, os, socket, time, popdist
attempt = int(os.environ["POPRUN_RESTART_COUNT"])
if attempt == 0:
    popdist.progress(5, 9)
    raise SystemExit(1)
host, _, port = os.environ["POPRUN_PROGRESS"].rpartition(":")
token = os.environ["POPRUN_PROGRESS_TOKEN"].encode()
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
for fields in ({"i": 0, "a": 0, "s": 8}, {"i": 99, "a": 1, "s": 8}):
    body = {"k": "p", "n": 9, "t": time.time(), "c": 1, **fields}
    s.sendto(b"PRP1 " + token + b" " + json.dumps(body).encode(), (host, int(port)))
time.sleep(0.3)
popdist.progress(2, 9)
"""
    done = poprun(environ(tmp_path / "runs"), "--max-restarts", "1", *ONE, PY, "-c", program, cwd=tmp_path)

    assert 0 == done.returncode, done.stderr
    run = only_run(tmp_path / "runs")
    told = [(e["attempt"], e["index"], e["step"]) for e in events(run) if e["event"] == "instance-progress"]
    assert [(0, 0, 5), (1, 0, 2)] == told
    progress = json.loads((run / "report.json").read_text())["progress"]
    assert (0, 2) == (progress["forged"], progress["dropped"])
    assert "PR448" not in done.stderr  # the run's own token: not strangers


def test_a_run_without_loopback_runs_without_progress_and_says_so_once(tmp_path: Path) -> None:
    """In a network namespace whose loopback is down, the socket cannot be made: PR447 once, the run succeeds."""
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("needs root and unshare(1) for a network namespace of its own")
    program = "import os, popdist; popdist.progress(1, 2); print(os.environ.get('POPRUN_PROGRESS'))"
    done = subprocess.run(["unshare", "--net", PY, "-m", "poprun.cli.main", *ONE, PY, "-c", program], env=environ(tmp_path / "runs"), cwd=tmp_path, capture_output=True,
                          text=True, timeout=120, check=False)

    assert (0, "None\n") == (done.returncode, done.stdout), done.stderr
    assert_golden(GOLDEN / "PR447_no_loopback_for_the_progress_channel", f"{done.stderr}exit {done.returncode}\n")


def test_a_run_without_a_record_or_features_opens_and_imports_nothing_of_the_channel(tmp_path: Path) -> None:
    """POPRUN_RECORD=0, no --heartbeat-timeout, --metrics-file or --notify: no POPRUN_PROGRESS, no channel module loaded."""
    script = ("import sys\nfrom poprun.cli.main import main\n"
              "status = main(['--num-instances', '1', '--num-replicas', '2', sys.executable, '-c', "
              "'import os; print(os.environ.get(\"POPRUN_PROGRESS\"), os.environ.get(\"POPRUN_PROGRESS_TOKEN\"))'])\n"
              "print(status, sorted(m for m in sys.modules if m in ('poprun.apply.channel', 'poprun.apply.progress', "
              "'poprun.core.progress')), flush=True)\n")

    done = subprocess.run([PY, "-c", script], env=environ(tmp_path / "runs", POPRUN_RECORD="0"), cwd=tmp_path,
                          capture_output=True, text=True, timeout=60, check=False)

    assert "None None\n0 []\n" == done.stdout, done.stderr
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())


FLOOD = """\
import socket, sys
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
data, where = b"PRP1 " + b"0" * 32 + b' {"i":0,"a":0,"k":"p","s":1,"t":1}', ("127.0.0.1", int(sys.argv[1]))
while True:
    try:
        s.sendto(data, where)
    except OSError:
        pass
"""


def cpu_seconds(pid: int) -> float:
    """Return the CPU time (user and system) process ``pid`` used so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def test_a_flood_of_forged_datagrams_neither_starves_the_run_nor_burns_poprun(tmp_path: Path) -> None:
    """Two processes flood the run's port with forged datagrams: the run's progress still arrives, poprun's CPU stays bounded."""
    (tmp_path / "prog.py").write_text(PROGRAM)
    runs = tmp_path / "runs"
    proc = subprocess.Popen([PY, "-m", "poprun.cli.main", *TWO, PY, "prog.py", "0.1"], env=environ(runs), cwd=tmp_path,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    flooders: list[subprocess.Popen[bytes]] = []
    try:
        deadline = time.monotonic() + 60
        port = None
        while port is None and time.monotonic() < deadline:
            plans = list(runs.glob("*/plan.json")) if runs.exists() else []
            found = re.search(r'"POPRUN_PROGRESS": "127\.0\.0\.1:(\d+)"', plans[0].read_text()) if plans else None
            port = int(found.group(1)) if found else None
            time.sleep(0.05)
        assert port is not None, "the run never recorded its plan"
        flooders = [subprocess.Popen([PY, "-c", FLOOD, str(port)]) for _ in range(2)]
        began = time.monotonic()
        used = last = cpu_seconds(proc.pid)
        while proc.poll() is None and time.monotonic() < began + 120:
            try:
                last = cpu_seconds(proc.pid)  # poprun's own threads (the instances are processes of their own)
            except OSError:  # ended meanwhile
                break
            time.sleep(0.2)
        took, burnt = time.monotonic() - began, last - used
        _, err = proc.communicate(timeout=60)
    finally:
        for flooder in flooders:
            flooder.kill()
            flooder.wait()
        if proc.poll() is None:
            proc.kill()
            proc.wait()

    assert 0 == proc.returncode, err
    run = only_run(runs)
    progress = json.loads((run / "report.json").read_text())["progress"]
    assert (True, True) == (progress["forged"] >= FILTER_AFTER, progress["filtered"]), progress  # the flood came
    assert {0: TOTAL - 1, 1: TOTAL - 1} == {i: e["step"] for i, e in last_progress(run).items()}  # the run's all came
    assert burnt / took < 0.6, (burnt, took)  # a share of one core: by design 0.1 at most, none once filtered


def test_progress_arrives_from_an_ipv6_only_sender_on_a_remote_style_socket(tmp_path: Path) -> None:
    """A dual-stack channel (a plan with remote hosts) takes datagrams over IPv6 (::1) and IPv4 alike."""
    from poprun.apply.channel import Channel
    from poprun.apply.progress import Board

    if not socket.has_ipv6:
        pytest.skip("no IPv6 here")
    board = Board()
    channel = Channel(board, remote=True, emit=lambda _event: None)
    channel.start()
    try:
        assert channel.ready(), channel.error
        body = b' {"i":0,"a":0,"k":"p","s":4,"n":8,"t":1.5,"c":1}'
        for family, address in ((socket.AF_INET6, "::1"), (socket.AF_INET, "127.0.0.1")):
            with socket.socket(family, socket.SOCK_DGRAM) as sender:
                sender.sendto(b"PRP1 " + channel.token.encode() + body, (address, channel.port))
        deadline = time.monotonic() + 10
        while channel.received < 2 and time.monotonic() < deadline:
            time.sleep(0.02)
    finally:
        channel.close()

    assert (2, 0) == (channel.received, channel.forged)
    assert [(0, 4.0, 8)] == [(p.index, p.step, p.total) for p in board.snapshot()]


def test_verbose_tells_the_runs_progress_and_logs_stay_the_instances_output(tmp_path: Path) -> None:
    """-v: an [I] Progress line naming the step, total, ETA and slowest instance; poprun logs holds only what instances printed."""
    (tmp_path / "prog.py").write_text(PROGRAM)
    env = environ(tmp_path / "runs")

    done = poprun(env, "-v", *TWO, PY, "prog.py", "0.05", cwd=tmp_path)

    assert 0 == done.returncode, done.stderr
    assert re.search(r"\[I\] Progress: step \d+/50, ETA \d+ s \(slowest: instance [01] on localhost\)", done.stderr), \
        done.stderr
    logs = poprun(env, "logs", "last", cwd=tmp_path)
    assert ["0 " + socket.gethostname(), "1 " + socket.gethostname()] == sorted(logs.stdout.splitlines()), logs.stderr
