"""The local and offline backends with real processes, mostly through the real CLI."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from popdist.env import EXECUTABLE_CACHE_PATH, from_environ
from poprun.backends.base import LaunchError
from poprun.backends.conformance import MemorySink
from poprun.backends.local import LocalBackend
from poprun.backends.offline import OfflineBackend
from poprun.cli.run import run_plan
from poprun.core.record import evolve
from poprun.planner.plan import BackendChoice
from tests.e2e.helpers import plan_of

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(60)]

PROBE = str(Path(__file__).parent / "bin" / "print_popdist.py")
PY = sys.executable
INDEX = "int(os.environ['POPDIST_INSTANCE_INDEX'])"


def poprun(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """Run the real CLI in a subprocess; return what it did."""
    return subprocess.run([PY, "-m", "poprun.cli.main", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=30, check=False)


def records(stdout: str) -> list[dict[str, object]]:
    """Return the probe's JSON lines, by instance index."""
    found = [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]
    return sorted(found, key=lambda r: int(str(r["instance_index"])))




def test_hello_world_prints_once_per_instance(tmp_path: Path) -> None:
    """The guide's validation step prints 'Hello world!' twice and exits 0."""
    done = poprun("--num-instances", "2", "--num-replicas", "2", "--offline-mode=1", "echo", "Hello world!",
                  cwd=tmp_path)

    assert (0, "Hello world!\nHello world!\n") == (done.returncode, done.stdout)


def test_each_instance_reads_the_values_of_its_plan_instance(tmp_path: Path) -> None:
    """Four probes report exactly what popdist reads from their planned environments."""
    # GIVEN
    argv = ("--num-instances", "4", "--num-replicas", "8", PY, PROBE)
    plan = plan_of(*argv)

    # WHEN
    done = poprun(*argv, cwd=tmp_path)
    got = records(done.stdout)

    # THEN
    cache = str(got[0]["executable_cache_path"])
    expected = [dataclasses.asdict(from_environ(i.env.as_dict() | {EXECUTABLE_CACHE_PATH: cache}))
                | {"instance_index": i.index} for i in plan.instances]
    assert 0 == done.returncode
    assert expected == [{k: v for k, v in r.items() if k in expected[0]} for r in got]


def test_tag_output_prefixes_every_whole_line_like_mpirun(tmp_path: Path) -> None:
    """With --tag-output each line, a final one without newline too, carries [1,i]<stream>:."""
    script = f"import os,sys; i={INDEX}; print('out', i); print('err', i, file=sys.stderr); print('end', end='')"
    done = poprun("--num-instances", "2", "--num-replicas", "2", "--mpi-global-args=--tag-output",
                  PY, "-c", script, cwd=tmp_path)

    expected_out = {"[1,0]<stdout>:out 0", "[1,0]<stdout>:end", "[1,1]<stdout>:out 1", "[1,1]<stdout>:end"}
    assert expected_out == set(done.stdout.splitlines())
    assert {"[1,0]<stderr>:err 0", "[1,1]<stderr>:err 1"} == set(done.stderr.splitlines())


def test_output_filename_writes_mpirun_file_layout(tmp_path: Path) -> None:
    """--output-filename DIR writes DIR/1/rank.N/{stdout,stderr} and still echoes, as mpirun does."""
    script = f"import os,sys; i={INDEX}; print('out', i); print('err', i, file=sys.stderr)"
    done = poprun("--num-instances", "2", "--num-replicas", "2", "--mpi-global-args=--output-filename logs",
                  PY, "-c", script, cwd=tmp_path)

    files = {str(p.relative_to(tmp_path)): p.read_text() for p in sorted(tmp_path.glob("logs/**/std*"))}
    assert {"logs/1/rank.0/stdout": "out 0\n", "logs/1/rank.0/stderr": "err 0\n",
            "logs/1/rank.1/stdout": "out 1\n", "logs/1/rank.1/stderr": "err 1\n"} == files
    assert {"out 0", "out 1"} == set(done.stdout.splitlines())


def test_only_output_from_instance_hides_the_others(tmp_path: Path) -> None:
    """--only-output-from-instance 1 shows instance 1's lines only."""
    script = f"import os,sys; i={INDEX}; print('out', i); print('err', i, file=sys.stderr)"
    done = poprun("--num-instances", "3", "--num-replicas", "3", "--only-output-from-instance", "1",
                  PY, "-c", script, cwd=tmp_path)

    assert (0, "out 1\n", "err 1\n") == (done.returncode, done.stdout, done.stderr)


def test_failing_instance_stops_a_sleeping_sibling_and_is_the_root_cause(tmp_path: Path) -> None:
    """Instance 1 exits 3: instance 0 (sleeping 30 s) is stopped at once and poprun exits 3."""
    script = f"import os,sys,time; i={INDEX}; print('bye', i, flush=True); time.sleep(30) if i == 0 else sys.exit(3)"
    started = time.monotonic()
    done = poprun("--num-instances", "2", "--num-replicas", "2", PY, "-c", script, cwd=tmp_path)

    report = re.sub(r" \(PID \d+\)| \(run [0-9a-f-]+\)", "", done.stderr)
    assert time.monotonic() - started < 10
    assert 3 == done.returncode
    assert report.startswith("poprun: 2 instances failed\n  instance 1 on localhost: exited with status 3\n    | bye 1\n")
    assert "\n  instance 0 on localhost: killed by SIGTERM (stopped by poprun)\n" in report
    assert "Root cause: instance 1 on localhost exited with status 3" == report.splitlines()[-1]


def test_death_by_signal_gives_128_plus_its_number(tmp_path: Path) -> None:
    """An instance killed by SIGUSR1 makes poprun exit 138 and the report names the signal."""
    script = "import os,signal; os.kill(os.getpid(), signal.SIGUSR1)"
    done = poprun("--num-instances", "1", "--num-replicas", "1", PY, "-c", script, cwd=tmp_path)

    assert 128 + signal.SIGUSR1 == done.returncode
    assert "Root cause: instance 0 on localhost killed by SIGUSR1" in done.stderr


def test_sigkill_is_reported_as_possibly_out_of_memory(tmp_path: Path) -> None:
    """An instance killed by SIGKILL that poprun did not kill is reported as a possible OOM."""
    script = "import os,signal; os.kill(os.getpid(), signal.SIGKILL)"
    done = poprun("--num-instances", "1", "--num-replicas", "1", PY, "-c", script, cwd=tmp_path)

    assert 137 == done.returncode
    assert "killed by SIGKILL (possibly out of memory)" in done.stderr


def test_missing_program_exits_127_with_its_diagnostic(tmp_path: Path) -> None:
    """A program that is nowhere gives 127 and PR426 naming it; nothing runs."""
    done = poprun("--num-instances", "2", "--num-replicas", "2", "no-such-program-xyz", cwd=tmp_path)

    assert (127, "") == (done.returncode, done.stdout)
    assert ("error[PR426]: program not found\n"
            "  --> PATH\n"
            f"   = program 'no-such-program-xyz' not found (on PATH or in {tmp_path})\n"
            "   = hint: check the program's name; a bare name is looked for on PATH, then in the working directory: "
            "install the program, put its directory on PATH, or give its path\n") == done.stderr


def test_program_that_is_not_executable_exits_126(tmp_path: Path) -> None:
    """A file without the execute bit gives 126."""
    (tmp_path / "plain.sh").write_text("echo hi\n")
    done = poprun("--num-instances", "1", "--num-replicas", "1", "./plain.sh", cwd=tmp_path)

    assert 126 == done.returncode
    assert (f"error[PR427]: program not executable\n  --> {tmp_path}/plain.sh\n"
            f"   = program './plain.sh' is not executable ({tmp_path}/plain.sh)\n") in done.stderr


def test_program_in_the_working_directory_runs_without_dot_slash(tmp_path: Path) -> None:
    """PopRun 2.1: 'hello.sh' in the cwd runs though it is not on PATH."""
    script = tmp_path / "hello.sh"
    script.write_text("#!/bin/sh\necho hello from $0\n")
    script.chmod(0o755)
    done = poprun("--num-instances", "1", "--num-replicas", "1", "hello.sh", cwd=tmp_path)

    assert (0, "hello from ./hello.sh\n") == (done.returncode, done.stdout)


def test_temporary_executable_cache_exists_during_the_run_and_is_gone_after(tmp_path: Path) -> None:
    """Both instances share one private cache directory, removed when poprun ends."""
    done = poprun("--num-instances", "2", "--num-replicas", "2", PY, PROBE, "--exitcode", "0", cwd=tmp_path)
    got = records(done.stdout)
    paths = {str(r["executable_cache_path"]) for r in got}

    assert [True, True] == [r["executable_cache_exists"] for r in got]
    assert 1 == len(paths)
    assert not Path(paths.pop()).exists()


def test_lines_of_concurrent_instances_are_never_cut(tmp_path: Path) -> None:
    """Four instances writing long lines at once: every forwarded line is one instance's whole line."""
    half = "(sys.stdout.write(str(i) * 500), sys.stdout.flush(), time.sleep(0.002))"
    script = f"import os,sys,time; i={INDEX}; [({half}, {half}, print()) for _ in range(60)]"
    done = poprun("--num-instances", "4", "--num-replicas", "4", PY, "-c", script, cwd=tmp_path)
    lines = done.stdout.splitlines()

    assert 240 == len(lines)
    assert {str(i) * 1000 for i in range(4)} == set(lines)


def test_instance_ignoring_sigterm_is_killed_after_the_grace_period() -> None:
    """Teardown escalates to SIGKILL after the backend's grace period."""
    # GIVEN
    plan = plan_of("--num-instances", "2", "--num-replicas", "2", PY, PROBE)
    argv = {0: (PY, PROBE, "--ignore-sigterm", "--sleep", "30"), 1: (PY, PROBE, "--sleep", "0.5", "--exitcode", "4")}
    plan = evolve(plan, instances=tuple(evolve(i, argv=argv[i.index]) for i in plan.instances))
    sink = MemorySink()

    # WHEN
    started = time.monotonic()
    result = LocalBackend(grace_s=0.3).launch(plan, env_source=os.environ, sink=sink).wait()

    # THEN
    assert time.monotonic() - started < 5
    assert (4, 1) == (result.status, result.root_cause)
    assert [(1, 4, None, False), (0, None, signal.SIGKILL, True)] == [
        (f.index, f.exit_code, f.signal, f.stopped) for f in result.failures]
    assert 2 == b"".join(data for stream, data in sink.written if stream == "stdout").count(b"\n")


def test_local_backend_refuses_a_host_that_is_not_this_machine() -> None:
    """A plan for pod1/pod2 cannot run locally; offline runs it here anyway."""
    plan = plan_of("--host", "pod1,pod2", "--num-replicas", "2", PY, "-c", "print('here')")
    sink = MemorySink()

    with pytest.raises(LaunchError) as info:
        LocalBackend().launch(plan, env_source=os.environ, sink=sink)
    result = OfflineBackend().launch(plan, env_source=os.environ, sink=sink).wait()

    assert (125, "host 'pod1' is not this machine") == (info.value.status, info.value.message.split(":")[0])
    assert (0, {"stdout"}, b"here\nhere\n") == (result.status, {s for s, _ in sink.written},
                                                 b"".join(d for _, d in sink.written))


def test_slurm_backend_outside_an_allocation_is_a_launch_error(capsys: pytest.CaptureFixture[str]) -> None:
    """A plan for the slurm backend, applied outside a Slurm allocation, exits 125 with one clear line."""
    plan = plan_of("--num-replicas", "1", PY, "-c", "pass")
    environ = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    status = run_plan(evolve(plan, backend=BackendChoice(name="slurm", reason="test")), env_source=environ)

    assert (125, ("error[PR436]: not inside a Slurm allocation\n"
                  "  --> SLURM_JOB_ID\n"
                  "   = the slurm backend runs inside a Slurm allocation, and SLURM_JOB_ID is not set: run poprun "
                  "under salloc or sbatch, or use 'poprun submit'\n"
                  "   = hint: run poprun inside an allocation (salloc, or a batch script given to sbatch), or let "
                  "'poprun submit' make one; or use another backend (--backend local or ssh)\n")) == \
        (status, capsys.readouterr().err)


@pytest.mark.parametrize("spec", ["hello.toml", "hello.pop"])
def test_example_specs_apply(spec):
    """``poprun apply examples/hello.toml`` (and the DSL twin) print the hello world once per instance."""
    examples = Path(__file__).parents[2] / "examples"
    result = subprocess.run([sys.executable, "-m", "poprun.cli.main", "apply", str(examples / spec)],
                            capture_output=True, text=True, timeout=30, check=False)

    assert (0, "Hello world!\nHello world!\n") == (result.returncode, result.stdout)


@pytest.mark.parametrize("topology", [
    ("--num-instances=2", "--num-replicas=2"),
    ("--num-instances=3", "--num-replicas=12", "--ipus-per-replica=2"),
    ("--num-instances=4", "--num-replicas=8", "--host=pod[1-2]"),
    ("--num-instances=6", "--num-replicas=12", "--host=pod[1-3]", "--num-ilds=3"),
    ("--num-instances=8", "--num-replicas=64", "--ipus-per-replica=4", "--host=pod[1-4]"),
], ids=["2x2", "3x12x2", "2hosts", "3hosts-3ilds", "4hosts-256ipus"])
def test_every_instance_sees_its_planned_values_offline(tmp_path: Path, topology: tuple[str, ...]) -> None:
    """Offline, multi-host and multi-ILD plans included: each probe reads exactly its plan instance."""
    argv = (*topology, "--offline-mode=1", PY, PROBE)
    plan = plan_of(*argv)
    done = poprun(*argv, cwd=tmp_path)
    expected = [{"instance_index": i.index, "replica_index_offset": i.replica_offset,
                 "num_local_replicas": i.num_local_replicas, "local_instance_index": i.local_index,
                 "num_total_replicas": plan.topology.num_replicas, "num_instances": plan.topology.num_instances,
                 "num_ipus_per_replica": plan.topology.ipus_per_replica} for i in plan.instances]

    assert 0 == done.returncode, done.stderr
    assert expected == [{key: r[key] for key in expected[0]} for r in records(done.stdout)]
