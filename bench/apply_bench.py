"""
Apply speed: poprun's local launch against OpenMPI's ``mpirun``, measured in the same run.

Run: ``.venv/bin/python bench/apply_bench.py [--runs N]`` (after installing the project; Debian's
``openmpi-bin`` for the comparisons). It first byte-compiles poprun and popdist, as an
installation does (an editable install run with ``PYTHONDONTWRITEBYTECODE=1`` never would). poprun runs as users run it, through its console script
(``.venv/bin/poprun``), with ``--offline-mode=1``; ``mpirun`` as
``mpirun --allow-run-as-root --oversubscribe -np N ...``. Each figure is the median of
``--runs`` runs, the commands compared taking turns, and is printed with its target and ``ok``
or ``MISSED``. A run that hangs (mpirun 4.1.4 here sometimes never exits after 32 ``true``) is
killed after 10 s, run again and counted at the end. Nothing asserts: the
figures are for people and the issue's closing note. A command that hangs more often than
``--runs`` times (mpirun 4.1.4 with 32 instances on a busy 2-core machine, every time) is given
up: its figure is the median of the runs that ended, or shown as ``inf``.

1. The cost of each extra local instance: the least-squares slope of wall time against N for
   N = 1, 2, 4, 8 instances of ``true``; poprun's slope over mpirun's (target: at most 1.0).
2. poprun's fixed start-up: ``poprun`` with 1 instance of ``true`` against
   ``mpirun --oversubscribe -np 1 true`` (target: at most 1.0x), and against a bare
   ``python3 -c pass`` of the same interpreter (target: at most 2.0x). With the defaults: the
   per-launch cgroup where cgroup v2 is writable, the run record on.
3. Tagged output: 4 instances each printing 200,000 lines (``seq``), ``--tag-output``, to
   ``/dev/null``; mpirun's wall time over poprun's (target: at least 1.0x); the same net of
   each launcher's own start-up (its run of 4 ``true``), and with 2,000,000 lines each.
4. From an instance's failure to poprun's exit: one instance prints the time and exits 1 at
   once while 3 others sleep; the time from that print to the end of poprun (target: < 0.3 s).
5. The mpirun backend's tagged output: 4 instances each printing 200,000 lines (``seq``) through
   ``poprun --backend mpirun --mpi-global-args=--tag-output``, against ``mpirun --tag-output``;
   the wall times' ratio (target: at least 1.0x), and the lines each delivers (poprun must
   deliver all 800,000; OpenMPI 4.1.4's ``--tag-output`` loses some).
6. The run record's cost (with and without ``POPRUN_RECORD=0``).
7. A restart: 4 instances of a program whose instance 1 fails at once on the first attempt and
   that all succeed on the second (``--max-restarts 1 --restart-backoff 0``), against torchrun's
   ``--nproc-per-node 4 --max-restarts 1`` (``--monitor-interval 0.1``) running the same program
   (it reads ``TORCHELASTIC_RESTART_COUNT``, which both set); the whole run's wall time, net of
   each launcher's run of the same program that does not fail (target: poprun's restart at
   most 0.5x torchrun's). Skipped without torchrun.

``--start-up`` measures 1 and 2 only. Figure 2 also measures poprun as an installed copy starts
(:func:`installed_copy`): an editable install (``pip install -e``, as the tests use) puts an import
finder of setuptools' on every start of its interpreter, ``python -c pass`` included, which
imports ``pathlib``, ``re`` and ``urllib`` (about 7 ms here) before poprun does anything.
"""

from __future__ import annotations

import argparse
import atexit
import os
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

from benchsetup import compile_bytecode

PY = sys.executable
POPRUN = [str(Path(PY).with_name("poprun"))] if Path(PY).with_name("poprun").exists() else [PY, "-m",
                                                                                          "poprun.cli.main"]
MPIRUN = shutil.which("mpirun")
ENV = os.environ | {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}
SIZES = (1, 2, 4, 8)
FAIL = 'if [ "${POPDIST_INSTANCE_INDEX:-$OMPI_COMM_WORLD_RANK}" = 1 ]; then date +%s.%N; exit 1; fi; exec sleep 60'


def poprun(n: int, *program: str, tag: bool = False) -> list[str]:
    """Return the command line of poprun running ``program`` in ``n`` instances."""
    tagging = ["--mpi-global-args=--tag-output"] if tag else []
    return [*POPRUN, "--offline-mode=1", f"--num-instances={n}", f"--num-replicas={n}", *tagging, *program]


def poprun_mpirun(n: int, *program: str) -> list[str]:
    """Return the command line of poprun's mpirun backend running ``program`` in ``n`` tagged instances."""
    return [*POPRUN, "--backend=mpirun", f"--num-instances={n}", f"--num-replicas={n}", "--mpi-global-args=--tag-output",
            *program]


def mpirun(n: int, *program: str, tag: bool = False) -> list[str]:
    """Return the command line of mpirun running ``program`` in ``n`` processes."""
    assert MPIRUN is not None
    return [MPIRUN, "--allow-run-as-root", "--oversubscribe", *(["--tag-output"] if tag else []), "-np", str(n),
            *program]


HANGS: dict[str, int] = {}  # runs that did not end within HANG_S, by launcher (mpirun 4.1 sometimes hangs)
HANG_S = 10.0


def run(argv: list[str], *, capture: bool = False, env: dict[str, str] | None = None) -> tuple[float, str] | None:
    """
    Run ``argv``; return its wall time in seconds and its stdout (when ``capture``), or None when it hung.

    A hang is killed after :data:`HANG_S`. (Not ``subprocess.run(timeout=...)``: its wait polls
    with sleeps of up to 50 ms, which would round every time measured.)
    """
    out = subprocess.PIPE if capture else subprocess.DEVNULL
    start = time.perf_counter()
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.DEVNULL, env=ENV | (env or {}),
                            text=True)
    timer = threading.Timer(HANG_S, proc.kill)
    timer.start()
    text = proc.communicate()[0] if capture else ""
    proc.wait()
    elapsed = time.perf_counter() - start
    timer.cancel()
    if proc.returncode == -signal.SIGKILL:
        HANGS[Path(argv[0]).name] = HANGS.get(Path(argv[0]).name, 0) + 1
        return None
    return elapsed, text or ""


def walls_s(argvs: list[list[str]], runs: int, envs: list[dict[str, str]] | None = None) -> list[float]:
    """
    Return the median wall time of each command (output to /dev/null), in seconds.

    The commands take turns, one run each per round, so that a slow spell of the machine
    weighs on all of them alike. A run that hung is run again. ``envs`` adds variables to each.
    """
    times: list[list[float]] = [[] for _ in argvs]
    hung = [0] * len(argvs)
    while any(len(t) < runs and h <= runs for t, h in zip(times, hung, strict=True)):
        for i, (argv, env, measured) in enumerate(zip(argvs, envs or [{}] * len(argvs), times, strict=True)):
            if len(measured) < runs and hung[i] <= runs:
                if (done := run(argv, env=env)) is not None:
                    measured.append(done[0])
                else:
                    hung[i] += 1
    return [statistics.median(t) if t else float("inf") for t in times]


def installed_copy() -> tuple[list[str], list[str]] | None:
    """
    Return the command line of poprun as an installed copy (no editable finder), and that interpreter's ``-c pass``.

    A virtual environment of the same base interpreter, made in a temporary folder, whose
    site-packages holds only a ``.pth`` line naming this checkout, and a ``poprun`` script like
    the one pip writes. None when it cannot be made.
    """
    import importlib.util
    import tempfile

    spec = importlib.util.find_spec("poprun")
    if spec is None or not spec.submodule_search_locations:
        return None
    root = str(Path(next(iter(spec.submodule_search_locations))).parent)
    folder = Path(tempfile.mkdtemp(prefix="poprun-bench-venv-"))
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    base = getattr(sys, "_base_executable", PY)
    if subprocess.run([base, "-m", "venv", "--without-pip", str(folder)], check=False).returncode != 0:
        return None
    python = folder / "bin" / "python"
    site = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=False).stdout.strip()
    Path(site, "poprun-checkout.pth").write_text(root + "\n")
    script = folder / "bin" / "poprun"
    script.write_text(f"#!{python}\nimport sys\nfrom poprun.cli.main import entry\nsys.exit(entry())\n")
    script.chmod(0o755)
    return [str(script)], [str(python), "-c", "pass"]


def slope(xs: tuple[int, ...], ys: list[float]) -> float:
    """Return the least-squares slope of ``ys`` against ``xs``."""
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sum((x - mx) ** 2 for x in xs)


def failure_latency_s(argv: list[str], runs: int) -> float:
    """Return the median time from the failing instance's print of the time to the end of ``argv``."""
    times: list[float] = []
    while len(times) < runs:
        done = run(argv, capture=True)
        ended = time.time()
        if done is not None:
            times.append(ended - float(done[1].split()[-1].rsplit(":", 1)[-1]))
    return statistics.median(times)


def line(name: str, value: str, target: str, ok: bool) -> None:
    """Print one figure with its target."""
    print(f"  {name:<58} {value:<34} target {target:<10} {'ok' if ok else 'MISSED'}")


def main() -> int:
    """Measure and print every figure."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    parser.add_argument("--runs", type=int, default=7, help="runs per measurement (median)")
    parser.add_argument("--start-up", action="store_true", help="measure the start-up only (figures 1 and 2)")
    arguments = parser.parse_args()
    runs = arguments.runs
    if "POPRUN_RUNS_DIR" not in os.environ:  # the launches' records go to a folder of the bench's, not the user's
        import tempfile

        os.environ["POPRUN_RUNS_DIR"] = tempfile.mkdtemp(prefix="poprun-bench-runs-")
    ENV["POPRUN_RUNS_DIR"] = os.environ["POPRUN_RUNS_DIR"]  # what every measured command runs with (ENV was made first)
    compile_bytecode()  # as an installation does (PYTHONDONTWRITEBYTECODE may be set)
    print(f"poprun: {' '.join(POPRUN)}\nmpirun: {MPIRUN or 'not installed: comparisons skipped'}\n"
          f"python: {PY}; {os.cpu_count()} CPUs; median of {runs} runs\n")
    walls = walls_s([poprun(n, "true") for n in SIZES] + ([mpirun(n, "true") for n in SIZES] if MPIRUN else []), runs)
    ours, theirs = walls[:len(SIZES)], walls[len(SIZES):]
    print("1. wall time of N instances of `true` (ms): " + ", ".join(
        f"N={n}: {p * 1e3:.0f}" + (f" / mpirun {m * 1e3:.0f}" if theirs else "")
        for n, p, m in zip(SIZES, ours, theirs or ours, strict=True)))
    ours_slope = slope(SIZES, ours)
    if theirs:
        theirs_slope = slope(SIZES, theirs)
        line("cost of each extra instance: poprun / mpirun",
             f"{ours_slope * 1e3:.2f} / {theirs_slope * 1e3:.2f} ms = {ours_slope / theirs_slope:.2f}x", "<= 1.0x",
             ours_slope <= theirs_slope)
    start, bare, imports, no_plugins, *peer = walls_s(
        [poprun(1, "true"), [PY, "-c", "pass"], [PY, "-c", "import poprun.cli.commands.launch, poprun.cli.run"],
         poprun(1, "true"), *([mpirun(1, "true")] if MPIRUN else [])], runs,
        envs=[{}, {}, {}, {"POPRUN_NO_PLUGINS": "1"}, *([{}] if MPIRUN else [])])
    print(f"\n2. poprun, 1 instance of `true`: {start * 1e3:.0f} ms; "
          + (f"mpirun -np 1: {peer[0] * 1e3:.0f} ms; " if peer else "")
          + f"python -c pass: {bare * 1e3:.0f} ms; python importing poprun's CLI: {imports * 1e3:.0f} ms; "
          f"poprun without plugin discovery (POPRUN_NO_PLUGINS=1): {no_plugins * 1e3:.0f} ms")
    if peer:
        line("fixed start-up: poprun / mpirun -np 1", f"{start / peer[0]:.2f}x", "<= 1.0x", start <= peer[0])
    line("fixed start-up: poprun / python -c pass", f"{start / bare:.2f}x", "<= 2.0x", start <= 2 * bare)
    if (installed := installed_copy()) is not None:
        argv, pass_argv = installed
        one = [*argv, "--offline-mode=1", "true"]
        copy, copy_bare, *copy_peer = walls_s([one, pass_argv, *([mpirun(1, "true")] if MPIRUN else [])], runs)
        print(f"   as an installed copy (no editable finder): poprun {copy * 1e3:.0f} ms; python -c pass "
              f"{copy_bare * 1e3:.0f} ms" + (f"; mpirun -np 1 {copy_peer[0] * 1e3:.0f} ms" if copy_peer else ""))
        if copy_peer:
            line("  fixed start-up as installed: poprun / mpirun -np 1", f"{copy / copy_peer[0]:.2f}x", "<= 1.0x",
                 copy <= copy_peer[0])
        line("  fixed start-up as installed: poprun / python -c pass", f"{copy / copy_bare:.2f}x", "<= 2.0x",
             copy <= 2 * copy_bare)
    if arguments.start_up:
        return 0
    if MPIRUN:
        _throughput(runs)
        _failure(runs)
        _mpirun_backend(runs)
        _record(runs)
    _restart(runs)
    if HANGS:
        print(f"\nruns that hung for {HANG_S:.0f} s and were left out: "
              + ", ".join(f"{name} {count}" for name, count in sorted(HANGS.items())))
    return 0


def _throughput(runs: int) -> None:
    ours, theirs, ours_true, theirs_true = walls_s([
        poprun(4, "seq", "200000", tag=True), mpirun(4, "seq", "200000", tag=True),
        poprun(4, "true", tag=True), mpirun(4, "true", tag=True)], runs)
    print(f"\n3. 4 x 200,000 tagged lines to /dev/null: poprun {ours * 1e3:.0f} ms "
          f"({800_000 / ours / 1e6:.2f} M lines/s), mpirun {theirs * 1e3:.0f} ms ({800_000 / theirs / 1e6:.2f} M lines/s)")
    line("tagged output throughput: poprun vs mpirun", f"{theirs / ours:.2f}x", ">= 1.0x", theirs >= ours)
    net_ours, net_theirs = max(ours - ours_true, 1e-3), max(theirs - theirs_true, 1e-3)
    line(f"  the same, net of each one's start-up (4 x true: {ours_true * 1e3:.0f} / {theirs_true * 1e3:.0f} ms)",
         f"{net_theirs / net_ours:.2f}x", ">= 1.0x", net_theirs >= net_ours)
    big_ours, big_theirs = walls_s([poprun(4, "seq", "2000000", tag=True), mpirun(4, "seq", "2000000", tag=True)],
                                   max(3, runs // 3))
    line(f"  the same with 2,000,000 lines each ({big_ours * 1e3:.0f} / {big_theirs * 1e3:.0f} ms)",
         f"{big_theirs / big_ours:.2f}x", ">= 1.0x", big_theirs >= big_ours)


def _record(runs: int) -> None:
    """The run record's cost: start-up and tagged throughput with it (the default) and without (POPRUN_RECORD=0)."""
    off = {"POPRUN_RECORD": "0"}
    quiet = {"POPRUN_CGROUP": "0"}  # the cgroup's move (an RCU grace period) varies by tens of ms: leave it out of both
    start_on, start_off, bare = walls_s([poprun(1, "true"), poprun(1, "true"), [PY, "-c", "pass"]], 3 * runs,
                                        envs=[quiet, off | quiet, {}])
    on, none, theirs, ours_true, theirs_true = walls_s([
        poprun(4, "seq", "200000", tag=True), poprun(4, "seq", "200000", tag=True), mpirun(4, "seq", "200000", tag=True),
        poprun(4, "true", tag=True), mpirun(4, "true", tag=True)], runs, envs=[{}, off, {}, {}, {}])
    print(f"\n6. the run record: 1 instance of `true` (POPRUN_CGROUP=0) {start_on * 1e3:.1f} ms with it, "
          f"{start_off * 1e3:.1f} ms without (POPRUN_RECORD=0); 4 x 200,000 tagged lines {on * 1e3:.0f} ms with it, {none * 1e3:.0f} ms without, "
          f"mpirun {theirs * 1e3:.0f} ms")
    line("the record's cost at start-up", f"{(start_on - start_off) * 1e3:.1f} ms", "<= 5 ms",
         start_on - start_off <= 0.005)
    line("  fixed start-up with it (POPRUN_CGROUP=0): poprun / python -c pass", f"{start_on / bare:.2f}x", "<= 2.0x",
         start_on <= 2 * bare)
    net_on, net_theirs = max(on - ours_true, 1e-3), max(theirs - theirs_true, 1e-3)
    line("tagged throughput with the record, net of start-up: vs mpirun", f"{net_theirs / net_on:.2f}x", ">= 2.0x",
         net_theirs >= 2 * net_on)


RESTARTING = ("import os, sys; sys.exit(3 if os.environ.get('TORCHELASTIC_RESTART_COUNT') == '0' "
              "and os.environ.get('LOCAL_RANK') == '1' and os.environ.get('FAIL') else 0)")


def _restart(runs: int) -> None:
    """A failure and a restart of every instance: poprun against torchrun, each net of a run that does not fail."""
    torchrun = shutil.which("torchrun", path=str(Path(PY).parent)) or shutil.which("torchrun")
    if torchrun is None:
        print("\n7. restarts: torchrun is not installed: comparison skipped")
        return
    ours = [*POPRUN, "--offline-mode=1", "--num-instances=4", "--num-replicas=4", "--max-restarts=1",
            "--restart-backoff=0", "--min-uptime=0", PY, "-c", RESTARTING]
    theirs = [torchrun, "--standalone", "--nproc-per-node=4", "--max-restarts=1", "--monitor-interval=0.1",
              "--no-python", PY, "-c", RESTARTING]
    fail = {"FAIL": "1"}
    o_fail, o_ok, t_fail, t_ok = walls_s([ours, ours, theirs, theirs], runs, envs=[fail, {}, fail, {}])
    net_ours, net_theirs = max(o_fail - o_ok, 1e-3), max(t_fail - t_ok, 1e-3)
    print(f"\n7. 4 instances, instance 1 fails once, every instance restarted: poprun {o_fail * 1e3:.0f} ms "
          f"(without the failure {o_ok * 1e3:.0f} ms), torchrun {t_fail * 1e3:.0f} ms ({t_ok * 1e3:.0f} ms)")
    line("a restart, net of a run without it: poprun / torchrun",
         f"{net_ours * 1e3:.0f} / {net_theirs * 1e3:.0f} ms = {net_ours / net_theirs:.2f}x", "<= 0.5x",
         net_ours <= 0.5 * net_theirs)


def _failure(runs: int) -> None:
    ours = failure_latency_s(poprun(4, "sh", "-c", FAIL), runs)
    theirs = failure_latency_s(mpirun(4, "sh", "-c", FAIL), runs)
    print(f"\n4. failure of 1 of 4 instances to exit: poprun {ours * 1e3:.0f} ms, mpirun {theirs * 1e3:.0f} ms")
    line("from an instance's failure to poprun's exit", f"{ours * 1e3:.0f} ms", "< 300 ms", ours < 0.3)


def _mpirun_backend(runs: int) -> None:
    ours, theirs = walls_s([poprun_mpirun(4, "seq", "200000"), mpirun(4, "seq", "200000", tag=True)], runs)
    counts = [len(done[1].splitlines()) if (done := run(argv, capture=True)) else 0
              for argv in (poprun_mpirun(4, "seq", "200000"), mpirun(4, "seq", "200000", tag=True))]
    print(f"\n5. the mpirun backend, 4 x 200,000 tagged lines to /dev/null: poprun {ours * 1e3:.0f} ms, "
          f"mpirun --tag-output {theirs * 1e3:.0f} ms; lines delivered: poprun {counts[0]:,}, mpirun {counts[1]:,}")
    line("mpirun backend tagged throughput: poprun vs mpirun", f"{theirs / ours:.2f}x", ">= 1.0x", theirs >= ours)
    line("mpirun backend: lines delivered of 800,000", f"{counts[0]:,}", "800,000", counts[0] == 800_000)


if __name__ == "__main__":
    sys.exit(main())
