"""
The progress channel on real hosts: popdist.progress from every instance reaches poprun over ssh (direct and through relays) and mpirun.

Each instance runs on its own namespace host (h1..h4) and sends its datagrams to ``:PORT``
resolved on its side: by ``$SSH_CONNECTION`` (direct), by the address its relay saw poprun at
(``POPRUN_SSH_RELAY=on``: a leaf's own ``SSH_CONNECTION`` names its relay), or by the address
through which mpirun's output wrapper reached poprun. The record must then hold every
instance's progress with its right host, ``poprun ps`` a step and an ETA while it runs, and
report.json each instance's step times.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest

from tests.e2e.hosts.test_ssh_backend import poprun
from tests.e2e.progress_helpers import (
    PROGRAM,
    PY,
    TOTAL,
    assert_progress_recorded,
    last_progress,
    only_run,
    ps_shows_progress,
)
from tests.golden.harness import assert_golden
from tests.testhosts import TestHosts

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]


def hosts_of(test_hosts: TestHosts, instances: int) -> list[str]:
    """Return each instance's host, by index, as the plan places ``instances`` over every test host."""
    per = instances // len(test_hosts.names)
    return [test_hosts.names[i // per] for i in range(instances)]


@pytest.mark.parametrize("relayed", [False, True], ids=["direct", "relayed"])
def test_ssh_instances_on_four_hosts_report_progress(test_hosts: TestHosts, tmp_path: Path, relayed: bool) -> None:
    """Four hosts, eight instances over ssh (through h1's and h3's relays, too): everyone's progress, with its host."""
    runs = tmp_path / "runs"
    env = {"POPRUN_RUNS_DIR": str(runs), **({"POPRUN_SSH_RELAY": "on"} if relayed else {})}

    done = poprun(test_hosts, "--host", ",".join(test_hosts.names), "--num-instances", "8", "--num-replicas", "8",
                  PY, "-c", PROGRAM, cwd=tmp_path, env=env, timeout=150)

    assert 0 == done.returncode, done.stderr
    assert sorted(f"{i} {h}" for i, h in enumerate(hosts_of(test_hosts, 8))) == sorted(done.stdout.splitlines())
    run = only_run(runs)
    assert_progress_recorded(run, hosts_of(test_hosts, 8))
    plan = json.loads((run / "plan.json").read_text())
    assert {re.sub(r"\d+", "P", dict(i["env"])["POPRUN_PROGRESS"]) for i in plan["instances"]} == {":P"}
    assert json.loads((run / "report.json").read_text())["progress"]["forged"] == 0


def test_mpirun_instances_on_four_hosts_report_progress(test_hosts: TestHosts, tmp_path: Path) -> None:
    """mpirun over ssh on four hosts: each instance's datagrams go where its output wrapper reached poprun."""
    runs = tmp_path / "runs"

    done = poprun(test_hosts, "--backend", "mpirun", "--host", ",".join(test_hosts.names), "--num-instances", "4",
                  "--num-replicas", "4", PY, "-c", PROGRAM, cwd=tmp_path, env={"POPRUN_RUNS_DIR": str(runs)},
                  timeout=150)

    assert 0 == done.returncode, done.stderr
    assert_progress_recorded(only_run(runs), hosts_of(test_hosts, 4))


def test_ps_shows_the_step_and_eta_of_a_run_on_the_hosts(test_hosts: TestHosts, tmp_path: Path) -> None:
    """While a run on four hosts goes on (a step every 0.1 s), a second poprun's ps shows STEP/50 and an ETA."""
    runs = tmp_path / "runs"
    env = {**test_hosts.env(), "POPRUN_RUNS_DIR": str(runs)}
    proc = subprocess.Popen([PY, "-m", "poprun.cli.main", "--host", ",".join(test_hosts.names), "--num-instances", "4",
                             "--num-replicas", "4", PY, "-c", PROGRAM, "0.1"], cwd=tmp_path,
                            env={**os.environ, **env}, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    try:
        shown = ps_shows_progress({**os.environ, **env})
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()

    assert shown is not None, "ps never showed the run's progress"
    assert re.search(r"running .* \d+/50 ETA \d+ s ", str(shown["table"])), shown["table"]
    assert 0 == proc.returncode, err
    assert {0, 1, 2, 3} == set(last_progress(only_run(runs)))
    assert TOTAL == 50


GOLDEN = Path(__file__).parent / "golden"


def test_a_host_reached_through_a_jump_host_is_named_once_for_its_lost_progress(test_hosts: TestHosts,
                                                                               tmp_path: Path) -> None:
    """ssh_config's ProxyJump h1 for h2: h2's SSH_CONNECTION names h1, its progress is lost, and PR449 says so once."""
    config = tmp_path / "ssh_config"
    config.write_text("Host h2\n  ProxyJump h1\n" + test_hosts.ssh_config.read_text())
    runs = tmp_path / "runs"

    done = poprun(test_hosts, "--host", "h1,h2", "--num-instances", "2", "--num-replicas", "2", PY, "-c", PROGRAM,
                  cwd=tmp_path, env={"POPRUN_RUNS_DIR": str(runs), "POPRUN_SSH_CONFIG": str(config)}, timeout=150)

    assert 0 == done.returncode, done.stderr
    assert ["0 h1", "1 h2"] == sorted(done.stdout.splitlines())
    assert [0] == sorted(last_progress(only_run(runs)))  # h1's instance is heard; h2's went to h1
    said = done.stderr[done.stderr.find("warning[PR449]"):]  # poprun's; not what the hosts' login shells print
    assert_golden(GOLDEN / "PR449_a_host_reached_through_a_jump_host", f"{said}exit {done.returncode}\n")
    quiet = poprun(test_hosts, "--host", "h1,h2", "--num-instances", "2", "--num-replicas", "2", PY, "-c", "pass",
                   cwd=tmp_path, env={"POPRUN_RUNS_DIR": str(runs), "POPRUN_SSH_CONFIG": str(config)}, timeout=150)
    assert (0, "") == (quiet.returncode, quiet.stderr)  # a program that reports no progress loses none: no warning
