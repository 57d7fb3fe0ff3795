"""
How instances reach a host: the name ssh_config maps it to, and whether a name resolves here.

Layer: ``poprun.planner``; standard library only, imported lazily (``subprocess`` and ``socket``
are not on a one-host launch's path). These read the world, so the solver never calls them
itself: the :class:`~poprun.planner.context.Context` of a real process carries them, and tests
give their own.
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping

SSH_CONFIG = "POPRUN_SSH_CONFIG"  # the ssh backend's -F file (poprun.backends.ssh.SSH_CONFIG)


def is_address(name: str) -> bool:
    """Return whether ``name`` is an IPv4 or IPv6 address (nothing to resolve)."""
    parts = name.split(".")
    return ":" in name or (len(parts) == 4 and all(part.isdigit() for part in parts))  # noqa: PLR2004 - IPv4


def ssh_hostname(name: str, environ: Mapping[str, str]) -> str | None:
    """
    Return the host name ssh connects to for ``name`` (``ssh -G``: ssh_config's ``HostName``), or None.

    ``ssh -G`` reads the configuration and prints it without connecting (only a configuration
    with ``CanonicalizeHostname`` or ``Match exec`` does more); ``-F $POPRUN_SSH_CONFIG`` when set,
    as the ssh backend runs it. None when ssh is missing or fails.
    """
    return _ssh_settings(name, environ).get("hostname") or None


def ssh_proxy(name: str, environ: Mapping[str, str]) -> str | None:
    """
    Return how ssh reaches ``name`` through another host (``ProxyJump J``, ``ProxyCommand C``), or None when directly.

    Read as :func:`ssh_hostname` reads ``HostName``; None too when ssh is missing or fails.
    """
    settings = _ssh_settings(name, environ)
    for key, shown in (("proxyjump", "ProxyJump"), ("proxycommand", "ProxyCommand")):
        value = settings.get(key, "")
        if value and value.lower() != "none":
            return f"{shown} {value}"
    return None


def _ssh_settings(name: str, environ: Mapping[str, str]) -> dict[str, str]:
    """Return ``ssh -G NAME``'s settings (lower-case key to value; the first of a repeated key), {} when it fails."""
    import subprocess

    config = environ.get(SSH_CONFIG)
    command = ["ssh", *(["-F", config] if config else []), "-G", "--", name]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=5, check=False,  # noqa: S603
                              stdin=subprocess.DEVNULL, errors="replace")
    except (OSError, subprocess.TimeoutExpired):
        return {}
    if done.returncode != 0:
        return {}
    settings: dict[str, str] = {}
    for line in done.stdout.splitlines():
        key, _, value = line.partition(" ")
        if value.strip():
            settings.setdefault(key.lower(), value.strip())
    return settings


def slurm_node_address(name: str, environ: Mapping[str, str]) -> str | None:
    """
    Return Slurm's address of node ``name`` (``NodeAddr``, by ``scontrol show node``), or None.

    Asks the Slurm controller, so only a launch calls it (``poprun plan`` never waits on a
    server). None when scontrol is missing, fails, or does not answer within 5 s.
    """
    import re
    import subprocess

    try:
        done = subprocess.run(["scontrol", "--oneliner", "show", "node", name], capture_output=True,  # noqa: S603, S607
                              text=True, timeout=5, check=False, stdin=subprocess.DEVNULL, env=dict(environ),
                              errors="replace")
    except (OSError, subprocess.TimeoutExpired):
        return None
    found = re.search(r"(?:^|\s)NodeAddr=(\S+)", done.stdout) if done.returncode == 0 else None
    return found.group(1) if found else None


def resolves(name: str, timeout_s: float = 2.0) -> bool | None:
    """Return whether ``name`` resolves on this machine; None when the resolver did not answer in ``timeout_s``."""
    import socket

    from poprun.core.threads import spawn

    answer: list[bool] = []

    def look_up() -> None:
        try:
            socket.getaddrinfo(name, None)
        except (OSError, UnicodeError):
            answer.append(False)
        else:
            answer.append(True)

    thread = spawn(look_up, name="poprun-resolve")
    thread.join(timeout_s)
    return answer[0] if answer else None
