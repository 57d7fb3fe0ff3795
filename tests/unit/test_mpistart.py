"""mpirun's settings for a launch (keepalives appended, the user's values kept) and the relay's greeting rules."""

from __future__ import annotations

import contextlib
import selectors
import shutil
import socket
import threading
from pathlib import Path

import pytest

from poprun.backends.conformance import probe_plan
from poprun.backends.mpirun.mpirelay import Relay
from poprun.backends.mpirun.mpistart import greets, host_timeout, mpirun_settings, ssh_host_named, startup_failure
from poprun.core.diagnostic import DiagnosticError
from poprun.core.record import evolve
from poprun.planner.plan import BackendSetting

SSH_15 = "-o ServerAliveInterval=5 -o ServerAliveCountMax=2 -o ConnectTimeout=15"


def test_ssh_keepalives_are_appended_to_the_users_plm_rsh_args_from_the_environment() -> None:
    """OMPI_MCA_plm_rsh_args=-F cfg: the ssh options come after the user's (ssh keeps the first value given)."""
    settings = mpirun_settings((), {"OMPI_MCA_plm_rsh_args": "-F cfg"})

    assert f"-F cfg {SSH_15}" == settings.env["OMPI_MCA_plm_rsh_args"]
    assert {"OMPI_MCA_oob_tcp_keepalive_time": "5", "OMPI_MCA_oob_tcp_keepalive_intvl": "5",
            "OMPI_MCA_oob_tcp_keepalive_probes": "2"} == {k: v for k, v in settings.env.items() if "keepalive" in k}


def test_plm_rsh_args_on_the_command_line_get_the_options_there() -> None:
    """--mca plm_rsh_args in --mpi-global-args: appended there (the command line beats the environment)."""
    settings = mpirun_settings(("--mca", "plm_rsh_args", "-p 2222", "--oversubscribe"), {})

    assert ("--mca", "plm_rsh_args", f"-p 2222 {SSH_15}", "--oversubscribe") == settings.global_args
    assert "OMPI_MCA_plm_rsh_args" not in settings.env


@pytest.mark.parametrize(("args", "environ"), [
    (("--mca", "oob_tcp_keepalive_time", "60"), {}),
    ((), {"OMPI_MCA_oob_tcp_keepalive_time": "60"}),
])
def test_the_users_keepalive_stands(args: tuple[str, ...], environ: dict[str, str]) -> None:
    """A keepalive MCA parameter the user set (command line or environment) is not set again."""
    assert "OMPI_MCA_oob_tcp_keepalive_time" not in mpirun_settings(args, environ).env


def test_an_agent_other_than_ssh_gets_no_ssh_options() -> None:
    """plm_rsh_agent=rsh: ssh's -o options would break it; none are added."""
    assert "OMPI_MCA_plm_rsh_args" not in mpirun_settings((), {"OMPI_MCA_plm_rsh_agent": "rsh"}).env


def test_output_filename_is_left_to_poprun_and_merge_is_seen() -> None:
    """--output-filename (both spellings) is taken out (the router writes the files); --merge-stderr-to-stdout noted."""
    settings = mpirun_settings(("--output-filename", "out", "--output-filename=o2", "--merge-stderr-to-stdout"), {})

    assert ("--merge-stderr-to-stdout",) == settings.global_args
    assert settings.merge


@pytest.mark.parametrize(("settings", "expected"), [
    ((BackendSetting(name="POPRUN_HOST_TIMEOUT", value="30", source="environment variable POPRUN_HOST_TIMEOUT"),), 30.0),
    ((BackendSetting(name="POPRUN_HOST_TIMEOUT", value="15", source="default"),), 15.0),
    ((), 15.0),
])
def test_host_timeout_is_the_plans_or_15(settings: tuple[BackendSetting, ...], expected: float) -> None:
    """POPRUN_HOST_TIMEOUT as the plan recorded it (the solver checked it); a plan without it: the default."""
    plan = probe_plan("pass", Path("/tmp"), backend="mpirun")
    plan = evolve(plan, backend=evolve(plan.backend, settings=settings))

    assert expected == host_timeout(plan)


def test_a_bad_host_timeout_is_refused_when_planning_not_at_launch() -> None:
    """POPRUN_HOST_TIMEOUT=x with the mpirun backend is PR225 from the solver (the backend never reads the shell)."""
    from poprun.planner.context import Context
    from poprun.planner.flags import parse_flags
    from poprun.planner.solve import solve

    spec = parse_flags(["--backend", "mpirun", "--num-instances", "2", "--num-replicas", "2", "true"], environ={}).spec
    with pytest.raises(DiagnosticError) as raised:
        solve(spec, Context(environ={"POPRUN_HOST_TIMEOUT": "x"}))

    assert ["PR225"] == [d.code for d in raised.value.diagnostics]


def greet(relay: Relay, greeting: bytes) -> bytes:
    """Connect to ``relay``, say ``greeting``; return what poprun answers before closing (b"" for nothing)."""
    fed: list[tuple[int, str, bytes]] = []
    with selectors.DefaultSelector() as selector, socket.create_connection(("127.0.0.1", relay.port)) as client:
        relay.attach(selector, lambda fd: relay.ready(fd, feed=lambda i, s, d: fed.append((i, s, d)),
                                                      end=lambda *_: None, lost=lambda _: None))
        client.sendall(greeting)
        client.settimeout(5)
        answer = b""
        while not answer:
            for key, _ in selector.select(0.1):
                key.data(key.fd)
            try:
                client.settimeout(0.05)
                answer = client.recv(1) or b"closed"
            except TimeoutError:
                continue
        relay.close(lambda *_: None)
    return answer


@pytest.mark.parametrize(("greeting", "answer"), [
    (b"{token} 1 stdout\n", b"k"),
    (b"wrong 1 stdout\n", b"closed"),
    (b"{token} 2 stdout\n", b"closed"),  # no instance 2 of 2
    (b"{token} 1 stdin\n", b"closed"),
    (b"{token} 1\n", b"closed"),
])
def test_only_a_wrapper_with_the_token_naming_an_instance_is_acknowledged(greeting: bytes, answer: bytes) -> None:
    """A greeting without the launch's token, or naming no instance and stream, is closed unanswered."""
    relay = Relay(count=2, remote=False, keepalive_s=15)

    assert answer == greet(relay, greeting.replace(b"{token}", relay.token.encode()))


@pytest.mark.skipif(shutil.which("ssh") is None, reason="no ssh client")
def test_an_address_that_ssh_printed_is_told_as_the_host_ssh_config_names(tmp_path: Path) -> None:
    """ssh says "Connection to 10.1.2.3 closed": with mpirun's ssh options (-F cfg), that is host h9."""
    config = tmp_path / "ssh_config"
    config.write_text("Host h8\n  HostName 10.1.2.2\nHost h9\n  HostName 10.1.2.3\n")

    assert "h9" == ssh_host_named("10.1.2.3", ["h8", "h9"], f"-F {config} -o ServerAliveInterval=5")
    assert "10.9.9.9" == ssh_host_named("10.9.9.9", ["h8", "h9"], f"-F {config}")


def test_a_host_mpirun_could_not_start_on_is_named_by_ssh_not_by_mpiruns_setpgid_warning() -> None:
    """mpirun's own setpgid warning ("Permission denied(13)") comes first: PR422 names h2 (by its address, mapped), from ssh's words."""
    from tests.unit.test_mpicommand import plan_of

    plan = plan_of("--host", "h1,h2,h3", "--num-instances", "3", "--num-replicas", "3")
    text = ("[vm:18986] plm:rsh: Warning: setpgid(18997,18997) failed in parent with errno=Permission denied(13)\n"
            "ssh: connect to host 10.77.72.12 port 22: Connection refused\n"
            "--------------------------------------------------------------------------\n"
            "ORTE was unable to reliably start one or more daemons.\n")

    found = startup_failure(text, 255, plan, named={"10.77.72.12": "h2"}.get)

    assert ("PR422", "mpirun could not start on host h2", "ssh: connect to host 10.77.72.12 port 22: Connection refused") \
        == (found.code, found.summary, found.detail)


@pytest.mark.skipif(shutil.which("ssh") is None, reason="needs OpenSSH's ssh -G")
@pytest.mark.parametrize(("greeting", "expected"), [(b"SSH-2.0-OpenSSH_9.2\r\n", True), (None, False)])
def test_a_host_greets_only_when_its_server_sends_the_ssh_line(greeting: bytes | None, expected: bool) -> None:
    """A server that sends "SSH-..." greets; one that accepts and says nothing (hung) does not, within the time given."""
    with socket.create_server(("127.0.0.1", 0)) as server:
        port = server.getsockname()[1]
        server.settimeout(5)
        def answer() -> None:
            conn, _ = server.accept()
            with conn, contextlib.suppress(OSError):  # the client goes when it has seen enough (a reset)
                if greeting is not None:
                    conn.sendall(greeting)
                conn.recv(1)  # held open until the client goes

        thread = threading.Thread(target=answer, daemon=True)
        thread.start()
        assert expected is greets("hung-or-not", f"-o Hostname=127.0.0.1 -o Port={port}", timeout_s=1.5)
        thread.join(5)


def test_a_host_whose_port_is_closed_does_not_greet() -> None:
    """Nothing listens there: no greeting."""
    with socket.create_server(("127.0.0.1", 0)) as server:
        port = server.getsockname()[1]
    assert not greets("gone", f"-o Hostname=127.0.0.1 -o Port={port}", timeout_s=1.5)
