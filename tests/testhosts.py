"""
Emulated hosts for end-to-end tests: K network namespaces on this machine, each a real OpenSSH host.

Test support, stdlib only (it also runs as a script before the project is installed); it
imports nothing from ``poprun``. Host ``hN`` is a network namespace with a veth into one
bridge, its own address on a private ``10.77.X.0/24``, its own hostname (a UTS namespace)
and its own ``sshd`` on port 22, whose sessions do not read this machine's ``~/.bashrc`` (it is
bound to /dev/null in the host's own mount namespace: a heavy shell start-up here, such as
pyenv's rehash, whose lock a killed login leaves behind to stall every later one for 60 s, is
not the hosts'). A generated client key is authorised everywhere, and an
``ssh_config`` with strict host key checking names the hosts ``h1..hK``; mpirun and poprun's
ssh backend reach them through it (see :meth:`TestHosts.env`). Every name carries a random
tag, so two sessions on one machine never collide. All that :func:`up` creates is recorded
in the state directory, so :func:`down` can undo it from another process; and a guard
process that :func:`up` starts undoes it if the process that called :func:`up` dies
without calling :func:`down` (a SIGKILLed test). 64 hosts come up in about 2 s. Needs root,
``ip`` (iproute2), ``unshare`` (util-linux) and OpenSSH's ``sshd``, ``ssh`` and ``ssh-keygen``.

With ``decoy=True`` each host also has a second interface, as a multi-homed server has (a
docker bridge, a management network): ``aaa0``, one end of a veth pair inside the host, made
before ``eth0`` so that its name sorts first and its ifindex is lower, with an address of its
own subnet (``10.78.N.1/24`` on ``hN``) that no other host reaches; and the host's own name
resolves to that address in the host's view (its own ``/etc/hosts``, bound in its mount
namespace). That is what Gloo's default picks (it binds to the address the hostname resolves
to): without poprun's choice (or ``GLOO_SOCKET_IFNAME``) a torch job over two hosts fails.

With ``slurm=True`` the hosts also form a real Slurm cluster: a private ``munged`` (its own
key and socket in the state directory), a ``slurmctld`` here on a free port, and one
``slurmd`` per host (the cluster has ``TopologyPlugin=topology/tree`` and the ``topology.conf`` of
:func:`slurm_topology`), started in the host's network namespace with the host's name
(``nsenter --net``, not ``ip netns exec``, which remounts /sys and leaves slurmd without its
cgroup file system), each node with ``CPUs=2`` and a ``TmpFS`` of its own. Clients find it
through ``SLURM_CONF`` (:meth:`TestHosts.env`). Needs ``munged``, ``slurmctld``, ``slurmd``
and ``nsenter`` too (apt-get install munge slurmctld slurmd slurm-client).

    python tests/testhosts.py up --count 4 --state DIR [--slurm] [--decoy]   # prints `export ...` lines
    python tests/testhosts.py down --state DIR
    (``up`` here starts no guard: the hosts outlive the command until ``down``)
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import re
import secrets
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, ClassVar

SSHD = "/usr/sbin/sshd"
TOOLS = ("ip", "unshare", "ssh", "ssh-keygen")
SLURM_TOOLS = ("/usr/sbin/munged", "/usr/sbin/slurmctld", "/usr/sbin/slurmd", "/usr/bin/nsenter", "/usr/bin/sinfo")
RECORD = "testhosts.json"  # what up() created, for down()
DECOY, DECOY_PEER = "aaa0", "aaa1"  # the second interface of up(..., decoy=True), and its veth peer
FIRST_HOST = 10  # host hN gets 10.77.X.(FIRST_HOST + N); the bridge has .1
# MaxStartups: a launch opens many connections to one host at once; the default (10) drops some.
SSHD_CONFIG = """\
Port 22
ListenAddress {address}
HostKey {state}/host_{name}
PidFile {state}/sshd_{name}.pid
AuthorizedKeysFile {state}/authorized_keys
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
PermitRootLogin prohibit-password
StrictModes no
UsePAM no
MaxStartups 100
"""
# The Slurm cluster of the hosts (up(..., slurm=True)); {slurm} is the state's slurm/ folder.
SLURM_CONFIG = """\
ClusterName=poprun{tag}
SlurmctldHost={controller}({address})
SlurmctldPort={port}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={slurm}/munge.socket
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
TopologyPlugin=topology/tree
MpiDefault=none
ReturnToService=2
KillWait=5
InactiveLimit=0
PlugStackConfig={slurm}/plugstack.conf
StateSaveLocation={slurm}/ctld
SlurmctldPidFile={slurm}/slurmctld.pid
SlurmctldLogFile={slurm}/slurmctld.log
SlurmdSpoolDir={slurm}/spool-%n
SlurmdPidFile={slurm}/slurmd-%n.pid
SlurmdLogFile={slurm}/slurmd-%n.log
TmpFS={slurm}/tmp-%n
{nodes}
PartitionName=poprun Nodes=ALL Default=YES State=UP MaxTime=INFINITE
"""
# The cluster's network (topology.conf beside slurm.conf): two leaf switches under one spine, the hosts NOT in the
# names' order (the first leaf holds the second host), so that a topology rank order differs from the given and the
# natural ones: h2 | h1 h3 ... (rank order topology: h2, h1, h3, ...).
SLURM_TOPOLOGY = """\
# Written by tests/testhosts.py: two leaf switches under one spine.
SwitchName=leaf1 Nodes={first}
SwitchName=leaf2 Nodes={rest} LinkSpeed=100
SwitchName=spine Switches=leaf[1-2]
"""


def slurm_topology(names: tuple[str, ...]) -> str:
    """Return the test cluster's topology.conf: the second host alone under leaf1, the others under leaf2."""
    if len(names) < 2:
        return f"SwitchName=leaf1 Nodes={names[0]}\n"
    return SLURM_TOPOLOGY.format(first=names[1], rest=",".join((names[0], *names[2:])))
SSH_DEFAULTS = """\
Host *
  User root
  IdentityFile {state}/id_ed25519
  IdentitiesOnly yes
  BatchMode yes
  StrictHostKeyChecking yes
  UserKnownHostsFile {state}/known_hosts
  LogLevel ERROR
  ConnectTimeout 5
"""


class TestHostsUnavailable(RuntimeError):  # noqa: N818 - names the reason to skip, not a bug
    """This machine cannot host the test hosts (not root, or a tool is missing); the message says why."""

    __test__: ClassVar[bool] = False  # not a pytest test class


@dataclasses.dataclass(frozen=True)
class TestHosts:
    """Running test hosts: names, addresses and the files a client needs to reach them."""

    __test__: ClassVar[bool] = False  # not a pytest test class

    names: tuple[str, ...]  # ("h1", ..., "hK"), the ssh_config aliases and the hostnames
    addresses: dict[str, str]  # name -> address on ``subnet``
    namespaces: dict[str, str]  # name -> network namespace (``ip netns``)
    bridge: str  # the bridge in the root namespace; it has the subnet's .1
    subnet: str  # "10.77.X.0/24", on no other interface of this machine
    ssh_config: Path
    known_hosts: Path
    client_key: Path
    state: Path
    slurm_conf: Path | None = None  # the Slurm cluster's slurm.conf, when up(..., slurm=True)
    decoys: dict[str, str] = dataclasses.field(default_factory=dict)  # name -> its decoy's address (up(..., decoy=True))

    def env(self) -> dict[str, str]:
        """Return the environment variables that send poprun's ssh backend, mpirun and Slurm's clients to these hosts."""
        return {
            "POPRUN_SSH_CONFIG": str(self.ssh_config),
            "OMPI_MCA_plm_rsh_args": f"-F {self.ssh_config}",
            "OMPI_MCA_oob_tcp_if_include": self.subnet,
            "OMPI_MCA_btl_tcp_if_include": self.subnet,
            "OMPI_ALLOW_RUN_AS_ROOT": "1",
            "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
            **({"SLURM_CONF": str(self.slurm_conf)} if self.slurm_conf is not None else {}),
        }

    def ssh(self, name: str, command: str, *, timeout: float = 30) -> subprocess.CompletedProcess[str]:
        """Run the shell ``command`` on host ``name`` over ssh; return what it did (never raises on failure)."""
        return subprocess.run(["ssh", "-F", str(self.ssh_config), name, command],
                              capture_output=True, text=True, timeout=timeout, check=False, stdin=subprocess.DEVNULL)

    def set_link(self, name: str, *, up: bool) -> None:
        """Take host ``name``'s network link down (it stops answering; its processes run on) or bring it up again."""
        record = json.loads((self.state / RECORD).read_text())
        veth = next(host["veth"] for host in record["hosts"] if host["name"] == name)
        _ip("link", "set", veth, "up" if up else "down")

    def stop_sshd(self, name: str) -> None:
        """Kill every sshd of host ``name`` (its listener and the sessions' own): its connections end at once."""
        inode = _netns_inode(self.namespaces[name])
        for pid, (_, line) in _processes_in({inode} if inode else set()).items():
            if line.startswith(("sshd", SSHD)):
                _kill(pid)

    def start_sshd(self, name: str, *, timeout_s: float = 10.0) -> None:
        """Start host ``name``'s sshd again (after :meth:`stop_sshd`); return once it answers."""
        daemon = _sshd_command(self.state, name)
        subprocess.run(["ip", "netns", "exec", self.namespaces[name], "unshare", "--uts", "--mount", "sh", "-c",
                        daemon], stdin=subprocess.DEVNULL, capture_output=True, timeout=timeout_s, check=True)
        _wait_listening([self.addresses[name]], deadline=time.monotonic() + timeout_s)

    def processes(self, name: str, pattern: str) -> list[str]:
        """Return ``"PID COMMAND LINE"`` of each living process on host ``name`` whose command line matches ``pattern``."""
        inode = _netns_inode(self.namespaces[name])
        found = _processes_in({inode} if inode else set())
        return [f"{pid} {line}" for pid, (_, line) in sorted(found.items()) if re.search(pattern, line)]

    def kill_sessions(self, name: str) -> list[int]:
        """SIGKILL every process of host ``name`` but its listening sshd (its sessions, all they run); return the pids."""
        listener = int((self.state / f"sshd_{name}.pid").read_text())
        inode = _netns_inode(self.namespaces[name])
        killed = [pid for pid in _processes_in({inode} if inode else set()) if pid != listener]
        for pid in killed:
            _kill(pid)
        return killed


def up(count: int, state: Path, *, timeout_s: float = 10.0, slurm: bool = False, guard: bool = True,
       decoy: bool = False) -> TestHosts:
    """
    Start ``count`` hosts ``h1..hK``, keeping their files in ``state`` (made if missing); return them.

    Returns only once every host greets on its ssh port, the first and last answer
    ``hostname`` over ssh with their own names (and, with ``slurm``, once every host is an
    idle node of the cluster). Cleans up everything if it fails half-way. ``state`` belongs
    to the hosts: :func:`down` deletes it. With ``guard`` (the default), a small guard
    process takes the hosts down if this process dies without calling :func:`down`
    (a SIGKILLed test); the command line's ``up`` goes without one. With ``decoy``, each host
    gets the second interface the module describes.

    Raises:
        TestHostsUnavailable: not root, or a needed tool is missing.
        RuntimeError: a command failed, or a host did not come up within ``timeout_s``.
    """
    _check_machine(slurm=slurm)
    state = state.resolve()
    if not 1 <= count <= 200:
        raise ValueError(f"count must be 1 to 200, not {count}")
    if re.search(r"\s", str(state)):
        raise ValueError(f"the state directory's path must not contain white space: {state}")
    if (state / RECORD).exists():
        raise RuntimeError(f"{state} holds running test hosts already; call down() first")
    state.mkdir(parents=True, exist_ok=True)
    tag = secrets.token_hex(3)  # 6 hex digits: "ptb" + tag and "pt" + tag + "v" + N fit Linux's 15 characters
    names = tuple(f"h{i}" for i in range(1, count + 1))
    record = {"bridge": f"ptb{tag}", "slurm": slurm, "decoy": decoy, "hosts": [
        {"name": name, "netns": f"poprun-{tag}-{name}", "veth": f"pt{tag}v{name[1:]}"} for name in names]}
    (state / RECORD).write_text(json.dumps(record, indent=2))  # before anything exists, so down() always works
    if guard:
        _start_guard(state)
    try:
        hosts = _start(record, tag, state, timeout_s)
        if slurm:
            hosts = dataclasses.replace(hosts, slurm_conf=start_slurm(hosts, tag, timeout_s=max(timeout_s, 30)))
    except BaseException:
        down(state)
        raise
    return hosts


def down(state: Path) -> None:
    """Stop the hosts recorded in ``state`` and remove all they were: processes, namespaces, links, files. Idempotent."""
    state = state.resolve()
    try:
        _down(state)
    finally:
        _release_guard(state)


# state -> (the write end of the guard's pipe, the guard): only this process holds the write end.
_GUARDS: dict[Path, tuple[int, subprocess.Popen[bytes]]] = {}


def _start_guard(state: Path) -> None:
    """Start a process that calls down(state) once this one dies without having called it (see guard())."""
    read_end, write_end = os.pipe()  # not inheritable: no other child of ours holds the write end
    try:
        proc = subprocess.Popen([sys.executable, str(Path(__file__).resolve()), "guard", "--state", str(state),
                                 "--fd", str(read_end)], pass_fds=(read_end,), start_new_session=True,
                                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    except BaseException:
        os.close(write_end)
        raise
    finally:
        os.close(read_end)
    _GUARDS[state] = (write_end, proc)


def _release_guard(state: Path) -> None:
    """Tell the guard of ``state`` (if this process started one) that down() ran, and reap it."""
    write_end, proc = _GUARDS.pop(state, (-1, None))
    if proc is None:
        return
    with contextlib.suppress(OSError):
        os.write(write_end, b"x")
    os.close(write_end)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=5)


def guard(state: Path, fd: int) -> None:
    """
    Wait on the pipe ``fd`` whose write end only the process that called up(state) holds; take the hosts down if it died.

    That process writes a byte before it closes the pipe when it called :func:`down` itself;
    an end of the pipe without that byte means it died (SIGKILL, a crash) and left the hosts.
    """
    for number in (signal.SIGINT, signal.SIGHUP, signal.SIGPIPE):
        signal.signal(number, signal.SIG_IGN)  # the terminal's ^C is for the tests, not for the guard
    if os.read(fd, 1) == b"":
        _down(state.resolve())


def _down(state: Path) -> None:
    """Do what :func:`down` says."""
    try:
        record = json.loads((state / RECORD).read_text())
    except FileNotFoundError:
        return  # never up, or down already: a directory without the record is not ours to delete
    hosts = record["hosts"]
    if record.get("slurm"):
        stop_slurm(state)
    for host in hosts:
        with contextlib.suppress(OSError, ValueError):
            pid = int((state / f"sshd_{host['name']}.pid").read_text())
            if str(state / f"sshd_{host['name']}.conf").encode() in Path(f"/proc/{pid}/cmdline").read_bytes():
                _kill(pid)  # only ours: a stale pid file may name another process by now
    inodes = {inode for host in hosts if (inode := _netns_inode(host["netns"]))}
    deadline = time.monotonic() + 5
    while (left := _processes_in(inodes)) and time.monotonic() < deadline:
        for pid in left:
            _kill(pid)
        time.sleep(0.02)
    # Deleting the namespaces lets the kernel destroy their veths in one batch (a "link del" each costs a
    # network-wide synchronisation: 2 s at 64 hosts); wait until they are gone.
    _ip_batch([f"link del {record['bridge']}", *(f"netns del {host['netns']}" for host in hosts)], check=False)
    veths = {host["veth"] for host in hosts}
    deadline = time.monotonic() + 10
    while (gone_slowly := veths & _links()) and time.monotonic() < deadline:
        time.sleep(0.02)
    _ip_batch([f"link del {veth}" for veth in sorted(gone_slowly)], check=False)
    shutil.rmtree(state, ignore_errors=True)


def _start(record: dict[str, Any], tag: str, state: Path, timeout_s: float) -> TestHosts:
    """
    Create the bridge, the hosts and the client files of ``record``; return the running hosts.

    Built for 64 hosts and more on a busy machine: the links and namespaces are made by one
    ``ip -batch``, the keys are generated and the sshds started all at once (each host's
    shell sets up its own addresses), and only a sample of hosts is checked with a full ssh
    login (64 logins at once take seconds of CPU, and would themselves time out under load).
    """
    bridge, hosts = record["bridge"], record["hosts"]
    _ip("link", "add", bridge, "type", "bridge")
    prefix = _claim_subnet(bridge, start=int(tag, 16))
    names = tuple(host["name"] for host in hosts)
    addresses = {name: f"{prefix}.{FIRST_HOST + i}" for i, name in enumerate(names, start=1)}
    decoys = {name: f"10.78.{i}.1" for i, name in enumerate(names, start=1)} if record.get("decoy") else {}
    keys = [state / "id_ed25519", *(state / f"host_{name}" for name in names)]
    keygens = [subprocess.Popen(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", key.name, "-f", str(key)],
                                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
               for key in keys]
    _ip_batch([f"link set {bridge} up"]
              + [line for host in hosts for line in (
                  f"netns add {host['netns']}",
                  *([f"link add name {DECOY} netns {host['netns']} type veth peer name {DECOY_PEER} netns {host['netns']}"]
                    if record.get("decoy") else []),  # before eth0: its name sorts first, its ifindex is lower
                  f"link add {host['veth']} type veth peer name eth0 netns {host['netns']}",
                  f"link set {host['veth']} master {bridge} up")])
    _wait_all(keygens, "ssh-keygen", timeout_s)
    shutil.copyfile(state / "id_ed25519.pub", state / "authorized_keys")
    Path("/run/sshd").mkdir(parents=True, exist_ok=True)  # sshd's privilege separation directory
    starting = []
    for host in hosts:
        name, address = host["name"], addresses[host["name"]]
        config = state / f"sshd_{name}.conf"
        config.write_text(SSHD_CONFIG.format(address=address, state=state, name=name))
        links = f"addr add {address}/24 dev eth0\\nlink set eth0 up\\nlink set lo up\\n"
        hosts_file = ""
        if record.get("decoy"):
            decoy = decoys[name]
            links += f"addr add {decoy}/24 dev {DECOY}\\nlink set {DECOY} up\\nlink set {DECOY_PEER} up\\n"
            (state / f"hosts_{name}").write_text(f"127.0.0.1 localhost\n::1 localhost\n{decoy} {name}\n")
            hosts_file = f"mount --bind {shlex.quote(str(state / f'hosts_{name}'))} /etc/hosts && "
        daemon = f"printf '{links}' | ip -b - && {hosts_file}{_sshd_command(state, name)}"
        starting.append(subprocess.Popen(["ip", "netns", "exec", host["netns"], "unshare", "--uts", "--mount", "sh", "-c",
                                          daemon],
                                         stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE))
    _write_client_files(state, addresses)
    _wait_all(starting, "sshd", timeout_s)  # sshd forks into the background once it listens
    hosts_up = TestHosts(names=names, addresses=addresses, bridge=bridge, subnet=f"{prefix}.0/24",
                         namespaces={host["name"]: host["netns"] for host in hosts}, ssh_config=state / "ssh_config",
                         known_hosts=state / "known_hosts", client_key=state / "id_ed25519", state=state,
                         decoys=decoys)
    _wait_listening(list(addresses.values()), deadline=time.monotonic() + timeout_s)
    _verify(hosts_up, timeout_s)
    return hosts_up


def _sshd_command(state: Path, name: str) -> str:
    """Return the shell command that names the host ``name`` and becomes its sshd (it fails if the name cannot be set)."""
    config, log = shlex.quote(str(state / f"sshd_{name}.conf")), shlex.quote(str(state / f"sshd_{name}.log"))
    # the host's sessions do not read this machine's ~/.bashrc (bound to /dev/null in the host's own mount namespace)
    mask = '{ [ ! -f "$HOME/.bashrc" ] || mount --bind /dev/null "$HOME/.bashrc"; }'
    return f"{mask} && hostname {name} && exec {SSHD} -f {config} -E {log}"


def _wait_all(procs: list[subprocess.Popen[bytes]], what: str, timeout_s: float) -> None:
    """Wait for every process of ``procs``; raise RuntimeError naming ``what`` if one failed."""
    for proc in procs:
        _, err = proc.communicate(timeout=timeout_s)
        if proc.returncode:
            raise RuntimeError(f"{what} failed (exit {proc.returncode}): {err.decode(errors='replace').strip()}")


def _claim_subnet(bridge: str, *, start: int) -> str:
    """
    Give ``bridge`` the .1 of a 10.77.X.0/24 that no other interface or route uses; return "10.77.X".

    X starts from ``start`` (the random tag), so concurrent sessions rarely try the same X; if
    one did in the same instant, both see the clash after adding the address, and move on.
    """
    for step in range(254):
        prefix = f"10.77.{(start + step) % 254 + 1}"
        if _subnet_in_use(prefix):
            continue
        _ip("addr", "add", f"{prefix}.1/24", "dev", bridge)
        if not _subnet_in_use(prefix, besides=bridge):
            return prefix
        _ip("addr", "del", f"{prefix}.1/24", "dev", bridge, check=False)
    raise RuntimeError("every 10.77.X.0/24 is in use on this machine")


def _subnet_in_use(prefix: str, *, besides: str = "") -> bool:
    """Return whether an address or route in ``prefix``.0/24 exists, on another interface than ``besides``."""
    lines = _ip("-o", "-4", "addr", "show").splitlines() + _ip("-4", "route", "show").splitlines()
    mine = re.compile(rf"(^\d+: {re.escape(besides)}\s)|(\sdev {re.escape(besides)}\s)") if besides else None
    return any(f" {prefix}." in f" {line}" and not (mine and mine.search(f"{line} ")) for line in lines)


def _write_client_files(state: Path, addresses: dict[str, str]) -> None:
    """Write ``ssh_config`` (aliases and the strict client options) and ``known_hosts`` (each host's real key)."""
    aliases = "".join(f"Host {name}\n  HostName {address}\n" for name, address in addresses.items())
    (state / "ssh_config").write_text(aliases + SSH_DEFAULTS.format(state=state))
    keys = [(name, address, (state / f"host_{name}.pub").read_text().split()[:2]) for name, address in addresses.items()]
    (state / "known_hosts").write_text("".join(f"{name},{address} {kind} {key}\n" for name, address, (kind, key) in keys))


def _wait_listening(addresses: list[str], *, deadline: float) -> None:
    """Return once the sshd of every ``address`` greets on port 22 ("SSH-2.0-..."); raise RuntimeError at ``deadline``."""
    waiting = list(addresses)
    while waiting:
        address = waiting[0]
        if _greets(address, timeout_s=max(0.2, deadline - time.monotonic())):
            waiting.pop(0)
        elif time.monotonic() > deadline:
            raise RuntimeError(f"sshd on {address}:22 did not answer in time")
        else:
            time.sleep(0.01)


def _greets(address: str, *, timeout_s: float) -> bool:
    """Return whether an ssh server at ``address``:22 sends its greeting within ``timeout_s``."""
    try:
        with socket.create_connection((address, 22), timeout=min(1, timeout_s)) as conn:
            conn.settimeout(timeout_s)
            return conn.recv(8).startswith(b"SSH-")
    except OSError:
        return False


def _verify(hosts: TestHosts, timeout_s: float) -> None:
    """
    Check that the first and last host answer ``hostname`` over ssh with their own names.

    Every host was made alike and greeted already (:func:`_wait_listening`), and its shell
    set its name before it became sshd; the logins show that the keys, known_hosts and
    ssh_config work. A login to every host would cost seconds at 64 hosts.
    """
    sample = sorted({hosts.names[0], hosts.names[-1]})
    calls = {name: subprocess.Popen(["ssh", "-F", str(hosts.ssh_config), "-o", f"ConnectTimeout={int(timeout_s)}",
                                     name, "hostname"],
                                    stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for name in sample}
    for name, proc in calls.items():
        out, err = proc.communicate(timeout=timeout_s + 5)
        if (proc.returncode, out.strip()) != (0, name):
            raise RuntimeError(f"ssh {name} hostname gave exit {proc.returncode}, {out.strip()!r}: {err.strip()}")


def start_slurm(hosts: TestHosts, tag: str, *, timeout_s: float) -> Path:
    """
    Start munged, slurmctld and a slurmd on every host, for ``hosts``; return the slurm.conf.

    Returns once every host is an idle node. Everything it starts writes its pid file under
    ``state/slurm``, where :func:`stop_slurm` finds it.
    """
    folder = hosts.state / "slurm"
    folder.mkdir(mode=0o700)
    (folder / "ctld").mkdir()
    for name in hosts.names:
        (folder / f"tmp-{name}").mkdir()
    key = folder / "munge.key"
    key.write_bytes(secrets.token_bytes(1024))
    key.chmod(0o600)
    _run("/usr/sbin/munged", "--force", f"--socket={folder}/munge.socket", f"--key-file={key}",
         f"--pid-file={folder}/munged.pid", f"--log-file={folder}/munged.log", f"--seed-file={folder}/munged.seed")
    (folder / "plugstack.conf").write_text("")
    nodes = "\n".join(f"NodeName={name} NodeAddr={address} CPUs=2 State=UNKNOWN"
                      for name, address in hosts.addresses.items())
    (folder / "topology.conf").write_text(slurm_topology(hosts.names))
    conf = folder / "slurm.conf"
    conf.write_text(SLURM_CONFIG.format(tag=tag, controller=socket.gethostname().split(".")[0], port=_free_port(),
                                        address=hosts.subnet.rsplit(".", 1)[0] + ".1", slurm=folder, nodes=nodes))
    _run("/usr/sbin/slurmctld", "-f", str(conf))
    for name, netns in hosts.namespaces.items():
        _run("nsenter", f"--net=/run/netns/{netns}", "unshare", "--uts", "sh", "-c",
             f"hostname {name}; exec /usr/sbin/slurmd -f {shlex.quote(str(conf))}")
    _wait_idle(conf, len(hosts.names), deadline=time.monotonic() + timeout_s)
    return conf


def stop_slurm(state: Path) -> None:
    """Kill the munged, slurmctld and slurmds that :func:`start_slurm` started for ``state`` (by their pid files)."""
    folder = state / "slurm"
    for pid_file in sorted(folder.glob("*.pid")):
        with contextlib.suppress(OSError, ValueError):
            pid = int(pid_file.read_text())
            if str(folder).encode() in Path(f"/proc/{pid}/cmdline").read_bytes():
                _kill(pid)  # only ours: its command line names our configuration or socket


def _run(*argv: str) -> None:
    """Run a daemon's start command (it forks into the background); raise RuntimeError if it fails."""
    done = subprocess.run(argv, capture_output=True, text=True, check=False, stdin=subprocess.DEVNULL, timeout=30)
    if done.returncode:
        raise RuntimeError(f"{' '.join(argv)}: exit {done.returncode}: {done.stderr.strip()}")


def _free_port() -> int:
    """Return a TCP port that nothing listens on now (for slurmctld, so that two clusters never share one)."""
    with socket.socket() as probe:
        probe.bind(("", 0))
        return int(probe.getsockname()[1])


def _wait_idle(conf: Path, count: int, *, deadline: float) -> None:
    """Return once ``count`` nodes of the cluster of ``conf`` are idle; raise RuntimeError at ``deadline``."""
    env = os.environ | {"SLURM_CONF": str(conf)}
    states = ""
    while time.monotonic() < deadline:
        done = subprocess.run(["sinfo", "-h", "-N", "-o", "%N %T"], capture_output=True, text=True, env=env,
                              check=False, timeout=30)
        states = done.stdout.strip() or done.stderr.strip()
        if done.returncode == 0 and [line.split()[1] for line in states.splitlines()] == ["idle"] * count:
            return
        time.sleep(0.1)
    raise RuntimeError(f"the Slurm nodes did not become idle in time: {states}")


def _check_machine(*, slurm: bool = False) -> None:
    """Raise TestHostsUnavailable unless this process is root and every tool is installed."""
    if os.geteuid() != 0:
        raise TestHostsUnavailable("test hosts need root (network namespaces and sshd on port 22)")
    missing = [tool for tool in TOOLS if shutil.which(tool) is None] + [SSHD] * (not os.access(SSHD, os.X_OK))
    if missing:
        raise TestHostsUnavailable(f"test hosts need {', '.join(missing)} (apt-get install iproute2 util-linux "
                                   "openssh-server openssh-client)")
    if slurm and (absent := [tool for tool in SLURM_TOOLS if not os.access(tool, os.X_OK)]):
            raise TestHostsUnavailable(f"a Slurm cluster needs {', '.join(absent)} (apt-get install munge "
                                       "slurmctld slurmd slurm-client)")


def _ip(*args: str, check: bool = True) -> str:
    """Run ``ip ARGS``; return its output. Raise RuntimeError with its message if it fails and ``check``."""
    done = subprocess.run(["ip", *args], capture_output=True, text=True, check=False)
    if check and done.returncode:
        raise RuntimeError(f"ip {' '.join(args)}: {done.stderr.strip()}")
    return done.stdout


def _ip_batch(lines: list[str], *, check: bool = True) -> None:
    """
    Run ``ip`` commands (one per line, without the leading ``ip``) in one ``ip -batch``.

    Raise RuntimeError with its message if one fails and ``check``; without ``check``, go on past failures.
    """
    done = subprocess.run(["ip", *(["-force"] if not check else []), "-batch", "-"], input="".join(f"{line}\n" for line in lines),
                          capture_output=True, text=True, check=False)
    if check and done.returncode:
        raise RuntimeError(f"ip -batch: {done.stderr.strip()}")


def _links() -> set[str]:
    """Return the names of the network interfaces of this network namespace."""
    return {line.split(":", 2)[1].strip().split("@")[0] for line in _ip("-o", "link", "show").splitlines()}


def _netns_inode(netns: str) -> int:
    """Return the inode of network namespace ``netns`` (as in ``/proc/PID/ns/net``), or 0 if it is gone."""
    try:
        return Path("/run/netns", netns).stat().st_ino
    except OSError:
        return 0


def _processes_in(inodes: set[int]) -> dict[int, tuple[int, str]]:
    """Return {pid: (netns inode, command line)} of every living process (not a zombie) in one of ``inodes``."""
    found = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            inode = Path(entry.path, "ns", "net").stat().st_ino
            if inode not in inodes or Path(entry.path, "stat").read_bytes().rsplit(b")", 1)[1].split()[0] == b"Z":
                continue
            line = Path(entry.path, "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
        except (OSError, IndexError):
            continue  # gone meanwhile
        found[int(entry.name)] = (inode, line)
    return found


def _kill(pid: int) -> None:
    """SIGKILL ``pid`` and reap it if it is this process's child (we may be a subreaper)."""
    with contextlib.suppress(OSError):
        os.kill(pid, signal.SIGKILL)
    with contextlib.suppress(OSError):
        os.waitpid(pid, os.WNOHANG)


def main(argv: list[str] | None = None) -> int:
    """Run the command line: ``up --count K --state DIR`` (prints ``export`` lines) or ``down --state DIR``."""
    parser = argparse.ArgumentParser(prog="testhosts.py", description=__doc__.split("\n\n")[0].strip())
    parser.add_argument("action", choices=["up", "down", "guard"])  # guard: only up() starts it
    parser.add_argument("--count", type=int, default=4, help="how many hosts (h1..hK)")
    parser.add_argument("--state", type=Path, required=True, help="directory for the hosts' files; down deletes it")
    parser.add_argument("--slurm", action="store_true", help="also run a Slurm cluster of the hosts (SLURM_CONF)")
    parser.add_argument("--decoy", action="store_true", help="give each host a second interface first in order "
                        "that no other host reaches (its name resolves to it there)")
    parser.add_argument("--fd", type=int, default=-1, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.action == "guard":
        guard(args.state, args.fd)
        return 0
    if args.action == "down":
        down(args.state)
        return 0
    try:
        hosts = up(args.count, args.state, slurm=args.slurm, guard=False, decoy=args.decoy)  # they outlive this command
    except TestHostsUnavailable as exc:
        sys.stderr.write(f"testhosts: {exc}\n")
        return 2
    exports = "".join(f"export {key}={shlex.quote(value)}\n" for key, value in hosts.env().items())
    listing = " ".join(f"{name}={address}" for name, address in hosts.addresses.items())
    sys.stdout.write(f"{exports}# ssh_config: {hosts.ssh_config}\n# hosts: {listing}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
