"""
Adversarial checks of the ssh backend's guarantees (README "Guarantees"), with real processes and hosts.

Each test here failed when it was written: it records a way the guarantees, or the promises of
the ssh backend's docstring, were broken by an attacker or by an operator's odd environment.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.hosts.conftest import settle
from tests.e2e.hosts.test_host_faults import command_lines
from tests.e2e.hosts.test_ssh_backend import PY, wait_for
from tests.testhosts import TestHosts

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(60)]

NOBODY = 65534
# A listener that accepts TCP on port 22 and never says a word: a host whose sshd hangs.
def start(hosts: TestHosts, *args: str, cwd: Path, env: dict[str, str] | None = None,
          stdin: int | None = subprocess.DEVNULL) -> subprocess.Popen[bytes]:
    return subprocess.Popen([PY, "-m", "poprun.cli.main", *args], cwd=cwd, env=os.environ | hosts.env() | (env or {}),
                            stdin=stdin, stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def run(hosts: TestHosts, *args: str, cwd: Path, env: dict[str, str] | None = None,
        timeout: float = 40) -> subprocess.CompletedProcess[str]:
    return subprocess.run([PY, "-m", "poprun.cli.main", *args], cwd=cwd, capture_output=True, text=True,
                          env=os.environ | hosts.env() | (env or {}), timeout=timeout, check=False,
                          stdin=subprocess.DEVNULL)


# --- 1. Piped stdin: another user of a host reads it ----------------------------------------------------------------


def test_piped_stdin_never_reaches_a_fifo_that_another_user_planted(test_hosts: TestHosts, tmp_path: Path,
                                                                    short_tmp: Path) -> None:
    """
    `echo PASSWORD | poprun --host h1,h2 ...`: the FIFO's path (/tmp/poprun-stdin-<hex>) is on the remote
    command line from the preflight on, and the directory is only made after "G". User nobody on h1
    watches ps, makes that directory (0777) with a FIFO `in` first: the stdin session checks only that
    `in` is a FIFO, not whose, and copies poprun's stdin into it. Nobody must read the user's input.
    """
    stop = threading.Event()
    mark = f"adv-{uuid.uuid4().hex[:8]}"

    def attacker() -> None:
        seen: set[str] = set()
        prefix = b"/tmp/poprun-stdin-"
        while not stop.is_set():
            for line in command_lines().values():
                at = line.find(prefix)
                if at < 0 or mark.encode() not in line:  # this test's launch only, never another's
                    continue
                directory = line[at:at + len(prefix) + 12].decode()
                if directory in seen:
                    continue
                seen.add(directory)
                loot = short_tmp / f"loot-{len(seen)}"
                pid = os.fork()
                if pid == 0:  # pragma: no cover - the attacker, as user nobody
                    signal.alarm(15)  # never outlives the test, whatever happens
                    try:
                        os.setgid(NOBODY)
                        os.setuid(NOBODY)
                        os.mkdir(directory, 0o777)  # an attacker, in a forked child
                        os.chmod(directory, 0o777)  # noqa: S103 - the attacker opens it to all
                        os.mkfifo(f"{directory}/in", 0o666)
                        fd = os.open(f"{directory}/in", os.O_RDONLY)
                        data = b""
                        while chunk := os.read(fd, 65536):
                            data += chunk
                        os.write(os.open(str(loot), os.O_WRONLY | os.O_CREAT, 0o666), data)
                    finally:
                        os._exit(0)
            time.sleep(0.001)

    short_tmp.chmod(0o777)  # the attacker writes what it read there
    thread = threading.Thread(target=attacker, daemon=True)
    thread.start()
    try:
        done = subprocess.run([PY, "-m", "poprun.cli.main", "--host", "h1,h2", "--num-instances", "2",
                               "--num-replicas", "2", "sh", "-c", f"cat >/dev/null; : {mark}"], cwd=tmp_path,
                              env=os.environ | test_hosts.env(), input=b"PASSWORD=hunter2\n", capture_output=True,
                              timeout=40, check=False)
        time.sleep(1)
    finally:
        stop.set()
        thread.join()
        for planted in Path("/tmp").glob("poprun-stdin-*"):
            with contextlib.suppress(OSError):
                if planted.stat().st_uid == NOBODY:
                    shutil.rmtree(planted, ignore_errors=True)
    stolen = [p.read_bytes() for p in short_tmp.glob("loot-*")]

    assert not any(b"hunter2" in s for s in stolen), (stolen, done.returncode, done.stderr[-500:])


# --- 2. SIGKILL: what is left here ------------------------------------------------------------------------------------


def test_sigkill_while_instances_run_leaves_no_ssh_client_running_here(test_hosts: TestHosts, tmp_path: Path,
                                                                        short_tmp: Path) -> None:
    """
    README: "nothing left running even when poprun itself is killed". poprun is SIGKILLed while 4 instances
    run on h1,h2: its shared connections (ssh -f -N ... ControlPersist=30, daemonised out of the clients'
    process group) stay up for 30 s, connected to the hosts.
    """
    proc = start(test_hosts, "--host", "h1,h2", "--num-instances", "4", "--num-replicas", "4", "sh", "-c",
                 "echo up; sleep 30", cwd=tmp_path, env={"TMPDIR": str(short_tmp)})
    assert proc.stdout is not None
    for _ in range(4):
        assert proc.stdout.readline() == b"up\n"
    proc.kill()
    proc.communicate()
    needle = f"{short_tmp}/poprun-ssh-".encode()

    def clients() -> dict[int, bytes]:
        return {pid: line for pid, line in command_lines().items() if needle in line}

    try:
        assert wait_for(lambda: not clients(), within_s=5), clients()
    finally:
        for pid in clients():
            os.kill(pid, signal.SIGKILL)
        settle(test_hosts)


def test_sigkill_during_the_preflight_leaves_no_directory_or_ssh_client(test_hosts: TestHosts, tmp_path: Path,
                                                                         short_tmp: Path, mute_h4: str) -> None:
    """
    poprun is SIGKILLed while it waits for h4 (accepts TCP, never answers) in the preflight: the temporary
    cache and the control directory are made before the watchdog that removes them starts, so both stay
    in TMPDIR for good, and h1's shared connection runs on.
    """
    proc = start(test_hosts, "--host", f"h1,{mute_h4}", "--num-instances", "4", "--num-replicas", "4", "true",
                 cwd=tmp_path, env={"TMPDIR": str(short_tmp)})
    try:
        assert wait_for(lambda: any(short_tmp.glob("poprun-ssh-*")), within_s=15), "no preflight seen"
        time.sleep(0.3)
    finally:
        proc.kill()
        proc.communicate()
    needle = f"{short_tmp}/poprun-ssh-".encode()
    time.sleep(3)
    left_dirs = sorted(p.name for p in short_tmp.iterdir())
    left_procs = {pid: line for pid, line in command_lines().items() if needle in line}
    for pid in left_procs:
        os.kill(pid, signal.SIGKILL)
    settle(test_hosts)

    assert ([], {}) == (left_dirs, left_procs)


# --- 3. Hosts that do not answer -----------------------------------------------------------------------------------


def test_interrupt_during_the_preflight_ends_at_once_with_130(test_hosts: TestHosts, tmp_path: Path,
                                                               short_tmp: Path, mute_h4: str) -> None:
    """
    README: Ctrl-C stops poprun and it exits 130. Sent while the preflight waits for h4 (a listener that
    never answers), poprun goes on waiting for it and then exits 125 with PR406, seconds later.
    """
    proc = start(test_hosts, "--host", f"h1,{mute_h4}", "--num-instances", "4", "--num-replicas", "4", "true",
                 cwd=tmp_path, env={"TMPDIR": str(short_tmp)})
    assert wait_for(lambda: any(short_tmp.glob("poprun-ssh-*")), within_s=15), "no preflight seen"
    time.sleep(0.2)
    proc.send_signal(signal.SIGINT)
    sent = time.monotonic()
    _, err = proc.communicate(timeout=30)
    took = time.monotonic() - sent

    assert (130, True) == (proc.returncode, took < 1.0), (took, err.decode()[-400:])


def test_a_host_that_never_answers_is_reported_within_the_preflight_time(test_hosts: TestHosts, tmp_path: Path,
                                                                           mute_h4: str) -> None:
    """
    A host that accepts connections but never speaks SSH is PR406, never a hang: with two instances a
    host, planning's topology probe opens the connections, and the launch takes them over: the mute
    host is probed twice (ssh's 3 s connect timeout, once more after a pause), once for both.
    """
    started = time.monotonic()
    done = run(test_hosts, "--host", f"h1,{mute_h4}", "--num-instances", "4", "--num-replicas", "4", "true",
               cwd=tmp_path)
    took = time.monotonic() - started

    assert 125 == done.returncode, done.stderr
    assert "PR406" in done.stderr
    assert took < 2 * 3 + 0.5 + 2.0, took


# --- 4. Odd environments make healthy hosts "unreachable" ----------------------------------------------------------


@pytest.mark.parametrize("odd", ["with space", "per%hcent", "quo'te"])
def test_a_tmpdir_with_odd_characters_does_not_make_healthy_hosts_unreachable(test_hosts: TestHosts, tmp_path: Path,
                                                                               short_tmp: Path, odd: str) -> None:
    """
    TMPDIR=/tmp/xxx/'with space' (or with % or a quote): the control path goes unquoted into `ssh -o
    ControlPath=...`, which splits it, expands %h or rejects the quote; every healthy host is then
    reported as "cannot be reached" (PR406, exit 125). The launch should run (or name TMPDIR).
    """
    tmpdir = short_tmp / odd
    tmpdir.mkdir()
    done = run(test_hosts, "--host", "h1,h2", "--num-instances", "4", "--num-replicas", "4", "true", cwd=tmp_path,
               env={"TMPDIR": str(tmpdir)})

    assert "PR406" not in done.stderr, done.stderr
    assert 0 == done.returncode, done.stderr


def test_a_long_tmpdir_does_not_make_healthy_hosts_unreachable(test_hosts: TestHosts, tmp_path: Path) -> None:
    """
    A TMPDIR of some 90 characters (pytest's own tmp_path, a Slurm job's TMPDIR): ssh's control socket
    path is then too long for a Unix socket and every healthy host is "cannot be reached" (PR406).
    """
    tmpdir = tmp_path / ("t" * max(1, 90 - len(str(tmp_path))))
    tmpdir.mkdir()
    done = run(test_hosts, "--host", "h1,h2", "--num-instances", "4", "--num-replicas", "4", "true", cwd=tmp_path,
               env={"TMPDIR": str(tmpdir)})

    assert "PR406" not in done.stderr, done.stderr
    assert 0 == done.returncode, done.stderr


def test_a_forwarded_value_of_many_lines_does_not_make_healthy_hosts_unreachable(test_hosts: TestHosts,
                                                                                  tmp_path: Path) -> None:
    """
    --mpi-global-args='-x CERTS' with a 120 kB value of 20,000 lines (a certificate bundle, a config): the
    remote shell reads it line by line, appending to a string (quadratic in dash), past the 4.5 s preflight;
    both healthy hosts are then reported as "cannot be reached" (PR406). 10,000 forwarded variables do
    the same.
    """
    value = "\n".join("xxxxx" for _ in range(20000))
    done = run(test_hosts, "--host", "h1,h2", "--num-instances", "2", "--num-replicas", "2",
               "--mpi-global-args=-x CERTS", "sh", "-c", 'echo "${#CERTS}"', cwd=tmp_path, env={"CERTS": value})

    assert "PR406" not in done.stderr, done.stderr[-600:]
    assert (0, [str(len(value))] * 2) == (done.returncode, done.stdout.split()), done.stderr[-600:]


# --- 5. A host with a /tmp of its own (not shared with this machine, as real hosts are) ------------------------------


def _sshd_pid(hosts: TestHosts, name: str) -> int:
    found = hosts.processes(name, r"^(/usr/sbin/)?sshd")
    assert found, f"no sshd on {name}"
    return int(found[0].split()[0])


@pytest.fixture
def private_tmp_h4(test_hosts: TestHosts, tmp_path: Path) -> Iterator[Path]:
    """
    Restart h4's sshd in a mount namespace of its own with an empty tmpfs on /tmp; yield h4's /tmp as seen from here.

    What the tests need from this machine's /tmp stays there, bound from it: the hosts' state, and the
    checkout and its interpreter when they lie under /tmp (a clone there must pass too). ``tmp_path``, the
    launch's working directory, is made empty.
    """
    state = test_hosts.state
    keep = Path(tempfile.mkdtemp(prefix="advtmp", dir="/run"))
    needed = {state, Path(__file__).resolve().parents[3], Path(sys.prefix).resolve(), Path(sys.executable).resolve().parent}
    binds = " && ".join(f"mkdir -p {shlex.quote(str(path))} && mount --bind {shlex.quote(str(keep / path.relative_to('/tmp')))} "
                        f"{shlex.quote(str(path))}" for path in sorted(needed) if path.is_relative_to("/tmp"))
    test_hosts.stop_sshd("h4")
    script = (f"mount --bind /tmp {keep} && mount -t tmpfs tmpfs /tmp && {binds or 'true'} && "
              f"mkdir -p {shlex.quote(str(tmp_path))} && hostname h4 && "
              f"exec /usr/sbin/sshd -f {state}/sshd_h4.conf -E {state}/sshd_h4.log")
    subprocess.run(["ip", "netns", "exec", test_hosts.namespaces["h4"], "unshare", "--mount",
                    "--propagation", "private", "--uts", "sh", "-c", script], check=True, timeout=10)
    try:
        assert wait_for(lambda: test_hosts.ssh("h4", "true", timeout=5).returncode == 0, within_s=10)
        yield Path(f"/proc/{_sshd_pid(test_hosts, 'h4')}/root/tmp")
    finally:
        settle(test_hosts)
        test_hosts.stop_sshd("h4")
        test_hosts.start_sshd("h4")
        keep.rmdir()


def test_sigkill_at_start_leaves_no_temporary_cache_on_a_host(test_hosts: TestHosts, tmp_path: Path,
                                                              private_tmp_h4: Path) -> None:
    """
    Two instances on h4, whose /tmp is its own: the first makes the temporary cache there with a marker per
    instance. poprun is SIGKILLed as soon as that cache exists: the sessions end (their clients are killed),
    but a session that has not reached its wait for "G" (still reading its environment, or killed by
    SIGPIPE while printing its check) never removes its marker, so /tmp/poprun-cache-* stays on h4 for good.
    The race is lost about every other time: up to 6 tries, each must leave nothing (here the watchdog removes
    the cache, and a late check on h3, whose /tmp is this machine's, must not make it again).
    """
    here = tmp_path / "tmp"  # this machine's (and h3's) TMPDIR for the launch: other work's caches are not in it
    here.mkdir()           # h4 has no such folder: its cache is made under its own /tmp
    for attempt in range(6):
        proc = start(test_hosts, "--host", "h4,h3", "--num-instances", "4", "--num-replicas", "4", "sh", "-c",
                     "sleep 20", cwd=tmp_path, env={"TMPDIR": str(here)})
        try:
            assert wait_for(lambda: any(private_tmp_h4.glob("poprun-cache-*")), within_s=30), "no cache made on h4"
        finally:
            proc.kill()
            proc.communicate()

        assert wait_for(lambda: not any(private_tmp_h4.glob("poprun-*")), within_s=20), \
            (attempt, test_hosts.ssh("h4", "ls -a /tmp /tmp/poprun-cache-*/.poprun-alive").stdout)
        assert wait_for(lambda: not any(here.glob("poprun-cache-*")), within_s=20), (attempt, list(here.iterdir()))


# --- 6. A slow but healthy host -----------------------------------------------------------------------------------------


@pytest.fixture
def slow_h2(test_hosts: TestHosts, tmp_path: Path) -> Iterator[Path]:
    """Yield an ssh_config where host `h2slow` is h2 behind a proxy that delays every chunk by 0.3 s (a far link)."""
    yield from _slow_proxy(test_hosts, tmp_path, delay_s=0.3)


@pytest.fixture
def slowish_h2(test_hosts: TestHosts, tmp_path: Path) -> Iterator[Path]:
    """Yield an ssh_config where host `h2slow` is h2 behind a proxy that delays every chunk by 0.1 s (some 2 s to log in)."""
    yield from _slow_proxy(test_hosts, tmp_path, delay_s=0.1)


def _slow_proxy(test_hosts: TestHosts, tmp_path: Path, *, delay_s: float) -> Iterator[Path]:
    """Yield an ssh_config where host `h2slow` is h2 behind a proxy that delays every chunk by ``delay_s``."""
    import socket

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(50)
    port = listener.getsockname()[1]

    def pump(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                time.sleep(delay_s)
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)
                s.close()

    def serve() -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return
            upstream = socket.create_connection((test_hosts.addresses["h2"], 22))
            threading.Thread(target=pump, args=(client, upstream), daemon=True).start()
            threading.Thread(target=pump, args=(upstream, client), daemon=True).start()

    threading.Thread(target=serve, daemon=True).start()
    config = tmp_path / "slow_config"
    config.write_text(f"Host h2slow\n  HostName 127.0.0.1\n  Port {port}\n  HostKeyAlias {test_hosts.addresses['h2']}\n"
                      + test_hosts.ssh_config.read_text())
    try:
        yield config
    finally:
        listener.close()


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")  # the proxy's sockets
def test_a_slow_healthy_host_is_not_unreachable_with_a_long_host_timeout(test_hosts: TestHosts, tmp_path: Path,
                                                                          slow_h2: Path) -> None:
    """
    h2 behind a slow link: `ssh h2slow hostname` answers in some 6 s. PR411's doc: "On a slow or congested
    network, a longer POPRUN_HOST_TIMEOUT avoids declaring a busy host lost"; with POPRUN_HOST_TIMEOUT=60
    the preflight still gives up after its fixed 4.5 s and reports h2slow as "cannot be reached" (PR406),
    whose hint is to "try 'ssh h2slow'", which works.
    """
    reached = subprocess.run(["ssh", "-F", str(slow_h2), "h2slow", "hostname"], capture_output=True, text=True,
                             timeout=30, check=False, stdin=subprocess.DEVNULL)
    assert "h2" == reached.stdout.strip(), reached.stderr
    done = run(test_hosts, "--host", "h1,h2slow", "--num-instances", "2", "--num-replicas", "2", "true", cwd=tmp_path,
               env={"POPRUN_SSH_CONFIG": str(slow_h2), "POPRUN_HOST_TIMEOUT": "60"})

    assert (0, "") == (done.returncode, done.stderr)


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")  # the proxy's sockets
def test_a_slow_host_among_fast_ones_is_named_slow_with_its_time_and_the_launch_goes_on(
        test_hosts: TestHosts, tmp_path: Path, slowish_h2: Path) -> None:
    """
    GIVEN h2 behind a link that makes its login take some 2 s, beside h1, h3 and h4 (well under a second)
    WHEN poprun -v launches on the four
    THEN every instance runs (exit 0), -v names h2slow as slow with its time, and the run report lists it
    """
    # WHEN
    runs = tmp_path / "runs"
    done = run(test_hosts, "-v", "--host", "h1,h2slow,h3,h4", "--num-instances", "4", "--num-replicas", "4", "true",
               cwd=tmp_path, env={"POPRUN_SSH_CONFIG": str(slowish_h2), "POPRUN_RUNS_DIR": str(runs)})

    # THEN
    assert 0 == done.returncode, done.stderr
    said = re.findall(r"Host (\S+) is slow: connected in (\d+\.\d\d) s", done.stderr)
    assert ["h2slow"] == [host for host, _ in said], done.stderr
    assert 1.0 < float(said[0][1]) < 4.5, said
    report = json.loads(next(runs.glob("*/report.json")).read_text())
    assert ["h2slow"] == [entry["host"] for entry in report["slow_hosts"]]


# --- 7. Ctrl-Z ----------------------------------------------------------------------------------------------------------


def _state(pid: int) -> str:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]


def test_ctrl_z_longer_than_the_host_timeout_does_not_kill_the_remote_instances(test_hosts: TestHosts,
                                                                               tmp_path: Path) -> None:
    """
    README: "Ctrl-Z stops the instances with poprun and `fg` continues them". Under the ssh backend the
    stopped poprun sends no heartbeat, so after POPRUN_HOST_TIMEOUT (3 s here, 15 s by default) every
    remote wrapper kills its instance: after `fg` poprun reports them "killed by SIGKILL (possibly out of
    memory)" and exits 137. A coffee break with Ctrl-Z kills a multi-host training run.
    """
    proc = start(test_hosts, "--host", "h1,h2", "--num-instances", "2", "--num-replicas", "2", "sh", "-c",
                 'echo start; sleep 4; echo "finished $POPDIST_INSTANCE_INDEX"', cwd=tmp_path,
                 env={"POPRUN_HOST_TIMEOUT": "3"})
    assert proc.stdout is not None
    assert [b"start\n", b"start\n"] == [proc.stdout.readline(), proc.stdout.readline()]
    time.sleep(0.3)  # the instances may print before the backend has handed poprun the launch to stop
    proc.send_signal(signal.SIGTSTP)
    assert wait_for(lambda: _state(proc.pid) == "T", within_s=3), "poprun did not stop"
    time.sleep(6)
    proc.send_signal(signal.SIGCONT)
    out, err = proc.communicate(timeout=30)

    assert (0, {b"finished 0", b"finished 1"}) == (proc.returncode, set(out.splitlines())), err.decode()[-600:]


# --- 8. Forwarded values that do not arrive --------------------------------------------------------------------------


def test_forwarded_variables_named_like_the_wrappers_own_arrive_unchanged(test_hosts: TestHosts,
                                                                           tmp_path: Path) -> None:
    """
    `-x n -x e -x l -x t -x f -x p -x go` (legal POSIX names): _READ_ENV ends with `unset e l n`, so n, e
    and l never reach a remote instance, and the wrapper's own `t=$1; f=$2; p=$3` and `read -r go` assign
    the exported t, f, p and go: the program sees t=15, f=- (or the stdin FIFO's path), p=sh, go=G.
    On this machine (local backend) each arrives as it is.
    """
    names = ["n", "e", "l", "t", "f", "p", "go"]
    done = run(test_hosts, "--host", "h1,h2", "--num-instances", "2", "--num-replicas", "2",
               "--mpi-global-args=" + " ".join(f"-x {n}" for n in names), "sh", "-c",
               " ".join(f'printf "%s\\n" "{n}=${n}";' for n in names), cwd=tmp_path,
               env={n: f"value-of-{n}" for n in names})

    assert 0 == done.returncode, done.stderr
    assert sorted(f"{n}=value-of-{n}" for n in names for _ in range(2)) == sorted(done.stdout.splitlines())


# --- 9. Many instances on one host --------------------------------------------------------------------------------------


def test_more_instances_on_a_host_than_sshds_max_sessions_add_no_ssh_noise_to_their_output(test_hosts: TestHosts,
                                                                                            tmp_path: Path) -> None:
    """
    12 instances on each of h1 and h2 (an IPU-POD64 host runs 16), with sshd's default MaxSessions (10): the
    sessions past the tenth are refused by the shared connection and ssh falls back to a connection of its
    own, printing "mux_client_request_session: session request failed: Session open refused by peer" and
    "ControlSocket ... already exists, disabling multiplexing" into those instances' stderr (tagged as theirs
    under --tag-output, in their --output-filename files). A program that prints nothing must show nothing.
    """
    done = run(test_hosts, "--host", "h1,h2", "--num-instances", "24", "--num-replicas", "24", "true", cwd=tmp_path)

    # what the hosts' login shells print (24 at once: the test machine's ~/.bashrc races its own pyenv
    # rehash) is theirs to print; ssh's own complaints must not be there
    noise = [line for line in done.stderr.splitlines() if re.search(r"mux_client|ControlSocket|multiplexing", line)]
    assert (0, "", []) == (done.returncode, done.stdout, noise), done.stderr


def test_a_local_tmpdir_that_a_host_lacks_does_not_stop_the_launch(test_hosts: TestHosts, tmp_path: Path,
                                                                   short_tmp: Path, private_tmp_h4: Path) -> None:
    """
    TMPDIR here is a directory that exists only on this machine (a Slurm job's TMPDIR, a $HOME/tmp that is
    not shared): the temporary cache "on each host" is made at the same absolute path there, whose parent
    h4 lacks, and the launch is refused with PR409 ("the temporary executable cache ... cannot be made"),
    though h4 has a /tmp of its own.
    """
    done = run(test_hosts, "--host", "h4,h3", "--num-instances", "4", "--num-replicas", "4", "true", cwd=tmp_path,
               env={"TMPDIR": str(short_tmp)})

    assert (0, "") == (done.returncode, done.stderr)


# --- 10. A login shell that greets without a newline ------------------------------------------------------------------

GREETER = "poprunadv"


@pytest.fixture
def greeting_user(test_hosts: TestHosts, tmp_path: Path) -> Iterator[Path]:
    """
    A user whose ~/.bashrc sets the terminal's title (`printf '\\033]0;user@host\\007'`: no newline), as
    many do; yield an ssh_config that logs into the hosts as that user. The hosts' state and ``tmp_path``
    are made reachable to the user for the test only.
    """
    subprocess.run(["useradd", "-m", "-s", "/bin/bash", GREETER], capture_output=True, check=False)
    subprocess.run(["usermod", "-p", "*", GREETER], check=True)
    home = Path("/home") / GREETER
    (home / ".bashrc").write_text('printf "\\033]0;%s@%s\\007" "$USER" "$HOSTNAME"\n')
    changed: dict[Path, int] = {}
    for path in [*test_hosts.state.parents, test_hosts.state, *tmp_path.parents, tmp_path,
                 test_hosts.state / "authorized_keys"]:
        if path != Path("/") and path not in changed:
            changed[path] = path.stat().st_mode & 0o7777
            path.chmod(changed[path] | (0o005 if path.is_dir() else 0o004) | (0o002 if path == tmp_path else 0))
    config = tmp_path / "greeter_config"
    config.write_text(test_hosts.ssh_config.read_text().replace("User root", f"User {GREETER}"))
    try:
        yield config
    finally:
        for path, mode in changed.items():
            path.chmod(mode)
        subprocess.run(["userdel", "-r", GREETER], capture_output=True, check=False)


def test_a_greeting_without_a_newline_does_not_make_healthy_hosts_unreachable(test_hosts: TestHosts, tmp_path: Path,
                                                                              greeting_user: Path) -> None:
    """
    The login shell prints a title escape without a newline before poprun's check: the check's first line
    is then "\\033]0;...\\007poprun-preflight ok", not recognised, and every healthy host is reported as
    "cannot be reached: ssh exited with 0" (PR406). `ssh h1 true` works; so must the launch.
    """
    fixed = tmp_path / "cache"
    done = run(test_hosts, "--host", "h1,h2", "--num-instances", "2", "--num-replicas", "2",
               f"--executable-cache-path={fixed}", "sh", "-c", "echo ran", cwd=tmp_path,
               env={"POPRUN_SSH_CONFIG": str(greeting_user)})

    assert "PR406" not in done.stderr, done.stderr
    assert 0 == done.returncode, done.stderr


# --- 11. Piped stdin's FIFO left on a host ------------------------------------------------------------------------------


def test_interrupt_while_instance_0s_host_is_unreachable_leaves_no_stdin_fifo_there(test_hosts: TestHosts,
                                                                                     tmp_path: Path) -> None:
    """
    Instance 0 (reading poprun's stdin) runs on h3 and ignores SIGTERM; h3's link goes down, Ctrl-C twice:
    poprun exits 130 at once, the instance is gone from h3 once the link is back, but its wrapper never
    removed the FIFO's directory: /tmp/poprun-stdin-<hex>/in stays on h3 for good. (A host frozen until
    PR411 leaves one too.)
    """
    mark = f"adv-{uuid.uuid4().hex[:8]}"
    proc = start(test_hosts, "--host", "h3,h2", "--num-instances", "2", "--num-replicas", "2", "sh", "-c",
                 f"trap '' TERM; echo up; sleep 60; : {mark}", cwd=tmp_path, env={"POPRUN_HOST_TIMEOUT": "3"},
                 stdin=subprocess.PIPE)  # a pipe, kept open: instance 0 reads it through a FIFO on h3 (not /dev/null)
    assert proc.stdout is not None
    assert [b"up\n", b"up\n"] == [proc.stdout.readline(), proc.stdout.readline()]
    named = [line for line in command_lines().values() if mark.encode() in line and b"/tmp/poprun-stdin-" in line]
    assert named, "no stdin FIFO for instance 0"
    at = named[0].index(b"/tmp/poprun-stdin-")
    fifo_dir = Path(named[0][at:at + len("/tmp/poprun-stdin-") + 12].decode())
    test_hosts.set_link("h3", up=False)
    try:
        proc.send_signal(signal.SIGINT)
        time.sleep(0.5)
        proc.send_signal(signal.SIGINT)
        proc.communicate(timeout=30)
    finally:
        test_hosts.set_link("h3", up=True)
    assert wait_for(lambda: test_hosts.ssh("h3", "true", timeout=10).returncode == 0, within_s=20)

    assert wait_for(lambda: not test_hosts.processes("h3", mark), within_s=10), test_hosts.processes("h3", mark)
    removed = wait_for(lambda: not fifo_dir.exists(), within_s=5)
    left = sorted(p.name for p in fifo_dir.iterdir()) if not removed else []
    shutil.rmtree(fifo_dir, ignore_errors=True)  # the other tests look for none in /tmp
    assert removed, left
