"""popdist's runtime in real instances started by the real CLI: init, execute_on_instances, barriers."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(60)]

PROBE = """
import json, sys, time
from pathlib import Path

import popdist

marks = Path(sys.argv[1])


def save(tag):
    time.sleep(0.2)  # the others must still be waiting when this ends
    (marks / f"ran-{popdist.getInstanceIndex()}").write_text(tag)
    return f"{tag} by {popdist.getInstanceIndex()}"


def meet_in_group():
    popdist.barrier()  # instances 1 and 2 only
    return popdist.getInstanceIndex()


popdist.init(timeout_s=30)
result = popdist.execute_on_instances({0}, save, "checkpoint")
saw_checkpoint = (marks / "ran-0").exists()
group = popdist.execute_on_instances({1, 2}, meet_in_group)
popdist.barrier()
record = {
    "instance": popdist.getInstanceIndex(), "instances": popdist.getNumInstances(),
    "local_replicas": popdist.getNumLocalReplicas(), "offset": popdist.getReplicaIndexOffset(),
    "replicas": list(popdist.replica_indices()), "shard": list(popdist.shard_range(100)),
    "device": popdist.getDeviceId(), "backend": popdist.backend_name(), "result": result,
    "saw_checkpoint": saw_checkpoint, "group": group,
}
popdist.finalize()
record["finished"] = not popdist.is_initialized()
print(json.dumps(record), flush=True)
"""


def free_port() -> int:
    """Return a TCP port nothing listens on now."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.mark.parametrize("hosts", [[], ["--host=pod1,pod2"]], ids=["one host", "two planned hosts"])
def test_instances_run_the_function_where_asked_and_wait_for_it(tmp_path, hosts):
    """4 instances of 8 replicas meet; only instance 0 runs the function, and everyone waits for it."""
    # GIVEN the probe, and a MASTER_PORT whose next port is free (popdist meets on MASTER_PORT + 1)
    probe, marks = tmp_path / "probe.py", tmp_path / "marks"
    probe.write_text(PROBE)
    marks.mkdir()
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("POPDIST_", "MASTER_"))}
    environ["MASTER_PORT"] = str(free_port() - 1)

    # WHEN poprun launches it offline
    done = subprocess.run([sys.executable, "-m", "poprun.cli.main", "--num-instances=4", "--num-replicas=8",
                           *hosts, "--offline-mode=1", sys.executable, str(probe), str(marks)],
                          cwd=tmp_path, env=environ, capture_output=True, text=True, timeout=45, check=False)

    # THEN every instance read its own values, and only instance 0 ran the function
    assert 0 == done.returncode, done.stderr
    records = sorted((json.loads(line) for line in done.stdout.splitlines()), key=lambda r: r["instance"])
    assert [expected(i) for i in range(4)] == records
    assert ["ran-0"] == sorted(p.name for p in marks.iterdir())


def expected(i: int) -> dict[str, object]:
    """Return what instance ``i`` of 4 (2 of the 8 replicas each) prints."""
    return {
        "instance": i, "instances": 4, "local_replicas": 2, "offset": 2 * i, "replicas": [2 * i, 2 * i + 1],
        "shard": list(range(25 * i, 25 * i + 25)), "device": 8 + i, "backend": "tcp",
        "result": "checkpoint by 0" if i == 0 else None, "saw_checkpoint": True,
        "group": i if i in {1, 2} else None, "finished": True,
    }
