"""
``--distribute-ssh-key``: copy an SSH public key to every host with ``ssh-copy-id`` (seed 2.2.2).

Layer: ``poprun.backends``; standard library, ``poprun.core`` and ``poprun.planner.plan``.

The key is ``id_<type>.pub`` in the key folder (``--distribute-ssh-key-path``, default
``~/.ssh``): with ``--distribute-ssh-key-type`` that one, made with ``ssh-keygen`` if it does not
exist yet; without, the first of ``id_ed25519``, ``id_ecdsa``, ``id_rsa`` and ``id_dsa`` there.
Every host is first tried without a password (a key it already trusts installs the new one, and
a key already installed is left alone); the hosts that ask for a password are then tried again
with the password the user types once, handed to ssh through ``SSH_ASKPASS``.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from poprun.core.diagnostic import launch_error
from poprun.core.private import make_directories
from poprun.core.span import SourceSpan
from poprun.planner.plan import SshKeyDistribution

KEY_TYPES = ("ed25519", "ecdsa", "rsa", "dsa")
_SECRET = "POPRUN_SSH_COPY_ID_SECRET"  # noqa: S105 - the name of the variable that carries the password to askpass
_ASKPASS = f'#!/bin/sh\nprintf "%s\\n" "${_SECRET}"\n'
_TIMEOUT_S = 30


def key_to_distribute(keys: SshKeyDistribution, *, home: str) -> Path:
    """
    Return the public key to distribute, making the key pair first when a type is given and it is missing.

    Raises:
        LaunchError: when there is no key, or ssh-keygen fails.
    """
    folder = Path(keys.key_path or Path(home, ".ssh")).expanduser()
    if keys.key_type is not None:
        private = folder / f"id_{keys.key_type}"
        if not private.exists():
            make_directories(str(folder), exist_ok=True)  # each one made 0o700, whatever the umask
            done = subprocess.run(["ssh-keygen", "-q", "-t", keys.key_type, "-N", "", "-f", str(private)],  # noqa: S603, S607
                                  stdin=subprocess.DEVNULL, capture_output=True, text=True, check=False)
            if done.returncode != 0:
                raise launch_error("PR443", "SSH key could not be made",
                                   detail=f"cannot make a {keys.key_type} key in {folder}: "
                                          f"{done.stderr.strip() or 'ssh-keygen failed'}",
                                   span=SourceSpan.flag("--distribute-ssh-key-type"),
                                   hint="ssh-keygen's own words say why: choose a key type this OpenSSH makes "
                                        "(--distribute-ssh-key-type ed25519), or a folder you can write in "
                                        "(--distribute-ssh-key-path)")
        return private.with_name(private.name + ".pub")
    for kind in KEY_TYPES:
        public = folder / f"id_{kind}.pub"
        if public.is_file():
            return public
    raise launch_error("PR442", "no SSH key to distribute",
                       detail=f"no SSH key to distribute in {folder} (id_ed25519.pub, id_ecdsa.pub, id_rsa.pub or "
                              "id_dsa.pub); add --distribute-ssh-key-type ed25519 to make one",
                       span=SourceSpan.flag("--distribute-ssh-key-path" if keys.key_path else "--distribute-ssh-key"),
                       hint="add --distribute-ssh-key-type ed25519 (poprun makes the key pair with ssh-keygen), or "
                            "name the folder of your key with --distribute-ssh-key-path")


def distribute_key(keys: SshKeyDistribution, hosts: Sequence[str], *, env: Mapping[str, str],
                   config: str | None = None, password: str | None = None) -> None:
    """
    Copy the key of ``keys`` to every host in ``hosts`` with ssh-copy-id; ask for a password once if one is needed.

    ``password`` is used instead of asking (tests). Raises :class:`LaunchError` naming the hosts
    that still refuse the key.
    """
    home = env.get("HOME", str(Path.home()))
    public = key_to_distribute(keys, home=home)
    Path(home, ".ssh").mkdir(mode=0o700, exist_ok=True)  # ssh-copy-id makes its temporary files there
    base = ["ssh-copy-id", "-i", str(public), *(["-F", config] if config else [])]
    refused = _copy([*base, "-o", "BatchMode=yes"], hosts, dict(env))
    if refused and password is None and sys.stdin.isatty():
        import getpass  # here, not at the top: only a password prompt needs it

        if sys.stderr.isatty():  # clear poprun's status line, so that the prompt starts on a clean line
            sys.stderr.write("\r\x1b[K")
            sys.stderr.flush()
        password = getpass.getpass(f"poprun: password for {', '.join(refused)} (asked once, for ssh-copy-id): ")
    if refused and password is not None:
        refused = _copy_with_password(base, refused, dict(env), password)
    if refused:
        raise launch_error("PR444", "ssh-copy-id refused",
                           detail=f"cannot copy {public} to {', '.join(refused)} with ssh-copy-id: the host refused it "
                                  "(run 'ssh-copy-id HOST' by hand to see why)",
                           span=SourceSpan.environment(f"host {refused[0]}"),
                           hint=f"run 'ssh-copy-id -i {public} {refused[0]}' by hand to see why (a wrong password, "
                                "password logins turned off, a full disk there), or install the key another way")


def _copy(argv: list[str], hosts: Sequence[str], env: dict[str, str]) -> list[str]:
    """Run ssh-copy-id for every host at once; return the hosts where it failed."""
    procs = {host: subprocess.Popen([*argv, "--", host], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,  # noqa: S603
                                    stderr=subprocess.DEVNULL, env=env) for host in hosts}
    failed = []
    for host, proc in procs.items():
        try:
            if proc.wait(_TIMEOUT_S) != 0:
                failed.append(host)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            failed.append(host)
    return failed


def _copy_with_password(base: list[str], hosts: Sequence[str], env: dict[str, str], password: str) -> list[str]:
    """Run ssh-copy-id for ``hosts`` with ``password`` given to ssh through SSH_ASKPASS; return the failures."""
    from poprun.process.files import private_directory, remove_directories

    folder = private_directory("poprun-askpass-")
    try:
        askpass = Path(folder, "askpass")
        askpass.write_text(_ASKPASS)
        askpass.chmod(0o700)
        env = env | {"SSH_ASKPASS": str(askpass), "SSH_ASKPASS_REQUIRE": "force", "DISPLAY": env.get("DISPLAY", ":0"),
                     _SECRET: password}
        return _copy([*base, "-o", "BatchMode=no", "-o", "NumberOfPasswordPrompts=1"], hosts, env)
    finally:
        remove_directories([folder])
