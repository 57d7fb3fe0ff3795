"""
The ``ssh`` backend: instances on other hosts through the OpenSSH client, those on this machine as children.

Layer: ``poprun.backends``; imports :mod:`poprun.backends.base`, :mod:`poprun.process`,
the ssh backend's other modules (:mod:`.client`, :mod:`.remote`, :mod:`.preflight`,
:mod:`.running`; none of them imports this one) and ``poprun.planner.plan``; never the spec,
never another backend. Needs ``ssh`` here and a POSIX login shell, ``sh`` and
``setsid`` (util-linux) on the hosts.

The client runs non-interactively (``BatchMode``), with a connect timeout, and with one
multiplexed connection per host (``ControlMaster``) that every instance of that host reuses
(:class:`~.client.SshClient`); ``POPRUN_SSH_CONFIG`` names an ``ssh_config`` file to use (``-F``), else
the user's own is. Before anything starts, every host is checked in parallel: each instance's
session first runs a check and waits for poprun's "G" (:mod:`.preflight`), sent only when
every host passed. A host whose name is unknown (PR405), that cannot be reached (PR406),
whose host key is not trusted (PR407), that refuses the key (PR408), or that lacks the working
directory, the program or its interpreter (PR409) is reported, each with the seed's advice
(section 2.2.1), within :data:`~.preflight.PREFLIGHT_S` seconds, never a hang. With ``--distribute-ssh-key``
the key is copied to every host first (:mod:`poprun.backends.ssh.sshkey`).

Each remote instance runs in the plan's working directory (section 2.2.4: the same on every
host) with the host's login environment minus ``env.unset``, plus the forwarded variables
with their values here, plus ``env.set``: every value is single-quoted for the remote shell,
so quotes, spaces, ``$(...)``, backticks, newlines and any Unicode arrive unchanged.

Teardown (:mod:`.remote`, :mod:`.running`). On the host, :data:`~.remote._WRAPPER` runs the program in a session of its own and reads the
ssh connection's standard input: a ``T`` line sends SIGTERM to the program's whole process
group (poprun stopping the launch gracefully), and the end of input, which comes when the ssh
client here dies (killed after the grace period, or with poprun itself, even by SIGKILL, by
the launch's watchdog), sends SIGKILL. The local ssh clients are spared SIGTERM, so that
a graceful stop reaches the remote program instead of cutting its connection: the clients live in a
process group of their own, led by a second watchdog, which gets SIGKILL but never SIGTERM.
So no remote process survives a failure, a Ctrl-C or the death of poprun.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Mapping

from poprun.backends.base import (
    CHECKS_BEFORE_START,
    PROCESSES,
    RESTARTS_INSTANCES,
    Gate,
    LaunchError,
    OutputSink,
    Restarter,
    TemporaryCache,
    environment,
)
from poprun.backends.ssh.client import CONNECT_TIMEOUT_S, SSH_CONFIG, SshClient, host_timeout
from poprun.backends.ssh.fanout import window
from poprun.backends.ssh.preflight import PREFLIGHT_S, preflight_budget
from poprun.backends.ssh.running import _relay_mode, _routes, _shared_connections, _slots, start
from poprun.core.diagnostic import launch_error
from poprun.core.localhost import is_this_machine
from poprun.core.span import SourceSpan
from poprun.planner.plan import LaunchPlan
from poprun.process.instance import DEFAULT_GRACE_S
from poprun.process.supervisor import LocalLaunch
from poprun.process.watchdog import WatchdogError

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (start-up; see poprun.core.record)
if TYPE_CHECKING:
    from typing import ClassVar

    from poprun.planner.machine import HostTopology


class SshBackend:
    """
    Runs the instances of remote hosts through ssh, and those of this machine as child processes.

    The backend keeps local state, which :meth:`close` releases (the registry's ``close()``, at the
    end of a command): the client of its launch, and a client kept for the launch to come (the
    topology probe's, :meth:`prepare`'s, a host command's before a launch: :meth:`_keep`), whose
    connections that launch takes over, so that a host pays one key exchange, not two. A kept
    client has a watchdog of its own: should poprun die meanwhile, even by SIGKILL, its control
    directory and connections go with it.
    """

    name: ClassVar[str] = "ssh"
    capabilities: ClassVar[frozenset[str]] = frozenset({PROCESSES, CHECKS_BEFORE_START, RESTARTS_INSTANCES})

    def __init__(self, *, grace_s: float = DEFAULT_GRACE_S) -> None:
        self.grace_s = grace_s
        self._client: SshClient | None = None  # the last client made: a launch's, or run_on_host's for the next launch
        self._client_lock = threading.Lock()
        self._kept: SshClient | None = None  # the client kept for the next launch with its settings (_keep)
        self._kept_lock = threading.Lock()

    def close(self) -> None:
        """
        Close the client kept for a launch that did not come, and the launch's, with their connections and directories.

        Idempotent (:class:`~poprun.backends.base.Closes`); called once the launches have ended.
        The backend may be used again: it then makes new clients.
        """
        with self._kept_lock:
            kept, self._kept = self._kept, None
        with self._client_lock:
            client, self._client = self._client, None
        for each in (kept, client):
            if each is not None and not each.closed:
                each.close()

    def _keep(self, client: SshClient) -> None:
        """
        Keep ``client`` (a probe's, prepare's, a command's before a launch) for the next launch with its settings.

        The one kept before is closed. This one is taken by that launch (:meth:`_take_kept`), or
        closed by :meth:`close`.
        """
        with self._kept_lock:
            old, self._kept = self._kept, client
        if old is not None and old is not client:
            old.close()

    def _take_kept(self, settings: tuple[str | None, str, float, float]) -> SshClient | None:
        """Return the kept client made with ``settings`` (no longer kept: the caller closes it), or None."""
        with self._kept_lock:
            client = self._kept
            if client is None or client.closed or client.settings != settings:
                return None
            self._kept = None
            return client

    def run_on_host(self, host: str, script: str, *, environ: Mapping[str, str],
                    timeout_s: float) -> tuple[int, bytes]:
        """
        Run ``script`` on ``host`` (:class:`~poprun.backends.base.HostCommands`): here, or over its shared connection.

        See :mod:`.hostcommand`: the connection is the running launch's, or one that the next
        launch of this backend reuses.

        Raises:
            LaunchError: when the host cannot be reached (PR405-PR408, in one line).
        """
        from poprun.backends.ssh.hostcommand import run_on_host, run_once

        with self._client_lock:
            client = self._client if self._client is not None and not self._client.closed else None
        if client is not None:  # a launch runs: through its connection
            return run_on_host(lambda _source: client, host, script, environ=environ, timeout_s=timeout_s)
        # before a launch (the port plan): through a client kept for the launch that follows (its connection is
        # the launch's), guarded by a watchdog of its own, so that a poprun killed meanwhile leaves no control
        # directory and no connection behind
        # (commands run at once on several hosts, the health check's, share that one client: one launch takes it)
        settings = self._settings(environ)
        try:
            kept = self._kept_for(settings, environ)
        except WatchdogError:  # no watchdog: a connection of its own, that leaves nothing behind
            return run_once(host, script, environ=environ, timeout_s=timeout_s, settings=settings)
        return run_on_host(lambda _source: kept, host, script, environ=environ, timeout_s=timeout_s)

    def _kept_for(self, settings: tuple[str | None, str, float, float], environ: Mapping[str, str]) -> SshClient:
        """
        Return the client kept for the next launch with ``settings``, made and kept now when there is none.

        Commands before a launch, one after another or at once from several threads, go through
        this one client (each host's connection opened once); the one kept before with other
        settings is closed. Raises :class:`WatchdogError` when the new client's watchdog cannot start.
        """
        with self._kept_lock:
            old = self._kept
            if old is not None and not old.closed and old.settings == settings:
                return old
            self._kept = client = SshClient(config=settings[0], host_timeout_s=settings[2],
                                            connect_timeout_s=settings[3], guarded=dict(environ))
        if old is not None:
            old.close()
        return client

    @staticmethod
    def _settings(source: Mapping[str, str]) -> tuple[str | None, str, float, float]:
        """Return the client settings (config, ssh, host timeout, connect timeout) a launch with ``source`` uses."""
        config = os.path.abspath(source[SSH_CONFIG]) if source.get(SSH_CONFIG) else None  # relays run elsewhere
        timeout_s = host_timeout(source)
        budget = preflight_budget(source, timeout_s)  # ssh's own connect timeout a little shorter: its word is clearer
        return (config, "ssh", timeout_s, CONNECT_TIMEOUT_S if budget == PREFLIGHT_S else budget - 1.5)

    def _shared_client(self, source: Mapping[str, str]) -> SshClient:
        """
        Return the client a launch with ``source`` uses: the open one made with the same settings (a probe's too), else a new one.

        Raises:
            LaunchError: for a host timeout or fan-out window that is not a number in range.
        """
        settings = self._settings(source)
        try:
            fanout = window(source)
        except ValueError as exc:
            raise launch_error("PR225", "invalid setting", detail=str(exc), span=SourceSpan.env("POPRUN_SSH_FANOUT"),
                               hint="set POPRUN_SSH_FANOUT to a number from 1 to 1024, or unset it") from None
        with self._client_lock:
            if self._client is None or self._client.closed or self._client.settings != settings:
                self._client = self._take_kept(settings) or SshClient(
                    config=settings[0], host_timeout_s=settings[2], connect_timeout_s=settings[3])
            self._client.window = fanout
            return self._client

    def prepare(self, plan: LaunchPlan, *, environ: Mapping[str, str]) -> None:
        """
        Open every remote host's shared connection for ``plan``, ahead of its launch (:class:`~poprun.backends.base.Prepares`).

        The apply step calls this before it reads instance 0's host (the port plan): that host's
        connection is then opened with all the others, in one window, not alone before them (one
        key exchange's time less). The client is kept for the launch, which takes it over and
        counts this time in its connect phase. A host that cannot be connected to is not raised
        here: the launch reports it (its failure is kept on the client, so nobody waits for it twice).
        The plan's spare hosts are connected too, so that a re-planned attempt finds their connections open.
        """
        if all(is_this_machine(instance.host) for instance in plan.instances):
            return
        given = plan.backend.given_settings()  # the plan's settings, never the shell's
        try:
            settings, budget = self._settings(given), preflight_budget(given, host_timeout(given))
            fanout, how = window(given), _relay_mode(given)
            client = self._take_kept(settings) or SshClient(config=settings[0], host_timeout_s=settings[2],
                                                            connect_timeout_s=settings[3], guarded=dict(environ))
        except (ValueError, LaunchError, WatchdogError):
            return  # a setting out of range, or no watchdog: the launch says so, or opens its connections itself
        try:
            client.window = fanout
            client.routes = _routes(plan, client, how)
            began = time.monotonic()
            connections = _shared_connections(plan, _slots(plan, client.routes), client.routes)
            if not client.routes.via:  # the spares too: a host's replacement costs no key exchange (docs/membership.md)
                connections += [(h, 0) for h in plan.membership.spares if not is_this_machine(h)]
            client.connect(connections, timeout_s=budget)
            client.ahead_s += time.monotonic() - began
        except OSError:  # no ssh to run: the launch says so
            client.close()
            return
        except BaseException:  # an interrupt: nothing of it is left
            client.close()
            raise
        self._keep(client)

    def probe_topologies(self, hosts: tuple[str, ...], *,
                         environ: Mapping[str, str]) -> Mapping[str, HostTopology | str]:
        """
        Return each host's topology, read through ssh, or why it could not be (:mod:`.probe`).

        The probe's client is kept for the launch that follows with this backend (:meth:`_keep`):
        its connections are the launch's.
        """
        from poprun.backends.ssh.probe import probe_topologies

        settings = self._settings(environ)
        try:
            client = self._take_kept(settings) or SshClient(config=settings[0], host_timeout_s=settings[2],
                                                            connect_timeout_s=settings[3], guarded=dict(environ))
        except WatchdogError as exc:
            return dict.fromkeys(hosts, f"cannot start a watchdog: {exc.strerror}")
        with contextlib.suppress(ValueError):  # a window out of range: the launch says so
            client.window = window(environ)
        try:
            return probe_topologies(hosts, environ=environ, client=client)
        finally:
            self._keep(client)

    def launch(self, plan: LaunchPlan, *, env_source: Mapping[str, str], sink: OutputSink,
               cache: TemporaryCache | None = None, restarter: Restarter | None = None,
               gate: Gate | None = None) -> LocalLaunch:
        """
        Check every host, then start every instance; return without waiting.

        With ``restarter``, a failed instance starts again alone when it says so (:func:`_respawner`).
        ``gate`` is awaited after a failure is told, before the others are stopped
        (:data:`~poprun.backends.base.Gate`).

        ``cache``, when to be removed at the end, is made on every remote host that lacks it
        (see :func:`remote_command`) and removed there by the last of its instances.

        Raises:
            PreflightError: when any host cannot run the plan (nothing has started).
            LaunchError: when an instance on this machine cannot start.
        """
        source = dict(env_source)
        given = plan.backend.given_settings()  # the ssh settings and the host timeout: the plan's, never the shell's
        envs = [environment(i, source) for i in plan.instances]
        config = given.get(SSH_CONFIG) or None
        hosts = list(dict.fromkeys(i.host for i in plan.instances if not is_this_machine(i.host)))
        if plan.ssh_keys.enabled:
            from poprun.backends.ssh.sshkey import distribute_key

            distribute_key(plan.ssh_keys, hosts, env=source, config=config)
        timeout_s = host_timeout(given)
        client = self._shared_client(given)  # a connection run_on_host or the probe opened is this launch's
        if plan.ssh_keys.enabled:  # a host that refused the key before (the port plan's command) may take it now
            client.forget_failures(hosts)
        try:
            return start(plan, envs, source, client, sink, timeout_s=timeout_s, cache=cache, restarter=restarter,
                         grace_s=self.grace_s, gate=gate)
        except BaseException:
            client.close()
            raise
