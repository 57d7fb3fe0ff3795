"""
popdist.progress in programs of their own: fork, signals, closed descriptors, exit, no network, a full queue.

Each test runs a small Python program (``python -c``) that calls popdist with POPRUN_PROGRESS
naming a real UDP receiver in the test, and reads every datagram with the strict parser of
``tests/unit/test_popdist_progress.py``. The programs print what they saw of themselves; the
test's verdict never depends on how fast the machine is, except where said (the per-call cost,
with a bound five times the benchmark's target).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap

import pytest

from tests.unit.test_popdist_progress import TOKEN, Receiver

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]

PRELUDE = "import os, sys, time, signal\nimport popdist\nfrom popdist import _progress\n"
AS_ROOT = pytest.mark.skipif(os.geteuid() != 0 or shutil.which("unshare") is None, reason="needs root and unshare")


def environment(address: str) -> dict[str, str]:
    """Return this environment without any launch's variables, and popdist's naming ``address``."""
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("POPRUN_", "POPDIST_", "OMPI_", "SLURM_"))}
    environ.pop("SSH_CONNECTION", None)
    return environ | {"POPRUN_PROGRESS": address, "POPRUN_PROGRESS_TOKEN": TOKEN, "POPDIST_INSTANCE_INDEX": "5"}


def run(code: str, receiver: Receiver | None, *, wrap: list[str] | None = None, address: str | None = None,
        timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """Run ``code`` (after :data:`PRELUDE`) in a new interpreter, with popdist sending to ``receiver``."""
    where = address or f"127.0.0.1:{receiver.port if receiver else 9}"
    return subprocess.run([*(wrap or []), sys.executable, "-c", PRELUDE + textwrap.dedent(code)],
                          env=environment(where), capture_output=True, text=True, timeout=timeout, check=False,
                          cwd=os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


@pytest.fixture
def receiver():
    """A real UDP receiver on loopback."""
    opened = Receiver()
    yield opened
    opened.close()


def by_sender(receiver: Receiver, count: int) -> dict[int, list[dict[str, object]]]:
    """Return ``count`` datagrams, parsed, grouped by the source port that sent them."""
    groups: dict[int, list[dict[str, object]]] = {}
    for _ in range(count):
        receiver.sock.settimeout(30)
        raw, (_, port) = receiver.sock.recvfrom(65536)
        groups.setdefault(port, []).append(strict_parse(raw))
    return groups


def strict_parse(raw: bytes) -> dict[str, object]:
    from tests.unit.test_popdist_progress import strict_parse as parse

    return parse(raw)


def test_a_forked_child_is_a_sender_of_its_own(receiver):
    """After fork the child sends at once from its own socket, never the parent's waiting state, and its exit sends its own."""
    done = run("""
        popdist.progress(1, 10)
        popdist.progress(2, 10)            # waits in the parent (within 0.1 s)
        pid = os.fork()
        if pid == 0:
            popdist.progress(100, 200)     # the child's first call: sent at once
            popdist.progress(101, 200)     # waits: the child's exit sends it
            sys.exit(0)
        os.waitpid(pid, 0)
        print("parent done")
    """, receiver)

    assert 0 == done.returncode, done.stderr
    groups = by_sender(receiver, 4)
    assert [[(1, 1), (2, 1)], [(100, 1), (101, 1)]] == sorted([(d["s"], d["c"]) for d in g] for g in groups.values())
    assert all(d["i"] == 5 for g in groups.values() for d in g)


def test_a_signal_handler_that_reports_while_a_send_is_under_way_never_deadlocks(receiver):
    """SIGALRM every 200 us calls progress and heartbeat while the program sends at every call: it ends, all well formed."""
    done = run("""
        _progress.INTERVAL_S = 0.0         # every call sends: the handler often lands inside a send
        fired = [0]
        def handler(number, frame):
            fired[0] += 1
            popdist.progress(-fired[0], None, handler=True)
            popdist.heartbeat()
        signal.signal(signal.SIGALRM, handler)
        signal.setitimer(signal.ITIMER_REAL, 0.0002, 0.0002)
        end, step = time.monotonic() + 2.0, 0
        while time.monotonic() < end or fired[0] < 100:
            step += 1
            popdist.progress(step, None, loss=0.5)
        signal.setitimer(signal.ITIMER_REAL, 0, 0)
        print(step, fired[0])
    """, None, address=f"127.0.0.1:{receiver.port}", timeout=120)

    assert 0 == done.returncode, done.stderr
    steps, fired = map(int, done.stdout.split())
    assert steps > 0 and fired >= 100
    for raw in receiver.raw(200, within_s=5):
        strict_parse(raw)


def test_a_program_that_closes_every_descriptor_keeps_its_files_and_popdist_goes_on(receiver, tmp_path):
    """``os.closerange(3, ...)`` then a file opened on popdist's old number: the file holds only the program's bytes."""
    path = tmp_path / "program.txt"
    done = run(f"""
        popdist.progress(1)
        number = _progress._SENDER.sock.fileno()
        os.closerange(3, 65536)
        fd = os.open({str(path)!r}, os.O_WRONLY | os.O_CREAT, 0o600)
        time.sleep(0.15)                   # the next call is due (0.1 s after the last send)
        popdist.progress(2)
        popdist.heartbeat()
        os.write(fd, b"the program's own")
        os.close(fd)
        print(fd == number)
    """, receiver)

    assert 0 == done.returncode, done.stderr
    assert "True\n" == done.stdout  # the file really took popdist's old descriptor number
    assert b"the program's own" == path.read_bytes()
    assert [1, 2] == [d.get("s") for d in receiver.receive(2)]


def test_exit_sends_the_waiting_state_but_os_exit_loses_it(receiver):
    """A normal exit sends the last coalesced call (atexit); ``os._exit`` does not (documented)."""
    normal = run("popdist.progress(1, 3)\npopdist.progress(2, 3)\npopdist.progress(2.5, 3, loss=1)\n", receiver)
    hard = run("popdist.progress(10, 30)\npopdist.progress(20, 30)\nos._exit(0)\n", receiver)

    assert (0, 0) == (normal.returncode, hard.returncode), normal.stderr + hard.stderr
    got = receiver.raw(5, within_s=5)
    assert [(1, 1), (2.5, 2), (10, 1)] == [(d["s"], d["c"]) for d in map(strict_parse, got)]


@AS_ROOT
def test_without_a_loopback_route_the_calls_return_and_the_program_ends():
    """In a network namespace whose loopback is down (ENETUNREACH at every send), 2,000 sending calls return at once."""
    done = run("""
        _progress.INTERVAL_S = 0.0
        worst = 0.0
        for step in range(2000):
            began = time.perf_counter()
            popdist.progress(step, 2000, loss=step)
            popdist.heartbeat()
            worst = max(worst, time.perf_counter() - began)
        print("sent nothing, slowest call", worst)
    """, None, wrap=["unshare", "--net"])

    assert 0 == done.returncode, done.stderr
    assert done.stdout.startswith("sent nothing, slowest call ")


@AS_ROOT
@pytest.mark.skipif(shutil.which("tc") is None or shutil.which("ip") is None, reason="needs iproute2's ip and tc")
def test_a_full_send_queue_drops_datagrams_without_blocking():
    """Loopback throttled to 8 bit/s by tbf and a tiny send buffer: EAGAIN or ENOBUFS comes, every call still returns."""
    code = textwrap.dedent("""
        import errno, socket
        _progress.INTERVAL_S = 0.0
        receiver = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        receiver.bind(("127.0.0.1", 0))
        os.environ["POPRUN_PROGRESS"] = "127.0.0.1:%d" % receiver.getsockname()[1]
        popdist.progress(0)
        sock = _progress._SENDER.sock
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 1)
        worst = 0.0
        for step in range(5000):
            began = time.perf_counter()
            popdist.progress(step, None, loss=step)
            worst = max(worst, time.perf_counter() - began)
        try:
            sock.sendto(b"x", socket.MSG_DONTWAIT, _progress._SENDER.address)
            full = "not full"
        except OSError as error:
            full = errno.errorcode[error.errno]
        print(full, worst)
    """)
    script = ("ip link set lo up && tc qdisc add dev lo root tbf rate 8bit burst 1600 limit 10000000 && "
              f'exec {sys.executable} -c "$0"')
    done = subprocess.run(["unshare", "--net", "sh", "-c", script, PRELUDE + code], env=environment("127.0.0.1:9"),
                          capture_output=True, text=True, timeout=120, check=False)

    assert 0 == done.returncode, done.stderr
    assert done.stdout.split()[0] in {"EAGAIN", "ENOBUFS"}, done.stdout


@AS_ROOT
def test_a_read_only_file_system_changes_nothing(receiver, tmp_path):
    """The root and the working directory read-only (a private mount namespace): popdist writes no file, progress is sent."""
    code = PRELUDE + textwrap.dedent("""
        try:
            open("popdist-probe", "w")
            print("writable")
        except OSError:
            popdist.progress(1, 2)
            popdist.progress(2, 2)
            print("read-only")
    """)
    here = str(tmp_path)
    script = ('mount --make-rprivate / && mount -o remount,bind,ro / && mount --bind "$1" "$1" && '
              f'mount -o remount,bind,ro "$1" && cd "$1" && exec {sys.executable} -c "$0"')
    environ = environment(f"127.0.0.1:{receiver.port}") | {"PYTHONDONTWRITEBYTECODE": "1"}
    done = subprocess.run(["unshare", "--mount", "sh", "-c", script, code, here], env=environ, capture_output=True,
                          text=True, timeout=120, check=False)

    if done.returncode != 0 and "mount" in done.stderr:
        pytest.skip(f"cannot remount read-only here: {done.stderr.strip()}")
    assert (0, "read-only\n") == (done.returncode, done.stdout), done.stderr
    assert [(1, 2), (2, 2)] == [(d["s"], d["n"]) for d in receiver.receive(2)]
    assert [] == list(tmp_path.iterdir())


def test_a_million_calls_a_second_are_at_most_ten_datagrams_a_second_and_cheap(receiver):
    """A loop that only calls progress for 2 s: about ten datagrams a second, and a call costs under 10 us (target 2 us)."""
    done = run("""
        def loop(report, seconds):
            step, now, end = 0, time.perf_counter, time.perf_counter() + seconds
            began = now()
            while now() < end:
                step += 1
                report(step, None, loss=0.5)
            return step, now() - began
        def nothing(step, total, **metrics):
            pass
        steps, seconds = loop(popdist.progress, 2.0)
        best = min(loop(popdist.progress, 0.2)[1] / loop(popdist.progress, 0.2)[0] for _ in range(3))
        bare = min(loop(nothing, 0.2)[1] / loop(nothing, 0.2)[0] for _ in range(3))
        print(steps, seconds, max(best - bare, 0.0))
    """, receiver)

    assert 0 == done.returncode, done.stderr
    steps, seconds, per_call = (float(v) for v in done.stdout.split())
    got = receiver.raw(1000, within_s=3)
    assert len(got) <= 10 * (seconds + 6 * 0.2) + 3, (len(got), seconds)
    assert sum(strict_parse(raw)["c"] for raw in got) >= steps
    assert per_call < 10e-6, per_call
