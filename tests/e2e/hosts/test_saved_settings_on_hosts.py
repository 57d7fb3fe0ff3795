"""
A saved plan runs on the namespace hosts with the settings it was planned with, not the launching shell's.

The ssh backend reads POPRUN_SSH_CONFIG (the file that sends ssh to the test hosts) and the other
ssh settings from ``plan.backend.settings`` (docs/settings.md): ``poprun apply PLAN.json`` from a
shell that lacks them, or sets them to junk, still reaches the hosts.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from tests.e2e.hosts.test_ssh_backend import PY
from tests.testhosts import TestHosts

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(90)]


def poprun(*args: str, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([PY, "-m", "poprun.cli.main", *args], cwd=cwd, capture_output=True, text=True, env=env,
                          timeout=60, check=False, stdin=subprocess.DEVNULL)


def test_a_saved_plan_reaches_the_hosts_with_its_recorded_ssh_config(test_hosts: TestHosts, tmp_path: Path) -> None:
    """
    Planned with POPRUN_SSH_CONFIG and POPRUN_SSH_FANOUT=2; applied without the config and with junk: it runs,
    and the port plan's command on h1 (asked without the plan: run_on_host) reaches h1 with the plan's settings.
    """
    planning = dict(os.environ) | test_hosts.env() | {"POPRUN_SSH_FANOUT": "2"}
    saved = poprun("plan", "--host", "h1,h2", "--num-instances", "2", "--num-replicas", "2", "--format", "json",
                   "-o", "plan.json", "hostname", cwd=tmp_path, env=planning)
    assert 0 == saved.returncode, saved.stderr
    recorded = {s["name"]: (s["value"], s["source"]) for s in json.loads((tmp_path / "plan.json").read_text())
                ["backend"]["settings"]}
    applying = {k: v for k, v in planning.items() if k != "POPRUN_SSH_CONFIG"} | {
        "POPRUN_SSH_FANOUT": "lots", "POPRUN_SSH_RELAY": "sometimes", "POPRUN_EVENTS": str(tmp_path / "events.jsonl")}

    done = poprun("apply", "plan.json", cwd=tmp_path, env=applying)
    events = [json.loads(line) for line in (tmp_path / "events.jsonl").read_text().splitlines()]

    assert (str(test_hosts.ssh_config), "environment variable POPRUN_SSH_CONFIG") == recorded["POPRUN_SSH_CONFIG"]
    assert ("2", "environment variable POPRUN_SSH_FANOUT") == recorded["POPRUN_SSH_FANOUT"]
    assert [True] == [e["chosen"] for e in events if e["event"] == "attempt-started"]  # the port plan read h1 too
    assert (0, ["h1", "h2"], "") == (done.returncode, sorted(done.stdout.split()), done.stderr), done.stderr[-800:]
