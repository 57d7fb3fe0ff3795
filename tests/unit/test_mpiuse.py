"""Whether a program will call MPI: Python imports, -m and -c, linked binaries, and files never to read."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from poprun.planner.context import Context
from poprun.planner.flags import parse_flags
from poprun.planner.mpiuse import mpirun_path, probe
from poprun.planner.solve import solve

PATH = {"PATH": "/usr/bin:/bin"}


@pytest.mark.parametrize(("text", "expected"), [
    ("from mpi4py import MPI\n", "train.py imports mpi4py"),
    ("import os\n  import horovod.torch as hvd\n", "train.py imports horovod"),
    ("import torch\nimport popdist\n", None),
    ("# import mpi4py in a comment\nx = 'from mpi4py import MPI'\n", None),
])
def test_a_python_script_calls_mpi_when_it_imports_mpi4py_or_horovod(tmp_path: Path, text: str,
                                                                    expected: str | None) -> None:
    """An import statement of mpi4py or horovod at the start of a line; comments and strings are not imports."""
    (tmp_path / "train.py").write_text(text)

    assert expected == probe(("python3", "-u", "train.py", "--epochs", "3"), str(tmp_path), PATH)


@pytest.mark.parametrize(("argv", "expected"), [
    (("python3", "-m", "mpi4py", "train.py"), "it runs the module mpi4py"),
    (("python3", "-m", "mpi4py.bench", "helloworld"), "it runs the module mpi4py.bench"),
    (("python", "-c", "from mpi4py import MPI"), "its code imports mpi4py"),
    (("python3.11", "-W", "ignore", "-m", "torch.distributed.run", "x.py"), None),
    (("python3", "-c", "print(1)"), None),
    (("echo", "from mpi4py import MPI"), None),
    ((), None),
])
def test_interpreter_arguments_are_read_as_python_reads_them(tmp_path: Path, argv: tuple[str, ...],
                                                             expected: str | None) -> None:
    """-m names a module, -c holds code, -W takes a value; a program that is not Python is not read as Python."""
    assert expected == probe(argv, str(tmp_path), PATH)


def test_a_binary_linked_with_libmpi_calls_mpi(tmp_path: Path) -> None:
    """An ELF file that needs libmpi.so (its dynamic string table names it) calls MPI; one that does not, does not."""
    for name, needed in (("ring", b"libmpi.so.40"), ("plain", b"libc.so.6")):
        (tmp_path / name).write_bytes(b"\x7fELF\x02\x01\x01" + b"\0" * 100 + needed + b"\0")
        (tmp_path / name).chmod(0o755)

    assert ("./ring is linked with Open MPI's libmpi", None) == (
        probe(("./ring",), str(tmp_path), PATH), probe(("./plain",), str(tmp_path), PATH))


@pytest.mark.timeout(10)
@pytest.mark.parametrize("kind", ["fifo", "device", "directory", "missing"])
def test_a_script_that_is_not_a_regular_file_is_never_read(tmp_path: Path, kind: str) -> None:
    """A FIFO (nobody writes: a read would hang), /dev/zero (endless), a directory or nothing: no MPI, at once."""
    script = tmp_path / "train.py"
    if kind == "fifo":
        os.mkfifo(script)
    elif kind == "device":
        script.symlink_to("/dev/zero")
    elif kind == "directory":
        script.mkdir()

    assert probe(("python3", "train.py"), str(tmp_path), PATH) is None


def test_a_huge_script_is_read_only_in_part(tmp_path: Path) -> None:
    """An import past the first 4 MiB is not seen: the read is bounded."""
    (tmp_path / "train.py").write_bytes(b"#" * (5 << 20) + b"\nimport mpi4py\n")

    assert probe(("python3", "train.py"), str(tmp_path), PATH) is None


def test_mpirun_is_found_on_path_only(tmp_path: Path) -> None:
    """mpirun is looked for on PATH, never in the working directory."""
    (tmp_path / "mpirun").write_text("#!/bin/sh\n")
    (tmp_path / "mpirun").chmod(0o755)

    assert (str(tmp_path / "mpirun"), None) == (mpirun_path({"PATH": str(tmp_path)}),
                                                 mpirun_path({"PATH": str(tmp_path / "none")}))


def _backend(argv: list[str], *, mpirun: str | None) -> tuple[str, tuple[str, ...]]:
    ctx = Context(environ={}, cwd="/app", mpi_probe=lambda a, _cwd: "train.py imports mpi4py" if "mpi" in a[-1] else None,
                  mpirun=lambda: mpirun)
    plan = solve(parse_flags(argv, environ={}).spec, ctx).plan
    return plan.backend.name, tuple(w.code for w in plan.warnings)


@pytest.mark.parametrize(("argv", "mpirun", "expected"), [
    (["--num-instances", "2", "--num-replicas", "2", "python3", "mpi.py"], "/usr/bin/mpirun", ("mpirun", ())),
    (["--num-instances", "2", "--num-replicas", "2", "python3", "mpi.py"], None, ("local", ("PR313",))),
    (["--num-instances", "1", "--num-replicas", "2", "python3", "mpi.py"], "/usr/bin/mpirun", ("local", ())),
    (["--num-instances", "2", "--num-replicas", "2", "python3", "train.py"], "/usr/bin/mpirun", ("local", ())),
    (["--backend", "local", "--num-instances", "2", "--num-replicas", "2", "python3", "mpi.py"], "/usr/bin/mpirun",
     ("local", ())),
    (["--host", "h1,h2", "--offline-mode=1", "--num-instances", "2", "--num-replicas", "2", "python3", "mpi.py"],
     "/usr/bin/mpirun", ("offline", ("PR313",))),
])
def test_a_program_that_calls_mpi_runs_under_mpirun_when_it_can(argv: list[str], mpirun: str | None,
                                                                expected: tuple[str, tuple[str, ...]]) -> None:
    """Several instances of an MPI program: mpirun when found, else PR313; one instance or --backend: as before."""
    assert expected == _backend(argv, mpirun=mpirun)
