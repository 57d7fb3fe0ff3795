"""The ssh backend's parts that need no host: the remote command, preflight answers, the key to distribute."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import IO

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from poprun.backends.base import LaunchError
from poprun.backends.ssh.client import host_timeout
from poprun.backends.ssh.preflight import _diagnose
from poprun.backends.ssh.remote import environment_input, remote_command
from poprun.backends.ssh.sshkey import key_to_distribute
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
    proc = subprocess.Popen(["sh", "-c", remote_command(planned)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    assert proc.stderr is not None
    assert proc.stdin is not None
    proc.stdin.write(environment_input(planned, env).decode())
    proc.stdin.flush()
    assert "poprun-preflight ok\n" == check_ended(proc.stdout)
    proc.stdin.write("G\n")
    proc.stdin.flush()
    out, err = proc.stdout.read(), proc.stderr.read()
    proc.communicate()

    assert (0, [str(cwd), [arg], value]) == (proc.returncode, json.loads(out)), err


def check_ended(stdout: IO[str]) -> str:
    """Return the line that ends a check, past the line that says which machine answered."""
    line = stdout.readline()
    return stdout.readline() if line.startswith("poprun-preflight id ") else line


def started(planned: Instance, command: str | None = None) -> tuple[subprocess.Popen[str], IO[str], IO[str]]:
    """Run ``planned``'s remote command as its login shell would, through its check and poprun's "G"."""
    proc = subprocess.Popen(["sh", "-c", command or remote_command(planned)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdin is not None
    assert proc.stdout is not None
    proc.stdin.write("0\n")  # no variables to export
    proc.stdin.flush()
    assert "poprun-preflight ok\n" == check_ended(proc.stdout)
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
    done = subprocess.run(["sh", "-c", remote_command(planned)], input="0\n", capture_output=True, text=True,
                          check=False)

    assert (0, "poprun-preflight ok\n") == (done.returncode, re.sub(r"poprun-preflight id .*\n", "", done.stdout))


def test_remote_command_in_a_missing_directory_exits_125(tmp_path: Path) -> None:
    """The working directory is entered first; when it is missing the command exits 125 (the preflight's sign)."""
    planned = instance(tmp_path / "gone", "true")

    assert 125 == subprocess.run(["sh", "-c", remote_command(planned)], input=b"0\n", capture_output=True,
                                 check=False).returncode


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


def test_no_value_of_the_environment_is_in_the_remote_command_line(tmp_path: Path) -> None:
    """Forwarded and set values travel on the session's input, never in the command text that ps shows."""
    planned = instance(tmp_path, "true")
    planned = evolve(planned, env=evolve(planned.env, forward=("TOKEN",), set=(*planned.env.set, ("V", "s3cr3t-v"))))
    env = {"TOKEN": "s3cr3t-token", "V": "s3cr3t-v"}

    command = remote_command(planned)
    given = environment_input(planned, env).decode()

    assert ("s3cr3t" not in command, "s3cr3t-token" in given, "s3cr3t-v" in given) == (True, True, True)


@pytest.mark.parametrize("name", ["A;touch pwned", "$(touch pwned)", "-f", "A B", "A\nB", ""])
def test_a_name_that_is_not_a_variable_name_never_reaches_the_shell(tmp_path: Path, name: str) -> None:
    """A hand-made plan's forwarded, set or unset name that is not a POSIX name is refused before ssh runs."""
    planned = instance(tmp_path, "true")
    for env in (evolve(planned.env, forward=(name,)), evolve(planned.env, unset=(name,)),
                evolve(planned.env, set=((name, "1"),))):
        with pytest.raises(LaunchError, match="is not a variable name"):
            environment_input(evolve(planned, env=env), {name: "1"})


def _run_with_cache(planned: Instance, cache: Path, *, go: bool = True) -> subprocess.CompletedProcess[str]:
    """Run ``planned``'s remote command as the only instance of its host, with ``cache`` as the temporary cache."""
    command = remote_command(planned, cache=str(cache), cache_instances=(planned.index,))
    proc = subprocess.Popen(["sh", "-c", command], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    assert proc.stdin is not None
    proc.stdin.write("0\nG\n" if go else "0\n")
    proc.stdin.flush()
    if go:
        proc.wait(timeout=30)  # stdin stays open until the program ends, as poprun's end of the connection does
    out, err = proc.communicate(timeout=30)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def test_a_temporary_cache_made_on_the_host_is_removed_there_at_the_end(tmp_path: Path) -> None:
    """A cache that does not exist on the host is made there (0700), used, and removed by the last instance."""
    cache = tmp_path / "poprun-cache-0123456789ab"
    planned = instance(tmp_path, "sh", "-c", f"ls -ld {cache} | cut -c1-10; touch {cache}/made")

    done = _run_with_cache(planned, cache)

    assert (0, "drwx------\n", False) == (done.returncode, done.stdout.split("ok\n")[-1], cache.exists())


def test_a_cache_that_already_exists_on_the_host_is_never_removed_whatever_its_name(tmp_path: Path) -> None:
    """A directory of the user's at the cache's path (even named poprun-cache-*) is used as it is and kept."""
    cache = tmp_path / "poprun-cache-0123456789ab"
    cache.mkdir(mode=0o700)
    (cache / "precious").write_text("keep me")
    planned = instance(tmp_path, "true")

    done = _run_with_cache(planned, cache)

    assert (0, "keep me") == (done.returncode, (cache / "precious").read_text())


def test_a_link_planted_at_the_cache_path_fails_the_check_and_nothing_runs(tmp_path: Path) -> None:
    """A symbolic link where the cache is to be made is refused: the check says so, and nothing is followed."""
    target = tmp_path / "elsewhere"
    target.mkdir()
    cache = tmp_path / "poprun-cache-0123456789ab"
    cache.symlink_to(target)
    planned = instance(tmp_path, "touch", str(cache / "followed"))

    done = _run_with_cache(planned, cache, go=False)

    assert f"poprun-preflight cache {cache}" in done.stdout
    assert (_diagnose("h1", 0, done.stdout, "", str(tmp_path)) or pytest.fail("no problem found")).code == "PR409"
    assert (cache.is_symlink(), list(target.iterdir())) == (True, [])


def test_the_remote_program_is_killed_when_poprun_falls_silent(tmp_path: Path) -> None:
    """No line from poprun for the host timeout (the link is down): the wrapper kills the program's group."""
    planned = instance(tmp_path, "sh", "-c", "sleep 30 & echo $!; wait")
    proc, stdin, stdout = started(planned, remote_command(planned, host_timeout_s=1))
    grandchild = int(stdout.readline())

    assert 128 + 9 == proc.wait(timeout=15)  # stdin is still open: only the silence ended it
    stdin.close()
    stdout.close()
    assert _gone_within(grandchild, 2.0), f"process {grandchild} outlived the silence"


def test_heartbeats_keep_the_remote_program_running(tmp_path: Path) -> None:
    """Lines of "H" within the host timeout: the program runs to its own end."""
    planned = instance(tmp_path, "sh", "-c", "sleep 2.5; echo done")
    proc, stdin, stdout = started(planned, remote_command(planned, host_timeout_s=1))
    for _ in range(10):
        time.sleep(0.4)
        stdin.write("H\n")
        stdin.flush()
        if proc.poll() is not None:
            break

    assert ("done\n", 0) == (stdout.readline(), proc.wait(timeout=10))
    stdin.close()
    stdout.close()


@pytest.mark.parametrize(("value", "expected"), [("", 15.0), ("30", 30.0), (" 4.5 ", 4.5)])
def test_host_timeout_comes_from_the_environment(value: str, expected: float) -> None:
    """POPRUN_HOST_TIMEOUT sets the host timeout; unset or empty, it is 15 s."""
    assert expected == host_timeout({"POPRUN_HOST_TIMEOUT": value})


@pytest.mark.parametrize("value", ["0", "2", "1e9", "nan", "inf", "ten", "-5"])
def test_a_host_timeout_out_of_range_is_refused(value: str) -> None:
    """A timeout that is not 3 to 3600 seconds is a LaunchError naming the variable."""
    with pytest.raises(LaunchError, match="POPRUN_HOST_TIMEOUT"):
        host_timeout({"POPRUN_HOST_TIMEOUT": value})


def test_a_host_name_that_looks_like_an_option_is_never_read_as_one(tmp_path: Path) -> None:
    """A host '-oProxyCommand=...' (a hand-made plan) reaches the real ssh as a name after '--': nothing runs."""
    from poprun.backends.ssh.client import SshClient

    planted = tmp_path / "pwned"
    client = SshClient(config=str(tmp_path / "no_config"))
    (tmp_path / "no_config").write_text("")
    try:
        failed = client.connect([(f"-oProxyCommand=touch {planted}", 0)], timeout_s=5)
        session = subprocess.run(client.argv(f"-oProxyCommand=touch {planted}", "true"), capture_output=True,
                                 timeout=10, check=False, stdin=subprocess.DEVNULL)
    finally:
        client.close()

    assert (1, 255, False) == (len(failed), session.returncode, planted.exists())


def test_a_login_greeting_without_a_newline_is_no_problem_and_stays_the_instances_output() -> None:
    """A shell that prints 'Welcome' (no newline) before the check: the host passed, and the greeting is kept."""
    from poprun.backends.ssh.preflight import _greeting

    answer = "Welcome to pod9poprun-preflight ok\n"

    assert (None, b"Welcome to pod9") == (_diagnose("pod9", 0, answer, "", "/app"), _greeting(answer.encode()))


def test_a_cache_whose_record_is_not_this_poprun_s_is_never_removed_on_a_host(tmp_path: Path) -> None:
    """A directory at the cache path holding a .poprun-made and a lock of another run (not its token) is kept."""
    cache = tmp_path / "poprun-cache-0123456789ab"
    cache.mkdir(mode=0o700)
    (cache / ".poprun-made").write_text("not-this-token")
    (cache / ".poprun-lock").write_text("")
    (cache / "precious").write_text("keep me")

    done = _run_with_cache(instance(tmp_path, "true"), cache)

    assert (0, "keep me") == (done.returncode, (cache / "precious").read_text())


def test_two_hosts_that_answer_from_one_machine_are_pr413_and_others_are_not(tmp_path: Path) -> None:
    """Which machine answered each check: the second name of one machine is PR413; no answer, or a different one, is fine."""
    from poprun.backends.conformance import probe_plan
    from poprun.backends.ssh.preflight import _machine, _one_machine

    plan = probe_plan("pass", tmp_path, backend="ssh", instances=4, hosts=("a", "b", "c", "d"))
    said = {host: _machine(f"motd\npoprun-preflight id {boot} net:[{net}]\npoprun-preflight ok\n".encode())
            for host, boot, net in (("a", "B1", 1), ("b", "B1", 2), ("c", "B2", 1), ("d", "B1", 1))}

    problems = _one_machine(plan, said)

    assert {"a": "B1 net:[1]", "b": "B1 net:[2]", "c": "B2 net:[1]", "d": "B1 net:[1]"} == said
    assert ["d"] == list(problems)
    assert "hosts 'a' and 'd' are one machine" == problems["d"].summary
    assert "" == _machine(b"poprun-preflight id  \npoprun-preflight ok\n")  # a host that could not say
    assert {} == _one_machine(plan, dict.fromkeys("abcd", ""))
