"""Inside a real Slurm allocation: the slurm backend, mpirun through Slurm, ``poprun submit``, and teardown."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from tests.e2e.hosts.test_mpirun_backend import MPI_PROBE
from tests.e2e.hosts.test_ssh_backend import PROBE, SLEEPER, marked_anywhere, wait_for
from tests.testhosts import TestHosts

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

PY = sys.executable
POPRUN = (PY, "-m", "poprun.cli.main")
EXPECTED = [{"host": f"h{i // 2 + 1}", "index": i, "instances": 6, "offset": i, "local": 1, "total": 6,
             "local_index": i % 2} for i in range(6)]


def environ(hosts: TestHosts, **extra: str) -> dict[str, str]:
    """Return this process's environment without Slurm's job variables, plus the cluster's, plus ``extra``."""
    return {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")} | hosts.env() | extra


def salloc(hosts: TestHosts, *args: str, cwd: Path, env: dict[str, str] | None = None,
           timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """Run ``poprun ARGS`` inside ``salloc -N3 --ntasks-per-node=2`` (3 hosts, 6 tasks)."""
    return subprocess.run(["salloc", "--quiet", "-N3", "--ntasks-per-node=2", *POPRUN, *args], cwd=cwd,
                          capture_output=True, text=True, env=env or environ(hosts), timeout=timeout, check=False)


def values(stdout: str, key: str = "index") -> list[dict[str, object]]:
    seen = sorted((json.loads(line) for line in stdout.splitlines() if line.startswith("{")), key=lambda v: v[key])
    for value in seen:
        value.pop("cwd", None)
    return seen


def test_six_instances_on_three_hosts_see_their_planned_values(slurm_hosts: TestHosts, tmp_path: Path) -> None:
    """No --host, no --num-instances: the allocation's nodes and tasks; each instance on its host with its values."""
    done = salloc(slurm_hosts, "--num-replicas", "6", PY, "-c", PROBE, cwd=tmp_path)

    assert 0 == done.returncode, done.stderr
    assert EXPECTED == values(done.stdout)


def test_explain_says_the_hosts_and_backend_come_from_the_allocation(slurm_hosts: TestHosts, tmp_path: Path) -> None:
    """plan --explain inside the allocation names the job, its node list and the slurm backend."""
    done = salloc(slurm_hosts, "plan", "--explain", "--num-replicas", "6", "true", cwd=tmp_path)

    assert 0 == done.returncode, done.stderr
    assert "backend: slurm (inside Slurm job " in done.stdout
    assert "not given: the nodes of Slurm job" in done.stdout and "(h[1-3]: 2 tasks and 2 CPUs per node)" in done.stdout


def test_mpi4py_under_srun_pmix_has_the_plans_rank_and_size(slurm_hosts: TestHosts, tmp_path: Path) -> None:
    """SLURM_MPI_TYPE=pmix: COMM_WORLD rank = instance index, size = instance count, and an allreduce works."""
    pytest.importorskip("mpi4py")
    done = salloc(slurm_hosts, "--num-replicas", "6", PY, "-c", MPI_PROBE, cwd=tmp_path,
                  env=environ(slurm_hosts, SLURM_MPI_TYPE="pmix"))

    assert 0 == done.returncode, done.stderr
    assert [{"rank": i, "size": 6, "index": i, "instances": 6, "host": f"h{i // 2 + 1}", "sum": 15}
            for i in range(6)] == values(done.stdout, "rank")


def test_mpirun_backend_launches_through_slurm_on_the_allocations_hosts(slurm_hosts: TestHosts, tmp_path: Path) -> None:
    """--backend mpirun inside the allocation, with no ssh configuration at all: OpenMPI starts its daemons with srun."""
    env = {k: v for k, v in environ(slurm_hosts).items() if k not in ("OMPI_MCA_plm_rsh_args", "POPRUN_SSH_CONFIG")}
    done = salloc(slurm_hosts, "--backend", "mpirun", "--num-replicas", "6", PY, "-c", PROBE, cwd=tmp_path, env=env)

    assert 0 == done.returncode, done.stderr
    assert EXPECTED == values(done.stdout)


def test_failing_instance_ends_the_step_on_every_host(slurm_hosts: TestHosts, tmp_path: Path) -> None:
    """Instance 4 (on h3) exits 3: poprun exits 3 naming it as the root cause, and nothing of the step is left."""
    mark = f"poprun-mark-{uuid.uuid4().hex[:8]}"
    program = (f'if [ "$POPDIST_INSTANCE_INDEX" = 4 ]; then sleep 0.5; echo failing >&2; exit 3; fi; '
               f'{SLEEPER.format(mark=mark)}')
    done = salloc(slurm_hosts, "--num-replicas", "6", "sh", "-c", program, mark, cwd=tmp_path)

    assert 3 == done.returncode, done.stderr
    assert re.search(r"poprun: 6 instances failed \(run [0-9a-f-]+\)\n  instance 4 on h3: exited with status 3\n    \| failing\n",
                     done.stderr), done.stderr
    assert done.stderr.endswith("Root cause: instance 4 on h3 exited with status 3\n"), done.stderr
    assert wait_for(lambda: not marked_anywhere(slurm_hosts, mark), within_s=5), marked_anywhere(slurm_hosts, mark)


def test_submit_runs_the_plan_as_a_batch_job(slurm_hosts: TestHosts, tmp_path: Path) -> None:
    """poprun submit --wait outside an allocation: sbatch -N3 --ntasks-per-node=2; the job's output has every instance."""
    done = subprocess.run([*POPRUN, "submit", "--wait", "--nodes", "3", "--num-instances", "6", "--num-replicas", "6",
                           PY, "-c", PROBE], cwd=tmp_path, capture_output=True, text=True,
                          env=environ(slurm_hosts), timeout=90, check=False)

    assert 0 == done.returncode, done.stdout + done.stderr
    job = done.stdout.split("submitted batch job ")[1].split()[0]
    assert EXPECTED == values((tmp_path / f"slurm-{job}.out").read_text())


def test_submit_dry_run_shows_the_batch_script(slurm_hosts: TestHosts, tmp_path: Path) -> None:
    """--dry-run prints the script: the allocation's shape and the poprun command, and submits nothing."""
    done = subprocess.run([*POPRUN, "submit", "--dry-run", "--nodes", "3", "--num-instances", "6", "--num-replicas",
                           "6", "true"], cwd=tmp_path, capture_output=True, text=True, env=environ(slurm_hosts),
                          timeout=30, check=False)

    assert 0 == done.returncode, done.stderr
    assert "#SBATCH --nodes=3\n#SBATCH --ntasks-per-node=2\n" in done.stdout
    assert done.stdout.endswith(" -m poprun.cli.main --num-instances 6 --num-replicas 6 true\n")


def test_a_slurm_run_is_recorded_instance_by_instance(slurm_hosts: TestHosts, tmp_path: Path) -> None:
    """Inside an allocation: each of the 6 instances' lines in its own log, and the report names the failure."""
    runs = tmp_path / "runs"
    program = ('echo "out $POPDIST_INSTANCE_INDEX $(hostname)"; echo "err $POPDIST_INSTANCE_INDEX" >&2; '
               'if [ "$POPDIST_INSTANCE_INDEX" = 5 ]; then sleep 0.5; exit 4; fi')
    done = salloc(slurm_hosts, "--num-replicas", "6", "sh", "-c", program, cwd=tmp_path,
                  env=environ(slurm_hosts, POPRUN_RUNS_DIR=str(runs)))
    (run,) = list(runs.iterdir())

    assert 4 == done.returncode, done.stderr
    for i in range(6):
        assert f"out {i} h{i // 2 + 1}\n" == (run / "logs" / f"{i}.stdout").read_text()
        assert f"err {i}\n" == (run / "logs" / f"{i}.stderr").read_text()
    report = json.loads((run / "report.json").read_text())
    assert (5, 4, "slurm") == (report["root_cause"], report["status"],
                               json.loads((run / "plan.json").read_text())["backend"]["name"])


def test_poprun_stop_ends_a_slurm_run_on_every_node(slurm_hosts: TestHosts, tmp_path: Path) -> None:
    """'poprun stop RUN' from another shell ends a run inside an allocation: 143, and nothing of the step is left."""
    runs, mark = tmp_path / "runs", f"poprun-mark-{uuid.uuid4().hex[:8]}"
    env = environ(slurm_hosts, POPRUN_RUNS_DIR=str(runs))
    proc = subprocess.Popen(["salloc", "--quiet", "-N3", "--ntasks-per-node=2", *POPRUN, "--num-replicas", "6", "sh",
                             "-c", SLEEPER.format(mark=mark), mark], cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        deadline, run = time.monotonic() + 30, None
        while run is None and time.monotonic() < deadline:
            for found in runs.iterdir() if runs.exists() else ():
                events = found / "events.jsonl"
                if events.exists() and '"event":"launch-running"' in events.read_text():
                    run = found
            time.sleep(0.05)
        assert run is not None, "the run never ran"
        stopped = subprocess.run([*POPRUN, "stop", run.name], cwd=tmp_path, env=env, capture_output=True, text=True,
                                 timeout=60, check=False)
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
        proc.wait()

    assert (0, 143) == (stopped.returncode, proc.returncode), stopped.stderr + err
    assert wait_for(lambda: not marked_anywhere(slurm_hosts, mark), within_s=10), marked_anywhere(slurm_hosts, mark)


def test_long_lines_from_slurm_tasks_arrive_whole(slurm_hosts: TestHosts, tmp_path: Path) -> None:
    """srun cuts lines into 1024-byte pieces; a 3 MiB and a 40 MiB line (every byte value) still arrive whole, byte-exact."""
    from tests.e2e.test_long_lines import SIZES, WRITER, expected, record_log, shape

    runs = tmp_path / "runs"
    done = subprocess.run(["salloc", "--quiet", "-N1", "--ntasks-per-node=1", *POPRUN, "--num-replicas", "1",
                           PY, "-c", WRITER, *map(str, SIZES)], cwd=tmp_path, capture_output=True, timeout=240,
                          env=environ(slurm_hosts, POPRUN_RUNS_DIR=str(runs)), check=False)

    want = expected(*SIZES)
    assert 0 == done.returncode, done.stderr[-2000:]
    assert shape(want) == shape(done.stdout)
    assert want == done.stdout
    assert want == record_log(runs, 0)
