"""What backends offer beyond launch, reached through the registry: describe, formats, topology probes; the typed cache."""

import os
from pathlib import Path

import pytest

from poprun.backends.base import FormatRequest, TemporaryCache
from poprun.backends.conformance import MemorySink, probe_plan
from poprun.backends.local import LocalBackend
from poprun.backends.registry import BackendRegistry, default_registry, describe, find_format, topology_prober
from poprun.backends.testing import RecordingBackend
from poprun.core.record import evolve
from poprun.process.files import private_directory, remove_directories


def test_describe_gives_the_mpirun_command_only_for_an_mpirun_plan(tmp_path):
    """The mpirun backend describes its command; local has nothing to add; an unknown backend adds nothing."""
    registry = default_registry(environ={"POPRUN_NO_PLUGINS": "1"})
    mpirun_plan = probe_plan("pass", tmp_path, backend="mpirun")

    assert describe(registry, mpirun_plan).startswith("mpirun command: mpirun '--bind-to' 'none' '--tag-output' ")
    assert "" == describe(registry, probe_plan("pass", tmp_path, backend="local"))
    assert "" == describe(registry, probe_plan("pass", tmp_path, backend="no-such"))


def test_describe_masks_secret_values(tmp_path):
    """A set variable whose name looks secret is masked in the mpirun command."""
    plan = probe_plan("pass", tmp_path, backend="mpirun")
    instance = plan.instances[0]
    plan = evolve(plan, instances=(evolve(instance, env=evolve(instance.env, set=(("API_TOKEN", "hunter2"),))),))

    text = describe(default_registry(environ={"POPRUN_NO_PLUGINS": "1"}), plan)

    assert "'API_TOKEN=********'" in text and "hunter2" not in text


def test_find_format_gives_the_slurm_backends_batch_script(tmp_path):
    """--format sbatch is the slurm backend's; a name no backend offers is None."""
    registry = default_registry(environ={"POPRUN_NO_PLUGINS": "1"})
    view = find_format(registry, "sbatch")
    assert view is not None

    script = view(probe_plan("pass", tmp_path, backend="slurm"), FormatRequest(command=("poprun", "true"), hosts=("a",)))

    assert script.startswith("#!/bin/sh\n#SBATCH --job-name=poprun\n#SBATCH --nodes=1\n")
    assert "#SBATCH --nodelist=a\n" in script and script.endswith("exec poprun true\n")
    assert find_format(registry, "yaml") is None


def test_topology_prober_is_the_ssh_backends_and_none_without_one():
    """A registry without the backend gives no prober; one whose backend cannot probe answers each host with a reason."""
    assert topology_prober(BackendRegistry()) is None
    prober = topology_prober(BackendRegistry({"ssh": RecordingBackend}))
    assert prober is not None

    assert {"h1": "the ssh backend cannot read host topologies"} == dict(prober(("h1",), environ={}))
    assert topology_prober(default_registry(environ={"POPRUN_NO_PLUGINS": "1"})) is not None


@pytest.mark.e2e
def test_a_temporary_cache_made_here_is_removed_at_the_end(tmp_path):
    """The local backend removes the TemporaryCache it is given, when it was made here and is to be removed."""
    cache = private_directory("poprun-cache-")
    (Path(cache) / "compiled").write_text("x")
    launch = LocalBackend().launch(probe_plan("pass", tmp_path, backend="local"), env_source=dict(os.environ),
                                   sink=MemorySink(), cache=TemporaryCache(path=cache, remove_at_exit=True))

    assert 0 == launch.wait().status
    assert not Path(cache).exists()


@pytest.mark.e2e
@pytest.mark.parametrize("remove_at_exit", [True, False], ids=["to-remove", "to-keep"])
def test_a_cache_not_made_here_or_to_keep_is_never_removed(tmp_path, remove_at_exit):
    """A directory of the user's passed as the cache, or a cache to keep, survives the launch with its files."""
    mine = tmp_path / "poprun-cache-mine"
    mine.mkdir()
    (mine / "precious").write_text("keep")
    made = private_directory("poprun-cache-")
    for path in (str(mine), made):
        launch = LocalBackend().launch(probe_plan("pass", tmp_path, backend="local"), env_source=dict(os.environ),
                                       sink=MemorySink(), cache=TemporaryCache(path=path, remove_at_exit=remove_at_exit))
        launch.wait()

    kept = Path(made).is_dir()
    remove_directories([made])  # the test's own, made above

    assert "keep" == (mine / "precious").read_text()
    assert (not remove_at_exit) == kept


def test_this_machine_has_one_definition_for_the_planner_and_the_backends():
    """The planner's local names are core.localhost's, which the backends ask too: its short host name included."""
    from poprun.core.localhost import is_this_machine, local_names
    from poprun.planner.context import Context

    short = os.uname().nodename.split(".")[0]

    assert local_names() == Context.from_process().local_names
    assert all(is_this_machine(name) for name in ("localhost", "127.0.0.1", "::1", os.uname().nodename, short))
    assert not is_this_machine("pod-elsewhere-7")


def test_the_topology_probe_runs_ssh_with_the_launchs_own_options(tmp_path):
    """probe_topologies opens the host's connection through the launch's client: exactly the options a launch's ssh has (one option set)."""
    from poprun.backends.ssh.client import SshClient, ssh_options
    from poprun.backends.ssh.probe import probe_topologies

    fake = tmp_path / "ssh"
    fake.write_text(f'#!/bin/sh\nprintf "%s\\0" "$@" > {tmp_path}/argv\necho "ssh: no way" >&2\nexit 255\n')
    fake.chmod(0o755)
    client = SshClient(config="/etc/cfg", ssh=str(fake))
    try:
        found = probe_topologies(("h1",), environ={"POPRUN_SSH_CONFIG": "/etc/cfg"}, client=client)
        argv = (tmp_path / "argv").read_text().split("\0")[:-1]
    finally:
        client.close()

    assert {"h1": "ssh: no way"} == found
    assert ssh_options(config="/etc/cfg", ssh=str(fake))[1:] == argv[:len(ssh_options(config="/etc/cfg")) - 1]
    assert ["-f", "-N", "--", "h1"] == argv[-4:]


def test_a_host_whose_probe_answer_has_no_end_is_refused_not_read_into_memory(tmp_path):
    """A host that answers the topology probe with 64 MiB of device lines is cut at 8 MiB and has no topology."""
    from poprun.backends.ssh.client import SshClient
    from poprun.backends.ssh.probe import MAX_ANSWER, probe_topologies

    fake = tmp_path / "ssh"
    fake.write_text('#!/bin/sh\ncase "$*" in *" -N "*) exit 0 ;; esac\n'
                    'yes "pci 0000:1b:00.0 0x10de 0x030200 0x2330 0 -" | head -c 67108864\n')
    fake.chmod(0o755)
    client = SshClient(config="/etc/cfg", ssh=str(fake))
    try:
        found = probe_topologies(("h1",), environ={}, client=client, timeout_s=60)
    finally:
        client.close()

    assert {"h1": f"its answer was over {MAX_ANSWER >> 20} MiB (a topology is far less): not read"} == found


@pytest.mark.parametrize(("opened", "expected"), [("/dev/null", None), ("a file", 0), ("a pipe", 0), ("closed", None)])
def test_instance_0_reads_stdin_only_when_there_is_something_to_read(opened: str, expected: int | None,
                                                                     tmp_path: Path) -> None:
    """mpirun's rule: a file or a pipe is instance 0's; /dev/null and a closed stdin are nothing to copy to it."""
    from poprun.process.instance import forwarded_stdin

    saved = os.dup(0)
    try:
        if opened == "/dev/null":
            fd = os.open(os.devnull, os.O_RDONLY)
        elif opened == "a file":
            (tmp_path / "in").write_text("data")
            fd = os.open(tmp_path / "in", os.O_RDONLY)
        elif opened == "a pipe":
            fd, write_end = os.pipe()
            os.close(write_end)
        if opened == "closed":
            os.close(0)
        else:
            os.dup2(fd, 0)
            os.close(fd)

        found = forwarded_stdin()
    finally:
        os.dup2(saved, 0)
        os.close(saved)

    assert expected == found
