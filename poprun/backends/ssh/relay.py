"""
Starting on many hosts through relays: the ssh backend's tree start.

Layer: ``poprun.backends``; standard library only.

Every ssh connection costs the machine that opens it a key exchange (about 70 ms of CPU with
OpenSSH 9's default); poprun alone opening thousands of them makes the launching machine the
bottleneck (docs/scale.md has the model). Above :data:`THRESHOLD` remote hosts
(``POPRUN_SSH_RELAY=auto``, the default; ``on`` relays from 3 hosts, ``off`` never), the hosts are
cut into about sqrt(N) groups in plan order: poprun connects to the first host of each group,
the *relay*, and each session of another host of the group (a *leaf*) is a session on the
relay's shared connection that runs ``exec ssh ... LEAF COMMAND`` there. So poprun makes about
sqrt(N) key exchanges (times one per 8 sessions of a relay: sshd's ``MaxSessions``), and each
relay makes those of its leaves, all relays at once.

Nothing else changes: the leaf's session runs the very command a direct one would
(:func:`~poprun.backends.ssh.remote.remote_command`), reads its variables, "G", heartbeats and
stops from its standard input, which the relay's ssh passes on, and its output comes back the
same way. So every guarantee of a direct start holds: the environment is exact (values on
standard input, never in a command line); the leaf's wrapper kills its program when its input
ends, which happens when poprun, the relay's session or the relay itself goes, or when the
heartbeats stop. The relay's ssh runs with poprun's own options (batch mode, connect timeout,
keep-alives, ``-F $POPRUN_SSH_CONFIG`` when set, which must then be at the same path there),
and the relay needs what ``mpirun``'s tree spawn needs: passwordless ssh from the relay to
its leaves, whose host keys it knows.
"""

from __future__ import annotations

import math
import shlex
from collections.abc import Mapping, Sequence

RELAY = "POPRUN_SSH_RELAY"  # auto (relays above THRESHOLD remote hosts), on, off
THRESHOLD = 256  # remote hosts from which "auto" starts through relays (docs/scale.md: the model)
MODES = ("auto", "on", "off")
_FEWEST = 3  # fewer remote hosts than this have nothing to relay
# On the relay: poprun's address as its sshd saw it, when it is an IP address (a leaf sends its progress there)
_SEEN = "__poprun_s=${SSH_CONNECTION%% *}; case $__poprun_s in ''|*[!0-9A-Fa-f.:]*) __poprun_s=;; esac; "

__all__ = ["MODES", "RELAY", "THRESHOLD", "Routes", "mode", "relays"]


def mode(env: Mapping[str, str]) -> str:
    """
    Return how the launch starts its hosts: ``POPRUN_SSH_RELAY`` (auto, on, off), else ``auto``.

    Raises:
        ValueError: for another value (the message says which are known).
    """
    text = env.get(RELAY, "").strip().lower() or "auto"
    if text not in MODES:
        raise ValueError(f"{RELAY}={env.get(RELAY, '')!r} is not one of {', '.join(MODES)}")
    return text


def relays(hosts: Sequence[str], how: str, *, threshold: int = THRESHOLD) -> dict[str, str]:
    """
    Return the relay of each leaf host (``{leaf: relay}``); a host not in it is reached directly.

    ``hosts``: the remote hosts in plan order, each once. Groups of ``ceil(sqrt(N))`` hosts, in
    order; the first host of each group relays for the others.
    """
    count = len(hosts)
    if how == "off" or count < _FEWEST or (how == "auto" and count < threshold):
        return {}
    size = math.isqrt(count - 1) + 1  # ceil(sqrt(count))
    return {host: hosts[i - i % size] for i, host in enumerate(hosts) if i % size}


class Routes:
    """How each host is reached: directly, or through its relay (:func:`relays`), with ``options`` (ssh and poprun's options) on the relay."""

    def __init__(self, via: Mapping[str, str], options: Sequence[str]) -> None:
        self.via, self._options = dict(via), list(options)

    def host(self, host: str) -> str:
        """Return the host whose shared connection a session of ``host`` goes through: its relay, or itself."""
        return self.via.get(host, host)

    def command(self, host: str, command: str) -> str:
        """
        Return the shell text that runs ``command`` on ``host`` from the host :meth:`host` names.

        A leaf's ``command`` runs after ``__poprun_via=ADDRESS;``: poprun's address as its relay's
        sshd saw it (the first field of the relay's ``SSH_CONNECTION``, an IP address: anything
        else is left out), where the leaf sends its progress (docs/progress.md).
        """
        if host not in self.via:
            return command
        return (_SEEN + "exec " + shlex.join([*self._options, "-T", "--", host])
                + ' "__poprun_via=$__poprun_s;" ' + shlex.quote(command))

    def relay_count(self) -> int:
        """Return how many hosts relay for others."""
        return len(set(self.via.values()))
