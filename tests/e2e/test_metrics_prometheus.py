"""
``--metrics-file`` end to end: a run whose instances call ``popdist.progress``, read by the real consumers.

The Done-means test starts Debian's node exporter (its textfile collector only) and Prometheus,
both on loopback with ports of their own and Prometheus's storage under ``tmp_path``, and polls
Prometheus's HTTP API until it has scraped ``poprun_instance_step`` with the run's id; both are
stopped after, and the test checks that neither is left. It is skipped, saying why, only where
the binaries are absent (``tests/run-all.sh`` installs them). The other tests keep the file
under a full disk (a tmpfs of a few pages, in a mount namespace of their own) and refuse a
launch whose path holds something that is not a regular file.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.openmetrics.parser import text_string_to_metric_families as openmetrics

from tests.conftest import Marked
from tests.e2e.test_runs import PY, runs_env

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]

EXPORTER = shutil.which("prometheus-node-exporter") or shutil.which("node_exporter")
PROMETHEUS = shutil.which("prometheus")
# 4 instances, 60 steps of 0.1 s each, reporting each one, then a moment for the last version
PROGRAM = ("import time, popdist\n"
           "for step in range(1, 61):\n"
           "    time.sleep(0.1)\n"
           "    popdist.progress(step, 60, loss=1.0 / step)\n")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def await_true(check: object, within_s: float = 90, every_s: float = 0.2) -> object:
    deadline = time.monotonic() + within_s
    while True:
        found = check()  # type: ignore[operator]
        if found or time.monotonic() > deadline:
            return found
        time.sleep(every_s)


def get(url: str) -> bytes | None:
    try:
        with urllib.request.urlopen(url, timeout=5) as answer:  # noqa: S310 - loopback, a URL of the test's
            return bytes(answer.read())
    except OSError:
        return None


def stop(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    try:
        proc.wait(20)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)


@pytest.fixture
def env(marked: Marked, tmp_path: Path) -> dict[str, str]:
    return runs_env(marked, tmp_path)


@pytest.mark.skipif(EXPORTER is None or PROMETHEUS is None,
                    reason="Debian's prometheus and prometheus-node-exporter are not installed (tests/run-all.sh "
                           "installs them)")
def test_prometheus_scrapes_the_instances_steps_through_the_node_exporter(env, tmp_path):
    """A real run's metrics file, served by the node exporter's textfile collector, is in Prometheus with its run id."""
    # GIVEN a node exporter reading a textfile folder and a Prometheus scraping it every second, both on loopback
    textfiles, data = tmp_path / "textfile", tmp_path / "prometheus-data"
    textfiles.mkdir()
    exporter_port, prometheus_port = free_port(), free_port()
    config = tmp_path / "prometheus.yml"
    config.write_text("global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nscrape_configs:\n"
                      f"  - job_name: node\n    static_configs:\n      - targets: ['127.0.0.1:{exporter_port}']\n")
    logs = (tmp_path / "exporter.log").open("wb"), (tmp_path / "prometheus.log").open("wb")
    exporter = subprocess.Popen([EXPORTER, f"--web.listen-address=127.0.0.1:{exporter_port}",  # type: ignore[list-item]
                                 "--collector.disable-defaults", "--collector.textfile",
                                 f"--collector.textfile.directory={textfiles}"], stdout=logs[0], stderr=logs[0])
    prometheus = subprocess.Popen([PROMETHEUS, f"--config.file={config}", f"--storage.tsdb.path={data}",  # type: ignore[list-item]
                                   f"--web.listen-address=127.0.0.1:{prometheus_port}"],
                                  stdout=logs[1], stderr=logs[1])
    try:
        # WHEN a run of 4 instances reporting their steps keeps its metrics file there
        run = subprocess.run([PY, "-m", "poprun.cli.main", "--num-instances", "4", "--num-replicas", "4",
                              "--metrics-file", str(textfiles / "poprun.prom"), PY, "-c", PROGRAM],
                             env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120, check=False)
        assert 0 == run.returncode, run.stderr
        text = (textfiles / "poprun.prom").read_text()
        run_id = next(s.labels["run_id"] for f in openmetrics(text) for s in f.samples)

        # THEN the exporter serves it, and Prometheus has the steps of every instance, labelled with the run id
        assert await_true(lambda: b"poprun_instance_step{" in (get(f"http://127.0.0.1:{exporter_port}/metrics") or b""))
        query = urllib.parse.quote(f'poprun_instance_step{{run_id="{run_id}"}}')

        seen: dict[str, str] = {}

        def steps() -> bool:
            answer = get(f"http://127.0.0.1:{prometheus_port}/api/v1/query?query={query}")
            found = json.loads(answer)["data"]["result"] if answer else []
            # the target's own "instance" label wins (honor_labels is off): the file's is "exported_instance"
            seen.clear()
            seen.update({r["metric"]["exported_instance"]: r["value"][1] for r in found})
            return seen == {"0": "60", "1": "60", "2": "60", "3": "60"}  # the run's last version, scraped

        await_true(steps, within_s=120, every_s=0.5)
        found = seen
        log = (tmp_path / "prometheus.log").read_text(errors="replace")[-2000:]
        assert {"0": "60", "1": "60", "2": "60", "3": "60"} == found, log
    finally:
        stop(exporter)
        stop(prometheus)
        for log in logs:
            log.close()

    # AND neither daemon is left
    assert exporter.poll() is not None
    assert prometheus.poll() is not None
    assert not Path(f"/proc/{exporter.pid}").exists()
    assert not Path(f"/proc/{prometheus.pid}").exists()


def test_the_metrics_file_of_a_run_has_every_instance_and_parses(env, tmp_path):
    """Without the daemons: the file a run leaves has its final state and each instance's step, total and times."""
    path = tmp_path / "poprun.prom"

    run = subprocess.run([PY, "-m", "poprun.cli.main", "--num-instances", "2", "--num-replicas", "2",
                          "--metrics-file", str(path), PY, "-c", PROGRAM], env=env, cwd=tmp_path, capture_output=True,
                         text=True, timeout=120, check=False)

    assert 0 == run.returncode, run.stderr
    found = {(s.name, s.labels.get("instance"), s.labels.get("state")): s.value
             for f in openmetrics(path.read_text()) for s in f.samples}
    assert 1 == found["poprun_run_state", None, "succeeded"]
    assert [60, 60] == [found["poprun_instance_step", i, None] for i in ("0", "1")]
    assert [60, 60] == [found["poprun_instance_step_total", i, None] for i in ("0", "1")]
    assert all(0.05 < found["poprun_instance_step_seconds", i, None] < 5 for i in ("0", "1"))
    assert ["poprun.prom", "runs"] == sorted(p.name for p in tmp_path.iterdir())  # no temporary file is left


def test_a_launch_whose_metrics_path_became_a_fifo_is_refused(env, tmp_path):
    """A saved plan whose path holds a FIFO by launch time: PR469, nothing starts, 125, the FIFO untouched."""
    # GIVEN a saved plan, then a FIFO put at its metrics path
    path = tmp_path / "poprun.prom"
    plan = subprocess.run([PY, "-m", "poprun.cli.main", "plan", "--metrics-file", str(path), "--format", "json",
                           "-o", str(tmp_path / "plan.json"), "sh", "-c", "touch ran"], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=60, check=False)
    assert 0 == plan.returncode, plan.stderr
    os.mkfifo(path)

    # WHEN it is applied
    run = subprocess.run([PY, "-m", "poprun.cli.main", "apply", str(tmp_path / "plan.json")], env=env, cwd=tmp_path,
                         capture_output=True, text=True, timeout=60, check=False)

    # THEN
    assert 125 == run.returncode, run.stderr
    assert f"error[PR469]: metrics file is not a regular file\n  --> the plan's observe.metrics_file\n   = {path} is a FIFO" \
        in run.stderr
    assert not (tmp_path / "ran").exists()
    assert (tmp_path / "poprun.prom").is_fifo()


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("unshare") is None, reason="a tmpfs needs root and unshare")
def test_a_full_disk_is_one_warning_and_the_last_version_stays(env, tmp_path):
    """The metrics folder on a full tmpfs: the run goes on and succeeds, one PR240, the last version whole, no temporary file."""
    # GIVEN a folder on a tmpfs of 64 KiB (in a mount namespace of this test's), filled once the run is going
    script = tmp_path / "full.sh"
    script.write_text(
        "set -e\n"
        'mount -t tmpfs -o size=64k tmpfs "$1"\n'
        f'{PY} -m poprun.cli.main --metrics-file "$1/poprun.prom" {PY} -c "$2" &\n'
        'while [ ! -s "$1/poprun.prom" ]; do sleep 0.05; done\n'
        'cp "$1/poprun.prom" "$1/first.prom"\n'
        'head -c 1000000 /dev/zero > "$1/filler" 2>/dev/null || true\n'
        "wait $! && echo status=0 || echo status=$?\n"
        'ls -a "$1"\n'
        'cat "$1/poprun.prom"\n')
    folder = tmp_path / "metrics"
    folder.mkdir()
    program = "import time, popdist\nfor s in range(1, 31):\n    time.sleep(0.1)\n    popdist.progress(s, 30)\n"

    # WHEN the run goes on while the disk is full
    run = subprocess.run(["unshare", "-m", "--propagation", "private", "sh", str(script), str(folder), program],
                         env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120, check=False)

    # THEN it succeeded, warned once, left no temporary file, and the file is a whole version
    assert "status=0" in run.stdout, run.stdout + run.stderr
    assert 1 == run.stderr.count("warning[PR240]"), run.stderr
    assert "the disk is full" in run.stderr
    listing, _, text = run.stdout.partition("poprun.prom\n")
    assert ["..", "filler", "first.prom", "status=0"] == sorted(listing.split())[1:], run.stdout  # no .tmp file
    assert text.endswith("# EOF\n")
    assert "poprun_run_info" in [f.name for f in openmetrics(text)]


def test_a_restarted_run_counts_its_restarts_and_attempt(env, tmp_path):
    """A run that fails once and restarts: the file ends with attempt 1, one restart, succeeded."""
    path = tmp_path / "poprun.prom"

    run = subprocess.run([PY, "-m", "poprun.cli.main", "--max-restarts", "1", "--restart-backoff", "0.05",
                          "--min-uptime", "0", "--metrics-file", str(path), "sh", "-c",
                          '[ "$POPRUN_RESTART_COUNT" = 1 ] || exit 5'], env=env, cwd=tmp_path, capture_output=True,
                         text=True, timeout=120, check=False)

    assert 0 == run.returncode, run.stderr
    found = {(s.name, s.labels.get("state")): s.value for f in openmetrics(path.read_text()) for s in f.samples}
    assert (1, 1, 1) == (found["poprun_attempt", None], found["poprun_restarts_total", None],
                         found["poprun_run_state", "succeeded"])
