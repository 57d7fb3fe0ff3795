"""
Whether a program will call MPI: what the solver needs to keep PopRun's promise to MPI programs.

Layer: ``poprun.planner``; standard library only. Reached through :attr:`Context.mpi_probe`
(the solver itself reads no file): :func:`probe` is what :meth:`Context.from_process` puts there.

Real PopRun started every instance through ``mpirun``, so a plain ``poprun --num-instances 2
python3 hvd_train.py`` gave Horovod and mpi4py programs one MPI world of two. poprun's own
backends are faster and need no MPI, so the solver picks ``mpirun`` only for programs that
will call MPI, found by looking at them without running anything:

- a Python program (``python3 script.py``, ``python3 -m module``, ``python3 -c code``) whose
  code imports ``mpi4py`` or ``horovod`` (a statement at a line's start or after ``;``, also
  in an ``import`` list), or that runs ``-m mpi4py``;
- a compiled program linked with Open MPI's library (``libmpi.so`` among its needed libraries);
- an executable Python script (``./train.py``, whose ``#!`` line runs Python) that imports them.

Reads are bounded (:data:`_MAX_BYTES`), only of regular files, and never follow a program's own
imports: a program that reaches MPI only through a module of its own is not seen, and runs
with ``--backend mpirun`` (or ``backend = "mpirun"``) as before. Inside a Slurm allocation
:func:`srun_mpi_plugins` asks ``srun --mpi=list`` (local, no controller) which MPI plugins
srun has, for the solver's choice of ``--mpi=``.
"""

from __future__ import annotations

import os
import re
import stat
import subprocess
from collections.abc import Mapping

_MAX_BYTES = 4 << 20  # read at most this much of a script or a binary
_PYTHON = re.compile(r"python[0-9.]*\Z")
# A statement that imports mpi4py or horovod: at the start of a line or after a ";", as "from X ..." or in the
# list of an "import" ("import os, mpi4py.MPI as M").
_IMPORT = re.compile(rb"(?:^|;)[ \t]*(?:from[ \t]+|import[ \t]+(?:[\w.]+(?:[ \t]+as[ \t]+\w+)?[ \t]*,[ \t]*)*)"
                     rb"(mpi4py|horovod)\b", re.MULTILINE)
_SHEBANG = re.compile(rb"#![ \t]*(?:\S*/env[ \t]+(?:-\S+[ \t]+)*|\S*/)?python[0-9.]*(?:[ \t]|\r?\n|\Z)")
_PLUGIN = re.compile(r"[a-z][a-z0-9_]{0,31}")  # an MPI plugin's name as srun lists it
_SRUN_S = 5.0  # how long srun --mpi=list may take (it reads the local configuration only)
_VALUED = frozenset({"-W", "-X", "--check-hash-based-pycs"})  # python options that take the next word


def probe(argv: tuple[str, ...], cwd: str, environ: Mapping[str, str]) -> str | None:
    """
    Return why ``argv`` (run in ``cwd`` with ``environ``'s PATH) will call MPI, or None when nothing says so.

    The reason names the evidence: ``train.py imports mpi4py``, ``./ring is linked with libmpi``.
    """
    if not argv:
        return None
    if any("\0" in word for word in (*argv, cwd)):  # no such file can exist: the launch says so
        return None
    program = _find(argv[0], cwd, environ.get("PATH", os.defpath))
    if program is None:
        return None
    if _PYTHON.match(os.path.basename(argv[0])):
        return _python(argv[1:], cwd)
    head = _read(program)
    if head.startswith(b"\x7fELF") and b"libmpi.so" in head:
        return f"{argv[0]} is linked with Open MPI's libmpi"
    if _SHEBANG.match(head):  # ./train.py, run by Python through its #! line
        found = _IMPORT.search(head)
        return f"{argv[0]} imports {found.group(1).decode()}" if found else None
    return None


def mpirun_path(environ: Mapping[str, str]) -> str | None:
    """Return the ``mpirun`` that ``environ``'s PATH finds, or None."""
    return _find("mpirun", "/", environ.get("PATH", os.defpath), search_cwd=False)


def srun_mpi_plugins(environ: Mapping[str, str], *, timeout_s: float = _SRUN_S) -> tuple[str, ...] | None:
    """
    Return the MPI plugins ``srun --mpi=list`` names (``pmix``, ``pmix_v4``, ``none``...), or None without an answer.

    srun lists the plugins installed on this machine (a shared Slurm installation: the nodes'),
    without asking the controller; a srun that is missing, fails or takes over ``timeout_s`` is
    no answer.
    """
    srun = _find("srun", "/", environ.get("PATH", os.defpath), search_cwd=False)
    if srun is None:
        return None
    try:
        done = subprocess.run([srun, "--mpi=list"], env=dict(environ), stdin=subprocess.DEVNULL,  # noqa: S603
                              capture_output=True, timeout=timeout_s, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    text = (done.stdout + done.stderr).decode(errors="replace")
    if done.returncode != 0:
        return None
    names = [line.strip() for line in text.splitlines() if line[:1] in ("\t", " ") and _PLUGIN.fullmatch(line.strip())]
    for line in text.splitlines():  # "specific pmix plugin versions available: pmix_v4"
        if "versions available:" in line:
            names += [n for n in line.split(":", 1)[1].replace(",", " ").split() if _PLUGIN.fullmatch(n)]
    return tuple(dict.fromkeys(names))


def _python(args: tuple[str, ...], cwd: str) -> str | None:
    """Return why the Python program of interpreter arguments ``args`` will call MPI, or None."""
    words = iter(args)
    for word in words:
        if word == "-c":
            code = next(words, "")
            found = _IMPORT.search(code.encode(errors="replace"))
            return f"its code imports {found.group(1).decode()}" if found else None
        if word == "-m":
            module = next(words, "")
            if module.split(".")[0] in {"mpi4py", "horovod"}:
                return f"it runs the module {module}"
            return None
        if word in _VALUED:
            next(words, None)
            continue
        if word.startswith("-"):
            continue
        found = _IMPORT.search(_read(os.path.join(cwd, word)))
        return f"{word} imports {found.group(1).decode()}" if found else None
    return None


def _find(name: str, cwd: str, path: str, *, search_cwd: bool = True) -> str | None:
    """Return the file ``name`` runs as (PATH lookup for a bare name, else relative to ``cwd``), or None."""
    if "/" in name:
        return os.path.join(cwd, name)
    for directory in path.split(os.pathsep):
        candidate = os.path.join(directory or cwd, name)
        if "\0" not in candidate and os.access(candidate, os.X_OK) and not os.path.isdir(candidate):
            return candidate
    return os.path.join(cwd, name) if search_cwd else None  # PopRun runs ./name from the cwd


def _read(path: str) -> bytes:
    """Return the first :data:`_MAX_BYTES` of the regular file ``path``; b"" for anything else or on error."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except (OSError, ValueError):  # ValueError: a NUL in the name
        return b""
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):  # a FIFO, a device, a directory: never read
            return b""
        chunks, left = [], _MAX_BYTES
        while left > 0 and (chunk := os.read(fd, min(left, 1 << 20))):
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)
    except OSError:
        return b""
    finally:
        os.close(fd)
