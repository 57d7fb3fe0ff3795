"""
The metrics file (:mod:`poprun.apply.metrics`): its exact text, parsed by prometheus_client, and how it is replaced.

Every text written here is parsed with both of prometheus_client's parsers (OpenMetrics, and the
Prometheus text format the node exporter's textfile collector reads).
"""

from __future__ import annotations

import os
import stat

import pytest
from prometheus_client.openmetrics.parser import text_string_to_metric_families as openmetrics
from prometheus_client.parser import text_string_to_metric_families as prometheus

from poprun.apply.metrics import STATES, MetricsFile, render
from poprun.core.events import AttemptEnded, AttemptStarted, InstanceStarted, LaunchRunning, RunEnded, Stopping
from poprun.core.progress import InstanceProgress


def progress(index: int, host: str = "h1", **values: object) -> InstanceProgress:
    fields: dict[str, object] = {"attempt": 0, "step": 10, "total": 200, "steps_per_s": 4.0, "step_time_s": 0.25,
                                 "eta_s": 47.5, "heard_s": 0.5, "calls": 10} | values
    return InstanceProgress(index=index, host=host, **fields)  # type: ignore[arg-type]


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Return every sample of ``text`` as OpenMetrics reads it; the Prometheus text parser must read it too."""
    found = {(s.name, tuple(sorted(s.labels.items()))): s.value
             for family in openmetrics(text) for s in family.samples}
    assert sorted(found) == sorted((s.name, tuple(sorted(s.labels.items())))
                                   for family in prometheus(text) for s in family.samples)
    return found


def test_the_text_of_a_run_with_two_instances():
    """The whole text: the run's metrics, then each instance's, with TYPE, UNIT and HELP, and # EOF."""
    text = render(run_id="r1", backend="ssh", state="running", attempt=1, restarts=1,
                  progress=[progress(1, "h2", straggler_ratio=2.5), progress(0, step=None, total=None,
                                                                             step_time_s=None, eta_s=None)])

    assert text == (
        "# TYPE poprun_run_info gauge\n"
        "# HELP poprun_run_info The run: its id and backend (always 1).\n"
        'poprun_run_info{run_id="r1",backend="ssh"} 1\n'
        "# TYPE poprun_run_state gauge\n"
        "# HELP poprun_run_state The run's state: 1 for the state it is in, 0 for the others.\n"
        + "".join(f'poprun_run_state{{run_id="r1",state="{s}"}} {int(s == "running")}\n' for s in STATES)
        + "# TYPE poprun_attempt gauge\n"
        "# HELP poprun_attempt The attempt running now (0 first, one more with each restart of every instance).\n"
        'poprun_attempt{run_id="r1"} 1\n'
        "# TYPE poprun_restarts counter\n"
        "# HELP poprun_restarts Restarts so far in the run (of every instance, or of one).\n"
        'poprun_restarts_total{run_id="r1"} 1\n'
        "# TYPE poprun_instance_step gauge\n"
        "# HELP poprun_instance_step The last step the instance reported (popdist.progress).\n"
        'poprun_instance_step{run_id="r1",instance="1",host="h2"} 10\n'
        "# TYPE poprun_instance_step_total gauge\n"
        "# HELP poprun_instance_step_total The number of steps the instance said it will make.\n"
        'poprun_instance_step_total{run_id="r1",instance="1",host="h2"} 200\n'
        "# TYPE poprun_instance_step_seconds gauge\n"
        "# UNIT poprun_instance_step_seconds seconds\n"
        "# HELP poprun_instance_step_seconds The instance's median step time over its recent steps.\n"
        'poprun_instance_step_seconds{run_id="r1",instance="1",host="h2"} 0.25\n'
        "# TYPE poprun_instance_eta_seconds gauge\n"
        "# UNIT poprun_instance_eta_seconds seconds\n"
        "# HELP poprun_instance_eta_seconds Seconds until the instance reaches its total at its pace.\n"
        'poprun_instance_eta_seconds{run_id="r1",instance="1",host="h2"} 47.5\n'
        "# TYPE poprun_instance_straggler_ratio gauge\n"
        "# HELP poprun_instance_straggler_ratio The instance's median step time over the run's median, when it is a "
        "straggler.\n"
        'poprun_instance_straggler_ratio{run_id="r1",instance="1",host="h2"} 2.5\n'
        "# TYPE poprun_instance_last_heard_seconds gauge\n"
        "# UNIT poprun_instance_last_heard_seconds seconds\n"
        "# HELP poprun_instance_last_heard_seconds Seconds since poprun last heard from the instance.\n"
        'poprun_instance_last_heard_seconds{run_id="r1",instance="0",host="h1"} 0.5\n'
        'poprun_instance_last_heard_seconds{run_id="r1",instance="1",host="h2"} 0.5\n'
        "# EOF\n")
    assert 3 + len(STATES) + 6 + 1 == len(samples(text))


def test_label_values_are_escaped_as_the_format_says():
    """A host with quotes, backslashes and a newline, a run id that is not UTF-8: read back as they were."""
    host = 'pod"1\\\n$(id)'
    text = render(run_id="r\udcff", backend='x"y', state="starting", attempt=0, restarts=0, progress=[progress(0, host)])

    found = samples(text)
    assert 10 == found["poprun_instance_step", (("host", host), ("instance", "0"), ("run_id", "r\ufffd"))]
    assert 1 == found["poprun_run_info", (("backend", 'x"y'), ("run_id", "r\ufffd"))]


@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf"), None])
def test_a_value_that_is_not_a_finite_number_is_left_out(value):
    """NaN, infinities and None write no sample: a reader never sees a made-up number."""
    text = render(run_id="r", backend="local", state="running", attempt=0, restarts=0,
                  progress=[progress(0, step=value, eta_s=value)])

    assert "poprun_instance_step{" not in text
    assert "poprun_instance_eta_seconds{" not in text
    samples(text)


def test_large_and_fractional_steps_are_written_exactly():
    """A float step keeps its digits; a huge integer stays whole."""
    text = render(run_id="r", backend="local", state="running", attempt=0, restarts=0,
                  progress=[progress(0, step=2.5e-7, total=2**62)])

    assert 'poprun_instance_step{run_id="r",instance="0",host="h1"} 2.5e-07\n' in text
    assert f'poprun_instance_step_total{{run_id="r",instance="0",host="h1"}} {2**62}\n' in text
    samples(text)


@pytest.mark.parametrize(("events", "state", "attempt", "restarts"), [
    ([], "starting", 0, 0),
    ([LaunchRunning()], "running", 0, 0),
    ([LaunchRunning(), AttemptEnded(attempt=0, status=1, restart=True)], "restarting", 0, 1),
    ([AttemptEnded(attempt=0, status=1, restart=True), AttemptStarted(attempt=1)], "starting", 1, 1),
    ([LaunchRunning(), InstanceStarted(index=1, pid=9, restart=1)], "running", 0, 1),
    ([LaunchRunning(), Stopping(reason="instance 0 failed")], "stopping", 0, 0),
    ([RunEnded(status=0)], "succeeded", 0, 0),
    ([RunEnded(status=3, root_cause=0)], "failed", 0, 0),
    ([RunEnded(status=143)], "stopped", 0, 0),
    ([RunEnded(status=143, root_cause=1)], "failed", 0, 0),
])
def test_the_run_state_follows_the_events(tmp_path, events, state, attempt, restarts):
    """The events the relay tells set the state (one-hot), the attempt and the restarts."""
    metrics = MetricsFile(str(tmp_path / "poprun.prom"), run_id="r", backend="local")
    for event in events:
        metrics.event(event)
    metrics.write()

    found = samples((tmp_path / "poprun.prom").read_text())
    assert [state] == [s for s in STATES if found["poprun_run_state", (("run_id", "r"), ("state", s))] == 1]
    assert (attempt, restarts) == (found["poprun_attempt", (("run_id", "r"),)],
                                   found["poprun_restarts_total", (("run_id", "r"),)])


def test_each_version_replaces_the_file_and_leaves_no_temporary_file(tmp_path):
    """Written twice: the path is a new file each time (renamed over), readable by others, and alone in its folder."""
    path = tmp_path / "poprun.prom"
    metrics = MetricsFile(str(path), run_id="r", backend="local", snapshot=lambda: [progress(0)])

    metrics.write()
    first = path.stat().st_ino
    metrics.write()

    assert first != path.stat().st_ino
    assert ["poprun.prom"] == sorted(p.name for p in tmp_path.iterdir())
    umask = os.umask(0o022)
    os.umask(umask)
    assert 0o644 & ~umask == stat.S_IMODE(path.stat().st_mode)  # the node exporter runs as another user
    assert () == metrics.close()
    assert 2 + 1 == metrics.writes


@pytest.mark.parametrize("name", ["m" * 249 + ".prom", "é" * 125 + ".prom"])
def test_a_name_as_long_as_the_file_system_allows_is_written(tmp_path, name):
    """A name of 254 bytes is a valid path: its temporary file's name must fit too (255 bytes), not fail every write."""
    path = tmp_path / name
    metrics = MetricsFile(str(path), run_id="r", backend="local", snapshot=lambda: [progress(0)])

    metrics.write()

    assert () == metrics.close()
    assert path.read_text().endswith("# EOF\n")
    assert [name] == [p.name for p in tmp_path.iterdir()]


@pytest.mark.parametrize("make", ["fifo", "symlink", "directory"])
def test_something_that_is_not_a_regular_file_at_the_path_is_left_alone(tmp_path, make):
    """A FIFO, a link or a folder put at the path: never written through nor replaced; one warning."""
    path, target = tmp_path / "poprun.prom", tmp_path / "target"
    target.write_text("theirs\n")
    if make == "fifo":
        os.mkfifo(path)
    elif make == "symlink":
        path.symlink_to(target)
    else:
        path.mkdir()
    metrics = MetricsFile(str(path), run_id="r", backend="local")

    metrics.write()
    metrics.write()
    warnings = metrics.close()

    assert "theirs\n" == target.read_text()
    assert {"fifo": stat.S_ISFIFO, "symlink": stat.S_ISLNK, "directory": stat.S_ISDIR}[make](path.lstat().st_mode)
    assert [("PR240", (f"something that is not a regular file is at {path}: it is left as it is and no metrics are "
                      "written there"))] == [(w.code, w.detail) for w in warnings]
    assert 0 == metrics.writes


def test_a_folder_that_is_missing_is_one_warning_and_the_file_comes_once_it_exists(tmp_path):
    """No folder yet: a warning once, however many seconds pass; the folder made, the next version is written."""
    path = tmp_path / "later" / "poprun.prom"
    metrics = MetricsFile(str(path), run_id="r", backend="local")

    metrics.write()
    metrics.write()
    (tmp_path / "later").mkdir()
    warnings = metrics.close()

    assert path.is_file()
    assert [f"no file can be made in {tmp_path / 'later'}: No such file or directory"] == [w.detail for w in warnings]


def test_a_snapshot_that_raises_never_stops_the_file(tmp_path):
    """The board failing: the run's own metrics are still written, and the failure told once."""
    def broken() -> list[InstanceProgress]:
        raise RuntimeError("board gone")

    metrics = MetricsFile(str(tmp_path / "poprun.prom"), run_id="r", backend="local", snapshot=broken)
    metrics.write()
    warnings = metrics.close()

    assert "poprun_run_info" in (tmp_path / "poprun.prom").read_text()
    assert ["the instances' progress could not be read: RuntimeError: board gone"] == [w.detail for w in warnings]


def test_a_temporary_file_of_someone_else_is_never_touched(tmp_path):
    """A file named like poprun's temporary files, not made by this poprun: left as it is."""
    stranger = tmp_path / ".poprun.prom.000000000000.tmp"
    stranger.write_text("not poprun's\n")
    metrics = MetricsFile(str(tmp_path / "poprun.prom"), run_id="r", backend="local")

    metrics.write()
    metrics.close()

    assert "not poprun's\n" == stranger.read_text()


def test_the_thread_replaces_the_file_each_second_until_closed(tmp_path):
    """start(): written at once, then again while it runs; close() ends the thread with one last version."""
    path = tmp_path / "poprun.prom"
    metrics = MetricsFile(str(path), run_id="r", backend="local")

    metrics.start()
    assert path.is_file()
    metrics.event(RunEnded(status=0))
    metrics.close()

    assert 'poprun_run_state{run_id="r",state="succeeded"} 1\n' in path.read_text()
    assert metrics.writes >= 2


def test_a_disk_that_never_answers_holds_neither_the_events_nor_the_end(tmp_path, monkeypatch):
    """fsync stuck (a hung NFS server, injected): event() returns at once, close() within its bound, one PR240."""
    import threading
    import time

    from poprun.apply import metrics as module

    stuck = threading.Event()
    real_fsync = os.fsync

    def hang(fd: int) -> None:
        stuck.set()
        time.sleep(60)
        real_fsync(fd)

    metrics = MetricsFile(str(tmp_path / "poprun.prom"), run_id="r", backend="local")
    monkeypatch.setattr(module, "CLOSE_S", 1.0)
    monkeypatch.setattr(os, "fsync", hang)
    writer = threading.Thread(target=metrics.write, daemon=True)
    writer.start()
    assert stuck.wait(10)

    started = time.monotonic()
    metrics.event(RunEnded(status=0))
    told = time.monotonic() - started
    warnings = metrics.close()
    closed = time.monotonic() - started

    assert told < 0.5
    assert closed < 1.0 + 3
    assert [(f"a version of {tmp_path / 'poprun.prom'} was still being written 1 s after the run ended: its file "
            "system does not answer, and the last state was not written")] == [w.detail for w in warnings]


def test_a_temporary_file_replaced_by_another_is_not_removed(tmp_path):
    """poprun removes its own temporary file by its record (device, inode), never another file put at that name."""
    from poprun.apply.metrics import _identity, _unlink_own

    ours = tmp_path / ".m.prom.tmp"
    ours.write_text("ours")
    made = _identity(os.lstat(ours))
    other = tmp_path / "other"
    other.write_text("someone else's")
    os.rename(other, ours)  # swapped in between

    _unlink_own(str(ours), made)

    assert "someone else's" == ours.read_text()
