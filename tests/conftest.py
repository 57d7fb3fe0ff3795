"""
Shared fixtures, the process-table checks and the hypothesis profiles (``dev``, ``ci`` with POPRUN_CI=1).

No orphan across the whole suite: the session sets ``POPRUN_TEST_RUN=<uuid>`` in its own
environment before any test runs, so every process a test starts (poprun, its watchdog, every
instance and what instances start) inherits it. At the end of the session no living process
may carry it; the survivors are listed (and killed) and the session fails.
"""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import signal
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

from poprun.core.record import positional_record

settings.register_profile("dev", max_examples=50, deadline=None)
settings.register_profile("ci", max_examples=300, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("ci" if os.environ.get("POPRUN_CI") else "dev")

RUN_MARKER = "POPRUN_TEST_RUN"  # carried by every process the test session starts
LAUNCH_MARKER = "POPRUN_TEST_LAUNCH"  # carried by the processes of one test's launch (the ``marked`` fixture)


def carrying(name: str, value: str) -> dict[int, str]:
    """Return {pid: command line} of every living process (zombies are dead) whose environment has ``name=value``."""
    needle = f"{name}={value}".encode()
    found = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            environ = Path(entry.path, "environ").read_bytes()
            state = Path(entry.path, "stat").read_bytes().rsplit(b")", 1)[1].split()[0]
            command = Path(entry.path, "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except (OSError, IndexError):
            continue
        if state != b"Z" and needle in environ.split(b"\0"):
            found[int(entry.name)] = command.strip()
    return found


def survivors(name: str, value: str, *, within_s: float) -> dict[int, str]:
    """Return the processes still carrying ``name=value`` after waiting up to ``within_s`` for them to go."""
    deadline = time.monotonic() + within_s
    while (found := carrying(name, value)) and time.monotonic() < deadline:
        time.sleep(0.02)
    return found


def kill_all(pids: dict[int, str]) -> None:
    """SIGKILL every pid (it may be gone already)."""
    for pid in pids:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)


def _fingerprint(path: Path) -> dict[str, tuple[int, int, int]]:
    """Return {relative path: (mode, size, mtime_ns)} of everything under the folder ``path`` ({} when there is none)."""
    found = {}
    for root, _, files in os.walk(path):
        for name in [root, *(os.path.join(root, file) for file in files)]:
            with contextlib.suppress(OSError):
                info = os.lstat(name)
                found[os.path.relpath(name, path)] = (info.st_mode, info.st_size, info.st_mtime_ns)
    return found


def _made_here(runs: Path, before: set[str], places: tuple[Path, ...]) -> list[str]:
    """Return the runs that appeared in ``runs`` since ``before`` and ran in one of ``places`` (a test's, not the user's)."""
    made = []
    for entry in sorted({entry.name for entry in runs.iterdir()} - before) if runs.is_dir() else []:
        with contextlib.suppress(OSError, ValueError, KeyError, IndexError, TypeError):
            cwd = json.loads((runs / entry / "plan.json").read_text(errors="replace"))["instances"][0]["cwd"]
            if any(Path(cwd).is_relative_to(place) for place in places):
                made.append(entry)
    return made


@pytest.fixture(scope="session", autouse=True)
def the_users_state_is_untouched(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """
    Run the session with a home of its own; fail it if a test wrote into the real user's runs, ``~/.ssh`` or /etc/hosts.

    The session's HOME and XDG_STATE_HOME point into its own temporary folder, so a launch that falls
    back on the default runs directory writes there. The real home is the password database's (ssh reads
    ``~/.ssh`` from there whatever HOME says). Other work on the machine may use the real runs directory
    while the tests run: only runs made in the checkout or the session's temporary folders count.
    """
    real_home = Path(pwd.getpwuid(os.getuid()).pw_dir)
    runs, ssh, hosts = real_home / ".local/state/poprun/runs", real_home / ".ssh", Path("/etc/hosts")
    runs_before = {entry.name for entry in runs.iterdir()} if runs.is_dir() else set()
    ssh_before = _fingerprint(ssh)
    hosts_before = hosts.read_bytes() if hosts.exists() else b""
    home = tmp_path_factory.mktemp("home")
    saved = {name: os.environ.get(name) for name in ("HOME", "XDG_STATE_HOME")}
    os.environ["HOME"], os.environ["XDG_STATE_HOME"] = str(home), str(home / ".local" / "state")
    yield
    for name, value in saved.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value
    places = (tmp_path_factory.getbasetemp().resolve(), Path(__file__).resolve().parent.parent)
    changed = [f"{runs}/{entry}" for entry in _made_here(runs, runs_before, places)]
    changed += [f"{ssh}/{name}" for name, info in _fingerprint(ssh).items() if ssh_before.get(name) != info]
    if (hosts.read_bytes() if hosts.exists() else b"") != hosts_before:
        changed.append(str(hosts))
    if changed:
        pytest.fail(f"the tests changed the real user's state: {', '.join(changed)}")


@pytest.fixture(scope="session", autouse=True)
def runs_of_the_session(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """Keep the records of the session's runs in a folder of its own (``POPRUN_RUNS_DIR``), never the user's."""
    folder = tmp_path_factory.mktemp("runs")
    previous = os.environ.get("POPRUN_RUNS_DIR")
    os.environ["POPRUN_RUNS_DIR"] = str(folder)
    yield folder
    if previous is None:
        os.environ.pop("POPRUN_RUNS_DIR", None)
    else:
        os.environ["POPRUN_RUNS_DIR"] = previous


_WATCHED_SIGNALS = (signal.SIGHUP, signal.SIGINT, signal.SIGTERM, signal.SIGQUIT, signal.SIGTSTP, signal.SIGCONT,
                    signal.SIGUSR1, signal.SIGUSR2, signal.SIGPIPE, signal.SIGCHLD)


def _signal_state() -> tuple[frozenset[int], dict[int, object]]:
    """Return the main thread's blocked signals and the handlers of the watched ones."""
    blocked = frozenset(int(s) for s in signal.pthread_sigmask(signal.SIG_BLOCK, ()))
    return blocked, {int(s): signal.getsignal(s) for s in _WATCHED_SIGNALS}


@pytest.fixture(autouse=True)
def signals_are_left_as_found() -> Iterator[None]:
    """
    Fail a test that leaves this process's signal mask or handlers changed.

    Every process a later test starts inherits the mask and the ignored signals: a SIGHUP left
    blocked or ignored here makes a later launch deaf to SIGHUP, which then fails far from its cause.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    before = _signal_state()
    yield
    after = _signal_state()
    if after != before:
        blocked, handlers = before
        now_blocked, now_handlers = after
        changed = {signal.Signals(n).name: (handlers[n], now_handlers[n]) for n in handlers if handlers[n] != now_handlers[n]}
        signal.pthread_sigmask(signal.SIG_SETMASK, blocked)  # the next tests start as the session did
        for number, handler in handlers.items():
            signal.signal(number, handler)  # type: ignore[arg-type]
        pytest.fail(f"the test left signals changed: blocked {sorted(now_blocked - blocked)} more, "
                    f"{sorted(blocked - now_blocked)} less; handlers {changed}")


@pytest.fixture(scope="session", autouse=True)
def no_orphan_survives_the_session() -> Iterator[str]:
    """Mark every process the tests start; fail the session if one of them is still alive at its end."""
    value = uuid.uuid4().hex
    os.environ[RUN_MARKER] = value
    yield value
    left = survivors(RUN_MARKER, value, within_s=2.0)
    kill_all(left)
    if left:
        listing = "\n".join(f"  {pid}: {command}" for pid, command in sorted(left.items()))
        pytest.fail(f"processes started by the tests outlived the session (now killed):\n{listing}")


@positional_record
class Marked:
    """An environment whose processes can be found in the process table: ``env`` carries a unique marker."""

    env: dict[str, str]
    value: str

    def alive(self) -> dict[int, str]:
        """Return {pid: command line} of the living processes that carry the marker."""
        return carrying(LAUNCH_MARKER, self.value)

    def survivors(self, *, within_s: float) -> dict[int, str]:
        """Return the processes still carrying the marker after waiting up to ``within_s``."""
        return survivors(LAUNCH_MARKER, self.value, within_s=within_s)


@pytest.fixture
def marked() -> Iterator[Marked]:
    """Return an environment (this one plus ``POPRUN_TEST_LAUNCH=<uuid>``); kill what carries it at the end."""
    value = uuid.uuid4().hex
    yield Marked(env=dict(os.environ) | {LAUNCH_MARKER: value}, value=value)
    kill_all(carrying(LAUNCH_MARKER, value))


def described(pids: list[int]) -> str:
    """Return each process's state, where it waits and its signal masks (why a signal was not acted on)."""
    lines = []
    for pid in pids:
        for task in sorted(Path(f"/proc/{pid}/task").glob("*")) or [Path(f"/proc/{pid}")]:
            try:
                status = dict(line.split(":\t", 1) for line in (task / "status").read_text().splitlines() if ":\t" in line)
                wchan = (task / "wchan").read_text()
            except OSError:
                lines.append(f"{task}: gone")
                continue
            masks = " ".join(f"{k}={status.get(k, '?').strip()}" for k in ("SigPnd", "ShdPnd", "SigBlk", "SigIgn", "SigCgt"))
            lines.append(f"{task} {status.get('Name', '').strip()} {status.get('State', '').strip()} wchan={wchan} {masks}")
    return "\n".join(lines)
