"""
The ssh backend's preflight on real hosts: each kind of failure, its exact text, in under 5 s.

Each folder under ``golden/`` is one case, as in ``tests/golden/diagnostics``: ``case.json`` holds
the command line, the ssh configuration to use (``ssh``: ``plain``, ``ghost`` with a host ``ghost``
at an address nobody has, ``no-known-hosts``, ``foreign-key`` with a key no host authorises) and
the working directory (``cwd``: ``app``, holding ``train.py``, or ``removed`` for one that no
longer exists); ``@h1`` in the command line is h1's address;
``expected.txt`` is poprun's standard error (the hosts' subnet and the working directory
written as ``10.77.X`` and ``<cwd>``, and an address that does not answer as ``<timed out or no
route>``, whichever of ARP and ssh gives up first) and exit status. ``POPRUN_UPDATE_GOLDEN=1`` rewrites them.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.golden.harness import assert_golden, case_dirs
from tests.testhosts import TestHosts

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(60)]

# Cases of failures mid-run ("runtime": true) are run by the tests of those failures (test_host_faults.py).
CASES = [c for c in case_dirs(Path(__file__).parent / "golden")
         if not json.loads((c / "case.json").read_text()).get("runtime")]


def ssh_config(hosts: TestHosts, variant: str, folder: Path) -> Path:
    """Return an ssh_config for ``variant``: the hosts' own, or one changed to fail in one way."""
    text = hosts.ssh_config.read_text()
    if variant == "ghost":
        unused = hosts.subnet.rsplit(".", 1)[0] + ".99"
        text = f"Host ghost\n  HostName {unused}\n{text}"
    elif variant == "no-known-hosts":
        (folder / "known_hosts").write_text("")
        text = re.sub(r"UserKnownHostsFile .*", f"UserKnownHostsFile {folder / 'known_hosts'}", text)
    elif variant == "foreign-key":
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(folder / "foreign")], check=True)
        text = re.sub(r"IdentityFile .*", f"IdentityFile {folder / 'foreign'}", text)
    path = folder / "ssh_config"
    path.write_text(text)
    return path


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_preflight_failure_is_reported_exactly_within_5_s(case: Path, test_hosts: TestHosts, tmp_path: Path) -> None:
    """GIVEN hosts that cannot run the plan in one way WHEN poprun starts THEN its diagnostic, exit 125, < 5 s."""
    spec = json.loads((case / "case.json").read_text())
    app = tmp_path / "app"
    app.mkdir()
    (app / "train.py").write_text("print('training')\n")
    env = os.environ | test_hosts.env() | {
        "POPRUN_SSH_CONFIG": str(ssh_config(test_hosts, spec.get("ssh", "plain"), tmp_path))}
    argv = [re.sub(r"@(h\d+)", lambda m: test_hosts.addresses[m[1]], arg) for arg in spec["argv"]]  # @h1: its address
    command = [sys.executable, "-m", "poprun.cli.main", *argv]
    if spec.get("cwd") == "removed":  # poprun starts in a directory that is gone, here and on the hosts
        command = ["sh", "-c", 'cd "$1" && rmdir "$1" && shift && exec "$@"', "sh", str(app), *command]

    started = time.monotonic()
    done = subprocess.run(command, cwd=tmp_path if spec.get("cwd") == "removed" else app, env=env,
                          capture_output=True, text=True, timeout=30, check=False)
    elapsed = time.monotonic() - started

    prefix = test_hosts.subnet.rsplit(".", 1)[0]  # 10.77.N
    text = f"{done.stderr}exit {done.returncode}\n".replace(str(app), "<cwd>").replace(prefix + ".", "10.77.X.")
    text = re.sub("Connection timed out|No route to host", "<timed out or no route>", text)  # ARP or ssh: a race
    assert_golden(case, text)
    assert elapsed < 5.0, f"the preflight took {elapsed:.1f} s"
