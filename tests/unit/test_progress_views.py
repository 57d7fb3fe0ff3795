"""What poprun shows of progress (ps's column, report's lines, the -v line) and how it reads and writes it (progress.json, addresses)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from poprun.apply.channel import addresses, event_of, progress_data
from poprun.backends.ssh.remote import _VIA
from poprun.cli.progress import ProgressLine
from poprun.core.events import InstanceProgressed
from poprun.core.progress import InstanceProgress
from poprun.core.runinfo import RunInfo
from poprun.render.runs import render_progress, render_ps, render_report_progress
from poprun.runs.store import read_progress

STARTED = 1767225600.0  # 2026-01-01 00:00:00 UTC


@pytest.fixture(autouse=True)
def _utc(monkeypatch: pytest.MonkeyPatch) -> None:
    """Times in UTC."""
    import time

    monkeypatch.setenv("TZ", "UTC")
    time.tzset()


def test_ps_shows_a_progress_column_while_a_run_reports_progress() -> None:
    """The running run's STEP/TOTAL and ETA; '-' for runs without; the column only when some run has progress."""
    runs = [RunInfo(id="20260101-000000-aaaaaa", path="/r/a", state="running", started=STARTED, instances=4,
                    hosts=("h1", "h2"), argv=("python3", "train.py"), step=120, total=200, eta_s=35.4),
            RunInfo(id="20251231-230000-bbbbbb", path="/r/b", state="ended", status=0, started=STARTED - 3600,
                    ended=STARTED - 3000, instances=1, hosts=("h1",), argv=("true",))]

    expected = (
        "RUN                     STATE    STARTED              DURATION    PROGRESS          INSTANCES  HOSTS   PROGRAM\n"
        "20260101-000000-aaaaaa  running  2026-01-01 00:00:00  1 min 40 s  120/200 ETA 35 s  4          h[1-2]  python3 train.py\n"
        "20251231-230000-bbbbbb  ended 0  2025-12-31 23:00:00  10 min 0 s  -                 1          h1      true\n")
    assert expected == render_ps(runs, now=STARTED + 100)
    assert "PROGRESS" not in render_ps(runs[1:], now=STARTED)


@pytest.mark.parametrize(("step", "total", "eta", "text"), [
    (None, None, None, "-"), (3.0, None, None, "3"), (1.25, 4, None, "1.25/4"), (120.0, 200, 3725.0, "120/200 ETA 1 h 2 min"),
    (7.0, 9, 0.2, "7/9 ETA 0 s"), (7.0, 9, 59.6, "7/9 ETA 1 min 0 s"),
    (3.9e301, 100, 1e300, "3.9e+301/100 ETA over 100000 h"), (1e20, None, None, "1e+20"), (0.9995, 1, None, "1/1"),
    (-39.0, 100, 0.0, "-39/100 ETA 0 s"), (2.0**53, 10, 360000000.0, "9.007e+15/10 ETA over 100000 h")])
def test_progress_reads_as_step_total_and_eta(step: float | None, total: int | None, eta: float | None, text: str) -> None:
    """A step without a total, fractions, ETAs in whole units."""
    assert text == render_progress(step, total, eta)


def test_report_lists_each_instances_steps_and_step_times() -> None:
    """report.json's progress, one line per instance; entries not as poprun writes them are left out."""
    progress = {"instances": [
        {"index": 0, "host": "h1", "steps": 49, "calls": 50, "last_step": 49, "total": 50,
         "step_time_ms": {"min": 20.1, "median": 20.25, "p90": 21, "max": 35.0}, "straggler_ratio": None},
        {"index": 1, "host": "h2\x1b[2J", "steps": 1, "calls": 1, "last_step": None, "total": None,
         "step_time_ms": {"min": None, "median": None, "p90": None, "max": None}, "straggler_ratio": 2.5},
        {"index": "2", "steps": 1}, "junk"], "forged": 3}

    expected = ("progress:\n"
                "  instance 0 on h1: step 49/50, 49 steps in 50 calls, step time min 20.1 / median 20.2 / p90 21.0 / "
                "max 35.0 ms\n"
                "  instance 1 on h2\\x1b[2J: no step, 1 step in 1 call, straggler (2.50x the run's median)\n"
                "  3 datagrams not the run's dropped (PR448)\n")
    assert expected == render_report_progress(progress)
    assert "" == render_report_progress({"instances": "no"}) == render_report_progress(None)


def test_report_leaves_out_numbers_no_float_holds() -> None:
    """An int of 400 digits in report.json (hand-edited, damaged) is no number: left out, never an OverflowError."""
    huge = 10**400
    progress = {"instances": [
        {"index": 0, "host": "h1", "steps": 2, "calls": 2, "last_step": huge, "total": 5,
         "step_time_ms": {"min": 1, "median": huge, "p90": 1, "max": 1}, "straggler_ratio": huge}]}

    assert "progress:\n  instance 0 on h1: no step, 2 steps in 2 calls\n" == render_report_progress(progress)


def event(index: int, step: float | None, eta_ms: int | None, *, attempt: int = 0) -> InstanceProgressed:
    """Return instance ``index``'s progress event on host h<index>."""
    return InstanceProgressed(index=index, host=f"h{index}", attempt=attempt, step=step, total=200, eta_ms=eta_ms)


def test_the_verbose_line_names_the_slowest_instance_every_ten_seconds_at_most() -> None:
    """The least step, the largest ETA and whose; then nothing for 10 s; a newer attempt's events replace older ones."""
    now = [100.0]
    line = ProgressLine(clock=lambda: now[0])

    assert line.line(event(0, None, None)) is None  # heartbeats only: no step to show
    assert "Progress: step 120/200, ETA 35 s (slowest: instance 1 on h1)" == line.line(event(1, 120, 35_000))
    now[0] += 9
    assert line.line(event(0, 150, 20_000)) is None
    now[0] += 1
    assert "Progress: step 120/200, ETA 50 s (slowest: instance 0 on h0)" == line.line(event(0, 121, 50_000))
    now[0] += 10
    assert "Progress: step 3/200, ETA 3 min 0 s (slowest: instance 1 on h1)" == line.line(event(1, 3, 180_000, attempt=1))


def test_progress_json_and_events_carry_whole_steps_as_ints() -> None:
    """progress.json's instance entries and instance-progress events, from the board's records."""
    state = InstanceProgress(index=2, host="h3", attempt=1, step=120.0, total=200, steps_per_s=50.0, step_time_s=0.0205,
                             eta_s=1.64, heard_s=0.25, calls=130, metrics=(("loss", 0.5),), straggler_ratio=None)

    assert {"v": 1, "time": 12.346, "attempt": 1, "instances": [
        {"index": 2, "host": "h3", "step": 120, "total": 200, "step_time_ms": 20.5, "eta_ms": 1640, "heard_ms": 250,
         "straggler_ratio": None}]} == progress_data([state], 1, 12.3456)
    assert InstanceProgressed(index=2, host="h3", attempt=1, step=120, total=200, step_time_ms=20.5, eta_ms=1640,
                              metrics=(("loss", 0.5),)) == event_of(state)


def test_instances_here_send_to_loopback_and_others_find_poprun_on_their_side() -> None:
    """127.0.0.1:PORT on this machine; :PORT elsewhere (popdist, the relay or mpirun's wrapper finds the address)."""
    assert {0: "127.0.0.1:4000", 1: ":4000"} == addresses([True, False], 4000)


@pytest.mark.parametrize(("via", "given", "expected"), [
    (None, ":4000", ":4000"), ("", ":4000", ":4000"), ("10.0.0.1", ":4000", "10.0.0.1:4000"),
    ("fd00::1", ":4000", "[fd00::1]:4000"), ("10.0.0.1", "127.0.0.1:4000", "127.0.0.1:4000")])
def test_a_relayed_leaf_sends_where_its_relay_saw_poprun(via: str | None, given: str, expected: str) -> None:
    """The leaf's shell text: a :PORT with the relay's view of poprun's address in front (brackets for IPv6)."""
    script = ("" if via is None else f"__poprun_via={via}; ") + f"export POPRUN_PROGRESS={given}\n{_VIA}\n"
    script += 'printf %s "$POPRUN_PROGRESS"'

    assert expected == subprocess.run(["sh", "-c", script], capture_output=True, text=True, check=True,
                                      env={}).stdout


def write(run: Path, data: object) -> Path:
    """Write ``data`` as the run's progress.json."""
    (run / "progress.json").write_text(data if isinstance(data, str) else json.dumps(data))
    return run


GOOD = {"v": 1, "time": 1, "attempt": 0, "instances": [
    {"index": 0, "host": "h1", "step": 120, "total": 200, "eta_ms": 35000},
    {"index": 1, "host": "h2", "step": 130, "total": 200, "eta_ms": 40000},
    {"index": 2, "host": "h3", "step": None, "total": None, "eta_ms": None}]}


def test_ps_reads_the_least_step_and_the_largest_eta(tmp_path: Path) -> None:
    """The run is as far as its least advanced instance, and done when its slowest is."""
    assert (120.0, 200, 40.0) == read_progress(str(write(tmp_path, GOOD)))


@pytest.mark.parametrize("bad", [
    "not json", "[]", "{}", {"v": 2, "instances": []}, {"v": 1, "instances": {}}, {"v": 1, "instances": ["x"]},
    {"v": 1, "instances": [{"step": "1"}]}, {"v": 1, "instances": [{"step": 1, "total": -1}]},
    {"v": 1, "instances": [{"step": 1, "total": True}]}, {"v": 1, "instances": [{"step": 1, "eta_ms": -5}]},
    '{"v": 1, "instances": [{"step": NaN}]}', '{"v": 1, "instances": [{"step": 1e999}]}',
    {"v": 1, "instances": []}, "[" * 100000 + "]" * 100000,
    '{"v": 1, "instances": [{"step": 1%s}]}' % ("0" * 400),  # no float holds it
    '{"v": 1, "instances": [{"step": 1, "eta_ms": 1%s}]}' % ("0" * 400)])
def test_a_progress_json_not_as_poprun_writes_it_shows_nothing(tmp_path: Path, bad: object) -> None:
    """Wrong types, values out of range, nested too deep: no progress, never an error."""
    assert (None, None, None) == read_progress(str(write(tmp_path, bad)))


def test_a_fifo_a_link_or_a_huge_progress_json_shows_nothing_and_never_blocks(tmp_path: Path) -> None:
    """A FIFO is never opened for waiting, a link never followed, a file beyond the bound never read whole."""
    os.mkfifo(tmp_path / "progress.json")
    assert (None, None, None) == read_progress(str(tmp_path))
    (tmp_path / "progress.json").unlink()
    (tmp_path / "real.json").write_text(json.dumps(GOOD))
    (tmp_path / "progress.json").symlink_to(tmp_path / "real.json")
    assert (None, None, None) == read_progress(str(tmp_path))
    (tmp_path / "progress.json").unlink()
    with (tmp_path / "progress.json").open("w") as file:
        file.truncate(5 << 20)
    assert (None, None, None) == read_progress(str(tmp_path))


def test_a_sink_that_raises_silences_the_channels_events_not_its_reading() -> None:
    """The channel's thread tells events through the relay; one that raises stops the telling, never the thread."""
    import socket
    import time

    from poprun.apply.channel import Channel
    from poprun.apply.progress import Board

    told: list[object] = []

    def emit(event: object) -> None:
        told.append(event)
        raise BrokenPipeError

    channel = Channel(Board(("h1", "h2")), remote=False, emit=emit)  # type: ignore[arg-type]
    channel.start()
    try:
        assert channel.ready(), channel.error
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sender:
            for index in (0, 1):
                body = json.dumps({"i": index, "a": 0, "k": "p", "s": 1, "n": 2, "t": 1.0, "c": 1}).encode()
                sender.sendto(b"PRP1 " + channel.token.encode() + b" " + body, ("127.0.0.1", channel.port))
                deadline = time.monotonic() + 10
                while channel.received <= index and time.monotonic() < deadline:
                    time.sleep(0.02)
                time.sleep(1.2)  # a tick: the first event is told (and raises), the second is not
    finally:
        channel.close()

    assert (2, 1) == (channel.received, len(told))


@pytest.mark.parametrize("remote", [False, True], ids=["loopback", "dual-stack"])
def test_after_strangers_the_kernel_drops_their_datagrams_and_keeps_the_runs(remote: bool) -> None:
    """64 datagrams without the token: a socket filter drops the rest in the kernel; the run's own (and only those) still come."""
    import socket
    import time

    from poprun.apply.channel import FILTER_AFTER, Channel
    from poprun.apply.progress import Board

    channel = Channel(Board(), remote=remote, emit=lambda _event: None)
    channel.start()
    body = json.dumps({"i": 0, "a": 0, "k": "p", "s": 1, "n": 2, "t": 1.0, "c": 1}).encode()
    near = channel.token[:-1] + ("0" if channel.token[-1] != "0" else "1")  # all but its last character

    def wait(condition: object) -> None:
        deadline = time.monotonic() + 10
        while not condition() and time.monotonic() < deadline:  # type: ignore[operator]
            time.sleep(0.02)

    try:
        assert channel.ready(), channel.error
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sender:
            for _ in range(FILTER_AFTER):
                sender.sendto(b"PRP1 " + b"0" * 32 + b" " + body, ("127.0.0.1", channel.port))
            wait(lambda: channel.filtered)
            for stranger in (b"PRP1 " + near.encode() + b" " + body, b"PRP2 " + channel.token.encode() + b" " + body,
                             b"", b"PRP1 "):
                sender.sendto(stranger, ("127.0.0.1", channel.port))
            sender.sendto(b"PRP1 " + channel.token.encode() + b" " + body, ("127.0.0.1", channel.port))
            wait(lambda: channel.received)
            time.sleep(0.3)
    finally:
        channel.close()

    assert (True, FILTER_AFTER, 1) == (channel.filtered, channel.forged, channel.received)


def test_a_report_with_a_start_no_float_holds_is_listed_by_its_id_time(tmp_path: Path) -> None:
    """report.json's ``started`` of 400 digits (hand-edited, damaged): ps lists the run, never an OverflowError."""
    import sys

    from poprun.runs.store import run_info

    env = {**os.environ, "POPRUN_RUNS_DIR": str(tmp_path)}
    subprocess.run([sys.executable, "-m", "poprun.cli.main", "--", "true"], env=env, check=True, timeout=60, capture_output=True)
    (run_id,) = os.listdir(tmp_path)
    report = tmp_path / run_id / "report.json"
    report.write_text(json.dumps({**json.loads(report.read_text()), "started": 10**400}))

    info = run_info(str(tmp_path), run_id)
    assert (info.state, info.status) == ("ended", 0)
    assert info.started is not None and 0 < info.started < 2**40


def test_the_record_thins_an_instances_progress_lines_beyond_their_limit(tmp_path: Path, monkeypatch) -> None:
    """A long run's events.jsonl: past the limit an instance's progress lines are kept once a minute, others' all."""
    from poprun.runs import record as recording

    monkeypatch.setattr(recording, "PROGRESS_EVENTS_LIMIT", 1000)
    record = recording.RunRecord.create({"POPRUN_RUNS_DIR": str(tmp_path)})
    for step in range(100):
        record.event(event(0, step, 1000))
    record.event(event(1, 5, 1000))
    record.close()

    lines = [json.loads(line) for line in (Path(record.path) / "events.jsonl").read_text().splitlines()]
    zero = [line["step"] for line in lines if line["event"] == "instance-progress" and line["index"] == 0]
    assert 1000 <= sum(len(json.dumps(line)) for line in lines if line.get("index") == 0) < 1300
    assert zero == list(range(len(zero))) and 4 < len(zero) < 10  # the first ~1000 bytes, then none within a minute
    assert [line["step"] for line in lines if line.get("index") == 1] == [5]
