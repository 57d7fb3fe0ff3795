"""
Elastic membership on five namespace hosts (real sshd): a lost host is replaced by a spare, or the plan shrinks.

Each test takes a host's link down mid-run (``ip link set ... down`` in its namespace): the ssh
backend names it lost (PR411) within the host timeout, and the next attempt is solved again
by the planner (docs/membership.md). The hosts are this module's own (h1..h5): the session's
stay healthy.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import jsonschema
import pytest

from tests.e2e.helpers import session_hosts
from tests.e2e.hosts.test_host_faults import ssh_clients_left as ssh_clients
from tests.e2e.hosts.test_ssh_backend import PY, marked_anywhere, wait_for
from tests.golden.harness import assert_golden
from tests.testhosts import TestHosts

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]

GOLDEN = Path(__file__).parent / "golden"
HOST_TIMEOUT_S = 3  # POPRUN_HOST_TIMEOUT: a lost host is noticed in 3 s and a few more
# attempt 0 waits (and is killed by the lost host); attempt 1 says where it runs and ends well
PROGRAM = ('if [ "$POPRUN_RESTART_COUNT" = 0 ]; then echo "ready $POPDIST_INSTANCE_INDEX"; exec sleep 60; fi; '
           'echo "attempt $POPRUN_RESTART_COUNT: $POPDIST_INSTANCE_INDEX of $WORLD_SIZE on $(hostname) '
           'replicas $POPDIST_NUM_TOTAL_REPLICAS master $MASTER_ADDR"')


@pytest.fixture(scope="module")
def five(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestHosts]:
    """Bring up h1..h5 for this module (its tests take links down)."""
    yield from session_hosts(tmp_path_factory.mktemp("memberhosts"), 5, what="the membership test hosts")


@pytest.fixture
def link_down(five: TestHosts) -> Iterator[list[str]]:
    """Yield a list to put host names in whose links the test took down; bring them up again after."""
    names: list[str] = []
    try:
        yield names
    finally:
        for name in names:
            five.set_link(name, up=True)
        for name in names:
            assert wait_for(lambda n=name: five.ssh(n, "true", timeout=10).returncode == 0, within_s=20)


def start(hosts: TestHosts, cwd: Path, *args: str, tmpdir: Path | None = None) -> subprocess.Popen[str]:
    """Start poprun with the hosts' ssh settings and a short host timeout; its record in ``cwd/runs``."""
    env = os.environ | hosts.env() | {"POPRUN_HOST_TIMEOUT": str(HOST_TIMEOUT_S), "POPRUN_RUNS_DIR": str(cwd / "runs")}
    if tmpdir is not None:
        env["TMPDIR"] = str(tmpdir)  # poprun's ssh sockets are there: a test finds its ssh clients by it
    return subprocess.Popen([PY, "-m", "poprun.cli.main", *args], cwd=cwd, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def await_ready(proc: subprocess.Popen[str], count: int) -> None:
    assert proc.stdout is not None
    seen = 0
    while seen < count:
        line = proc.stdout.readline()
        if not line:
            _, err = proc.communicate(timeout=30)
            pytest.fail(f"poprun ended ({proc.returncode}) before every instance was ready:\n{err}")
        seen += line.startswith("ready ")


SCHEMA = json.loads((Path(__file__).parents[3] / "docs" / "events.schema.json").read_text())


def events(cwd: Path) -> list[dict[str, object]]:
    """Return the run's events, each checked against the documented schema."""
    (run,) = (cwd / "runs").iterdir()
    found = [json.loads(line) for line in (run / "events.jsonl").read_text().splitlines()]
    for event in found:
        jsonschema.validate(event, SCHEMA)
    return found


def the_run(cwd: Path) -> Path:
    (run,) = (cwd / "runs").iterdir()
    return run


def test_a_lost_host_is_replaced_by_the_spare_and_the_world_keeps_its_size(five: TestHosts, tmp_path: Path,
                                                                             link_down: list[str]) -> None:
    """h3's link goes down: attempt 1 runs on h1, h2, h5, h4 with WORLD_SIZE 4; a replan event and the report say why."""
    mark = f"mark-{uuid.uuid4().hex[:8]}"
    proc = start(five, tmp_path, "--host", "h1,h2,h3,h4", "--spare-host", "h5", "--num-replicas", "8",
                 "--max-restarts", "2", "--restart-backoff", "0.1", f"--mpi-local-args=-x MARK={mark}", "sh", "-c", PROGRAM)
    await_ready(proc, 4)
    link_down.append("h3")
    five.set_link("h3", up=False)
    out, err = proc.communicate(timeout=90)

    assert 0 == proc.returncode, err
    lines = sorted(line for line in out.splitlines() if line.startswith("attempt 1:"))
    master = five.addresses["h1"]  # ssh_config's HostName: as every host reaches it
    assert [f"attempt 1: {i} of 4 on {h} replicas 8 master {master}" for i, h in enumerate(("h1", "h2", "h5", "h4"))] \
        == lines, out
    (replan,) = [e for e in events(tmp_path) if e["event"] == "replan"]
    assert (["h3"], ["h5"], False, ["h1", "h2", "h5", "h4"], 4, 8) == (
        replan["removed"], replan["added"], replan["shrunk"], replan["hosts"], replan["instances"], replan["replicas"])
    assert "h5 replaces h3" in str(replan["reason"]) and "PR411" in str(replan["reason"])
    report = json.loads((the_run(tmp_path) / "report.json").read_text())
    hosts = [a["hosts"] for a in report["attempts"]]
    assert [["h1", "h2", "h3", "h4"], ["h1", "h2", "h5", "h4"]] == hosts, report["attempts"]
    plans = [json.loads((the_run(tmp_path) / "attempts" / str(n) / "plan.json").read_text()) for n in (0, 1)]
    assert [["h1", "h2", "h3", "h4"], ["h1", "h2", "h5", "h4"]] == [p["topology"]["hosts"] for p in plans]
    alive = ("h1", "h2", "h4", "h5")
    assert wait_for(lambda: not any(five.processes(h, mark) for h in alive), within_s=10), marked_anywhere(five, mark)


def test_without_a_spare_the_plan_shrinks_to_the_minimum(five: TestHosts, tmp_path: Path,
                                                         link_down: list[str]) -> None:
    """--min-hosts 3 without spares: h2's link goes down; attempt 1 has 3 instances, WORLD_SIZE 3, 6 replicas."""
    proc = start(five, tmp_path, "--host", "h1,h2,h3,h4", "--min-hosts", "3", "--num-replicas", "8",
                 "--max-restarts", "2", "--restart-backoff", "0.1", "sh", "-c", PROGRAM)
    await_ready(proc, 4)
    link_down.append("h2")
    five.set_link("h2", up=False)
    out, err = proc.communicate(timeout=90)

    assert 0 == proc.returncode, err
    lines = sorted(line for line in out.splitlines() if line.startswith("attempt 1:"))
    master = five.addresses["h1"]
    assert [f"attempt 1: {i} of 3 on {h} replicas 6 master {master}" for i, h in enumerate(("h1", "h3", "h4"))] \
        == lines, out
    (replan,) = [e for e in events(tmp_path) if e["event"] == "replan"]
    assert (["h2"], [], True, 3) == (replan["removed"], replan["added"], replan["shrunk"], replan["instances"])


def test_instance_0s_host_lost_moves_master_addr_to_its_replacement(five: TestHosts, tmp_path: Path,
                                                                     link_down: list[str]) -> None:
    """h1 (instance 0, MASTER_ADDR) is lost: the spare takes its place, and MASTER_ADDR with it."""
    proc = start(five, tmp_path, "--host", "h1,h2", "--spare-host", "h5", "--num-replicas", "2",
                 "--max-restarts", "1", "--restart-backoff", "0.1", "sh", "-c", PROGRAM)
    await_ready(proc, 2)
    link_down.append("h1")
    five.set_link("h1", up=False)
    out, err = proc.communicate(timeout=90)

    assert 0 == proc.returncode, err
    lines = sorted(line for line in out.splitlines() if line.startswith("attempt 1:"))
    master = five.addresses["h5"]
    assert [f"attempt 1: 0 of 2 on h5 replicas 2 master {master}", f"attempt 1: 1 of 2 on h2 replicas 2 master {master}"] \
        == lines, out


def test_below_the_minimum_the_run_ends_with_a_diagnostic_not_a_restart(five: TestHosts, tmp_path: Path,
                                                                        link_down: list[str]) -> None:
    """--min-hosts 3 on three hosts, no spare: h3 is lost; no attempt 1, PR310 says why, exit 125."""
    proc = start(five, tmp_path, "--host", "h1,h2,h3", "--min-hosts", "3", "--spare-host", "h4",
                 "--num-replicas", "3", "--max-restarts", "2", "--restart-backoff", "0.1",
                 "sh", "-c", PROGRAM)
    await_ready(proc, 3)
    link_down.extend(["h3", "h4"])
    five.set_link("h4", up=False)  # the spare is gone too: its replacement fails its preflight
    five.set_link("h3", up=False)
    out, err = proc.communicate(timeout=120)

    assert 125 == proc.returncode, err
    assert "attempt 1:" not in out
    assert "PR310" in err, err


def test_training_resumes_on_the_spare_to_the_uninterrupted_runs_weights(five: TestHosts, tmp_path: Path,
                                                                          link_down: list[str]) -> None:
    """
    examples/train_resume.py on h1..h4, spare h5: h3's link goes down once step 20 is checkpointed.

    The run ends 0; attempt 1 runs on h1, h2, h5, h4 with the same world size and resumes at
    step 20; the final weights equal an uninterrupted run's; ``plan --diff`` of the attempts'
    plans shows the host change only; nothing of the run is left on any host.
    """
    torch = pytest.importorskip("torch")
    pytest.importorskip("sklearn")
    script = str(Path(__file__).parents[3] / "examples" / "train_resume.py")
    common = ("--num-replicas", "4", "--mpi-local-args=-x GLOO_SOCKET_IFNAME=eth0")  # the hosts' one interface
    whole = subprocess.run([PY, "-m", "poprun.cli.main", "--host", "h1,h2,h5,h4", *common, PY, script,
                            "--checkpoint", str(tmp_path / "whole.ckpt"), "--save", str(tmp_path / "whole.pt")],
                           cwd=tmp_path, env=os.environ | five.env() | {"POPRUN_RUNS_DIR": str(tmp_path / "other")},
                           capture_output=True, text=True, timeout=120, check=False)
    assert 0 == whole.returncode, whole.stderr

    proc = start(five, tmp_path, "--host", "h1,h2,h3,h4", "--spare-host", "h5", *common, "--max-restarts", "2",
                 "--restart-backoff", "0.1", PY, script, "--checkpoint", str(tmp_path / "crashed.ckpt"),
                 "--hold-at-step", "20", "--save", str(tmp_path / "crashed.pt"))
    assert proc.stdout is not None
    held = [proc.stdout.readline() for _ in range(4)]
    assert all("held at step 20" in line for line in held), held
    link_down.append("h3")
    five.set_link("h3", up=False)
    out, err = proc.communicate(timeout=120)

    assert 0 == proc.returncode, err
    summary = json.loads(out.strip().splitlines()[-1])
    assert (1, 20) == (summary["attempt"], summary["resumed_at_step"])
    a, b = torch.load(tmp_path / "whole.pt"), torch.load(tmp_path / "crashed.pt")
    assert all(torch.equal(a[k], b[k]) for k in a), "the resumed run's weights differ from the uninterrupted run's"
    run = the_run(tmp_path)
    diff = subprocess.run([PY, "-m", "poprun.cli.main", "plan", "--diff", str(run / "attempts/0/plan.json"),
                           str(run / "attempts/1/plan.json")], capture_output=True, text=True, timeout=60, check=False)
    assert (0, ["topology:", "  hosts: h[1-4] -> h[1-2,4-5]", "placement:", "  host: h3 -> h5 (instance 2)",
                "membership:", "  spares: h5 -> (none)"]) == (diff.returncode, diff.stdout.splitlines()[2:]), diff.stdout
    assert wait_for(lambda: not marked_anywhere(five, str(tmp_path)), within_s=10), marked_anywhere(five, str(tmp_path))


def test_a_spare_that_is_a_hosts_own_machine_is_left_out_at_its_preflight(five: TestHosts, tmp_path: Path,
                                                                          link_down: list[str]) -> None:
    """The spare is h1's address (one machine with h1): h3 is lost, the spare fails its preflight (PR413), the plan shrinks."""
    same = five.addresses["h1"]
    proc = start(five, tmp_path, "--host", "h1,h2,h3,h4", "--spare-host", same, "--min-hosts", "3",
                 "--num-replicas", "4", "--max-restarts", "1", "--restart-backoff", "0.1", "sh", "-c", PROGRAM)
    await_ready(proc, 4)
    link_down.append("h3")
    five.set_link("h3", up=False)
    out, err = proc.communicate(timeout=90)

    assert 0 == proc.returncode, err
    assert ["h1", "h2", "h4"] == sorted(line.split()[6] for line in out.splitlines() if line.startswith("attempt 1:")), out
    replans = [e for e in events(tmp_path) if e["event"] == "replan"]
    assert [(["h3"], [same]), ([same], [])] == [(e["removed"], e["added"]) for e in replans]
    assert "PR413" in str(replans[1]["reason"]), replans


def test_under_mpirun_a_lost_host_is_replaced_by_the_spare(five: TestHosts, tmp_path: Path,
                                                            link_down: list[str]) -> None:
    """--backend mpirun: h2's link goes down; the next mpirun runs on h1, h5, h3 (a new host list)."""
    proc = start(five, tmp_path, "--backend", "mpirun", "--host", "h1,h2,h3", "--spare-host", "h5",
                 "--num-replicas", "3", "--max-restarts", "1", "--restart-backoff", "0.1", "sh", "-c", PROGRAM)
    await_ready(proc, 3)
    link_down.append("h2")
    five.set_link("h2", up=False)
    out, err = proc.communicate(timeout=120)

    assert 0 == proc.returncode, err
    lines = sorted(line.split()[2:7] for line in out.splitlines() if line.startswith("attempt 1:"))
    assert [["0", "of", "3", "on", "h1"], ["1", "of", "3", "on", "h5"], ["2", "of", "3", "on", "h3"]] == lines, out


def test_a_saved_plan_whose_kept_spec_was_edited_never_runs_it(five: TestHosts, tmp_path: Path,
                                                                link_down: list[str]) -> None:
    """
    plan.json's membership.spec edited to run another program: when h2 is lost, the re-plan is refused (PR312).

    What a reviewer read in the plan is all that ever runs: the edited program never starts anywhere.
    """
    plan = tmp_path / "plan.json"
    made = subprocess.run([PY, "-m", "poprun.cli.main", "plan", "--format", "json", "-o", str(plan), "--host", "h1,h2",
                           "--spare-host", "h5", "--num-replicas", "2", "--max-restarts", "1", "--restart-backoff",
                           "0.1", "sh", "-c", PROGRAM], cwd=tmp_path, capture_output=True, text=True, timeout=60,
                          env=os.environ | five.env() | {"POPRUN_HOST_TIMEOUT": str(HOST_TIMEOUT_S)}, check=False)
    assert 0 == made.returncode, made.stderr
    data = json.loads(plan.read_text())
    evil = tmp_path / "evil-ran"
    data["membership"]["spec"] = data["membership"]["spec"].replace("if [", f"touch {evil}; if [", 1)
    plan.write_text(json.dumps(data))
    proc = start(five, tmp_path, "apply", str(plan))
    await_ready(proc, 2)
    link_down.append("h2")
    five.set_link("h2", up=False)
    _, err = proc.communicate(timeout=90)

    diagnostic = err[err.index("error[PR312]"):err.index("poprun: 1 attempt")]  # then the run's id and times
    assert_golden(GOLDEN / "PR312_a_kept_spec_edited_by_hand", f"{diagnostic}exit {proc.returncode}\n")
    assert not evil.exists()


@pytest.mark.parametrize("how", [signal.SIGINT, signal.SIGKILL])
def test_a_stop_while_a_replacement_waits_to_start_leaves_nothing_anywhere(five: TestHosts, tmp_path: Path,
                                                                            link_down: list[str], short_tmp: Path,
                                                                            how: signal.Signals) -> None:
    """h3 is lost; poprun is stopped (Ctrl-C, or SIGKILL) while the re-planned attempt waits: no process, no ssh client is left."""
    mark = f"mark-{uuid.uuid4().hex[:8]}"
    proc = start(five, tmp_path, "--host", "h1,h2,h3,h4", "--spare-host", "h5", "--num-replicas", "4",
                 "--max-restarts", "2", "--restart-backoff", "30", "--min-uptime", "0", "sh", "-c", PROGRAM, mark,
                 tmpdir=short_tmp)
    await_ready(proc, 4)
    link_down.append("h3")
    five.set_link("h3", up=False)
    # attempt 0's launch has ended (h3 named lost): the restart on the spare waits now
    assert wait_for(lambda: any(e["event"] == "launch-ended" for e in events(tmp_path)), within_s=30)
    proc.send_signal(how)
    _, err = proc.communicate(timeout=60)

    assert proc.returncode == (130 if how == signal.SIGINT else -signal.SIGKILL), err
    assert wait_for(lambda: not ssh_clients(short_tmp), within_s=10), ssh_clients(short_tmp)
    assert wait_for(lambda: not any(five.processes(h, mark) for h in ("h1", "h2", "h4", "h5")), within_s=10)
    assert not any(e["event"] == "attempt-started" and e["attempt"] == 1 for e in events(tmp_path))


def test_when_no_smaller_plan_holds_the_run_ends_with_pr311_not_a_restart(five: TestHosts, tmp_path: Path,
                                                                          link_down: list[str]) -> None:
    """--num-ilds 2 on four hosts, --min-hosts 3: h2 is lost; 3 instances cannot split over 2 ILDs: PR311, exit 125."""
    proc = start(five, tmp_path, "--host", "h1,h2,h3,h4", "--min-hosts", "3", "--num-ilds", "2", "--num-replicas", "8",
                 "--max-restarts", "2", "--restart-backoff", "0.1", "sh", "-c", PROGRAM)
    await_ready(proc, 4)
    link_down.append("h2")
    five.set_link("h2", up=False)
    out, err = proc.communicate(timeout=90)

    assert (125, "") == (proc.returncode, "".join(line for line in out.splitlines() if line.startswith("attempt 1"))), err
    assert "error[PR311]: no plan on the hosts left" in err and "error[PR302]" in err, err
    assert not any(e["event"] in ("replan", "attempt-started") and e["attempt"] == 1 for e in events(tmp_path))


UNHEALTHY_ON_H3 = 'if [ "$(hostname)" = h3 ]; then echo "gpu 3: ECC errors" >&2; exit 1; fi; echo healthy'


def test_a_host_that_fails_its_health_check_is_replaced_before_anything_starts(five: TestHosts,
                                                                               tmp_path: Path) -> None:
    """--health-check fails on h3: the run starts on h1, h2, h5, h4 at once; h3 never runs an instance."""
    done = subprocess.run([PY, "-m", "poprun.cli.main", "--host", "h1,h2,h3,h4", "--spare-host", "h5",
                           "--num-replicas", "4", "--health-check", UNHEALTHY_ON_H3, "sh", "-c",
                           'echo "ran $POPDIST_INSTANCE_INDEX on $(hostname) of $WORLD_SIZE"'],
                          cwd=tmp_path, env=os.environ | five.env() | {"POPRUN_RUNS_DIR": str(tmp_path / "runs")},
                          capture_output=True, text=True, timeout=90, check=False)

    assert 0 == done.returncode, done.stderr
    assert [f"ran {i} on {h} of 4" for i, h in enumerate(("h1", "h2", "h5", "h4"))] == sorted(done.stdout.splitlines())
    found = events(tmp_path)
    checks = {e["host"]: (e["ok"], e["tail"]) for e in found if e["event"] == "health-check"}
    assert {"h1": (True, ["healthy"]), "h2": (True, ["healthy"]), "h3": (False, ["gpu 3: ECC errors"]),
            "h4": (True, ["healthy"]), "h5": (True, ["healthy"])} == checks
    (replan,) = [e for e in found if e["event"] == "replan"]
    assert (0, ["h3"], ["h5"]) == (replan["attempt"], replan["removed"], replan["added"])
    assert "poprun: attempt 0 runs on h1,h2,h5,h4: h5 replaces h3 (h3: its health check failed with status 1)" \
        in done.stderr


def test_without_a_spare_the_unhealthy_host_is_named_before_anything_starts(five: TestHosts, tmp_path: Path) -> None:
    """--health-check fails on h3, no spare, no smaller minimum: PR445 names h3 and its last line; nothing ran (125)."""
    done = subprocess.run([PY, "-m", "poprun.cli.main", "--host", "h1,h2,h3", "--num-replicas", "3",
                           "--health-check", UNHEALTHY_ON_H3, "sh", "-c", "echo ran"],
                          cwd=tmp_path, env=os.environ | five.env() | {"POPRUN_RUNS_DIR": str(tmp_path / "runs")},
                          capture_output=True, text=True, timeout=90, check=False)

    assert (125, "") == (done.returncode, done.stdout), done.stderr
    assert_golden(GOLDEN / "PR445_a_host_that_fails_its_health_check", f"{done.stderr}exit {done.returncode}\n")


@pytest.mark.parametrize("how", [signal.SIGINT, signal.SIGKILL])
def test_a_stop_during_the_health_checks_leaves_nothing_on_any_host(five: TestHosts, tmp_path: Path, short_tmp: Path,
                                                                    how: signal.Signals) -> None:
    """A check that hangs on every host; poprun is stopped (Ctrl-C, SIGKILL) while it runs: nothing is left anywhere."""
    mark = f"check-{uuid.uuid4().hex[:8]}"
    proc = start(five, tmp_path, "--host", "h1,h2,h3,h4", "--spare-host", "h5", "--num-replicas", "4",
                 "--health-check", f"sh -c 'sleep 100; : {mark}'", "--health-check-timeout", "60", "sh", "-c", "true",
                 tmpdir=short_tmp)
    assert wait_for(lambda: sum(bool(five.processes(h, mark)) for h in five.names) == 5, within_s=30)
    proc.send_signal(how)
    proc.communicate(timeout=30)

    assert proc.returncode == (130 if how == signal.SIGINT else -signal.SIGKILL)
    assert wait_for(lambda: not marked_anywhere(five, mark), within_s=10), marked_anywhere(five, mark)
    assert wait_for(lambda: not ssh_clients(short_tmp), within_s=10), ssh_clients(short_tmp)


def test_the_health_check_runs_again_before_a_restart_and_replaces_a_host_that_fails_it_then(five: TestHosts,
                                                                                            tmp_path: Path) -> None:
    """Instance 1 makes h2 unhealthy and fails: before the restart h2 fails its check, and h4 takes its place."""
    program = ('if [ "$POPRUN_RESTART_COUNT" = 0 ]; then [ "$POPDIST_INSTANCE_INDEX" != 1 ] || '
               f'{{ touch {tmp_path}/sick-$(hostname); exit 3; }}; exit 0; fi; echo "ran $POPDIST_INSTANCE_INDEX on $(hostname)"')
    done = subprocess.run([PY, "-m", "poprun.cli.main", "--host", "h1,h2,h3", "--spare-host", "h4", "--num-replicas",
                           "3", "--max-restarts", "1", "--restart-backoff", "0.1", "--health-check",
                           f"test ! -e {tmp_path}/sick-$(hostname) || {{ echo sick; exit 1; }}", "sh", "-c", program],
                          cwd=tmp_path, env=os.environ | five.env() | {"POPRUN_RUNS_DIR": str(tmp_path / "runs")},
                          capture_output=True, text=True, timeout=90, check=False)

    assert 0 == done.returncode, done.stderr
    assert ["ran 0 on h1", "ran 1 on h4", "ran 2 on h3"] == sorted(done.stdout.splitlines())
    checks = [(e["host"], e["ok"]) for e in events(tmp_path) if e["event"] == "health-check"]  # as each ends
    assert [{("h1", True), ("h2", True), ("h3", True), ("h4", True)},
            {("h1", True), ("h2", False), ("h3", True), ("h4", True)}] == [set(checks[:4]), set(checks[4:])]


def test_a_host_the_health_check_cannot_reach_is_named_before_anything_starts(five: TestHosts, tmp_path: Path,
                                                                              link_down: list[str]) -> None:
    """h3's link is down before the start: its health check cannot run there (PR446); nothing ran (125)."""
    link_down.append("h3")
    five.set_link("h3", up=False)
    done = subprocess.run([PY, "-m", "poprun.cli.main", "--host", "h1,h2,h3", "--num-replicas", "3",
                           "--health-check", "true", "sh", "-c", "echo ran"],
                          cwd=tmp_path, env=os.environ | five.env() | {"POPRUN_RUNS_DIR": str(tmp_path / "runs")},
                          capture_output=True, text=True, timeout=90, check=False)

    assert (125, "") == (done.returncode, done.stdout), done.stderr
    text = done.stderr.replace(five.subnet.rsplit(".", 1)[0] + ".", "10.77.X.")  # the hosts' subnet varies
    text = re.sub("Connection timed out|No route to host", "<timed out or no route>", text)  # ARP or ssh: a race
    assert_golden(GOLDEN / "PR446_a_host_the_health_check_cannot_reach", f"{text}exit {done.returncode}\n")


def test_a_spare_down_at_the_start_and_up_again_when_needed_takes_the_lost_hosts_place(
        five: TestHosts, tmp_path: Path, link_down: list[str]) -> None:
    """
    h5 (the spare) is down while the run starts, then comes back; h3 is lost later: attempt 1 runs on h5.

    The ssh backend connects the spares at the start: a spare that did not answer then is tried
    again when it joins, never refused on that old failure alone.
    """
    link_down.append("h5")
    five.set_link("h5", up=False)
    proc = start(five, tmp_path, "--host", "h1,h2,h3,h4", "--spare-host", "h5", "--min-hosts", "3",
                 "--num-replicas", "4", "--max-restarts", "2", "--restart-backoff", "0.1", "sh", "-c", PROGRAM)
    await_ready(proc, 4)
    five.set_link("h5", up=True)
    assert wait_for(lambda: five.ssh("h5", "true", timeout=10).returncode == 0, within_s=20)
    link_down.append("h3")
    five.set_link("h3", up=False)
    out, err = proc.communicate(timeout=120)

    assert 0 == proc.returncode, err
    hosts = sorted(line.split()[6] for line in out.splitlines() if line.startswith("attempt 1:"))
    assert ["h1", "h2", "h4", "h5"] == hosts, (out, err)
    assert [(["h3"], ["h5"])] == [(e["removed"], e["added"]) for e in events(tmp_path) if e["event"] == "replan"]
