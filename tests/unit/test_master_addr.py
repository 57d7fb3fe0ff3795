"""MASTER_ADDR: an address of instance 0's host that every instance can reach, with the reason explained."""

import pytest

from poprun.core.record import evolve
from poprun.planner import address
from poprun.planner.context import Context
from poprun.planner.flags import parse_flags
from poprun.planner.solve import Solution, solve

MAPPED = {"pod1": "10.1.0.1", "pod2": "10.1.0.2", "alias": "pod1.example.com"}
CTX = Context(environ={"PATH": "/usr/bin"}, cwd="/work", local_names=("127.0.0.1", "::1", "localhost", "me"),
              ssh_hostname=lambda name, _env: MAPPED.get(name, name))


def plan_of(*argv: str, ctx: Context = CTX) -> Solution:
    return solve(parse_flags([*argv, "--num-replicas=2", "python3", "train.py"]).spec, ctx)


def master_addr(solution: Solution) -> tuple[str, str | None]:
    """Return every instance's MASTER_ADDR (all equal) and the master_addr decision's reason, if any."""
    values = {instance.env.as_dict()["MASTER_ADDR"] for instance in solution.plan.instances}
    assert 1 == len(values)
    reasons = [d.reason for d in solution.plan.explanation if d.key == "master_addr"]
    return values.pop(), (reasons[0] if reasons else None)


@pytest.mark.parametrize(("argv", "expected"), [
    (["--host=pod1,pod2", "--offline-mode=1"],
     ("localhost", ("offline mode: every instance runs on this machine, so instance 0 is reached at localhost "
                    "(not at pod1)"))),
    (["--host=pod1,pod2", "--backend=local"],
     ("localhost", ("the local backend runs every instance on this machine, so instance 0 is reached at "
                    "localhost (not at pod1)"))),
    (["--host=pod1", "--num-instances=2"],
     ("localhost", "every instance runs on pod1, so instance 0 is reached at localhost (not at pod1)")),
    (["--num-instances=2"], ("localhost", None)),
    (["--host=127.0.0.1", "--num-instances=2"], ("127.0.0.1", None)),
    (["--host=localhost,pod2"],
     ("me", "instance 0 runs on this machine (localhost); the other hosts reach it by its name")),
    (["--host=pod1,pod2"], ("10.1.0.1", "instance 0's host pod1 as ssh reaches it (ssh_config: HostName 10.1.0.1)")),
    (["--host=pod1,pod2", "--backend=mpirun"],
     ("10.1.0.1", "instance 0's host pod1 as ssh reaches it (ssh_config: HostName 10.1.0.1)")),
    (["--host=pod1,pod2", "--backend=slurm"],
     ("pod1", "instance 0's node pod1; its address in Slurm (NodeAddr) is read when launching")),
    (["--host=pod3,pod4"], ("pod3", None)),
    (["--host=10.2.0.1,10.2.0.2"], ("10.2.0.1", None)),
], ids=["offline", "local backend", "one remote host", "this machine", "loopback as written", "this machine first",
        "ssh_config alias", "mpirun through ssh", "slurm when planning", "unmapped name", "addresses"])
def test_master_addr_is_reachable_from_every_instance(argv, expected):
    """Each launch gets the address its instances reach instance 0 at; one that is not the first host is explained."""
    assert expected == master_addr(plan_of(*argv))


def test_a_users_master_addr_wins():
    """-x MASTER_ADDR=... is the address, whatever poprun would have chosen."""
    solution = plan_of("--host=pod1,pod2", "--offline-mode=1", "--mpi-local-args=-x MASTER_ADDR=10.9.9.9")

    assert ("10.9.9.9", None) == master_addr(solution)


SLURM = evolve(CTX, slurm_node_address=lambda name, _env: {"pod1": "10.5.0.1"}.get(name),
               environ={"PATH": "/usr/bin", "SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "pod[1-2]"})


@pytest.mark.parametrize("argv", [[], ["--backend=mpirun"]], ids=["slurm", "mpirun through srun"])
def test_a_launch_in_slurm_meets_at_the_nodes_address(argv):
    """Launching in an allocation, instance 0's node is reached at Slurm's NodeAddr (not through ssh_config)."""
    assert ("10.5.0.1", "instance 0's host pod1 as Slurm reaches it (NodeAddr 10.5.0.1)") == master_addr(
        plan_of(*argv, ctx=SLURM))


def codes(solution: Solution) -> list[str]:
    return [w.code for w in solution.warnings]


def test_a_name_that_does_not_resolve_at_a_launch_is_pr309():
    """At a launch (a resolver in the context), an unmapped first host that does not resolve here is PR309."""
    ctx = evolve(CTX, resolves=lambda name: name == "pod4")
    solution = plan_of("--host=pod3,pod4", ctx=ctx)

    assert ["PR309"] == codes(solution)
    assert ("give --host the address of pod3, map pod3 to its address with HostName in ssh_config "
            "(POPRUN_SSH_CONFIG names the file), or set it with -x MASTER_ADDR=ADDRESS") == solution.warnings[0].hint
    assert "slurm" not in solution.warnings[0].hint


def test_pr309_in_slurm_does_not_point_at_ssh_config():
    """A node whose NodeAddr Slurm did not give and that does not resolve: PR309 without the ssh_config advice."""
    ctx = evolve(SLURM, slurm_node_address=lambda _name, _env: None, resolves=lambda _name: False)
    solution = plan_of(ctx=ctx)

    assert ["PR309"] == codes(solution)
    assert "give --host the address of pod1, or set it with -x MASTER_ADDR=ADDRESS" == solution.warnings[0].hint


@pytest.mark.parametrize(("argv", "resolves"), [
    (["--host=pod3,pod4"], None),
    (["--host=pod3,pod4"], lambda _name: None),
    (["--host=pod1,pod2"], lambda _name: False),
    (["--host=alias,pod2"], lambda name: name == "pod1.example.com"),
    (["--host=pod3,pod4", "--offline-mode=1"], lambda _name: False),
    (["--host=pod3,pod4", "--mpi-local-args=-x MASTER_ADDR"], lambda _name: False),
], ids=["planning only", "resolver gave no answer", "mapped to an address", "mapped to a name that resolves",
        "offline", "user's MASTER_ADDR"])
def test_pr309_only_when_the_address_is_known_not_to_resolve(argv, resolves):
    """No PR309 when planning, when DNS did not answer, for addresses and resolving names, offline, or -x MASTER_ADDR."""
    assert [] == codes(plan_of(*argv, ctx=evolve(CTX, resolves=resolves)))


def test_ssh_hostname_reads_ssh_config_without_connecting(tmp_path):
    """``ssh -G`` with POPRUN_SSH_CONFIG gives the HostName of an alias, and the name itself when unmapped."""
    config = tmp_path / "ssh_config"
    config.write_text("Host h1\n  HostName 10.77.0.11\nHost *\n  ConnectTimeout 1\n")
    environ = {"POPRUN_SSH_CONFIG": str(config)}

    assert ("10.77.0.11", "pod9") == (address.ssh_hostname("h1", environ), address.ssh_hostname("pod9", environ))
    assert address.ssh_hostname("h1", {"POPRUN_SSH_CONFIG": str(tmp_path / "missing")}) is None


def test_slurm_node_address_is_none_without_slurm(monkeypatch):
    """Without scontrol (or a controller that answers), there is no NodeAddr, and the node name stays."""
    monkeypatch.setenv("PATH", "/nonexistent")

    assert address.slurm_node_address("h1", {"PATH": "/nonexistent"}) is None


def test_resolves_answers_for_this_machine():
    """``resolves`` is True for localhost and not True for a reserved name that cannot exist."""
    assert address.resolves("localhost") is True
    assert address.resolves("no-such-host.invalid") is not True


def test_without_ssh_there_is_no_mapping(monkeypatch):
    """Without ssh on PATH there is no mapping (None), and planning goes on with the name."""
    monkeypatch.setenv("PATH", "/nonexistent")

    assert address.ssh_hostname("h1", {}) is None
