"""The ssh backend's parts that need no host: the remote command, preflight answers, the key to distribute."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import IO

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from poprun.backends.base import LaunchError
from poprun.backends.ssh import _diagnose, remote_command
from poprun.backends.sshkey import key_to_distribute
from poprun.core.record import evolve
from poprun.planner.context import Context
from poprun.planner.flags import parse_flags
from poprun.planner.plan import Instance, SshKeyDistribution
from poprun.planner.solve import solve

PRINT_ENV = "import json, os, sys; print(json.dumps([os.getcwd(), sys.argv[1:], os.environ.get('V')]))"


def instance(cwd: Path, *argv: str) -> Instance:
    """Return instance 0 of a plan for hosts h1,h2 that runs ``argv`` in ``cwd``."""
    ctx = Context(environ={"PATH": "/usr/bin:/bin"}, cwd=str(cwd))
    spec = parse_flags(["--host", "h1,h2", "--num-instances", "2", "--num-replicas", "2", *argv], environ={}).spec
    return solve(spec, ctx, require_program=True).plan.instances[0]


@settings(max_examples=60, deadline=None)
@given(value=st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=40),
       arg=st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=20))
def test_remote_command_run_by_a_login_shell_gives_the_values_exactly(tmp_path_factory: pytest.TempPathFactory,
                                                                      value: str, arg: str) -> None:
    """Any value (quotes, $(...), backticks, newlines, Unicode) and argument reaches the program unchanged."""
    cwd = tmp_path_factory.mktemp("cwd")
    planned = instance(cwd, sys.executable, "-c", PRINT_ENV, arg)
    planned = evolve(planned, env=evolve(planned.env, set=(*planned.env.set, ("V", value))))
    env = {"PATH": "/usr/bin:/bin", "V": value} | dict(planned.env.set)

    # stdin stays open, as poprun's end of the ssh connection does: its end would stop the program
    proc = subprocess.Popen(["sh", "-c", remote_command(planned, env)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    assert proc.stderr is not None
    assert proc.stdin is not None
    assert "poprun-preflight ok\n" == proc.stdout.readline()
    proc.stdin.write("G\n")
    proc.stdin.flush()
    out, err = proc.stdout.read(), proc.stderr.read()
    proc.communicate()

    assert (0, [str(cwd), [arg], value]) == (proc.returncode, json.loads(out)), err


def started(planned: Instance) -> tuple[subprocess.Popen[str], IO[str], IO[str]]:
    """Run ``planned``'s remote command as its login shell would, through its check and poprun's "G"."""
    proc = subprocess.Popen(["sh", "-c", remote_command(planned, {})], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=True)
    assert proc.stdin is not None
    assert proc.stdout is not None
    assert "poprun-preflight ok\n" == proc.stdout.readline()
    proc.stdin.write("G\n")
    proc.stdin.flush()
    return proc, proc.stdin, proc.stdout


def test_remote_program_is_killed_with_its_children_when_the_connection_ends(tmp_path: Path) -> None:
    """The end of stdin (poprun or its ssh client gone) kills the program's whole group, grandchildren too."""
    proc, stdin, stdout = started(instance(tmp_path, "sh", "-c", "sleep 30 & echo $!; wait"))
    grandchild = int(stdout.readline())

    stdin.close()

    assert 128 + 9 == proc.wait(timeout=10)
    stdout.close()
    assert _gone_within(grandchild, 2.0), f"process {grandchild} outlived the connection"


def _gone_within(pid: int, seconds: float) -> bool:
    """Return whether ``pid`` is gone or a zombie within ``seconds`` (SIGKILL takes a moment to land)."""
    deadline = time.monotonic() + seconds
    while True:
        try:
            if Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
                return True
        except (OSError, IndexError):
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)


def test_remote_program_gets_sigterm_on_a_t_line(tmp_path: Path) -> None:
    """A 'T' line on stdin: SIGTERM to the program, whose trap runs; the wrapper exits with its status."""
    proc, stdin, stdout = started(instance(tmp_path, "sh", "-c",
                                           "trap 'echo stopped; exit 7' TERM; echo ready; while :; do sleep 0.05; done"))
    assert "ready\n" == stdout.readline()

    stdin.write("T\n")
    stdin.flush()

    assert ("stopped\n", 7) == (stdout.readline(), proc.wait(timeout=10))
    stdin.close()
    stdout.close()


def test_remote_program_never_starts_without_go(tmp_path: Path) -> None:
    """The end of stdin before "G" (another host failed its check): the check ran, the program did not."""
    planned = instance(tmp_path, "sh", "-c", "echo started")
    done = subprocess.run(["sh", "-c", remote_command(planned, {})], input="", capture_output=True, text=True,
                          check=False)

    assert (0, "poprun-preflight ok\n") == (done.returncode, done.stdout)


def test_remote_command_in_a_missing_directory_exits_125(tmp_path: Path) -> None:
    """The working directory is entered first; when it is missing the command exits 125 (the preflight's sign)."""
    planned = instance(tmp_path / "gone", "true")

    assert 125 == subprocess.run(["sh", "-c", remote_command(planned, {})], capture_output=True, check=False).returncode


@pytest.mark.parametrize(("status", "err", "code"), [
    (255, "ssh: Could not resolve hostname pod9: Name or service not known", "PR405"),
    (255, "ssh: Could not resolve hostname pod9: Temporary failure in name resolution", "PR405"),
    (255, "ssh: connect to host 10.0.0.9 port 22: No route to host", "PR406"),
    (255, "kex_exchange_identification: Connection closed by remote host", "PR406"),
    (255, "Host key verification failed.", "PR407"),
    (255, "@@@ WARNING: REMOTE HOST IDENTIFICATION HAS CHANGED! @@@", "PR407"),
    (255, "root@pod9: Permission denied (publickey,password).", "PR408"),
])
def test_ssh_errors_are_told_apart(status: int, err: str, code: str) -> None:
    """Each way ssh fails maps to its own code."""
    diagnostic = _diagnose("pod9", status, "", err, "/app")

    assert diagnostic is not None
    assert code == diagnostic.code


def test_a_host_that_answers_ok_has_no_problem() -> None:
    """The check's last word 'ok' and nothing else: no diagnostic."""
    assert _diagnose("pod9", 0, "poprun-preflight ok\n", "", "/app") is None


def test_key_to_distribute_prefers_ed25519_and_says_when_there_is_none(tmp_path: Path) -> None:
    """Without a type: the first of id_ed25519, id_ecdsa, id_rsa, id_dsa; none at all is a LaunchError."""
    keys = SshKeyDistribution(enabled=True, key_path=str(tmp_path), key_type=None)
    with pytest.raises(LaunchError, match="no SSH key to distribute"):
        key_to_distribute(keys, home="/nonexistent")
    for kind in ("rsa", "ed25519"):
        (tmp_path / f"id_{kind}.pub").write_text("ssh-key\n")

    assert tmp_path / "id_ed25519.pub" == key_to_distribute(keys, home="/nonexistent")


def test_key_to_distribute_makes_a_key_of_the_type_asked_for(tmp_path: Path) -> None:
    """With a type and no such key in a new folder: ssh-keygen makes it there."""
    folder = tmp_path / "new"
    public = key_to_distribute(SshKeyDistribution(enabled=True, key_path=str(folder), key_type="ed25519"),
                               home="/nonexistent")

    assert (folder / "id_ed25519.pub", True) == (public, (folder / "id_ed25519").is_file())
    assert public.read_text().startswith("ssh-ed25519 ")
